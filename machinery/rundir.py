"""rundir.py: what a train.py run keeps in its out_dir, and how a killed run finds its way back.

    out_dir/step_000010/      a checkpoint, written to .tmp_step_000010/ and renamed, so a
                              checkpoint is complete or absent:
        model/ | designer/, executor/   HF folders (save_pretrained's layout: sharded safetensors
                              in the engine's dtype, bf16 on a GPU, fp32 on the CPU; config,
                              tokenizer), what transformers, vLLM, evaluate.py and the final table
                              load as they are
        state/                a torch.distributed.checkpoint folder: each rank's shards of the fp32
                              master weights ("NAME/model") and of each Adam state that has stepped
                              ("NAME/STATE"), written by that rank, no gather; and "trainer": step,
                              data position, every rank's RNG, the config
    out_dir/metrics.jsonl     a line a step (recorder.py: what the step's rollout did, the update's
                              numbers, times), fsync'ed before that step's checkpoint is written
    out_dir/run.json          what made the run: commit (dirty or not), command, clock times,
                              machine, config
    out_dir/rollouts.jsonl    the step's tree, a line per recorded query (rollout.Batch.tree;
                              tools/show.py draws it), written the same way just before the metrics
                              line

    save_checkpoint(cfg, step, policies, tokenizer, trainer_state, rank)   # every rank (collective)
                                           # kept: the 2 newest and the benchmark curve's steps
                                           # (multiples of val_every), which evaluate.py reads
    ckpt, ts = latest(out_dir)             # the newest checkpoint's folder and trainer state
                                           # (None, None without one)
    restore(policies, ckpt, ts)            # master weights and Adam states (every rank: collective)
    restore_rng(ts, seed, rank)
    read_state(ckpt, keys)                 # whole tensors of a checkpoint's state, one process
    trainer_state(ckpt)                    # its trainer state alone (either format), to read
    truncate_jsonl(path, ts["step"])       # a resume drops the lines of steps after its checkpoint

fault(point, step) is the fault injection tests/test_train.py uses to SIGKILL a run at chosen
points; append_jsonl writes a step's lines, durably (recorder.py calls both at their points of the
step). run_files / clear_run: what a run writes into out_dir (a fresh run refuses such a folder;
--overwrite deletes it); cold_start_dirs: the model folders of a cold start. A run folder that
cannot be resumed raises RunFolderError, saying what to do.

Needs: machinery/provenance.py
"""

import copy
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
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from huggingface_hub import save_torch_state_dict
from torch.distributed.checkpoint import state_dict as sd_api
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
from torch.distributed.tensor import DTensor

from machinery.provenance import CLOCK, git_state


def full_state(model, dtype=None):
    """Yield (name, full tensor) one parameter at a time; under FSDP2 each is all-gathered on every
    rank."""
    for name, t in model.state_dict().items():
        t = t.full_tensor() if isinstance(t, DTensor) else t
        yield name, (t.detach().to(dtype) if dtype is not None else t.detach())


def gathered_state(model, rank, dtype=None):
    """The full weights on rank 0, in CPU memory ({} on the other ranks), in `dtype` (None: as they
    are). Collective: every rank must call it (each tensor is gathered on all of them, one at a
    time, and kept by rank 0 alone)."""
    state = {}
    for name, t in full_state(model, dtype):
        if rank == 0:
            state[name] = t.cpu()
    return state


def save_hf(path, state, model, tokenizer, max_shard_size="5GB"):
    """HF folder loadable by from_pretrained and vLLM (config, generation config, tokenizer, and the
    weights as save_pretrained writes them: safetensors shards of at most max_shard_size, with
    model.safetensors.index.json when there is more than one; huggingface_hub's writer, which
    save_pretrained calls, given the gathered tensors). The config's dtype is the weights'. The
    generation config is where Qwen3 keeps its second EOS (<|endoftext|>; engine.eos_ids reads
    both)."""
    os.makedirs(path, exist_ok=True)
    config = copy.deepcopy(model.config)  # the trainer's model keeps its own (its dtype: fp32)
    config.architectures = [type(model).__name__.removeprefix("FSDP")]
    dtypes = {t.dtype for t in state.values()}
    if len(dtypes) == 1:
        config.dtype = dtypes.pop()
    config.save_pretrained(path)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(path)
    if getattr(config, "tie_word_embeddings", False):
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    state = {k: v.contiguous().cpu() for k, v in state.items()}
    save_torch_state_dict(state, path, max_shard_size=max_shard_size)
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


class RunFolderError(ValueError):
    """out_dir holds what this run cannot use: another run, a checkpoint of another format,
    policy or mode. The message says what to do."""


