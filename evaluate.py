"""evaluate.py: the paper's evaluation -- benchmarks, baselines, tables and structure shares.

Every method is evaluated through the same rollout and reward code that training uses, so a number here and
a reward during training mean the same thing. For each problem and each of K samples:

    learned designer ("auto"):   the Designer writes one script, the Executor runs it once
    fixed template ("template:NAME"):  mas.TEMPLATES[NAME] runs once (no Designer)
    single agent ("single"):     the "single" template: one Executor call, no structure

    pass@1 (avg@K) of a problem = (1/K) * sum_k correct_k ,     correct_k in {0, 1}  (reward.py, lam = 0)

averaged over the problems of a benchmark, and the benchmarks averaged with equal weight (the paper's "Avg").
A script or program that crashes is simply wrong; it never aborts the run.

    python evaluate.py                                      # tiny default: out/tiny-sft vs the latest RL run
    python evaluate.py --model Qwen/Qwen3-8B --tasks aime24 aime25 olympiadbench --samples 16 --out out/eval
    python evaluate.py --model M --tasks my.jsonl --mode single template:ensemble auto
    python evaluate.py --designer D_RL --executor E_SFT ...     # one pairing of separate models
    python evaluate.py --pairings sft=out/tiny-sft rl=out/tiny-rl/final --tasks tiny   # {SFT,RL} x {SFT,RL}
    python evaluate.py answers --tasks aime24 --answers outputs.jsonl    # grade existing outputs, no model

--tasks takes task files in data.py's format, or the names aime24 / aime25 / olympiadbench (read from
../shared/data through data.py's converters) and tiny (held-out tiny-world tasks). Results go to
OUT/results.md (Tables 1-2 and 6 of the paper, as Markdown) and OUT/results.json (every number plus exactly
what was evaluated: problem ids, data-file hashes, models, K, sampling settings).

paired_margin gives the honest error bar of a difference on the same problems (final_table.py, sft.py's quality
bar).

Needs: engine.py, decode.py, chunked.py, tiny.py, rollout.py, mas.py, sandbox.py, isolation.py, reward.py, data.py
"""

import argparse
import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

import data
import engine as engine_lib
import mas
import reward
import rollout as rollout_lib
import tiny

ROOT = Path(__file__).resolve().parent
SHARED = ROOT.parent / "shared" / "data" / "benchmarks"
NAMED = {"aime24": "aime24.jsonl", "aime25": "aime25.jsonl", "olympiadbench": "olympiadbench.jsonl"}
STRUCTURES = ("single", "ensemble", "critic", "tester", "other")
TINY_EVAL_SEED = 10_007      # held-out tiny tasks: the "eval" split (tiny.SPLITS), which SFT and RL never see


# ----------------------------------------------------------------------------------------------- tasks
def load_benchmark(spec, n_tiny=100):
    """(name, tasks, source file or None) for a benchmark name or a task file; clear errors otherwise."""
    if spec == "tiny":
        return "tiny", tiny.make_tasks(n_tiny, seed=TINY_EVAL_SEED, split="eval"), None
    if spec in NAMED:
        path = SHARED / NAMED[spec]
        if not path.exists():
            raise SystemExit(f"benchmark {spec!r}: {path} not found (the published file, see data.py prepare)")
        with tempfile.TemporaryDirectory() as tmp:   # the tested converter path, then the validating loader
            data.convert(spec, path, Path(tmp) / "tasks.jsonl")
            return spec, data.load_tasks(Path(tmp) / "tasks.jsonl"), path
    path = Path(spec)
    if not path.exists():
        raise SystemExit(f"task file not found: {spec} (give a task file or one of {sorted(NAMED) + ['tiny']})")
    return path.stem, data.load_tasks(path), path


