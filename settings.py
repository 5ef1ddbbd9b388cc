"""settings.py: train.py's settings -- the Config dataclass, the config-file / command-line parser,
and the checks that run before any model loads.

A config file is a Python file that assigns some of Config's names; `--name=value` overrides
anything (values are Python literals; strings may be bare, `--flag` alone means True). Unknown
names, wrong types, missing data files and settings that contradict each other stop the run with a
ConfigError that names the setting. The paper's values are marked [paper]; [authors] marks a default
taken from the authors' released config where the paper is silent; everything else is ours.

    cfg = parse_config(["config/qwen3_8b.py", "--M=8", "--backend=hf"])   # no file: config/tiny.py
    validate(cfg, world=8)                                                 # raises ConfigError
    plan = memory_plan(cfg, 8, init_params(cfg))   # a GPU rank's memory, GiB (validate's check)

The memory plan of a GPU rank (init_from's parameters, the preset's engine share
gpu_memory_utilization, the GPU's memory: this one's, or an H200's where none is here), refused
before any model loads when it does not fit:

    trainer = 16 B x params / ranks      fp32 weights, gradients, Adam's two moments (FSDP2 shards
                                         all four)
    engine  = gpu_memory_utilization x gpu_gib
                                         vLLM's share: its bf16 weights (2 B x params, whole on
                                         every rank), activations, CUDA graphs, the KV cache
    trainer + engine + RESERVE_GIB <= gpu_gib,   engine >= 2 B x params + RESERVE_GIB

The update's activations live in the engine's share, which its level-2 sleep frees while the
trainer runs; tools/first_gpu_run.py prints the plan beside what it measures.

run_files / clear_run: what a run writes into out_dir (a fresh run refuses such a folder;
--overwrite deletes it).

Needs: mas.py, stagewise.py
"""

import ast
import dataclasses
import difflib
import json
import math
import os
import re
import shutil
from dataclasses import dataclass, field

import mas
import stagewise


@dataclass
class Config:
    # the run
    out_dir: str = "out/tiny-rl"
    init_from: str = (
        "out/tiny-sft"  # the cold start (HF model dir; separate policies: its designer/, executor/)
    )
    resume: bool = False  # continue from the last checkpoint in out_dir
    overwrite: bool = False  # start over in an out_dir that holds a run (deletes that run's files)
    steps: int = 200
    save_every: int = 10  # a checkpoint every save_every steps, and at the end
    record_queries: int = 2  # queries a step written to rollouts.jsonl, rank 0's first (show.py)
    loggers: str = ""  # metrics also to: tensorboard | wandb | tensorboard,wandb (loggers.py)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    # data
    # {path.jsonl or TINY_SOURCES: weight}
    data_mix: dict = field(default_factory=lambda: {"tiny": 1.0})
    eval_tasks: int = 0  # held-out tiny tasks in the final table (0: no table)
    probe_tasks: int = 0  # tiny "val" tasks of the held-out curve, probed at each checkpoint
    # the method
    M: int = 4  # [paper] designs per query
    N: int = 4  # [paper] executions per design
    K: int = 30  # [paper] stage length: steps per role
    mode: str = "stagewise"  # [paper] stagewise | coupled | designer | executor (stagewise.py)
    first_role: str = "executor"  # [authors] the role of the first stage (stagewise.py)
    policy: str = "shared"  # [paper] shared (one model plays both roles) | separate
    lam: float = 0.4  # [paper] R = correct + lam * format
    template: str = (
        ""  # a fixed structure (mas.TEMPLATES), no Designer: "single" = single-agent GRPO
    )
    # the update
    batch_size: int = 8  # [paper] B queries per step (global, over all ranks)
    executor_batch_size: int = 0  # > 0: an Executor-only step rolls out this many queries instead
    designer_lr: float = 5e-6  # [paper] the Designer's updates
    executor_lr: float = 5e-6  # [paper] the Executor's updates
    tis_cap: float = 0.0  # > 0: truncated importance sampling engine -> trainer, capped here
    minibatches: int = 1  # optimizer steps per rollout (1: on-policy; the paper does not say;
    # [authors] verl's ppo_mini_batch_size of 16 rows takes several)
    micro_batch: int = 8  # sequences per forward/backward
    logprobs: str = (
        "plain"  # how the update computes log-probs: plain | shared | chunked[+compile][+keep]
    )
    # generation
    backend: str = "auto"  # auto | vllm | hf | lean (engine.make_engine)
    engine_kwargs: dict = field(default_factory=dict)
    # the chat template's switches (Qwen3: enable_thinking), one source for every rendering of a
    # prompt: SFT, RL, evaluation and distillation (engine.prompt_ids)
    chat_template_kwargs: dict = field(default_factory=dict)
    max_tokens: int = 8192  # [paper] per executor completion
    designer_max_tokens: int = 8192  # [paper] per designer completion
    # GPU
    ac_policy: str = "off"  # activation checkpointing: off | full | selective (speed.py)
    compile_layers: bool = False  # torch.compile each decoder layer (speed.py)


