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
    write_checkpoint(out_dir, step, policies, tokenizer, trainer, rank)    # the same, of any
                                           # trainer (sft.py's); no process group: one process
    ckpt, ts = latest(out_dir)             # the newest checkpoint's folder and trainer state
                                           # (None, None without one)
    restore(policies, ckpt, ts)            # master weights and Adam states (every rank: collective)
    restore_rng(ts, seed, rank)
    read_state(ckpt, keys)                 # whole tensors of a checkpoint's state, one process
    trainer_state(ckpt)                    # its trainer state alone (either format), to read
    truncate_jsonl(path, ts["step"])       # a resume drops the lines of steps after its checkpoint

EvalParts: an evaluation's results a benchmark at a time, which a resumed evaluation takes back.

append_jsonl writes a step's lines, durably (recorder.py's). METAAGENT_FAULT=saved:N SIGKILLs a
run once step N's checkpoint is whole (save_checkpoint), a crash to rehearse `--resume` on.
run_files / clear_run: what a run writes into out_dir (a fresh run refuses such a folder;
--overwrite deletes it); cold_start_dirs: the model folders of a cold start. A run folder that
cannot be resumed raises RunFolderError, saying what to do.

A full disk. A checkpoint holds, for each model of P parameters, its HF folder, P x b (b: 2 bytes,
bf16, when the weights live on a GPU; else their own dtype's, 4 for fp32; a tied lm head once), and
in state/ the fp32 masters, P x 4, and every tensor of each optimizer state that has stepped (AdamW:
exp_avg and exp_avg_sq, 2 x P x 4; Muon: a momentum buffer a matrix), counted from the tensors in
memory (an idle role's, in host memory, too):

    checkpoint_bytes = sum over the models of P x (b + 4) + the optimizer states' bytes

(an 8B model: 16.4 + 32.8 + 2 x 65.5 GB = ~180 GB with two Adam states). Config, tokenizer and
metadata are left out: the estimate is a little under the size on disk (within 10%), so a disk with
room for exactly one checkpoint takes it. write_checkpoint and save_model ask the disk first
(check_room; every rank of a group asks, so all stop or none); too little room, or a write that
meets a full disk, raises DiskFull with the temp folder deleted and every complete checkpoint kept.

    need = checkpoint_bytes(policies)           # {name: {"model": m, "opt": {state: optimizer}}}
    with full_disk_exits("train.py", out_dir):  # DiskFull, or ENOSPC from any write inside: the
        ...                                     # program ends non-zero with DiskFull's one line

Needs: machinery/provenance.py, machinery/py, machinery/ranks.py, machinery/cpu_bits.py
"""

import contextlib
import copy
import dataclasses
import errno
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
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
from torch.distributed.tensor import DTensor

from machinery import cpu_bits
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


def finished(out_dir):
    """Whether out_dir is a finished model folder (save_model's): an HF config, no checkpoint."""
    return os.path.isfile(os.path.join(out_dir, "config.json")) and not checkpoints(out_dir)


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
    """The CPU model and cores, the GPU if any, torch's and Python's versions, and whether its CPU
    numerics were pinned (machinery/cpu_bits.py: the same bits on any x86 CPU) or this CPU's own."""
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
        "cpu_bits": "pinned" if cpu_bits.pinned() else "native",
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


def save_checkpoint(cfg, step, policies, tokenizer, trainer_state, rank, keep=2):
    """out_dir/step_{step}/: {model | designer, executor}/ (HF folders) and state/ (a
    torch.distributed.checkpoint folder), written into a temp folder and renamed (atomic: a
    checkpoint folder is either complete or absent); the `keep` newest checkpoints stay, and those
    of the benchmark curve's steps (multiples of cfg.val_every: `evaluate.py --run RUN --step N`
    reads the model whose curve it saw; stale()). The trainer state gets the run's config.
    write_checkpoint does the writing.

    A crash to rehearse a resume on: with METAAGENT_FAULT=saved:N in the environment, every rank
    SIGKILLs itself once step N's checkpoint is whole (`--resume` then goes on from step N)."""
    trainer = {**trainer_state, "config": dataclasses.asdict(cfg)}
    write_checkpoint(cfg.out_dir, step, policies, tokenizer, trainer, rank, keep, cfg.val_every)
    if os.environ.get("METAAGENT_FAULT") == f"saved:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def write_checkpoint(out_dir, step, policies, tokenizer, trainer, rank, keep=2, keep_every=0):
    """out_dir/step_{step}/ of {name: {"model", "opt": {state: optimizer}}} (train.py's policies,
    sft.py's one model), written whole into .tmp_step_{step}/ and renamed into place; then all but
    the `keep` newest removed, save the multiples of keep_every (> 0). First the disk is asked for
    the checkpoint's bytes (checkpoint_bytes): too little free, or a write that meets a
    full disk, raises DiskFull with the temp folder deleted and every complete
    checkpoint kept. Collective under a process group; one process without one.

    The HF folders: the weights gathered one tensor at a time, in the engine's dtype (bf16 when they
    live on a GPU), kept and written by rank 0 alone. state/: every rank writes its own shards of
    the fp32 master weights and of each optimizer state (an idle role's from host memory, where
    machinery/offload.py keeps it), nothing gathered; rank 0 adds `trainer` with every rank's RNG.
    An optimizer state that has never stepped is not saved: torch's state-dict helpers would
    initialise it with a zero step, which shifts Adam's bias correction of that state's first real
    step."""
    name, need = f"step_{step:06d}", checkpoint_bytes(policies)
    tmp = os.path.join(out_dir, f".tmp_{name}")
    if rank == 0 and os.path.isdir(tmp):
        shutil.rmtree(tmp)
    barrier()  # a killed save's folder is gone (and its room free) before any rank writes
    check_room(out_dir, need, name)
    try:
        write_state(tmp, step, policies, tokenizer, trainer, rank)
    except (Exception, CheckpointException) as e:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing partial stays
        if not failed_for_room(e, out_dir, need):
            raise
        raise DiskFull(name, out_dir, need) from None
    if rank == 0:
        os.replace(tmp, os.path.join(out_dir, name))
        for old in stale(checkpoints(out_dir), keep, keep_every):
            shutil.rmtree(os.path.join(out_dir, old), ignore_errors=True)
    barrier()


def save_model(model, tokenizer, out_dir):
    """A finished model: out_dir as an HF folder (save_hf, in the weights' own dtype), written to
    out_dir.tmp and renamed into place, so a model folder is whole or absent (what out_dir held
    before, its checkpoints too, goes when the new one is in place). The disk is asked first for
    its bytes; a full one raises DiskFull, the temp folder deleted. Under FSDP every rank
    takes part in gathering the weights (a collective, one tensor at a time); rank 0 writes."""
    rank, _ = rank_world()
    out_dir = os.path.abspath(out_dir)
    need, tmp, old = weights_bytes(model), out_dir + ".tmp", out_dir + ".old"
    check_room(os.path.dirname(out_dir), need, os.path.basename(out_dir))
    state = gathered_state(model, rank)  # collective: every rank takes part
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            save_hf(tmp, state, model, tokenizer)
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if not failed_for_room(e, out_dir, need):
                raise
            raise DiskFull(os.path.basename(out_dir), out_dir, need) from None
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(out_dir):
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    barrier()


def one_policy(model, opt):
    """A model and its optimizer as the checkpoints hold a policy: {"model": {...}}, a state a
    member of a muon.Together (muon, adamw) or the one optimizer's."""
    members = getattr(opt, "optimizers", [opt])
    return {
        "model": {
            "name": "model",
            "model": model,
            "opt": {type(o).__name__.lower(): o for o in members},
        }
    }


def save_training(out_dir, step, model, opt, sched, tokenizer):
    """sft.py's checkpoint: out_dir/step_{step}/ of one model, its optimizer and the LR schedule's
    position (write_checkpoint: model/ and state/, the 2 newest kept). It reads no RNG and changes
    no number. Collective under a process group."""
    rank, _ = rank_world()
    # the schedule's position (its lambdas are code: torch.distributed.checkpoint keeps no None)
    sched_state = {k: v for k, v in sched.state_dict().items() if k != "lr_lambdas"}
    trainer = {"step": step, "sched": sched_state}
    write_checkpoint(out_dir, step, one_policy(model, opt), tokenizer, trainer, rank)


def resume_training(out_dir, model, opt, sched, seed):
    """out_dir's newest save_training checkpoint into the model (its fp32 weights), the optimizer's
    states, the schedule and every RNG: the step to go on from (0 without a checkpoint)."""
    ckpt, ts = latest(out_dir)
    if ckpt is None:
        return 0
    restore(one_policy(model, opt), ckpt, ts)
    if hasattr(opt, "relink"):  # a muon.Together: its groups the members' new ones
        opt.relink()
    sched.load_state_dict({**ts["sched"], "lr_lambdas": [None] * len(sched.lr_lambdas)})
    restore_rng(ts, seed, rank_world()[0])
    return ts["step"]


def write_state(tmp, step, policies, tokenizer, trainer, rank):
    """A checkpoint's files into the folder tmp (write_checkpoint's): the HF folders, state/."""
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
    rngs = [rng_state()]
    if dist.is_initialized():
        rngs = [None] * dist.get_world_size()
        dist.all_gather_object(rngs, rng_state())
    state["trainer"] = {**trainer, "optimizers": sorted(stepped), "rng": rngs}
    with warnings.catch_warnings():  # "... assuming the intent is to save in a single process": yes
        warnings.filterwarnings("ignore", "torch.distributed is .*unavailable")
        dcp.save(state, checkpoint_id=os.path.join(tmp, "state"))  # collective; rank 0: "trainer"


def barrier():
    """Every rank here before any goes on; nothing without a process group."""
    if dist.is_initialized():
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


class EvalParts:
    """An evaluation's results a benchmark at a time (evaluate.py): OUT/parts/METHOD@NAME.json, each
    with the key of what made it (models, settings, task files, samples, seed), written atomically
    as the benchmark finishes; a resumed evaluation (resume=True) takes those whose key is its own
    instead of evaluating them again."""

    def __init__(self, out, key, resume=False):
        self.folder, self.resume = os.path.join(out, "parts"), resume
        self.key = json.loads(json.dumps(key))  # as a file gives it back: lists, not tuples

    def path(self, method, name):
        return os.path.join(self.folder, f"{method}@{name}.json".replace(os.sep, "_"))

    def read(self, method, name):
        """The part's results, or None: not resuming, not written, or made with another key."""
        if not (self.resume and os.path.exists(self.path(method, name))):
            return None
        with open(self.path(method, name)) as f:
            held = json.load(f)
        return held["result"] if held["key"] == self.key else None

    def write(self, method, name, result):
        """The part on disk, atomically; result None (a rank but the first's): nothing."""
        if result is None:
            return
        os.makedirs(self.folder, exist_ok=True)
        tmp = self.path(method, name) + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"key": self.key, "result": result}, f)
        os.replace(tmp, self.path(method, name))


# --------------------------------------------------------------------------------------------------
# a full disk: a checkpoint's size known before it is written, and told in one line


def rank_world():
    """(rank, world size): the process group's, or (0, 1) without one."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class DiskFull(OSError):
    """The disk of `where` has too little room for `what`: need bytes (None: not known), free
    bytes. Its message is the one line a program ends with."""

    def __init__(self, what, where, need=None, free=None):
        where = os.path.abspath(where)
        free = shutil.disk_usage(nearest(where)).free if free is None else free
        need = "" if need is None else f" needs {gb(need)},"
        super().__init__(
            errno.ENOSPC,
            f"disk full: {what}{need} {where} has {gb(free)} free; the last complete checkpoint "
            "there is kept: make room, then run again with --resume",
        )

    def __str__(self):
        return self.strerror


def gb(n):
    """Bytes as a short figure: GB from 1 GB up, MB below."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def nearest(path):
    """path, or its nearest folder that exists (the disk it will be written to)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def tensor_bytes(t):
    """A tensor's bytes, whole (a DTensor's global shape: every rank's shards together)."""
    return t.numel() * t.element_size()


def weights_bytes(model, bf16=False):
    """A model's HF folder's bytes: every weight in bf16 (2 bytes) or in its own dtype; a tied lm
    head once."""
    tied = getattr(model.config, "tie_word_embeddings", False)
    total = 0
    for name, t in model.state_dict().items():
        if not (tied and name == "lm_head.weight"):
            total += t.numel() * 2 if bf16 else tensor_bytes(t)
    return total


def model_bytes(model):
    """A model's checkpoint bytes: its HF folder (the engine's dtype: bf16 on a GPU) and its fp32
    master weights in state/."""
    on_gpu = next(model.parameters()).device.type == "cuda"
    masters = sum(tensor_bytes(t) for t in model.state_dict().values())
    return weights_bytes(model, bf16=on_gpu) + masters


def optimizer_bytes(opt):
    """The bytes of an optimizer's state, as state/ holds it: every tensor of it (an idle role's
    held in host memory included). A torch optimizer, or one of several (muon.Together)."""
    total = 0
    for member in getattr(opt, "optimizers", [opt]):
        states = list(member.state.values()) + list(getattr(member, "host_state", {}).values())
        for st in states:
            total += sum(tensor_bytes(v) for v in st.values() if torch.is_tensor(v))
    return total


def checkpoint_bytes(policies):
    """A checkpoint's bytes (the module docstring's sum) of {name: {"model", "opt": {...}}}."""
    total = 0
    for pol in policies.values():
        total += model_bytes(pol["model"])
        total += sum(optimizer_bytes(o) for o in pol["opt"].values())
    return total


def check_room(folder, need, what):
    """Raise DiskFull when folder's disk has less than `need` bytes free. Collective under a process
    group: every rank stops when one finds too little."""
    free = shutil.disk_usage(nearest(os.path.abspath(folder))).free
    short = float(need > free)
    if dist.is_initialized():
        flag = torch.tensor([short], device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        short = float(flag[0])
    if short:
        raise DiskFull(what, folder, need, free)


def is_full(e):
    """Whether an exception is a full disk: ENOSPC, as an OSError, inside torch's checkpoint
    exception, or as the text of a writer that raises its own type (safetensors, torch.save)."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(e, CheckpointException):
        return any(is_full(exc) for exc, _ in e.failures.values())
    text = str(e)
    if "No space left on device" in text or "os error 28" in text:
        return True
    return e.__cause__ is not None and is_full(e.__cause__)


def failed_for_room(e, folder, need):
    """Whether a write's failure e was the disk's: it says so (is_full), or the writer does not
    (torch's archive writer says "unexpected pos") and folder's disk has less free than the `need`
    bytes that were being written, plus the estimate's 10%."""
    free = shutil.disk_usage(nearest(os.path.abspath(folder))).free
    return is_full(e) or free < 1.1 * need


@contextlib.contextmanager
def full_disk_exits(program, folder, what="a write"):
    """A full disk inside the block (DiskFull, or ENOSPC from any write) ends the program non-zero
    with one line on stderr, `program: disk full: ...`, and no traceback."""
    try:
        yield
    except (Exception, CheckpointException) as e:
        if not (isinstance(e, DiskFull) or is_full(e)):
            raise
        line = e if isinstance(e, DiskFull) else DiskFull(what, folder)
        sys.stdout.flush()
        sys.exit(f"{program}: {line}")
