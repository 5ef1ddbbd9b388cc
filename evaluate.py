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

train.py's final table is here too (final_table: the RL and SFT models on held-out tiny tasks, sampled and
exact by teacher forcing, with paired standard errors from paired_margin).

Needs: settings.py, stagewise.py, engine.py, decode.py, chunked.py, tiny.py, rollout.py, mas.py, sandbox.py, reward.py, data.py
"""

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent
SHARED = ROOT.parent / "shared" / "data" / "benchmarks"
NAMED = {"aime24": "aime24.jsonl", "aime25": "aime25.jsonl", "olympiadbench": "olympiadbench.jsonl"}
STRUCTURES = ("single", "ensemble", "critic", "tester", "other")
TINY_EVAL_SEED = 10_007      # held-out tiny tasks: the "eval" split (tiny.SPLITS), which SFT and RL never see


# ----------------------------------------------------------------------------------------------- tasks
def load_benchmark(spec, n_tiny=100):
    """(name, tasks, source file or None) for a benchmark name or a task file; clear errors otherwise."""
    import data
    if spec == "tiny":
        import tiny
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
    import rollout as rollout_lib
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
    from tqdm import tqdm
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
    import engine as engine_lib
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
    import engine as engine_lib
    d = engine_lib.Sampling(temperature=args.temperature, top_p=args.top_p, max_tokens=args.designer_max_tokens)
    e = engine_lib.Sampling(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)
    return d, e


# ----------------------------------------------------------------------------------------------- answers mode
def grade_answers(tasks, answers):
    """Grade existing outputs {id, output} against tasks with the training reward's grader: math by
    math_equal (on the tagged or boxed answer when there is one, else the whole text), code solved when every
    hidden test passes. Several outputs per id average (avg@K); a problem with no output counts as wrong."""
    import reward
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


# ----------------------------------------------------------------------------------------------- train.py's final table
# the tiny default ends with it: held-out tasks, learned designs vs SFT designs vs a single agent


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


def exact_figures_of(tok, tasks, designer, executor):
    """tiny.exact_figures of a (designer, executor) pair: the Designer's choice from the designer's model, the
    oracle reply's probability from the executor's (separate policies: another model)."""
    import tiny
    d = tiny.exact_figures(designer, tok, tasks)
    if executor is not designer:
        d["oracle"] = tiny.exact_figures(executor, tok, tasks)["oracle"]
    return d


def heldout_row(cfg, eng, tasks, template, on_phase):
    """One sampled row of the final table: 1 design x 1 execution a task -> (reward, accuracy, structure shares
    as text, per-task correct)."""
    import engine as engine_lib
    import rollout as rollout_lib
    import settings
    b = rollout_lib.rollout(tasks, eng, eng, 1, 1, 10**6, seed=cfg.seed + 31, template=template,
                            designer_sampling=engine_lib.Sampling(max_tokens=cfg.designer_max_tokens),
                            executor_sampling=engine_lib.Sampling(max_tokens=cfg.max_tokens),
                            short=settings.is_tiny(cfg), lam=cfg.lam, on_phase=on_phase)
    recs = b.records(tasks)
    n, shares = max(len(recs), 1), Counter(r["structure"] for r in recs)
    return (sum(r["reward"] for r in recs) / n, sum(r["correct"] for r in recs) / n,
            ", ".join(f"{k} {v / n:.0%}" for k, v in shares.most_common()), [float(r["correct"]) for r in recs])


def final_table(cfg, eng, sources, ckpt):
    """train.py's last act (eval_tasks > 0, tiny data, rank 0): the RL models of checkpoint `ckpt` and the SFT
    cold start on the same held-out tasks, sampled and exact, printed and written to out_dir/final_table.json.
    `eng` is the run's engine: each row loads the weights it needs into it.

    Rows: sampled accuracy of the learned designs and of the single agent, RL against SFT with paired standard
    errors, and exact rows by teacher forcing (tiny.exact_figures): P(the Designer writes each template | kind of
    task) and P(the single agent writes the oracle reply). Sampled accuracy on 200 tasks carries ~3.5 points of
    noise; the exact rows show what the Designer learned even when the accuracy cannot resolve it."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import mas
    import settings
    import tiny
    tasks = heldout_tasks(cfg, sources)
    sft = settings.model_dirs(cfg)
    dirs = {"RL": {r: os.path.join(ckpt, "model" if cfg.policy == "shared" else r) for r in ("designer", "executor")},
            "SFT": {r: sft["model" if cfg.policy == "shared" else r] for r in ("designer", "executor")}}
    rows, exact = [], {}
    for who in ("RL", "SFT"):
        loaded = {d: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32) for d in set(dirs[who].values())}
        models = {r: loaded[d] for r, d in dirs[who].items()}   # shared: one model plays both roles
        eng.load_weights(models["designer"].state_dict())
        # separate policies: the engine holds the designer's weights in the design phase, the executor's after
        on_phase = (lambda role, m=models: eng.load_weights(m[role].state_dict())) \
            if cfg.policy == "separate" else None
        rows += [("RL: learned designs" if who == "RL" else "SFT: designs", heldout_row(cfg, eng, tasks, None, on_phase)),
                 (f"{who}: single agent", heldout_row(cfg, eng, tasks, "single", on_phase))]
        tok = AutoTokenizer.from_pretrained(dirs[who]["designer"])
        exact[who] = exact_figures_of(tok, tasks, models["designer"], models["executor"])
    with open(os.path.join(cfg.out_dir, "metrics.jsonl")) as f:
        rs = [json.loads(ln)["reward/mean"] for ln in f if ln.strip()]
    k = max(1, min(5, len(rs) // 2))
    # every step draws other queries, so first vs last mixes learning with how hard the draws were
    print(f"\ntraining reward (mean of {k} steps): first {np.mean(rs[:k]):.3f} -> last {np.mean(rs[-k:]):.3f} "
          "(other queries at every step; the paired held-out rows below are the measure)")
    print(f"held-out tiny tasks: {len(tasks)} (1 design x 1 execution each, T=1)")
    print(f"{'':24s} {'reward':>7s} {'accuracy':>9s}  structures")
    for name, (rw, acc, sh, _) in rows:
        print(f"{name:24s} {rw:7.3f} {acc:9.1%}  {sh}")
    # RL and SFT rows ran on the same tasks in the same order: the paired difference is the honest error bar
    gains = {}
    for what, a, b in (("learned designs", 0, 2), ("single agent", 1, 3)):
        gains[what] = paired_margin(rows[a][1][3], rows[b][1][3])
        print(f"RL - SFT, {what + ':':16s} {100 * gains[what][0]:+5.1f} points (paired standard error "
              f"{100 * gains[what][1]:.1f})")
    # the same comparison without sampling noise: what each model would write, by teacher forcing
    kinds, names = sorted({t["kind"] for t in tasks}), list(mas.TEMPLATES)
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
             "rl_minus_sft": {w: {"points": 100 * m, "stderr": 100 * se} for w, (m, se) in gains.items()},
             # per task, in the order of "ids", so that runs of one seed (the same tasks) can be paired task by
             # task (ablations.py): the sampled rows' correctness and the exact probabilities
             "ids": [str(t["id"]) for t in tasks], "kinds": [t["kind"] for t in tasks],
             "per_task": {"correct": {name: r[3] for name, r in rows},
                          "exact": {who: {**summary[who], "choice": {n: [c[n] for c in f["choice"]] for n in names}}
                                    for who, f in exact.items()}}}
    with open(os.path.join(cfg.out_dir, "final_table.json"), "w") as f:   # for scripts (ablations.py)
        json.dump(table, f, indent=1)


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
    import mas
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
