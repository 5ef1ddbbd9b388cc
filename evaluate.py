"""evaluate.py: the paper's evaluation -- benchmarks, baselines, tables and structure shares.

Every method is evaluated through the same rollout and reward code that training uses, so a number
here and a reward during training mean the same thing. For each problem and each of K samples:

    learned designer ("auto"):   the Designer writes one script, the Executor runs it once
    fixed template ("template:NAME"):  mas.TEMPLATES[NAME] runs once (no Designer)
    single agent ("single"):     the "single" template: one Executor call, no structure

    pass@1 (avg@K) of a problem = (1/K) * sum_k correct_k ,  correct_k in {0, 1}  (reward.py, lam 0)

averaged over the problems of a benchmark, and the benchmarks averaged with equal weight (the
paper's "Avg"). A script or program that crashes is simply wrong; it never aborts the run.

    python evaluate.py --model Qwen/Qwen3-8B --tasks aime24 aime25 olympiadbench --samples 16
    python evaluate.py --model M --tasks my.jsonl --mode single template:ensemble auto --out out/x
    python evaluate.py --designer RUN/step_000300/designer --executor RUN/step_000300/executor \\
        --tasks aime24                                      # separate policies, one model a role
    python world/tiny.py tasks && python evaluate.py --model out/tiny-sft --tasks tiny \\
        --short-prompt --max-tokens 128 --designer-max-tokens 400 --temperature 1 --top-p 1
                                                            # the tiny world's held-out tasks

--tasks takes task files in machinery/data.py's format, or the names aime24 / aime25 / olympiadbench
(read from ../shared/data through its converters) and tiny (the tiny world's held-out tasks,
--data/tiny.jsonl: `python world/tiny.py tasks` writes them). Results go to OUT/results.md (Tables
1-2 and 6 of the paper, as Markdown) and OUT/results.json (every number plus exactly what was
evaluated: problem ids, data-file hashes, the models, K, sampling settings). --model: one model
plays both roles (a shared policy); --designer and --executor: separate policies, one engine holding
each role's weights in its phase (machinery/weights.py), as train.py runs them. A model that is not
there ends the run in one line that says so. One query of your own, as a page of its tree:
tools/ask.py.

paired_margin gives the honest error bar of a difference on the same problems (world/final_table.py,
sft.py's quality bar).

Needs: machinery/data.py, machinery/engine.py, machinery/weights.py, mas.py, rollout.py,
settings.py, machinery/decode.py, machinery/isolation.py, machinery/provenance.py,
machinery/ranks.py, machinery/reload_check.py, machinery/rundir.py, reward.py, sandbox.py,
stagewise.py
"""

import argparse
import hashlib
import json
import math
import os
import sys
from pathlib import Path

from tqdm import tqdm

import mas
import rollout as rollout_lib
import settings
from machinery import data, weights
from machinery import engine as engine_lib

ROOT = Path(__file__).resolve().parent
SHARED = ROOT.parent / "shared" / "data" / "benchmarks"
NAMED = ("aime24", "aime25", "olympiadbench")  # SHARED/NAME.jsonl, as published
DATA = ROOT / "data"  # prepared task files: data/NAME.jsonl
STRUCTURES = ("single", "ensemble", "critic", "tester", "other")


