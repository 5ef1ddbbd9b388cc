"""settings.py: train.py's settings -- the Config dataclass, the config-file / command-line parser,
and the checks that run before any model loads.

A config file is a Python file that assigns some of Config's names; `--name=value` overrides
anything (values are Python literals; strings may be bare, `--flag` alone means True). Unknown
names, wrong types, missing data files and settings that contradict each other stop the run with a
ConfigError that names the setting. The paper's values are marked [paper]; [authors] marks a default
taken from the authors' released config where the paper is silent; everything else is ours.

    cfg = parse_config(["config/qwen3_8b.py", "--M=8", "--backend=hf"])   # no file: config/tiny.py
    validate(cfg, world=8)                                                 # raises ConfigError
    python train.py config/qwen3_8b.py --plan --ranks=1,2,8   # plan_report: a GPU rank's memory
                                                               # (machinery/plans.py), nothing loads

Needs: mas.py, stagewise.py, machinery/cpu_bits.py, machinery/plans.py, machinery/provenance.py,
machinery/rundir.py"""

import ast
import dataclasses
import difflib
import math
import os
from dataclasses import dataclass, field

import mas
import stagewise
from machinery import plans, rundir


@dataclass
class Config:
    # the run
    out_dir: str = "out/tiny-rl"
    # the cold start (an HF model folder; separate policies: its designer/ and executor/)
    init_from: str = "out/tiny-sft"
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
    # the benchmark curve during RL (world/heldout.py's Benchmark), under heldout/NAME/ in
    # metrics.jsonl: a benchmark name (data/NAME.jsonl, as machinery/data.py prepare writes it) or
    # a task file; "" none
    val_tasks: str = ""
    # [authors] their val_freq is 100 steps; ours: 0, off (the tiny default's run unchanged)
    val_every: int = 0  # the curve at step 0 and every val_every steps, and at the last
    val_size: int = 0  # ours: a fixed seeded sample of this many of val_tasks (0: all of them)
    # (one greedy draw a task, [authors]: heldout.VAL_SAMPLING)
    # the method
    M: int = 4  # [paper] designs per query
    N: int = 4  # [paper] executions per design
    K: int = 30  # [paper] stage length: steps per role
    mode: str = "stagewise"  # [paper] stagewise | coupled | designer | executor (stagewise.py)
    first_role: str = "executor"  # [authors] the role of the first stage (stagewise.py)
    policy: str = "shared"  # [paper] shared (one model plays both roles) | separate
    lam: float = 0.4  # [paper] R = correct + lam * format
    # paper | authors: their format term, 0.4 a check of two, in place of lam * format (reward.py)
    format_reward: str = "paper"
    # a fixed structure (mas.TEMPLATES), no Designer: "single" = single-agent GRPO
    template: str = ""
    # the update
    batch_size: int = 8  # [paper] B queries per step (global, over all ranks)
    executor_batch_size: int = 0  # > 0: an Executor-only step rolls out this many queries instead
    designer_lr: float = 5e-6  # [paper] the Designer's updates
    executor_lr: float = 5e-6  # [paper] the Executor's updates
    # constant [authors] (their override_lr sets each update's lr) | warmup_cosine (lr_warmup steps,
    # then cosine down to lr_floor x at the last step: warmup_cosine below; their PPO optim's)
    lr_schedule: str = "constant"
    lr_warmup: int = 10  # warmup_cosine's warmup steps
    lr_floor: float = 0.3  # warmup_cosine's last lr, a fraction of the peak
    weight_decay: float = 0.01  # [authors] AdamW's (verl's actor optimizer); the paper does not say
    grad_clip: float = 1.0  # [authors] the gradient's global norm clipped to this (verl's)
    clip_eps: float = 0.2  # [authors] GRPO's clip, both ways (verl's clip_ratio); paper: silent
    minibatches: int = 1  # optimizer steps per rollout (1: on-policy; the paper does not say;
    # [authors] verl's ppo_mini_batch_size of 16 rows takes several)
    micro_batch: int = 8  # sequences per forward/backward
    logprobs: str = "plain"  # how the update computes log-probs: plain | shared | chunked
    # ours: forward samples of A = 0 too (no gradient, the same update): tools/first_gpu_run.py's
    # random weights earn no reward, and its check must still run the update's forward and backward
    forward_zero_adv: bool = False
    # generation
    backend: str = "auto"  # auto | vllm | hf | lean (engine.make_engine)
    # ours: ticks (every live script's calls in one batch, the reference) | continuous (each call
    # submitted when made; the same rollouts on a batch-invariant engine): sandbox.run_workflows
    rollout_schedule: str = "ticks"
    engine_kwargs: dict = field(default_factory=dict)
    # the chat template's switches (Qwen3: enable_thinking), one source for every rendering of a
    # prompt: SFT, RL, evaluation and distillation (engine.prompt_ids)
    chat_template_kwargs: dict = field(default_factory=dict)
    max_tokens: int = 8192  # [paper] per executor completion
    designer_max_tokens: int = 8192  # [paper] per designer completion
    temperature: float = 1.0  # [authors] the rollout's sampling, both roles
    top_p: float = 1.0  # ours: untruncated (theirs 0.9: the presets say why ours)
    # the sandbox and grading: mas.Limits' fields a run changes ({"timeout": 120.0}: max_calls,
    # timeout, max_output, code_timeout, max_programs); a program's wall seconds for a task's hidden
    # tests (reward.passes_all); SymPy's seconds for a math comparison (reward.math_equal)
    sandbox: dict = field(default_factory=dict)
    grade_budget: float = 120.0
    math_timeout: float = 5.0
    # GPU
    ac_policy: str = "off"  # activation checkpointing: off | full (speed.py)
    compile_layers: bool = False  # torch.compile each decoder layer (speed.py)
    # ours: the idle role's AdamW state in host memory for the other role's stage, back at the
    # switch (machinery/offload.py): the GPU holds one state, not two (memory_plan)
    offload_idle_state: bool = False