def run_files(out_dir):
    """What a run writes into out_dir (checkpoints, metrics, table): a fresh run refuses a folder
    that holds any of them, and --overwrite deletes exactly these."""
    if not os.path.isdir(out_dir):
        return []
    names = (
        "metrics.jsonl",
        "rollouts.jsonl",
        "rollouts.html",
        "run.json",
        "final_table.json",
        "final_table_val.json",
        "plots",
        "tensorboard",
        "wandb",
    )
    return [
        d
        for d in sorted(os.listdir(out_dir))
        if d in names
        or re.fullmatch(r"\.?(tmp_)?step_\d+", d)
        or re.fullmatch(r"\.(metrics|rollouts)\.jsonl\.\d+\.tmp", d)
    ]


def clear_run(out_dir):
    for d in run_files(out_dir):
        path = os.path.join(out_dir, d)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def cold_start_dirs(init_from, separate=False):
    """The model folders of a cold start (sft.py --out init_from [--roles separate]). sft.py renames
    each into place when it is finished, a separate one's designer/ before its executor/: a build
    stopped between the two leaves init_from/ with designer/ alone, so a cold start is whole when
    every folder here is a directory, not when init_from is."""
    if not separate:
        return {"model": init_from}
    return {r: os.path.join(init_from, r) for r in ("designer", "executor")}


def cold_start_whole(init_from, separate=False):
    """Whether every model folder of the cold start at init_from is in place (cold_start_dirs)."""
    return all(os.path.isdir(d) for d in cold_start_dirs(init_from, separate).values())


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
    run_files)."""
    if cfg.overwrite and run_files(cfg.out_dir):
        held = ", ".join(run_files(cfg.out_dir))
        print(f"--overwrite: deleting the run in {cfg.out_dir} ({held})")
        clear_run(cfg.out_dir)
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


def stale(names, keep, val_every=0):
    """The checkpoints (step_N folder names, oldest first) a save removes: all but the `keep`
    newest, save those whose step is a multiple of val_every (> 0), the benchmark curve's."""
    old = names[: max(0, len(names) - keep)]
    return [d for d in old if not (val_every > 0 and int(d[5:]) % val_every == 0)]


def fault(point, step):
    """Fault injection (tests/test_train.py): METAAGENT_FAULT=point:step SIGKILLs this process when
    it reaches `point` of step `step` (1-based). Points: designer-phase and executor-phase
    (mid-rollout: a role's first generate call, weights.RoleView), update (mid-update), checkpoint
    (between a checkpoint's files), logged (metrics line written, checkpoint not), saved (checkpoint
    written)."""
    if os.environ.get("METAAGENT_FAULT") == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def save_checkpoint(cfg, step, policies, tokenizer, trainer_state, rank, keep=2):
    """out_dir/step_{step}/: {model | designer, executor}/ (HF folders) and state/ (a
    torch.distributed.checkpoint folder), written into a temp folder and renamed (atomic: a
    checkpoint folder is either complete or absent); the `keep` newest checkpoints stay, and those
    of the benchmark curve's steps (multiples of cfg.val_every: `evaluate.py --run RUN --step N`
    reads the model whose curve it saw; stale()).

    The HF folders: the weights gathered one tensor at a time, in the engine's dtype (bf16 when they
    live on a GPU), kept and written by rank 0 alone. state/: every rank writes its own shards of
    the fp32 master weights and of each Adam state (an idle role's from host memory, where
    machinery/offload.py keeps it), nothing gathered; rank 0 adds the trainer state (the step, the
    data position, every rank's RNG, the config). An optimizer state that has never stepped is not
    saved: torch's state-dict helpers would initialise it with a zero step, which shifts Adam's bias
    correction of that state's first real step."""
    final = os.path.join(cfg.out_dir, f"step_{step:06d}")
    tmp = os.path.join(cfg.out_dir, f".tmp_step_{step:06d}")
    if rank == 0 and os.path.isdir(tmp):
        shutil.rmtree(tmp)
    dist.barrier()  # a killed save's folder is gone before any rank writes into it
    state, stepped = {}, []
    for name, pol in policies.items():
        model = pol["model"]
        on_gpu = next(model.parameters()).device.type == "cuda"
        weights = gathered_state(model, rank, torch.bfloat16 if on_gpu else None)  # collective
        if rank == 0:
            save_hf(os.path.join(tmp, name), weights, model, tokenizer)
        del weights
        state[f"{name}/model"] = sd_api.get_model_state_dict(model)  # this rank's shards
        for sname, opt in pol["opt"].items():
            # an idle role's state in host memory (machinery/offload.py) is saved from there: back
            # in opt.state while its state dict is taken (its tensors, not copies), then out again
            held = getattr(opt, "host_state", {})
            opt.state.update(held)
            if opt.state:  # the same on every rank: they step together
                state[f"{name}/{sname}"] = sd_api.get_optimizer_state_dict(model, opt)
                stepped.append(f"{name}/{sname}")
            for p in held:
                del opt.state[p]
        fault("checkpoint", step)
    rngs = [None] * dist.get_world_size()
    dist.all_gather_object(rngs, rng_state())
    state["trainer"] = {
        **trainer_state,
        "optimizers": sorted(stepped),
        "rng": rngs,
        "config": dataclasses.asdict(cfg),
    }
    dcp.save(state, checkpoint_id=os.path.join(tmp, "state"))  # collective; rank 0 writes "trainer"
    if rank == 0:
        os.replace(tmp, final)
        for old in stale(checkpoints(cfg.out_dir), keep, cfg.val_every):
            shutil.rmtree(os.path.join(cfg.out_dir, old), ignore_errors=True)
    dist.barrier()


