"""rundir.py: what a train.py run keeps in its out_dir, and how a killed run finds its way back.

    out_dir/step_000010/      a checkpoint: {model | designer, executor}/ (HF format), optimizer.pt,
                              trainer_state.pt (step, data position, every rank's RNG, the config);
                              written to .tmp_step_000010/ and renamed, so a checkpoint is complete
                              or absent
    out_dir/metrics.jsonl     a line a step (recorder.py: what the step's rollout did, the update's
                              numbers, times), fsync'ed before that step's checkpoint is written
    out_dir/run.json          what made the run: commit (dirty or not), command, clock times,
                              machine, config
    out_dir/rollouts.jsonl    the step's tree, a line per recorded query (rollout.Batch.tree;
                              tools/show.py draws it), written the same way just before the metrics
                              line

    save_checkpoint(cfg, step, policies, tokenizer, trainer_state, rank)   # every rank (collective)
    ckpt, ts = latest(out_dir)             # the newest checkpoint's folder and trainer state
                                           # (None, None without one)
    restore_optimizers(policies, ckpt, ts, master); restore_rng(ts, seed, rank)
    truncate_jsonl(path, ts["step"])       # a resume drops the lines of steps after its checkpoint

fault(point, step) is the fault injection tests/test_train.py uses to SIGKILL a run at chosen
points; append_jsonl writes a step's lines, durably (recorder.py calls both at their points of the
step).

Needs: settings.py, mas.py, stagewise.py, machinery/provenance.py
"""

import dataclasses
import json
import os
import platform
import random
import re
import shutil
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint import state_dict as dcp
from torch.distributed.tensor import DTensor

import settings
from machinery.provenance import CLOCK, git_state


def full_state(model, dtype=None):
    """Yield (name, full tensor) one parameter at a time; under FSDP2 each is all-gathered on every
    rank."""
    for name, t in model.state_dict().items():
        t = t.full_tensor() if isinstance(t, DTensor) else t
        yield name, (t.detach().to(dtype) if dtype is not None else t.detach())


def gathered_state(model, rank):
    """The full weights on rank 0, in CPU memory ({} on the other ranks). Collective: every rank
    must call it (each tensor is gathered on all of them, one at a time, and kept by rank 0
    alone)."""
    state = {}
    for name, t in full_state(model):
        if rank == 0:
            state[name] = t.cpu()
    return state


def save_hf(path, state, model, tokenizer):
    """HF folder loadable by from_pretrained and vLLM (config, generation config, safetensors,
    tokenizer). The generation config is where Qwen3 keeps its second EOS (<|endoftext|>;
    engine.eos_ids reads both)."""
    os.makedirs(path, exist_ok=True)
    config = model.config
    config.architectures = [type(model).__name__.removeprefix("FSDP")]
    config.save_pretrained(path)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(path)
    if getattr(config, "tie_word_embeddings", False):
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    save_file(
        {k: v.contiguous().cpu() for k, v in state.items()},
        os.path.join(path, "model.safetensors"),
        metadata={"format": "pt"},
    )
    tokenizer.save_pretrained(path)


def rng_state():
    st = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st):
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def restore_rng(ts, seed, rank):
    """Every RNG as the checkpoint's trainer state left it on this rank, or seeded afresh (ts
    None)."""
    if ts is not None:
        return set_rng_state(ts["rng"][rank] if rank < len(ts["rng"]) else ts["rng"][0])
    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed)


def prepare(cfg):
    """out_dir made; with --overwrite, the run it holds deleted first (its files only:
    settings.run_files)."""
    if cfg.overwrite and settings.run_files(cfg.out_dir):
        held = ", ".join(settings.run_files(cfg.out_dir))
        print(f"--overwrite: deleting the run in {cfg.out_dir} ({held})")
        settings.clear_run(cfg.out_dir)
    os.makedirs(cfg.out_dir, exist_ok=True)


def provenance(cfg, argv, end=False):
    """out_dir/run.json: what made this run, one entry a start (a resume adds one): the commit and
    whether the tree had uncommitted changes, the full command, clock times (start; end once the run
    is done), the machine (CPU model, cores, torch and Python versions); and the run's config.
    Written atomically by rank 0."""
    path = os.path.join(cfg.out_dir, "run.json")
    info = {"config": dataclasses.asdict(cfg), "starts": []}
    if os.path.exists(path):
        with open(path) as f:
            info = {**json.load(f), "config": dataclasses.asdict(cfg)}
    now = time.strftime(CLOCK)
    if end:
        info["starts"][-1]["end"] = now
    else:
        info["starts"].append(
            {
                **git_state(),  # the commit and whether the tree had changes (provenance.py)
                "command": [sys.executable, *sys.argv[:1], *argv],
                "start": now,
                "end": None,
                "machine": machine(),
            }
        )
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(info, f, indent=1)
    os.replace(tmp, path)


def machine():
    """The CPU model and cores, the GPU if any, torch's and Python's versions."""
    cpu = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "gpu": gpu,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }


def checkpoints(out_dir):
    """The step_N folders in out_dir, oldest first (by step number)."""
    if not os.path.isdir(out_dir):
        return []
    return sorted(
        (d for d in os.listdir(out_dir) if re.fullmatch(r"step_\d+", d)), key=lambda d: int(d[5:])
    )