CONFIG_KEYS = {f.name: f for f in dataclasses.fields(Config)}
TINY_PRESET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config", "tiny.py")
LOGPROBS = ("plain", "shared", "chunked")
LR_SCHEDULES = ("constant", "warmup_cosine")


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


def split_argv(argv):
    """(config files, [(key, raw value)]) of a command line: `--name=value` and `--name value`
    alike; a bool setting's `--name` alone is True (so `--resume config/tiny.py` keeps its file)."""
    files, flags, k = [], [], 0
    while k < len(argv):
        arg, k = argv[k], k + 1
        if not arg.startswith("--"):
            files.append(arg)
            continue
        key, eq, raw = arg[2:].partition("=")
        field_type = CONFIG_KEYS[key].type if key in CONFIG_KEYS else None
        if not eq and field_type is not bool and k < len(argv) and not argv[k].startswith("--"):
            raw, k = argv[k], k + 1  # --name value
        elif not eq:
            raw = "True"  # --resume
        flags.append((key, raw))
    return files, flags


def parse_config(argv):
    """argv (without the program name) -> Config. Files are exec'd, `--k=v` / `--k v` / `--flag`
    override them; `--help` prints every setting with its default and comment, and exits."""
    if "--help" in argv or "-h" in argv:
        raise SystemExit(config_help())
    files, flags = split_argv(argv)
    values = {}
    for path in files or [TINY_PRESET]:
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
    for key, raw in flags:
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw  # a bare string: --backend=hf
        if key in CONFIG_KEYS and CONFIG_KEYS[key].type is str:
            value = raw  # never turn a path like "123" into an int
        values[key] = _coerce(key, value)
    return Config(**values)


def config_help():
    """`--help`: Config as its source states it (each setting, its default, its comment), after
    how to give them."""
    import inspect

    body = inspect.getsource(Config).split("\n", 2)[2]  # (past the decorator and class lines)
    usage = "usage: [CONFIG.py ...] [--name=value | --name value | --flag ...]; the settings:"
    return f"{usage}\n{inspect.cleandoc(body)}"


