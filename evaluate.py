"""evaluate.py: the paper's evaluation -- benchmarks, baselines, tables and structure shares.

Every method is evaluated through the same rollout and reward code that training uses, so a number
here and a reward during training mean the same thing. For each problem and each of K samples:

    learned designer ("auto"):   the Designer writes one script, the Executor runs it once
    fixed template ("template:NAME"):  mas.TEMPLATES[NAME] runs once (no Designer)
    single agent ("single"):     the "single" template: one Executor call, no structure

    pass@1 (avg@K) of a problem = (1/K) * sum_k correct_k ,  correct_k in {0, 1}  (reward.py, lam 0)

averaged over the problems of a benchmark, and the benchmarks averaged with equal weight (the
paper's "Avg"). A script or program that crashes is simply wrong; it never aborts the run.

    python evaluate.py --run out/qwen3-8b-rl --tasks aime24 aime25 olympiadbench  # as trained
    python evaluate.py --run RUN --step 200 --tasks apps --protocol train --samples 4
    torchrun --nproc_per_node=8 evaluate.py --rundir RUN --tasks aime24 livecodebench  # every GPU
    python evaluate.py --model Qwen/Qwen3-8B --config config/qwen3_8b.py --tasks aime24 --samples 16
    python evaluate.py --model M --tasks my.jsonl --mode single template:ensemble auto --out out/x
    python evaluate.py --designer RUN/step_000300/designer --executor RUN/step_000300/executor \\
        --config config/qwen3_8b.py --tasks aime24          # separate policies, one model a role
    python world/tiny.py tasks && python evaluate.py --run out/tiny-rl --tasks tiny
                                                            # the tiny world's held-out tasks
    python evaluate.py --table out/eval-base out/eval-sft out/eval-rl   # the paper's Table 1: a
                                        # row per model and method of each folder, nothing run

--run RUN evaluates a train.py run with the settings it was trained with, read from RUN/run.json's
config: the backend and engine_kwargs, chat_template_kwargs (Qwen3: thinking off), max_tokens and
designer_max_tokens, the tiny world's one-line prompts where it trained on them, and its models:
RUN/step_N/model, or RUN/step_N/designer and executor for separate policies (--step N; default
the last checkpoint). --model / --designer, --executor take them from --config PRESET instead (no
preset: Config's defaults, the paper's 8,192 tokens). Each flag given overrides what was read.

The sampling protocol (--protocol), stated in both outputs:

    greedy  [authors] T = 0: the authors' validation (their eval config); the default
    train   ours: T = 1, top_p = 1, as train.py's rollouts sample (untruncated)
    qwen3   ours: T = 0.6, top_p = 0.95, Qwen3's card for thinking mode (this file's old default)

--temperature / --top_p override the protocol's values (then recorded as "custom"). Greedy makes
the K samples of a problem one; avg@K needs a sampled protocol.

Every GPU: under `torchrun --nproc_per_node=G` each rank holds one engine and evaluates its share
of each benchmark's problems (contiguous, in order); rank 0 gathers them into the one table. A
problem's seeds follow its index in the benchmark, so G ranks give the table of one (on a CPU,
two gloo ranks give one process's numbers). There --run is spelt --rundir: torchrun's own
parser would take --run for its --run-path.

--tasks takes the benchmark names aime24, aime25, olympiadbench, apps, apps500 (the authors' APPS
set: the first 500 rows of test.jsonl), livecodebench and codecontests (DATA_DIR/NAME.jsonl, as
`python machinery/data.py prepare NAME` writes it from the published test split; a missing one
says that command), task files in machinery/data.py's format, and tiny (the tiny world's
held-out tasks, DATA_DIR/tiny.jsonl: `python world/tiny.py tasks` writes them). --data DATA_DIR
(default data/). Results go to OUT/results.md (a header with the run, the protocol and the
settings used, and each benchmark's source, split, subset and problems with the samples a
problem, read from the manifest beside its task file; then Tables 1-2 and 6 of the paper, as
Markdown) and OUT/results.json (every number plus exactly what was evaluated: problem ids,
data-file hashes, the models, K, the protocol, the settings and where they were read). A model
that is not there ends the run in one line that says so. One query of your own, as a page of its
tree: tools/ask.py.

Needs: machinery/data.py, machinery/engine.py, machinery/weights.py, mas.py, rollout.py,
settings.py, machinery/decode.py, machinery/isolation.py, machinery/confine.py,
machinery/provenance.py, machinery/ranks.py, machinery/cpu_bits.py, machinery/reload_check.py,
machinery/rundir.py,
reward.py, sandbox.py, stagewise.py, machinery/plans.py, machinery/programs.py,
machinery/grader.py, machinery/results.py"""

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch.distributed as dist
from tqdm import tqdm

