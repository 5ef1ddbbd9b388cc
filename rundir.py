"""rundir.py: what a train.py run keeps in its out_dir, and how a killed run finds its way back.

    out_dir/step_000010/      a checkpoint: {model | designer, executor}/ (HF format), optimizer.pt,
                              trainer_state.pt (step, data position, schedulers, every rank's RNG, the config);
                              written to .tmp_step_000010/ and renamed, so a checkpoint is complete or absent
    out_dir/metrics.jsonl     a line a step, fsync'ed before that step's checkpoint is written
    out_dir/tb/, wandb/       TensorBoard events and the wandb run, when those are installed

    save_checkpoint(cfg, step, policies, tokenizer, trainer_state, rank)   # every rank calls it (collective)
    ckpt, ts = latest(out_dir)             # the newest checkpoint's folder and trainer state (None, None)
    truncate_metrics(path, ts["step"])     # a resume drops the metrics lines of steps after its checkpoint

fault(point, step) is the fault injection tests/test_train.py uses to SIGKILL a run at chosen points.

Needs: settings.py, stagewise.py, mas.py
"""

import dataclasses
import json
import os
import random
import re
import shutil
import signal

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint import state_dict as dcp
from torch.distributed.tensor import DTensor

import settings


def full_state(model, dtype=None):
    """Yield (name, full tensor) one parameter at a time; under FSDP2 each is all-gathered on every rank."""
    for name, t in model.state_dict().items():
        t = t.full_tensor() if isinstance(t, DTensor) else t
        yield name, (t.detach().to(dtype) if dtype is not None else t.detach())


def save_hf(path, state, model, tokenizer):
    """HF folder loadable by from_pretrained and vLLM (config + safetensors + tokenizer)."""
    os.makedirs(path, exist_ok=True)
    config = model.config
    config.architectures = [type(model).__name__.removeprefix("FSDP")]
    config.save_pretrained(path)
    if getattr(config, "tie_word_embeddings", False):
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    save_file({k: v.contiguous().cpu() for k, v in state.items()}, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    tokenizer.save_pretrained(path)


def rng_state():
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st):
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def checkpoints(out_dir):
    """The step_N folders in out_dir, oldest first (by step number)."""
    if not os.path.isdir(out_dir):
        return []
    return sorted((d for d in os.listdir(out_dir) if re.fullmatch(r"step_\d+", d)), key=lambda d: int(d[5:]))


def fault(point, step):
    """Fault injection (tests/test_train.py): METAAGENT_FAULT=point:step SIGKILLs this process when it reaches
    `point` of step `step` (1-based). Points: executor-phase (mid-rollout), update (mid-update), checkpoint
    (between a checkpoint's files), logged (metrics line written, checkpoint not), saved (checkpoint written)."""
    if os.environ.get("METAAGENT_FAULT") == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def save_checkpoint(cfg, step, policies, tokenizer, trainer_state, rank):
    """out_dir/step_{step}/: {model | designer, executor}/ (HF format), optimizer.pt, trainer_state.pt, written
    into a temp folder and renamed (atomic: a checkpoint folder is either complete or absent).
    Only rank 0 holds full tensors in CPU memory: the weights are gathered one tensor at a time and kept on
    rank 0 alone, the optimizer state is gathered with cpu_offload (rank 0 alone). An optimizer state that has
    never stepped is not saved: torch's state-dict helpers would initialise it with a zero step, which shifts
    Adam's bias correction of that state's first real step."""
    final = os.path.join(cfg.out_dir, f"step_{step:06d}")
    tmp = os.path.join(cfg.out_dir, f".tmp_step_{step:06d}")
    opts = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
    if rank == 0 and os.path.isdir(tmp):
        shutil.rmtree(tmp)
    optim = {}
    for name, pol in policies.items():
        state = {}
        for k, v in full_state(pol["model"]):   # collective: every rank takes part, rank 0 keeps
            if rank == 0:
                state[k] = v.cpu()
        if rank == 0:
            save_hf(os.path.join(tmp, name), state, pol["model"], tokenizer)
        del state
        for sname, st in pol["states"].items():
            if st["opt"].state:   # the same on every rank: they step together
                optim[f"{name}/{sname}"] = dcp.get_optimizer_state_dict(pol["model"], st["opt"], options=opts)
        fault("checkpoint", step)
    rngs = [None] * dist.get_world_size()
    dist.all_gather_object(rngs, rng_state())
    if rank == 0:
        torch.save(optim, os.path.join(tmp, "optimizer.pt"))   # loaded on rank 0 alone at resume
        torch.save({**trainer_state, "optimizers": sorted(optim),
                    "schedulers": {f"{n}/{sn}": st["sched"].state_dict()
                                   for n, pol in policies.items() for sn, st in pol["states"].items()},
                    "rng": rngs, "config": dataclasses.asdict(cfg)}, os.path.join(tmp, "trainer_state.pt"))
        os.replace(tmp, final)
        for old in checkpoints(cfg.out_dir)[:-cfg.keep_checkpoints]:
            shutil.rmtree(os.path.join(cfg.out_dir, old), ignore_errors=True)
    dist.barrier()