def chat_template_kwargs(preset=None):
    """The chat template's switches of a preset file (Config.chat_template_kwargs; None: the tiny
    default's): sft.py, evaluate.py and tools/distill.py take them with --config PRESET, so that
    they render every prompt as train.py does with that preset."""
    return parse_config([preset] if preset else []).chat_template_kwargs


def val_path(cfg):
    """The task file of the benchmark curve: val_tasks itself when it is a file, else
    data/VAL_TASKS.jsonl (a benchmark name, as machinery/data.py prepare writes it)."""
    if os.path.isfile(cfg.val_tasks) or cfg.val_tasks.endswith(".jsonl"):
        return cfg.val_tasks
    return os.path.join("data", f"{cfg.val_tasks}.jsonl")


def val_problems(cfg):
    """What is wrong with the benchmark curve's settings (val_every > 0 turns it on)."""
    if cfg.val_every <= 0:
        return []
    if not cfg.val_tasks:
        return ["val_every > 0 needs val_tasks: a benchmark name (data/NAME.jsonl) or a task file"]
    path = val_path(cfg)
    if os.path.isfile(path):
        return []
    name = os.path.basename(path).removesuffix(".jsonl")
    return [
        f"val_tasks {cfg.val_tasks!r}: {path} not found (`python machinery/data.py prepare "
        f"{name}` writes data/{name}.jsonl)"
    ]


# data_mix's names for the tiny world's RL tasks (train.load_mix) and the kinds each draws: both
# interleaved, or one alone, so that a mix can weight them ({"tiny:math": 1.0, "tiny:code": 3.0})
TINY_SOURCES = {"tiny": ("math", "code"), "tiny:math": ("math",), "tiny:code": ("code",)}


def is_tiny(cfg):
    """The embedded tiny world: its data only (its one-line prompts, its cold start, its final
    table)."""
    return bool(cfg.data_mix) and set(cfg.data_mix) <= set(TINY_SOURCES)


def validate(cfg, world=1):
    """Every check that needs no model: fails fast with a message that names the setting."""
    problems = value_problems(cfg, world) + data_problems(cfg) + folder_problems(cfg)
    problems += plans.plan_problems(cfg, world)
    if not problems:  # a plan that fits: is it free on this rank's GPU now?
        problems += plans.free_memory_problems(cfg, world)
    if problems:
        raise ConfigError("bad config:\n  " + "\n  ".join(problems))


def value_problems(cfg, world):
    """The values that are out of range, not among their choices, or at odds with each other."""
    problems = []
    positive = ("M", "N", "K", "steps", "batch_size", "minibatches", "micro_batch", "save_every")
    for k in (*positive, "max_tokens", "designer_max_tokens"):
        if getattr(cfg, k) < 1:
            problems.append(f"{k} must be >= 1, got {getattr(cfg, k)}")
    try:
        stagewise.active_roles(0, cfg.mode, max(cfg.K, 1), cfg.first_role)
    except ValueError as e:
        problems.append(f"mode/first_role: {e}")
    choices = {
        "policy": ("shared", "separate"),
        "backend": ("auto", "vllm", "hf", "lean"),
        "rollout_schedule": ("ticks", "continuous"),
        "format_reward": ("paper", "authors"),
        "device": ("auto", "cpu", "cuda"),
        "ac_policy": ("off", "full"),
        "logprobs": LOGPROBS,
        "lr_schedule": LR_SCHEDULES,
    }
    for k, allowed in choices.items():
        if getattr(cfg, k) not in allowed:
            problems.append(f"{k} must be one of {allowed}, got {getattr(cfg, k)!r}")
    if any(n not in ("tensorboard", "wandb") for n in cfg.loggers.split(",") if n):
        allowed = "'', 'tensorboard', 'wandb' or 'tensorboard,wandb'"
        problems.append(f"loggers must be {allowed}, got {cfg.loggers!r}")
    counts = ("record_queries", "probe_tasks", "eval_tasks", "val_every", "val_size", "lr_warmup")
    for k in (*counts, "weight_decay", "clip_eps", "lam", "temperature"):
        if getattr(cfg, k) < 0:
            problems.append(f"{k} must be >= 0, got {getattr(cfg, k)}")
    for k in ("designer_lr", "executor_lr", "grad_clip", "grade_budget", "math_timeout"):
        if getattr(cfg, k) <= 0:
            problems.append(f"{k} must be > 0, got {getattr(cfg, k)}")
    for k in ("top_p", "lr_floor"):
        if not 0 < getattr(cfg, k) <= 1:
            problems.append(f"{k} must be in (0, 1], got {getattr(cfg, k)}")
    limits = {f.name: f.type for f in dataclasses.fields(mas.Limits)}
    for k, v in cfg.sandbox.items():
        if k not in limits or not isinstance(v, int | float) or v <= 0:
            problems.append(f"sandbox: {k}={v!r}: a number > 0 for one of {', '.join(limits)}")
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
            v = getattr(cfg, k)
            fix = plans.batch_fix(f"--{k}", v, world)
            problems.append(f"{k}={v} must be divisible by the number of ranks ({world}): {fix}")
    if cfg.policy == "shared" and cfg.mode == "coupled" and cfg.designer_lr != cfg.executor_lr:
        # one optimizer step serves both roles then; Adam's step cannot be split between them
        problems.append(
            "designer_lr != executor_lr needs one role per step (mode stagewise, designer or "
            "executor) or policy='separate'"
        )
    return problems