import mas
import rollout as rollout_lib
import settings
from machinery import data, ranks, rundir, weights
from machinery import engine as engine_lib
from machinery import results as report

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"  # prepared task files: data/NAME.jsonl
# the benchmark names: the test splits machinery/data.py prepares (RL reads the train splits)
BENCHMARKS = tuple(n for n, r in data.RECIPES.items() if r.split == "test")
# the sampling protocols: (temperature, top_p, label)
PROTOCOLS = {
    "greedy": (0.0, 1.0, "[authors] greedy, T 0: their validation (eval config)"),
    "train": (1.0, 1.0, "ours: T 1, top_p 1, as train.py's rollouts sample"),
    "qwen3": (0.6, 0.95, "ours: T 0.6, top_p 0.95, Qwen3's card (thinking mode)"),
}


# -------------------------------------------------------------------------------------------- tasks
def load_benchmark(spec, n_tiny=100, data_dir=DATA):
    """(name, tasks, source file) for a benchmark name or a task file; clear errors otherwise.
    NAME of BENCHMARKS: data_dir/NAME.jsonl, as `python machinery/data.py prepare NAME` writes it.
    tiny: the first n_tiny tasks of data_dir/tiny.jsonl (`python world/tiny.py tasks` writes the
    tiny world's held-out "eval" split there)."""
    if spec == "tiny":
        path = Path(data_dir) / "tiny.jsonl"
        if not path.exists():
            raise SystemExit(
                f"evaluate.py: benchmark 'tiny': {path} not found (`python world/tiny.py "
                f"tasks --out {path}` writes the tiny world's held-out tasks)"
            )
        return "tiny", data.load_tasks(path)[:n_tiny], path
    if spec in BENCHMARKS:
        path = Path(data_dir) / f"{spec}.jsonl"
        if not path.exists():
            out = "" if Path(data_dir) == DATA else f" --out {data_dir}"
            raise SystemExit(
                f"evaluate.py: benchmark {spec!r}: {path} not found (`python machinery/data.py "
                f"prepare {spec}{out}` writes it)"
            )
        return spec, data.load_tasks(path), path
    path = Path(spec)
    if not path.exists():
        raise SystemExit(
            f"evaluate.py: task file not found: {spec} "
            f"(give a task file or one of {[*BENCHMARKS, 'tiny']})"
        )
    return path.stem, data.load_tasks(path), path