def file_hash(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None


# ----------------------------------------------------------------------------------------------- methods
def evaluate_method(tasks, designer_engine, executor_engine, method, K=1, *, seed=0, short=False,
                    designer_sampling=None, executor_sampling=None, chunk=32, progress=None, on_phase=None):
    """Evaluate one method on one benchmark. Returns per-problem pass@1 and the design structures.

    K samples per problem are K designs executed once each (rollout with M=K, N=1), so every sample of
    the learned Designer is a fresh script. lam=0 makes the rollout's reward exactly `correct`.
    on_phase is rollout's weight-swap hook (separate policies sharing one engine).
    """
    template = None if method == "auto" else ("single" if method == "single" else method.split(":", 1)[1])
    per_problem, structures = [], {s: 0 for s in STRUCTURES + ("unparseable",)}
    errors = 0
    for start in range(0, len(tasks), chunk):
        part = tasks[start:start + chunk]
        batch = rollout_lib.rollout(part, designer_engine, executor_engine, M=K, N=1, step=start, seed=seed,
                                    template=template, lam=0.0, short=short, designer_sampling=designer_sampling,
                                    executor_sampling=executor_sampling, on_phase=on_phase)
        correct = (batch.R >= 1 - 1e-6).float()            # [b, K, 1]: a code run counts when all tests pass
        per_problem += correct.mean(dim=(1, 2)).tolist()
        for run in batch.runs:
            structures[run.structure or "unparseable"] += 1
            errors += run.error is not None
        if progress is not None:
            progress.update(len(part))
    n = max(1, sum(structures.values()))
    return {"pass@1": sum(per_problem) / max(1, len(per_problem)), "per_problem": per_problem,
            "structures": {k: v / n for k, v in structures.items()}, "error_rate": errors / n}


def evaluate_all(benchmarks, designer_engine, executor_engine, methods, K=1, **kw):
    """results[method][benchmark] = evaluate_method(...); a tqdm bar over all problems of all methods."""
    total = sum(len(t) for _, t, _ in benchmarks) * len(methods)
    results = {}
    with tqdm(total=total, desc="evaluate", unit="problem", file=sys.stderr) as bar:
        for method in methods:
            for name, tasks, _ in benchmarks:
                bar.set_postfix_str(f"{method} on {name}")
                results.setdefault(method, {})[name] = evaluate_method(
                    tasks, designer_engine, executor_engine, method, K, progress=bar, **kw)
    return results


# ----------------------------------------------------------------------------------------------- tables
def _pct(x):
    return f"{100 * x:.2f}"


def results_table(results, bench_names):
    """Tables 1-2 of the paper: benchmarks as columns, methods as rows, the average last."""
    lines = ["| method | " + " | ".join(bench_names) + " | Avg |", "|---" * (len(bench_names) + 2) + "|"]
    for method, per in results.items():
        vals = [per[b]["pass@1"] for b in bench_names]
        lines.append(f"| {method} | " + " | ".join(_pct(v) for v in vals) + f" | {_pct(sum(vals) / len(vals))} |")
    return "\n".join(lines)


def structure_table(per_bench):
    """Table 6 of the paper: the share of each structure among the learned Designer's scripts."""
    cols = list(STRUCTURES) + ["unparseable"]
    lines = ["| benchmark | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, r in per_bench.items():
        lines.append(f"| {name} | " + " | ".join(_pct(r["structures"].get(c, 0.0)) for c in cols) + " |")
    return "\n".join(lines)


def write_results(out_dir, tables, record):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("\n\n".join(f"### {title}\n\n{table}" for title, table in tables) + "\n")
    (out / "results.json").write_text(json.dumps(record, indent=1))
    return out


# ----------------------------------------------------------------------------------------------- models
def load_engine(path, backend, **kw):
    if not (Path(path) / "config.json").exists() and not str(path).count("/") == 1:
        raise SystemExit(f"model not found: {path} (a folder with config.json, or a hub name like Qwen/Qwen3-8B)")
    return engine_lib.make_engine(str(path), backend=backend, **kw)


def latest_checkpoint(run_dir):
    """The newest HF-format checkpoint under a train.py output folder (or the folder itself)."""
    run_dir = Path(run_dir)
    if (run_dir / "config.json").exists():
        return run_dir
    found = sorted((p.parent for p in run_dir.glob("**/config.json")), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def sampling_of(args):
    d = engine_lib.Sampling(temperature=args.temperature, top_p=args.top_p, max_tokens=args.designer_max_tokens)
    e = engine_lib.Sampling(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)
    return d, e


# ----------------------------------------------------------------------------------------------- answers mode
def grade_answers(tasks, answers):
    """Grade existing outputs {id, output} against tasks with the training reward's grader: math by
    math_equal (on the tagged or boxed answer when there is one, else the whole text), code solved when every
    hidden test passes. Several outputs per id average (avg@K); a problem with no output counts as wrong."""
    by_id = {}
    for row in answers:
        by_id.setdefault(str(row.get("id")), []).append(str(row.get("output", "")))
    per_problem = []
    for task in tasks:
        outs = by_id.get(str(task["id"]), [])
        # reward.correctness is the training reward's grader: the same answer is right here and there
        scores = [float(reward.correctness(task, text) >= 1 - 1e-9) for text in outs]
        per_problem.append(sum(scores) / len(scores) if scores else 0.0)
    return {"pass@1": sum(per_problem) / max(1, len(per_problem)), "per_problem": per_problem,
            "answered": sum(str(t["id"]) in by_id for t in tasks)}


def main_answers(argv):
    p = argparse.ArgumentParser(prog="evaluate.py answers", description=grade_answers.__doc__)
    p.add_argument("--tasks", required=True)
    p.add_argument("--answers", required=True, help="JSONL rows with id and output")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    name, tasks, src = load_benchmark(a.tasks)
    if not Path(a.answers).exists():
        raise SystemExit(f"answers file not found: {a.answers}")
    rows = []
    for n, line in enumerate(Path(a.answers).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise SystemExit(f"{a.answers}:{n}: not valid JSON ({e.msg})") from None
    r = grade_answers(tasks, rows)
    print(f"{name}: pass@1 {_pct(r['pass@1'])}% over {len(tasks)} problems ({r['answered']} answered)")
    if a.out:
        write_results(a.out, [("answers", results_table({"answers": {name: r}}, [name]))],
                      {"answers": a.answers, "tasks": {name: {"file": str(src), "sha256": file_hash(src)}},
                       "results": {name: r}})
    return r


# ----------------------------------------------------------------------------------------------- statistics
def paired_margin(a, b):
    """Mean of a - b over the same problems, and its standard error (the spread of the per-problem
    differences / sqrt(n)): the draw of problems cancels, so this is the honest error bar of a margin."""
    d = [x - y for x, y in zip(a, b)]
    if not d:
        return float("nan"), float("nan")
    mean = sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / max(1, len(d) - 1)
    return mean, math.sqrt(var / len(d))


# ----------------------------------------------------------------------------------------------- main
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="one model playing both roles (shared policy)")
    p.add_argument("--designer", help="Designer model (separate policies)")
    p.add_argument("--executor", help="Executor model (separate policies)")
    p.add_argument("--pairings", nargs="+", metavar="NAME=PATH",
                   help="evaluate every designer x executor pairing of these checkpoints (e.g. sft=... rl=...)")
    p.add_argument("--tasks", nargs="+", default=None)
    p.add_argument("--mode", nargs="+", default=None,
                   help="methods: auto (learned designer), single, template:NAME; default all of them")
    p.add_argument("--samples", type=int, default=1, help="K: pass@1 averaged over K samples per problem")
    p.add_argument("--backend", default="auto", choices=["auto", "vllm", "hf"])
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-tokens", type=int, default=4096, help="per Executor call")
    p.add_argument("--designer-max-tokens", type=int, default=2048)
    p.add_argument("--short-prompt", action="store_true", help="the tiny world's one-line Designer prompt")
    p.add_argument("--n-tiny", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/eval")
    return p.parse_args(argv)


def tiny_defaults(a):
    """No arguments: the SFT model and the latest tiny RL checkpoint on held-out tiny tasks."""
    sft = ROOT / "out" / "tiny-sft"
    if not (sft / "config.json").exists():
        raise SystemExit("out/tiny-sft not found: run `python sft.py` (or `python train.py`) first")
    pairs = [f"sft={sft}"]
    rl = latest_checkpoint(ROOT / "out" / "tiny-rl") if (ROOT / "out" / "tiny-rl").exists() else None
    if rl is not None:
        pairs.append(f"rl={rl}")
    a.pairings, a.tasks, a.short_prompt = pairs, ["tiny"], True
    a.temperature, a.top_p, a.max_tokens, a.designer_max_tokens = 1.0, 1.0, 128, 400
    return a


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["answers"]:
        return main_answers(argv[1:])
    a = parse_args(argv)
    if not argv:
        a = tiny_defaults(a)
    if not a.tasks:
        raise SystemExit("--tasks is required (a task file, or aime24 / aime25 / olympiadbench / tiny)")
    if not (a.model or a.designer or a.executor or a.pairings):
        raise SystemExit("give --model, or --designer and --executor, or --pairings")
    for m in a.mode or []:
        if m not in ("auto", "single") and not m.startswith("template:"):
            raise SystemExit(f"unknown mode {m!r}: use auto, single or template:NAME")
    methods = a.mode or ["single"] + [f"template:{t}" for t in mas.TEMPLATES if t != "single"] + ["auto"]
    benchmarks = [load_benchmark(t, a.n_tiny) for t in a.tasks]
    names = [b[0] for b in benchmarks]
    dsamp, esamp = sampling_of(a)
    kw = {"seed": a.seed, "short": a.short_prompt, "designer_sampling": dsamp, "executor_sampling": esamp}
    record = {"tasks": {n: {"file": str(src) if src else None, "sha256": file_hash(src),
                            "ids": [str(t["id"]) for t in tasks]} for n, tasks, src in benchmarks},
              "samples": a.samples, "backend": a.backend, "seed": a.seed,
              "sampling": {"designer": vars(dsamp), "executor": vars(esamp)}}
    tables = []
    if a.pairings:
        models = dict(x.split("=", 1) for x in a.pairings)
        engines = {k: load_engine(v, a.backend) for k, v in models.items()}
        record["models"] = models
        record["pairings"] = {}
        base = next(iter(engines))
        # baselines once, with the first checkpoint as the executor; then every designer x executor pairing
        res = evaluate_all(benchmarks, engines[base], engines[base],
                           [m for m in methods if m != "auto"], a.samples, **kw)
        res = {f"{m} ({base} executor)": r for m, r in res.items()}
        for dn, de in engines.items():
            for en, ee in engines.items():
                r = evaluate_all(benchmarks, de, ee, ["auto"], a.samples, **kw)["auto"]
                res[f"designer {dn} x executor {en}"] = r
                record["pairings"][f"{dn}/{en}"] = {b: r[b]["pass@1"] for b in names}
        tables.append(("pass@1 (%)", results_table(res, names)))
        for key, r in res.items():
            if key.startswith("designer"):
                tables.append((f"structure shares (%), {key}", structure_table(r)))
    else:
        if a.model:
            d = e = load_engine(a.model, a.backend)
            record["models"] = {"shared": a.model}
        else:
            if not (a.designer and a.executor):
                raise SystemExit("separate policies need both --designer and --executor")
            d, e = load_engine(a.designer, a.backend), load_engine(a.executor, a.backend)
            record["models"] = {"designer": a.designer, "executor": a.executor}
        res = evaluate_all(benchmarks, d, e, methods, a.samples, **kw)
        tables.append(("pass@1 (%)", results_table(res, names)))
        if "auto" in res:
            tables.append(("structure shares of the learned Designer (%)", structure_table(res["auto"])))
    record["results"] = res
    out = write_results(a.out, tables, record)
    for title, table in tables:
        print(f"\n{title}\n{table}")
    print(f"\nwritten: {out / 'results.md'}, {out / 'results.json'}")
    return res


if __name__ == "__main__":
    main()