def truncate_metrics(path, step):
    """After a resume from the checkpoint of `step`, drop the lines of later steps (a kill between a step's
    metrics line and its checkpoint leaves one; a kill mid-write leaves a partial last line). Atomic: the kept
    lines go to a temporary file that replaces metrics.jsonl, so a second kill cannot lose them."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = [ln for ln in f if ln.strip()]
    keep = []
    for k, ln in enumerate(lines):
        try:
            row = json.loads(ln)
        except json.JSONDecodeError:
            if k == len(lines) - 1:   # the partial line of a write the kill interrupted
                break
            raise ValueError(f"{path}: line {k + 1} is not JSON; the run folder is damaged") from None
        if row["step"] <= step:
            keep.append(ln if ln.endswith("\n") else ln + "\n")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.writelines(keep)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def progress(it, cfg, master):
    """A tqdm bar over the steps on rank 0 (tqdm is optional: lazily imported, plain iteration without it)."""
    if master and cfg.progress:
        try:
            from tqdm import tqdm
            return tqdm(it, desc="rl", dynamic_ncols=True)
        except ImportError:
            pass
    return it


def loggers(cfg, start):
    """wandb and TensorBoard, when installed (optional: imported here, lazily, and only when they are used). After a resume from step `start` neither gets a step twice:
    TensorBoard purges its events from step start+1 on (purge_step); the wandb run is the same one (its id is
    kept in out_dir) and steps it already holds are not sent again (a resume is exact, so they hold the same
    values, timings aside)."""
    out = []
    if cfg.wandb_project:
        try:
            import wandb
            id_path = os.path.join(cfg.out_dir, settings.WANDB_ID)
            run_id = open(id_path).read().strip() if os.path.exists(id_path) else None
            run = wandb.init(project=cfg.wandb_project, config=dataclasses.asdict(cfg), dir=cfg.out_dir,
                             id=run_id, resume="allow")
            with open(id_path, "w") as f:
                f.write(run.id)
            last = int(run.summary.get("_step", 0)) if run_id else 0
            out.append(lambda m: run.log(m, step=m["step"]) if m["step"] > last else None)
        except ImportError:
            print("wandb_project is set but wandb is not installed: logging to metrics.jsonl only")
    try:
        from torch.utils.tensorboard import SummaryWriter
        w = SummaryWriter(os.path.join(cfg.out_dir, "tb"), purge_step=start + 1 if start > 0 else None)
        out.append(lambda m: [w.add_scalar(k, v, m["step"]) for k, v in m.items() if isinstance(v, int | float)])
    except ImportError:
        pass
    return out


def latest(out_dir):
    """(folder, trainer state) of the newest checkpoint in out_dir, or (None, None) when it holds none."""
    if not checkpoints(out_dir):
        return None, None
    ckpt = os.path.join(out_dir, checkpoints(out_dir)[-1])
    return ckpt, torch.load(os.path.join(ckpt, "trainer_state.pt"), weights_only=False)


def optimizer_states(ckpt, ts, layout, master):
    """The checkpoint's optimizer states {"policy/state": full state dict}, read on rank 0 alone (the others get
    {}: set_optimizer_state_dict broadcasts from rank 0), after checking that they fit this config's `layout`."""
    if not all(isinstance(k, str) for k in ts["optimizers"]):
        raise settings.ConfigError(f"{ckpt} was written by an older train.py (one optimizer state per policy); "
                                   f"start over with --overwrite")
    if not set(ts["optimizers"]) <= layout:
        raise settings.ConfigError(f"the checkpoint's optimizer states {ts['optimizers']} do not fit this config "
                                   f"({sorted(layout)}): resume with the policy, mode and optim_per_role it was "
                                   f"written with")
    return torch.load(os.path.join(ckpt, "optimizer.pt"), weights_only=False, mmap=True) if master else {}


def append_metrics(path, m):
    """One metrics line, on disk (fsync) before the step's checkpoint is written: no kill loses it."""
    with open(path, "a") as f:
        f.write(json.dumps(m) + "\n")
        f.flush()
        os.fsync(f.fileno())