def truncate_jsonl(path, step):
    """After a resume from the checkpoint of `step`, drop the lines of later steps from
    metrics.jsonl or rollouts.jsonl (a kill between a step's lines and its checkpoint leaves some; a
    kill mid-write leaves a partial last line). Atomic: the kept lines go to a hidden temporary file
    (.NAME.PID.tmp, which run_files covers) that replaces the file, so a second kill cannot
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


def read_state(ckpt, keys):
    """{key: ...} of a checkpoint's state/ folder, whole tensors: "trainer", "NAME/model" (the fp32
    master weights), "NAME/STATE" (an Adam state: {"state": {param name: {"step", "exp_avg",
    "exp_avg_sq"}}, "param_groups": [...]}). In one process without a process group; collective
    (every rank calls it) when there is one."""
    with warnings.catch_warnings():  # "... assuming the intent is to load in a single process": yes
        warnings.filterwarnings("ignore", "torch.distributed is unavailable or uninitialized")
        return _load_state_dict_from_keys(set(keys), checkpoint_id=os.path.join(ckpt, "state"))


def trainer_state(ckpt):
    """A checkpoint's trainer state (step, data position, RNGs, config), for a reader that needs no
    more: from state/, or from the trainer_state.pt of a checkpoint of the format before it."""
    old = os.path.join(ckpt, "trainer_state.pt")
    if not os.path.isdir(os.path.join(ckpt, "state")) and os.path.exists(old):
        return torch.load(old, weights_only=False)
    return read_state(ckpt, ["trainer"])["trainer"]


def latest(out_dir):
    """(folder, trainer state) of the newest checkpoint in out_dir, or (None, None) when it holds
    none. A checkpoint of the format before state/ (optimizer.pt, trainer_state.pt) raises
    RunFolderError, saying what to do."""
    if not checkpoints(out_dir):
        return None, None
    ckpt = os.path.join(out_dir, checkpoints(out_dir)[-1])
    if not os.path.isdir(os.path.join(ckpt, "state")):
        if os.path.exists(os.path.join(ckpt, "optimizer.pt")):
            why = "is a checkpoint of the old format (optimizer.pt, trainer_state.pt)"
            fix = "resume it with the project as it was before state/ (docs/NOTES.md, issue #54)"
        else:
            why = "has no state/ folder"
            fix = "delete it to resume from the checkpoint before it"
        raise RunFolderError(f"{ckpt} {why}: {fix}, or start over with --overwrite")
    return ckpt, read_state(ckpt, ["trainer"])["trainer"]


def restore(policies, ckpt, ts):
    """The checkpoint's fp32 master weights into each policy's model (its HF folder, which the model
    was loaded from, is in the engine's dtype) and its Adam states into policies[name]["opt"]:
    every rank reads its own shards. Collective."""
    have = []
    for n, pol in policies.items():
        have += [f"{n}/{s}" for s in pol["opt"]]
    have.sort()
    if not set(ts["optimizers"]) <= set(have):
        raise RunFolderError(
            f"the checkpoint's optimizer states {ts['optimizers']} do not fit this config "
            f"({have}): resume with the policy and mode it was written with"
        )
    state = {f"{n}/model": sd_api.get_model_state_dict(pol["model"]) for n, pol in policies.items()}
    for key in ts["optimizers"]:
        name, sname = key.split("/")
        pol = policies[name]
        state[key] = sd_api.get_optimizer_state_dict(pol["model"], pol["opt"][sname])
    dcp.load(state, checkpoint_id=os.path.join(ckpt, "state"))  # into these tensors, in place
    for n, pol in policies.items():
        sd_api.set_model_state_dict(pol["model"], state[f"{n}/model"])
    for key in ts["optimizers"]:
        name, sname = key.split("/")
        pol = policies[name]
        sd_api.set_optimizer_state_dict(pol["model"], pol["opt"][sname], state[key])


def append_jsonl(path, rows):
    """A step's lines (its metrics line; its rollouts.jsonl records), on disk (fsync) before the
    step's checkpoint is written: no kill loses them."""
    with open(path, "a") as f:
        f.writelines(json.dumps(m) + "\n" for m in rows)
        f.flush()
        os.fsync(f.fileno())