def fault(point, step):
    """Fault injection (tests/test_train.py): METAAGENT_FAULT=point:step SIGKILLs this process when
    it reaches `point` of step `step` (1-based). Points: designer-phase and executor-phase
    (mid-rollout: a role's first generate call, weights.RoleView), update (mid-update), checkpoint
    (between a checkpoint's files), logged (metrics line written, checkpoint not), saved (checkpoint
    written)."""
    if os.environ.get("METAAGENT_FAULT") == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def save_checkpoint(cfg, step, policies, tokenizer, trainer_state, rank, keep=2):
    """out_dir/step_{step}/: {model | designer, executor}/ (HF format), optimizer.pt,
    trainer_state.pt, written into a temp folder and renamed (atomic: a checkpoint folder is either
    complete or absent); the `keep` newest checkpoints stay. Only rank 0 holds full tensors in CPU
    memory: the weights are gathered one tensor at a time and kept on rank 0 alone, the optimizer
    state is gathered with cpu_offload (rank 0 alone). An optimizer state that has never stepped is
    not saved: torch's state-dict helpers would initialise it with a zero step, which shifts Adam's
    bias correction of that state's first real step."""
    final = os.path.join(cfg.out_dir, f"step_{step:06d}")
    tmp = os.path.join(cfg.out_dir, f".tmp_step_{step:06d}")
    opts = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
    if rank == 0 and os.path.isdir(tmp):
        shutil.rmtree(tmp)
    optim = {}
    for name, pol in policies.items():
        state = gathered_state(pol["model"], rank)  # collective
        if rank == 0:
            save_hf(os.path.join(tmp, name), state, pol["model"], tokenizer)
        del state
        for sname, opt in pol["opt"].items():
            # an idle role's state in host memory (machinery/offload.py) is saved from there: back
            # in opt.state for the save, which gathers it a tensor at a time, then out again
            held = getattr(opt, "host_state", {})
            opt.state.update(held)
            if opt.state:  # the same on every rank: they step together
                optim[f"{name}/{sname}"] = dcp.get_optimizer_state_dict(
                    pol["model"], opt, options=opts
                )
            for p in held:
                del opt.state[p]
        fault("checkpoint", step)
    rngs = [None] * dist.get_world_size()
    dist.all_gather_object(rngs, rng_state())
    if rank == 0:
        torch.save(optim, os.path.join(tmp, "optimizer.pt"))  # loaded on rank 0 alone at resume
        torch.save(
            {
                **trainer_state,
                "optimizers": sorted(optim),
                "rng": rngs,
                "config": dataclasses.asdict(cfg),
            },
            os.path.join(tmp, "trainer_state.pt"),
        )
        os.replace(tmp, final)
        for old in checkpoints(cfg.out_dir)[:-keep]:
            shutil.rmtree(os.path.join(cfg.out_dir, old), ignore_errors=True)
    dist.barrier()


def truncate_jsonl(path, step):
    """After a resume from the checkpoint of `step`, drop the lines of later steps from
    metrics.jsonl or rollouts.jsonl (a kill between a step's lines and its checkpoint leaves some; a
    kill mid-write leaves a partial last line). Atomic: the kept lines go to a hidden temporary file
    (.NAME.PID.tmp, which settings.run_files covers) that replaces the file, so a second kill cannot
    lose them. Returns the kept rows."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [ln for ln in f if ln.strip()]
    keep = []
    for k, ln in enumerate(lines):
        try:
            row = json.loads(ln)
        except json.JSONDecodeError:
            if k == len(lines) - 1:  # the partial line of a write the kill interrupted
                break
            raise ValueError(
                f"{path}: line {k + 1} is not JSON; the run folder is damaged"
            ) from None
        if row["step"] <= step:
            keep.append(ln if ln.endswith("\n") else ln + "\n")
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.writelines(keep)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return [json.loads(ln) for ln in keep]


def latest(out_dir):
    """(folder, trainer state) of the newest checkpoint in out_dir, or (None, None) when it holds
    none."""
    if not checkpoints(out_dir):
        return None, None
    ckpt = os.path.join(out_dir, checkpoints(out_dir)[-1])
    return ckpt, torch.load(os.path.join(ckpt, "trainer_state.pt"), weights_only=False)


def restore_optimizers(policies, ckpt, ts, master):
    """The checkpoint's optimizer states into policies[name]["opt"][state]. Read on rank 0 alone;
    set_optimizer_state_dict broadcasts them to the other ranks."""
    have = []
    for n, pol in policies.items():
        have += [f"{n}/{s}" for s in pol["opt"]]
    have.sort()
    if not set(ts["optimizers"]) <= set(have):
        raise settings.ConfigError(
            f"the checkpoint's optimizer states {ts['optimizers']} do not fit this config "
            f"({have}): resume with the policy and mode it was written with"
        )
    saved = (
        torch.load(os.path.join(ckpt, "optimizer.pt"), weights_only=False, mmap=True)
        if master
        else {}
    )
    for key in ts["optimizers"]:
        name, sname = key.split("/")
        dcp.set_optimizer_state_dict(
            policies[name]["model"],
            policies[name]["opt"][sname],
            optim_state_dict=saved.get(key, {}),
            options=dcp.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )


def append_jsonl(path, rows):
    """A step's lines (its metrics line; its rollouts.jsonl records), on disk (fsync) before the
    step's checkpoint is written: no kill loses them."""
    with open(path, "a") as f:
        f.writelines(json.dumps(m) + "\n" for m in rows)
        f.flush()
        os.fsync(f.fileno())
