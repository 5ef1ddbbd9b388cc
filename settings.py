"""settings.py: train.py's settings -- the Config dataclass, the config-file / command-line parser, and the checks
that run before any model loads.

A config file is a Python file that assigns some of Config's names; `--name=value` overrides anything (values are
Python literals; strings may be bare, `--flag` alone means True). Unknown names, wrong types, missing data files
and settings that contradict each other stop the run with a ConfigError that names the setting. The paper's values
are marked [paper] below; everything else is ours (the paper does not give it).

    cfg = parse_config(["config/qwen3_8b.py", "--M=8", "--backend=hf"])   # no file: config/tiny.py
    validate(cfg, world=8)                                                 # raises ConfigError
    role_lr(cfg, "designer")                                               # designer_lr, else lr

run_files / clear_run: what a run writes into out_dir (a fresh run refuses such a folder; --overwrite deletes it).

Needs: stagewise.py, mas.py
"""

import ast
import dataclasses
import difflib
import os
import re
import shutil
from dataclasses import dataclass, field

import mas
import stagewise


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
    executor_batch_size: int = 0          # > 0: a step that trains the Executor alone rolls out this many queries
                                          # instead (its gradient is an average over more, shorter replies per
                                          # query; in the tiny world it learned at B=32, not at 8: docs/NOTES.md)
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
    skip_zero_adv: bool = True            # the update forwards only samples with a nonzero advantage (the others
                                          # have no loss and no gradient; they still count in the token-mean): the
                                          # same update up to float rounding, at less cost; with kl_coef > 0 every
                                          # sample is forwarded
    share_prompts: bool = False           # forward each prompt once for all its samples: one row [prompt, c_1,
                                          # .., c_k], c_i seeing the prompt and itself (grpo.shared_prompt_rows)
    share_row_cap: float = 1.5            # ...a row at most this x the longest sequence of the batch, a longer
                                          # group cut into several rows (the mask is dense: attention costs
                                          # row length^2; 1.5: fastest over both roles of a tiny step)
    optim_per_role: bool = True           # shared policy, one role per step: one AdamW state per role over the
                                          # same weights, so each role's moments see only its own gradients
                                          # (False: one state for both; coupled mode always has one)
    designer_weight: float = 1.0          # loss weights of the two per-role token-means
    executor_weight: float = 1.0
    # generation
    backend: str = "auto"                 # auto | vllm | hf | lean (engine.make_engine)
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
               "backend": ("auto", "vllm", "hf", "lean"), "device": ("auto", "cpu", "cuda"), "ac_policy": ("full", "selective")}
    for k, allowed in choices.items():
        if getattr(cfg, k) not in allowed:
            problems.append(f"{k} must be one of {allowed}, got {getattr(cfg, k)!r}")
    if cfg.template:
        if cfg.template not in mas.TEMPLATES:
            problems.append(f"template must be '' or one of {sorted(mas.TEMPLATES)}, got {cfg.template!r}")
        if cfg.mode != "executor":   # with a fixed structure there is no Designer: its stages would train nothing
            problems.append(f"template={cfg.template!r} has no Designer to train: set mode='executor' "
                            f"(got mode={cfg.mode!r})")
    for k in ("batch_size", "executor_batch_size"):
        if getattr(cfg, k) % world:
            problems.append(f"{k}={getattr(cfg, k)} must be divisible by the number of ranks ({world})")
    if not 0 <= cfg.pad_cap <= 1:
        problems.append(f"pad_cap must be in [0, 1], got {cfg.pad_cap}")
    if cfg.share_row_cap < 1:
        problems.append(f"share_row_cap must be >= 1 (a row holds at least one sample), got {cfg.share_row_cap}")
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


def step_batch(cfg, active):
    """B, the queries of a step whose active roles are `active`: executor_batch_size for an Executor-only step."""
    return cfg.executor_batch_size if cfg.executor_batch_size > 0 and set(active) == {"executor"} else cfg.batch_size


def role_lr(cfg, role):
    """The peak learning rate of a role's updates: designer_lr / executor_lr where set, else lr."""
    return {"designer": cfg.designer_lr, "executor": cfg.executor_lr}[role] or cfg.lr