def data_problems(cfg):
    """The training mix's weights and files, and the benchmark curve's."""
    problems = []
    if not cfg.data_mix:
        problems.append("data_mix is empty: give at least one {path.jsonl or 'tiny': weight}")
    for src, w in cfg.data_mix.items():
        if not isinstance(w, int | float) or isinstance(w, bool) or w <= 0:
            problems.append(f"data_mix weight of {src!r} must be a number > 0, got {w!r}")
        if src not in TINY_SOURCES and not os.path.isfile(str(src)):
            name = os.path.basename(str(src)).removesuffix(".jsonl")
            problems.append(
                f"data file {src!r} (in data_mix) not found (`python machinery/data.py prepare "
                f"{name}` writes data/{name}.jsonl; docs/gpu.md)"
            )
    return problems + val_problems(cfg)


def folder_problems(cfg):
    """out_dir and init_from: a fresh run never writes into a folder that holds another run."""
    problems = []
    if cfg.resume and cfg.overwrite:
        problems.append(
            "resume and overwrite exclude each other: --resume continues the run in out_dir, "
            "--overwrite deletes it"
        )
    held = rundir.run_files(cfg.out_dir)
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
    return problems


def model_dirs(cfg):
    """{policy name: its cold start}: {"model": init_from}, or init_from's designer/ and executor/
    folders."""
    return rundir.cold_start_dirs(cfg.init_from, separate=cfg.policy != "shared")


def plan_report(argv):
    """`train.py PRESET --plan [--ranks=1,2,8] [--params=8b] [--k=v ...]` (or `--ranks 1,2,8`):
    plans.plan_report of the config, for each rank count. Loads no model, checks no folder."""
    files, flags = split_argv([a for a in argv if a != "--plan"])
    world, given, rest = [1, 2, 8], None, files
    for key, value in flags:
        if key == "ranks":
            try:
                world = [int(w) for w in value.split(",")]
            except ValueError:
                raise ConfigError(f"--ranks={value}: rank counts, as --ranks=1,2,8") from None
        elif key == "params":
            given = value
        else:
            rest.append(f"--{key}={value}")
    if not world or min(world) < 1:
        raise ConfigError(f"--ranks: rank counts >= 1, got {world}")
    try:
        return plans.plan_report(parse_config(rest), world, given)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def warmup_cosine(step, warmup, end, floor):
    """An lr's multiplier at step t: (t + 1) / warmup over the first `warmup` steps, then
    floor + (1 - floor) (1 + cos(pi p)) / 2, p from 0 at step `warmup` to 1 at step `end` and after
    (RL: the last step, train.lr_factor; SFT: its step count, sft.train_sft)."""
    if step < warmup:
        return (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, end - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