# ------------------------------------------------------------------------------------------ methods
def evaluate_method(
    tasks,
    designer_engine,
    executor_engine,
    method,
    K=1,
    *,
    seed=0,
    short=False,
    designer_sampling=None,
    executor_sampling=None,
    chunk=32,
    progress=None,
    q_offset=0,
    schedule="ticks",
    limits=None,
    grading=None,
):
    """Evaluate one method on one benchmark. Returns per-problem pass@1 and the design structures.

    K samples per problem are K designs executed once each (rollout with M=K, N=1), so every sample
    of the learned Designer is a fresh script. lam=0 makes the rollout's reward exactly `correct`.
    Separate policies on one engine: pass each role's view of it (machinery/weights.py). q_offset:
    the benchmark index of tasks[0] (a rank's share): a problem's seeds follow that index alone.
    """
    # "single" is a template
    template = None if method == "auto" else method.removeprefix("template:")
    per_problem, counts = [], {s: 0 for s in (*report.STRUCTURES, "unparseable")}
    for start in range(0, len(tasks), chunk):
        part = tasks[start : start + chunk]
        batch = rollout_lib.rollout(
            part,
            designer_engine,
            executor_engine,
            M=K,
            N=1,
            step=0,
            seed=seed,
            template=template,
            lam=0.0,
            short=short,
            designer_sampling=designer_sampling,
            executor_sampling=executor_sampling,
            q_offset=q_offset + start,
            schedule=schedule,
            limits=limits,
            grading=grading,
        )
        correct = batch.R  # [b, K, 1]: lam = 0, so R is correct: 0 or 1 (code: every hidden test)
        per_problem += correct.mean(dim=(1, 2)).tolist()
        for run in batch.runs:
            counts[run.structure or "unparseable"] += 1
        if progress is not None:
            progress.update(len(part))
    return summary(per_problem, counts)


def summary(per_problem, counts):
    """pass@1 (the mean over the problems), per_problem, the structure counts and their shares."""
    n = max(1, sum(counts.values()))
    return {
        "pass@1": sum(per_problem) / max(1, len(per_problem)),
        "per_problem": per_problem,
        "counts": counts,
        "structures": {k: v / n for k, v in counts.items()},
    }


def evaluate_all(
    benchmarks, designer_engine, executor_engine, methods, parts, K=1, rank=0, world=1, **kw
):
    """results[method][benchmark] = evaluate_method(...); a tqdm bar over all problems of all
    methods. With world ranks, this rank evaluates its share of each benchmark (contiguous, np's
    array_split) and rank 0 returns every rank's, gathered (gather) as each benchmark finishes; the
    others return None. parts (rundir.EvalParts(OUT, key)): each benchmark's results written as it
    finishes, and those it already holds (a resumed evaluation's) taken instead of evaluated
    again."""
    total = sum(len(share(t, rank, world)[1]) for _, t, _ in benchmarks) * len(methods)
    results = {}
    with tqdm(
        total=total, desc="evaluate", unit="problem", file=sys.stderr, disable=rank > 0
    ) as bar:
        for method in methods:
            for name, tasks, _ in benchmarks:
                bar.set_postfix_str(f"{method} on {name}")
                first, mine = share(tasks, rank, world)
                done = parts.read(method, name)
                if done is None:  # (every rank reads the same file: all skip it, or none)
                    part = evaluate_method(
                        mine,
                        designer_engine,
                        executor_engine,
                        method,
                        K,
                        progress=bar,
                        q_offset=first,
                        **kw,
                    )
                    done = gather({method: {name: part}}, rank, world)
                    done = done and done[method][name]  # rank 0's, every rank's results
                    parts.write(method, name, done)  # (rank 0 writes; the others have None)
                else:
                    bar.update(len(mine))
                results.setdefault(method, {})[name] = done
    return results if rank == 0 else None


def share(tasks, rank, world):
    """(the benchmark index of the first, the tasks) of this rank's share: contiguous, in order."""
    part = np.array_split(np.arange(len(tasks)), world)[rank]
    return (int(part[0]) if len(part) else 0), [tasks[k] for k in part]


def gather(results, rank, world):
    """Every rank's results on rank 0, as one: per-problem lists concatenated in rank order (the
    benchmark's order), structure counts summed, pass@1 and shares recomputed (None elsewhere)."""
    if world == 1:
        return results
    every = [None] * world
    dist.all_gather_object(every, results)
    if rank > 0:
        return None
    out = {}
    for method, per in results.items():
        for name in per:
            parts = [r[method][name] for r in every]
            problems = []
            for p in parts:
                problems += p["per_problem"]
            counts = {k: sum(p["counts"][k] for p in parts) for k in parts[0]["counts"]}
            out.setdefault(method, {})[name] = summary(problems, counts)
    return out