CONFIG_KEYS = {f.name: f for f in dataclasses.fields(Config)}
TINY_PRESET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config", "tiny.py")
LOGPROBS = ("plain", "shared", "chunked", "chunked+compile", "chunked+keep", "chunked+compile+keep")


class ConfigError(ValueError):
    pass


def _coerce(name, value):
    """Check one value against the type of its Config field (ints are fine where floats are
    expected)."""
    if name not in CONFIG_KEYS:
        close = difflib.get_close_matches(name, CONFIG_KEYS, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(f"unknown config key {name!r}{hint}")
    want = CONFIG_KEYS[name].type
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if (want is int and isinstance(value, bool)) or not isinstance(value, want):
        raise ConfigError(
            f"config key {name!r} must be {want.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def parse_config(argv):
    """argv (without the program name) -> Config. Files are exec'd, `--k=v` / `--flag` override
    them."""
    files = [a for a in argv if not a.startswith("--")] or [TINY_PRESET]
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
    for flag in (a for a in argv if a.startswith("--")):
        key, eq, raw = flag[2:].partition("=")
        raw = raw if eq else "True"  # --resume
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw  # a bare string: --backend=hf
        if key in CONFIG_KEYS and CONFIG_KEYS[key].type is str:
            value = raw  # never turn a path like "123" into an int
        values[key] = _coerce(key, value)
    return Config(**values)


# tiny.SOURCES: the tiny world's tasks, or one kind of them
TINY_SOURCES = (
    "tiny",
    "tiny:math",
    "tiny:code",
)


def is_tiny(cfg):
    """The embedded tiny world: its data only (its one-line prompts, its cold start, its final
    table)."""
    return bool(cfg.data_mix) and set(cfg.data_mix) <= set(TINY_SOURCES)


def validate(cfg, world=1):
    """Every check that needs no model: fails fast with a message that names the setting."""
    problems = []
    for k in (
        "M",
        "N",
        "K",
        "steps",
        "batch_size",
        "minibatches",
        "micro_batch",
        "save_every",
        "max_tokens",
        "designer_max_tokens",
    ):
        if getattr(cfg, k) < 1:
            problems.append(f"{k} must be >= 1, got {getattr(cfg, k)}")
    try:
        stagewise.active_roles(0, cfg.mode, max(cfg.K, 1), cfg.first_role)
    except ValueError as e:
        problems.append(f"mode/first_role: {e}")
    choices = {
        "policy": ("shared", "separate"),
        "backend": ("auto", "vllm", "hf", "lean"),
        "device": ("auto", "cpu", "cuda"),
        "ac_policy": ("off", "full", "selective"),
        "logprobs": LOGPROBS,
    }
    for k, allowed in choices.items():
        if getattr(cfg, k) not in allowed:
            problems.append(f"{k} must be one of {allowed}, got {getattr(cfg, k)!r}")
    if any(n not in ("tensorboard", "wandb") for n in cfg.loggers.split(",") if n):
        allowed = "'', 'tensorboard', 'wandb' or 'tensorboard,wandb'"
        problems.append(f"loggers must be {allowed}, got {cfg.loggers!r}")
    for k in ("record_queries", "probe_tasks", "eval_tasks"):
        if getattr(cfg, k) < 0:
            problems.append(f"{k} must be >= 0, got {getattr(cfg, k)}")
    if cfg.template and cfg.template not in mas.TEMPLATES:
        problems.append(
            f"template must be '' or one of {sorted(mas.TEMPLATES)}, got {cfg.template!r}"
        )
    if cfg.template and cfg.mode != "executor":  # no Designer: its stages would train nothing
        problems.append(
            f"template={cfg.template!r} has no Designer to train: set mode='executor' "
            f"(got mode={cfg.mode!r})"
        )
    for k in ("batch_size", "executor_batch_size"):
        if getattr(cfg, k) % world:
            problems.append(
                f"{k}={getattr(cfg, k)} must be divisible by the number of ranks ({world})"
            )
    if cfg.designer_lr <= 0 or cfg.executor_lr <= 0:
        problems.append("designer_lr and executor_lr must be > 0")
    if cfg.policy == "shared" and cfg.mode == "coupled" and cfg.designer_lr != cfg.executor_lr:
        # one optimizer step serves both roles then; Adam's step cannot be split between them
        problems.append(
            "designer_lr != executor_lr needs one role per step (mode stagewise, designer or "
            "executor) or policy='separate'"
        )
    if not cfg.data_mix:
        problems.append("data_mix is empty: give at least one {path.jsonl or 'tiny': weight}")
    for src, w in cfg.data_mix.items():
        if not isinstance(w, int | float) or isinstance(w, bool) or w <= 0:
            problems.append(f"data_mix weight of {src!r} must be a number > 0, got {w!r}")
        if src not in TINY_SOURCES and not os.path.isfile(str(src)):
            problems.append(f"data file {src!r} (in data_mix) not found")
    if cfg.resume and cfg.overwrite:
        problems.append(
            "resume and overwrite exclude each other: --resume continues the run in out_dir, "
            "--overwrite deletes it"
        )
    held = run_files(cfg.out_dir)
    if held and not cfg.resume and not cfg.overwrite:
        problems.append(
            f"out_dir={cfg.out_dir!r} holds a run ({', '.join(held[:3])}"
            f"{', ...' if len(held) > 3 else ''}): continue it with --resume, start over with "
            f"--overwrite (deletes those files), or choose another --out_dir"
        )
    for path in model_dirs(cfg).values():
        # tiny: the cold start makes it
        if not cfg.resume and not os.path.isdir(path) and not is_tiny(cfg):
            problems.append(f"init_from: {path!r} is not a model directory")
    problems += plan_problems(cfg, world)
    if problems:
        raise ConfigError("bad config:\n  " + "\n  ".join(problems))


RESERVE_GIB = 4.0  # ours: the CUDA context, NCCL's buffers, the allocator's fragmentation
H200_GIB = 139.0  # the plan's GPU where no GPU is here to ask: one H200
GIB = 2**30


def memory_plan(cfg, world, params):
    """A GPU rank's memory plan in GiB for a model of `params` parameters (see the module
    docstring): {"trainer", "engine", "engine_weights", "reserve", "total", "gpu"}; None without a
    plan (no engine share set: the CPU presets)."""
    util = cfg.engine_kwargs.get("gpu_memory_utilization")
    if util is None or cfg.device == "cpu":
        return None
    gpu = gpu_gib() or H200_GIB
    plan = {
        "trainer": 16 * params / world / GIB,
        "engine": util * gpu,
        "engine_weights": 2 * params / GIB,
        "reserve": RESERVE_GIB,
        "gpu": gpu,
    }
    plan["total"] = plan["trainer"] + plan["engine"] + plan["reserve"]
    return plan


def plan_line(cfg, world, params):
    """The plan's arithmetic, in a line (validate's message, first_gpu_run.py's print)."""
    p, util = memory_plan(cfg, world, params), cfg.engine_kwargs["gpu_memory_utilization"]
    return (
        f"16 B x {params:.3g} params / {world} rank(s) = {p['trainer']:.1f} GiB "
        f"(fp32 weights, gradients, Adam's two moments) + the engine {util} x "
        f"{p['gpu']:g} GiB = {p['engine']:.1f} GiB (its bf16 weights {p['engine_weights']:.1f} "
        f"GiB, the KV cache) + {p['reserve']:g} GiB reserve = {p['total']:.1f} GiB of "
        f"{p['gpu']:g} GiB"
    )


def init_params(cfg):
    """The parameters the trainer holds: init_from's models' (*.safetensors headers); 0 while a
    folder is missing (validate says so on its own)."""
    return sum(stored_params(path) for path in model_dirs(cfg).values())


def plan_problems(cfg, world, params=None):
    """What is wrong with the memory plan of a model of `params` parameters (None: init_from's):
    it does not fit a rank, or it leaves the engine no room beside its weights."""
    if memory_plan(cfg, world, 0.0) is None:  # no plan: nothing to read
        return []
    params = init_params(cfg) if params is None else params
    if params <= 0:
        return []
    util = cfg.engine_kwargs["gpu_memory_utilization"]
    if not isinstance(util, float) or not 0 < util < 1:
        return [f"engine_kwargs' gpu_memory_utilization must be in (0, 1), got {util!r}"]
    p, problems = memory_plan(cfg, world, params), []
    if p["total"] > p["gpu"]:
        # the fewest ranks that fit (within a few nodes), the largest utilization that fits these
        fewest = None
        for w in range(world + 1, 65):
            if memory_plan(cfg, w, params)["total"] <= p["gpu"]:
                fewest = w
                break
        most = (p["gpu"] - p["trainer"] - p["reserve"]) / p["gpu"]
        fix = f"at least {fewest} ranks" if fewest else "a smaller engine share"
        if most * p["gpu"] >= p["engine_weights"] + p["reserve"]:  # the engine still fits
            fix += f", or gpu_memory_utilization <= {most:.2f}"
        problems.append(f"the memory plan does not fit: {plan_line(cfg, world, params)} ({fix})")
    if p["engine"] < p["engine_weights"] + p["reserve"]:
        problems.append(
            f"the memory plan leaves the engine no KV cache: {util} x {p['gpu']:g} GiB = "
            f"{p['engine']:.1f} GiB for its bf16 weights ({p['engine_weights']:.1f} GiB) and "
            f"{p['reserve']:g} GiB of activations"
        )
    return problems


def gpu_gib():
    """This machine's first GPU's memory in GiB (0: none, or no torch to ask)."""
    try:
        import torch
    except ImportError:
        return 0.0
    if not torch.cuda.is_available():
        return 0.0
    return torch.cuda.get_device_properties(0).total_memory / GIB


def stored_params(path):
    """The parameters a model folder's *.safetensors files hold (their headers alone: nothing is
    loaded); 0 without such files."""
    total = 0
    for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(path, name), "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for key, t in header.items():
            if key != "__metadata__":
                total += math.prod(t["shape"])
    return total


def model_dirs(cfg):
    """{policy name: its cold start}: {"model": init_from}, or init_from's designer/ and executor/
    folders."""
    if cfg.policy == "shared":
        return {"model": cfg.init_from}
    return {r: os.path.join(cfg.init_from, r) for r in ("designer", "executor")}


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


def step_batch(cfg, active):
    """B, the queries of a step whose active roles are `active`: executor_batch_size for an
    Executor-only step."""
    only_executor = cfg.executor_batch_size > 0 and set(active) == {"executor"}
    return cfg.executor_batch_size if only_executor else cfg.batch_size