# -------------------------------------------------------------------------------------------- tasks
def load_benchmark(spec, n_tiny=100, data_dir=DATA):
    """(name, tasks, source file) for a benchmark name or a task file; clear errors otherwise.
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
    if spec in NAMED:
        path = SHARED / f"{spec}.jsonl"
        if not path.exists():
            raise SystemExit(
                f"evaluate.py: benchmark {spec!r}: {path} not found "
                "(the published file, see data.py)"
            )
        convert = data.CONVERTERS[spec]  # the tested converter, each task validated
        tasks = [data.validate_task(convert(row, k)) for k, row in enumerate(data.read_jsonl(path))]
        return spec, tasks, path
    path = Path(spec)
    if not path.exists():
        raise SystemExit(
            f"evaluate.py: task file not found: {spec} "
            f"(give a task file or one of {[*NAMED, 'tiny']})"
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
):
    """Evaluate one method on one benchmark. Returns per-problem pass@1 and the design structures.

    K samples per problem are K designs executed once each (rollout with M=K, N=1), so every sample
    of the learned Designer is a fresh script. lam=0 makes the rollout's reward exactly `correct`.
    Separate policies on one engine: pass each role's view of it (machinery/weights.py).
    """
    # "single" is a template
    template = None if method == "auto" else method.removeprefix("template:")
    per_problem, structures = [], {s: 0 for s in STRUCTURES + ("unparseable",)}
    for start in range(0, len(tasks), chunk):
        part = tasks[start : start + chunk]
        batch = rollout_lib.rollout(
            part,
            designer_engine,
            executor_engine,
            M=K,
            N=1,
            step=start,
            seed=seed,
            template=template,
            lam=0.0,
            short=short,
            designer_sampling=designer_sampling,
            executor_sampling=executor_sampling,
        )
        correct = batch.R  # [b, K, 1]: lam = 0, so R is correct: 0 or 1 (code: every hidden test)
        per_problem += correct.mean(dim=(1, 2)).tolist()
        for run in batch.runs:
            structures[run.structure or "unparseable"] += 1
        if progress is not None:
            progress.update(len(part))
    n = max(1, sum(structures.values()))
    return {
        "pass@1": sum(per_problem) / max(1, len(per_problem)),
        "per_problem": per_problem,
        "structures": {k: v / n for k, v in structures.items()},
    }


def evaluate_all(benchmarks, designer_engine, executor_engine, methods, K=1, **kw):
    """results[method][benchmark] = evaluate_method(...); a tqdm bar over all problems of all
    methods."""
    total = sum(len(t) for _, t, _ in benchmarks) * len(methods)
    results = {}
    with tqdm(total=total, desc="evaluate", unit="problem", file=sys.stderr) as bar:
        for method in methods:
            for name, tasks, _ in benchmarks:
                bar.set_postfix_str(f"{method} on {name}")
                results.setdefault(method, {})[name] = evaluate_method(
                    tasks, designer_engine, executor_engine, method, K, progress=bar, **kw
                )
    return results


# ------------------------------------------------------------------------------------------- tables
def _pct(x):
    return f"{100 * x:.2f}"


def results_table(results, bench_names):
    """Tables 1-2 of the paper: benchmarks as columns, methods as rows, the average last."""
    lines = [
        "| method | " + " | ".join(bench_names) + " | Avg |",
        "|---" * (len(bench_names) + 2) + "|",
    ]
    for method, per in results.items():
        vals = [per[b]["pass@1"] for b in bench_names]
        lines.append(
            f"| {method} | " + " | ".join(map(_pct, vals)) + f" | {_pct(sum(vals) / len(vals))} |"
        )
    return "\n".join(lines)


def structure_table(per_bench):
    """Table 6 of the paper: the share of each structure among the learned Designer's scripts."""
    cols = list(STRUCTURES) + ["unparseable"]
    lines = ["| benchmark | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, r in per_bench.items():
        lines.append(
            f"| {name} | " + " | ".join(_pct(r["structures"].get(c, 0.0)) for c in cols) + " |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------- statistics
def paired_margin(a, b):
    """Mean of a - b over the same problems, and its standard error (the spread of the per-problem
    differences / sqrt(n)): the draw of problems cancels, so this is the honest error bar of a
    margin."""
    d = [x - y for x, y in zip(a, b)]
    if not d:
        return float("nan"), float("nan")
    mean = sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / max(1, len(d) - 1)
    return mean, math.sqrt(var / len(d))


# --------------------------------------------------------------------------------------------- main
def sha256(path):
    """The file's SHA-256 (hex), or None for no file (the tiny tasks are made, not read)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None


MAKES = (
    "train.py writes RUN/step_N/model, or its designer/ and executor/; sft.py writes out/tiny-sft"
)


def load_engine(path, backend, flag="--model", template_kwargs=None):
    """The engine of a model folder or hub id, rendering chat prompts with template_kwargs (the
    preset's chat_template_kwargs, as train.py's engine); a missing one ends the program in one
    line."""
    why = engine_lib.missing_model(path)
    if why:
        raise SystemExit(f"evaluate.py: {flag}: {why} ({MAKES}; or a hub id: Qwen/Qwen3-8B)")
    return engine_lib.make_engine(str(path), backend=backend, chat_template_kwargs=template_kwargs)


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


def load_policies(a):
    """(the Designer's engine, the Executor's): one model playing both roles (--model), or separate
    policies (--designer, --executor: two model folders) on one engine, each role's view of it
    holding that role's weights (machinery/weights.py), as train.py's separate policies run."""
    kw = settings.chat_template_kwargs(a.config)
    if a.model:
        eng = load_engine(a.model, a.backend, template_kwargs=kw)
        return eng, eng
    eng = load_engine(a.designer, a.backend, "--designer", kw)
    folders = {"designer": a.designer, "executor": a.executor}
    held = weights.EngineWeights(eng, folders, held="designer")
    return held.view("designer"), held.view("executor")


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
        help="task files, aime24/aime25/olympiadbench, tiny",
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
    p.add_argument("--backend", default="auto", choices=["auto", "vllm", "hf"])
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-tokens", type=int, default=4096, help="per Executor call")
    p.add_argument("--designer-max-tokens", type=int, default=2048)
    p.add_argument(
        "--short-prompt", action="store_true", help="the tiny world's one-line Designer prompt"
    )
    p.add_argument("--n-tiny", type=int, default=100, help="tiny: its first N tasks")
    p.add_argument("--data", default=str(DATA), help="the folder of prepared task files")
    p.add_argument(
        "--config",
        default=None,
        help="the RL preset whose chat_template_kwargs render the prompts (as train.py renders "
        "them: config/qwen3_8b.py, thinking off); default: the tiny preset's",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/eval")
    return p.parse_args(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    dsamp = engine_lib.Sampling(
        temperature=a.temperature, top_p=a.top_p, max_tokens=a.designer_max_tokens
    )
    esamp = engine_lib.Sampling(temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens)
    both = "evaluate.py: give --model (one model, both roles), or --designer and --executor"
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
    check_models(a)
    benchmarks = [load_benchmark(t, a.n_tiny, a.data) for t in a.tasks]
    names = [b[0] for b in benchmarks]
    designer_eng, executor_eng = load_policies(a)
    res = evaluate_all(
        benchmarks,
        designer_eng,
        executor_eng,
        methods,
        a.samples,
        seed=a.seed,
        short=a.short_prompt,
        designer_sampling=dsamp,
        executor_sampling=esamp,
    )
    tables = [("pass@1 (%)", results_table(res, names))]
    if "auto" in res:
        tables.append(
            ("structure shares of the learned Designer (%)", structure_table(res["auto"]))
        )
    models = {"shared": a.model} if a.model else {"designer": a.designer, "executor": a.executor}
    record = {
        "tasks": {
            n: {
                "file": str(src) if src else None,
                "sha256": sha256(src),
                "ids": [str(t["id"]) for t in tasks],
            }
            for n, tasks, src in benchmarks
        },
        "models": models,
        "samples": a.samples,
        "backend": a.backend,
        "chat_template_kwargs": settings.chat_template_kwargs(a.config),
        "seed": a.seed,
        "sampling": {"designer": vars(dsamp), "executor": vars(esamp)},
        "results": res,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(
        "\n\n".join(f"### {title}\n\n{table}" for title, table in tables) + "\n"
    )
    (out / "results.json").write_text(json.dumps(record, indent=1))
    for title, table in tables:
        print(f"\n{title}\n{table}")
    print(f"\nwritten: {out / 'results.md'}, {out / 'results.json'}")
    return res


if __name__ == "__main__":
    main()