# --------------------------------------------------------------------------------------------- main
MAKES = (
    "train.py writes RUN/step_N/model, or its designer/ and executor/; sft.py writes out/tiny-sft"
)


def load_engine(path, backend, flag="--model", template_kwargs=None, engine_kwargs=None):
    """The engine of a model folder or hub id, rendering chat prompts with template_kwargs (the
    preset's chat_template_kwargs, as train.py's engine) and made with engine_kwargs (the run's:
    max_model_len, gpu_memory_utilization); a missing one ends the program in one line."""
    why = engine_lib.missing_model(path)
    if why:
        raise SystemExit(f"evaluate.py: {flag}: {why} ({MAKES}; or a hub id: Qwen/Qwen3-8B)")
    return engine_lib.make_engine(
        str(path), backend=backend, chat_template_kwargs=template_kwargs, **(engine_kwargs or {})
    )


def check_models(a):
    """Each model path given is a model folder (or a hub id): a missing one ends the program in one
    line, before any task file is read or any model loads."""
    if a.model:
        why = engine_lib.missing_model(a.model)
        if why:
            raise SystemExit(f"evaluate.py: --model: {why} ({MAKES}; or a hub id: Qwen/Qwen3-8B)")
        return
    for flag, path in (("--designer", a.designer), ("--executor", a.executor)):
        why = engine_lib.missing_model(path) or (
            None if os.path.isdir(path) else f"no model folder {path}"
        )
        if why:  # (a hub id is no folder: the weights are read from the folder's safetensors)
            raise SystemExit(f"evaluate.py: {flag}: {why} ({MAKES})")


def load_policies(a, used=None):
    """(the Designer's engine, the Executor's): one model playing both roles (--model), or separate
    policies (--designer, --executor: two model folders) on one engine, each role's view of it
    holding that role's weights (machinery/weights.py), as train.py's separate policies run.
    used: the settings (settings_used); None: --config's."""
    used = used or settings_used(a)
    kw = dict(template_kwargs=used["chat_template_kwargs"], engine_kwargs=used["engine_kwargs"])
    if a.model:
        eng = load_engine(a.model, used["backend"], **kw)
        return eng, eng
    eng = load_engine(a.designer, used["backend"], "--designer", **kw)
    folders = {"designer": a.designer, "executor": a.executor}
    held = weights.EngineWeights(eng, folders, held="designer")
    return held.view("designer"), held.view("executor")


def read_run(a):
    """--run RUN [--step N]: RUN/run.json's config, and the checkpoint's models into a.model or
    a.designer / a.executor (a shared or a separate-policy run); a.step the step read. A run or
    checkpoint that is not there ends the program in one line."""
    path = Path(a.run) / "run.json"
    if not path.is_file():
        raise SystemExit(f"evaluate.py: --run: no {path} (train.py writes it, in its out_dir)")
    try:
        cfg = json.loads(path.read_text())["config"]
    except (ValueError, KeyError, TypeError):
        raise SystemExit(f"evaluate.py: --run: {path} holds no run's config") from None
    steps = rundir.checkpoints(a.run)
    if not steps:
        raise SystemExit(
            f"evaluate.py: --run: no checkpoint step_N in {a.run} (train.py saves one)"
        )
    folder = steps[-1] if a.step is None else f"step_{a.step:06d}"
    if folder not in steps:
        have = ", ".join(str(int(d[5:])) for d in steps)
        raise SystemExit(f"evaluate.py: --step {a.step}: no {a.run}/{folder} (the run has {have})")
    a.step = int(folder[5:])
    ckpt = Path(a.run) / folder
    if cfg.get("policy", "shared") == "separate":
        a.designer, a.executor = str(ckpt / "designer"), str(ckpt / "executor")
    else:
        a.model = str(ckpt / "model")
    return cfg


def settings_used(a, cfg=None):
    """The settings of this evaluation and where each came from: the run's config (--run), else
    --config's preset, else Config's defaults; a flag given overrides. Sampling: the protocol's,
    --temperature / --top_p overriding it ("custom")."""
    if cfg is not None:
        source = f"{a.run}/run.json (step {a.step})"
    elif a.config:
        cfg, source = dataclasses.asdict(settings.parse_config([a.config])), a.config
    else:
        cfg, source = dataclasses.asdict(settings.Config()), "settings.Config's defaults"
    read = source != "settings.Config's defaults"
    tiny_mix = settings.Config(data_mix=cfg.get("data_mix", {}))
    temperature, top_p, label = PROTOCOLS[a.protocol]
    custom = [
        f for f, v in (("--temperature", a.temperature), ("--top_p", a.top_p)) if v is not None
    ]
    used = {
        "from": source,
        "backend": a.backend or cfg.get("backend", "auto"),
        "engine_kwargs": cfg.get("engine_kwargs", {}),
        "chat_template_kwargs": cfg.get("chat_template_kwargs", {}),
        "max_tokens": a.max_tokens or cfg["max_tokens"],
        "designer_max_tokens": a.designer_max_tokens or cfg["designer_max_tokens"],
        # the tiny world's one-line prompts where the run (or preset) trained on its data
        "short_prompt": a.short_prompt or (read and settings.is_tiny(tiny_mix)),
        "protocol": a.protocol + (" (custom: " + ", ".join(custom) + ")" if custom else ""),
        "protocol_label": label,
        "temperature": temperature if a.temperature is None else a.temperature,
        "top_p": top_p if a.top_p is None else a.top_p,
        # how the scripts run and are graded: as the run (or preset) trained
        "rollout_schedule": cfg.get("rollout_schedule", "ticks"),
        "sandbox": cfg.get("sandbox", {}),
        "grade_budget": cfg.get("grade_budget", settings.Config.grade_budget),
        "math_timeout": cfg.get("math_timeout", settings.Config.math_timeout),
    }
    flags = ("backend", "max_tokens", "designer_max_tokens", "short_prompt")
    used["flags"] = [f"--{k}" for k in flags if getattr(a, k)] + custom
    return used


class HelpFormat(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help: the module's docstring as it is, every setting with its default."""


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormat)
    p.add_argument(
        "--run",
        "--rundir",  # under torchrun: its own parser takes --run for its --run-path
        dest="run",
        help="a train.py run folder: its checkpoint, with its settings (--rundir: the same)",
    )
    p.add_argument("--step", type=int, help="--run's checkpoint step_N (default: its last)")
    p.add_argument("--model", help="one model playing both roles (shared policy)")
    p.add_argument(
        "--designer", help="the Designer's model folder (separate policies, with --executor)"
    )
    p.add_argument(
        "--executor", help="the Executor's model folder (separate policies, with --designer)"
    )
    p.add_argument(
        "--tasks",
        nargs="+",
        required=True,
        help=f"benchmark names ({', '.join(BENCHMARKS)}), task files, tiny",
    )
    p.add_argument(
        "--mode",
        nargs="+",
        default=None,
        help="methods: auto (learned designer), single, template:NAME; default all of them",
    )
    p.add_argument(
        "--samples", type=int, default=1, help="K: pass@1 averaged over K samples per problem"
    )
    p.add_argument("--protocol", default="greedy", choices=list(PROTOCOLS), help="sampling")
    p.add_argument("--backend", default=None, choices=["auto", "vllm", "hf", "lean"])
    p.add_argument("--temperature", type=float, default=None, help="overrides the protocol's")
    p.add_argument("--top_p", type=float, default=None, help="overrides the protocol's")
    p.add_argument("--max_tokens", type=int, default=None, help="per Executor call")
    p.add_argument("--designer_max_tokens", type=int, default=None)
    p.add_argument(
        "--short_prompt", action="store_true", help="the tiny world's one-line Designer prompt"
    )
    p.add_argument("--n_tiny", type=int, default=100, help="tiny: its first N tasks")
    p.add_argument("--data", default=str(DATA), help="the folder of prepared task files")
    p.add_argument(
        "--config",
        default=None,
        help="without --run: the RL preset whose settings (chat_template_kwargs, engine_kwargs, "
        "max tokens, backend) the evaluation takes, as train.py does (config/qwen3_8b.py)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/eval")
    p.add_argument("--resume", action="store_true", help="keep OUT/parts/' benchmarks done")
    return p.parse_args(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--table"]:  # results.json of earlier evaluations, one table (results.py)
        return print(report.paper_table(argv[1:]))
    a = parse_args(argv)
    both = (
        "evaluate.py: give --run RUN, --model (one model, both roles), or --designer and --executor"
    )
    if a.run and (a.model or a.designer or a.executor or a.config):
        raise SystemExit("evaluate.py: --run takes its models and settings from the run alone")
    if a.step is not None and not a.run:
        raise SystemExit("evaluate.py: --step picks a checkpoint of --run RUN")
    cfg = read_run(a) if a.run else None
    if a.model and (a.designer or a.executor):
        raise SystemExit(both)
    if not a.model and not (a.designer and a.executor):
        raise SystemExit(both)
    if bad := [
        m for m in a.mode or [] if m not in ("auto", "single") and not m.startswith("template:")
    ]:
        raise SystemExit(f"unknown mode {bad[0]!r}: use auto, single or template:NAME")
    methods = a.mode or ["single"] + [f"template:{t}" for t in mas.TEMPLATES if t != "single"] + [
        "auto"
    ]
    try:
        used = settings_used(a, cfg)
    except settings.ConfigError as e:
        raise SystemExit(f"evaluate.py: --config: {e}") from None
    check_models(a)
    benchmarks = [load_benchmark(t, a.n_tiny, a.data) for t in a.tasks]
    names = [b[0] for b in benchmarks]
    torchrun = "RANK" in os.environ  # torchrun: a process group, an engine a rank
    rank, world, _ = ranks.setup() if torchrun else (0, 1, None)
    sampling = dict(temperature=used["temperature"], top_p=used["top_p"])
    dsamp = engine_lib.Sampling(max_tokens=used["designer_max_tokens"], **sampling)
    esamp = engine_lib.Sampling(max_tokens=used["max_tokens"], **sampling)
    if a.samples > 1 and used["temperature"] == 0 and rank == 0:
        print(
            f"evaluate.py: {a.samples} greedy samples are one draw; --protocol train or qwen3 "
            "samples (avg@K)",
            file=sys.stderr,
        )
    designer_eng, executor_eng = load_policies(a, used)
    # each benchmark's results in OUT/parts/ as it finishes, with what made them
    key = dict(models=[a.model, a.designer, a.executor], samples=a.samples, seed=a.seed, **used)
    key["tasks"] = [(n, len(t), report.sha256(src)) for n, t, src in benchmarks]
    res = evaluate_all(
        benchmarks,
        designer_eng,
        executor_eng,
        methods,
        rundir.EvalParts(a.out, key, a.resume),
        a.samples,
        rank=rank,
        world=world,
        seed=a.seed,
        short=used["short_prompt"],
        designer_sampling=dsamp,
        executor_sampling=esamp,
        schedule=used["rollout_schedule"],
        limits=mas.Limits(**used["sandbox"]),
        grading=dict(budget=used["grade_budget"], math_timeout=used["math_timeout"]),
    )
    if rank == 0:
        report.write_results(a, used, benchmarks, names, res, world)
    # as train.py ends: every rank done, then the engine (vLLM's groups, made from ours), then ours
    if torchrun:
        dist.barrier()
    holder = getattr(designer_eng, "holder", None)  # separate policies: the views' one engine
    (holder.eng if holder else designer_eng).close()
    if torchrun and dist.is_initialized():
        dist.destroy_process_group()
    return res


if __name__ == "__main__":
    main()
