"""results.py: what an evaluation writes: OUT/results.md (a header that names the models, the
protocol, the settings and where they came from, each benchmark's source, split, subset and count,
and the samples a problem; then the paper's tables) and OUT/results.json (the same, every
problem's result, each task file's SHA-256 and ids). evaluate.py calls write_results.

    results_table(results, names)    Tables 1-2 of the paper: benchmarks as columns, methods as rows
    structure_table(per_benchmark)   Table 6: each structure's share of the learned Designer's
                                     scripts
    write_results(a, used, benchmarks, names, results, world)   both files, the tables printed
    paper_table(["out/eval-base", "out/eval-sft", "out/eval-rl"])   Table 1 across evaluations
                                     (`python evaluate.py --table DIR [DIR ...]` prints it)
    paired_margin(a, b)              a margin over the same problems and its standard error

`a` is evaluate.py's arguments, `used` its settings_used().

Needs: machinery/data.py (the manifest beside a task file)
"""

import hashlib
import json
import math
import os
from pathlib import Path

from machinery import data

STRUCTURES = ("single", "ensemble", "critic", "tester", "other")  # (mas.structure_of's names)
# Table 1's columns in the paper's order (LiveCodeBench, APPS, CodeContests, AIME24, AIME25,
# OlympiadBench), by evaluate.py's benchmark names; any other set follows, as first met
PAPER_ORDER = (
    "livecodebench",
    "apps500",
    "apps",
    "codecontests",
    "aime24",
    "aime25",
    "olympiadbench",
)


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
    cols = [*STRUCTURES, "unparseable"]
    lines = ["| benchmark | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, r in per_bench.items():
        lines.append(
            f"| {name} | " + " | ".join(_pct(r["structures"].get(c, 0.0)) for c in cols) + " |"
        )
    return "\n".join(lines)


def sha256(path):
    """The file's SHA-256 (hex), or None for no file (the tiny tasks are made, not read)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None


def benchmark_line(name, tasks, src, K):
    """What one benchmark of the table is: its source, split, subset and count (from the manifest
    `machinery/data.py prepare` writes beside its task file), and the samples a problem."""
    count = f"{len(tasks)} problems x {K} sample{'s' if K != 1 else ''} a problem"
    if name == "tiny":
        return (
            f"{name}: the tiny world's held-out eval split ({src}), its first {len(tasks)}; {count}"
        )
    path = Path(data.manifest_path(str(src))) if src else None
    if path is None or not path.is_file():
        return f"{name}: the task file {src} (no manifest beside it); {count}"
    m = json.loads(path.read_text())
    rev = m.get("revision")
    if isinstance(rev, str):  # the published files at a commit
        origin = f"{m.get('source')} {', '.join(map(str, m.get('files', [])))} @ {rev[:12]}"
    else:  # prepare --from: local files in the published shape
        names = ", ".join(os.path.basename(str(f)) for f in m.get("files", []))
        origin = f"{m.get('source')}'s shape, from local files ({names})"
    subset = "; ".join(x for x in (m.get("filter"), m.get("subset")) if x) or "every row"
    return (
        f"{name}: {origin}; split {m.get('split')}; {subset}; {m.get('written')} problems "
        f"({m.get('rows_read')} rows read); {count}"
    )


def header(a, used, K, world, benchmarks=()):
    """results.md's header: what was evaluated (each benchmark's source, split, subset and count,
    and the samples a problem), with which protocol and settings, and from where."""
    models = f"--model {a.model}" if a.model else f"--designer {a.designer} --executor {a.executor}"
    sets = [f"  - {benchmark_line(n, tasks, src, K)}" for n, tasks, src in benchmarks]
    if sets:
        sets.insert(0, "- benchmarks (source; split; subset; problems x samples a problem):")
    return "\n".join(
        [
            "# evaluate.py",
            "",
            f"- models: {models}" + (f" (run {a.run}, step {a.step})" if a.run else ""),
            f"- protocol: {used['protocol']}: temperature {used['temperature']}, top_p "
            f"{used['top_p']} ({used['protocol_label']}); K = {K}",
            f"- settings from {used['from']}"
            + (f"; flags: {' '.join(used['flags'])}" if used["flags"] else ""),
            f"- backend: {used['backend']}; engine_kwargs: {json.dumps(used['engine_kwargs'])}",
            f"- chat_template_kwargs: {json.dumps(used['chat_template_kwargs'])}",
            f"- max_tokens: {used['max_tokens']}; designer_max_tokens: "
            f"{used['designer_max_tokens']}; short prompts: {used['short_prompt']}",
            f"- ranks: {world}",
            *sets,
        ]
    )


def write_results(a, used, benchmarks, names, res, world):
    """OUT/results.md (the header, then the tables) and OUT/results.json; the tables printed."""
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
                "what": benchmark_line(n, tasks, src, a.samples),
                "ids": [str(t["id"]) for t in tasks],
            }
            for n, tasks, src in benchmarks
        },
        "models": models,
        "run": {"dir": a.run, "step": a.step} if a.run else None,
        "samples": a.samples,
        "ranks": world,
        "settings": used,
        "backend": used["backend"],
        "chat_template_kwargs": used["chat_template_kwargs"],
        "seed": a.seed,
        "sampling": {
            "protocol": used["protocol"],
            "label": used["protocol_label"],
            "designer": {
                "temperature": used["temperature"],
                "top_p": used["top_p"],
                "max_tokens": used["designer_max_tokens"],
            },
            "executor": {
                "temperature": used["temperature"],
                "top_p": used["top_p"],
                "max_tokens": used["max_tokens"],
            },
        },
        "results": res,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    head = header(a, used, a.samples, world, benchmarks)
    (out / "results.md").write_text(
        head + "\n\n" + "\n\n".join(f"### {title}\n\n{table}" for title, table in tables) + "\n"
    )
    (out / "results.json").write_text(json.dumps(record, indent=1))
    print(head)
    for title, table in tables:
        print(f"\n{title}\n{table}")
    print(f"\nwritten: {out / 'results.md'}, {out / 'results.json'}")


def paper_table(folders):
    """The paper's Table 1 across evaluations: a row per (evaluated model, method) of each folder's
    results.json (the base model's single agent, the cold start's and the RL model's learned
    Designer...), a column per benchmark any of them has (PAPER_ORDER first), pass@1 in percent,
    then `average`: the row's mean over every column, "-" where the row lacks one (the paper's Avg
    is over the same six sets for every row)."""
    if not folders:
        raise SystemExit("evaluate.py --table: give the evaluations' folders (their --out)")
    rows, names = [], []
    for folder in folders:
        path = Path(folder) / "results.json"
        if not path.is_file():
            raise SystemExit(
                f"evaluate.py --table: no results.json in {folder} (its --out writes one)"
            )
        record = json.loads(path.read_text())
        run = record.get("run")
        model = f"{run['dir']} step {run['step']}" if run else " + ".join(record["models"].values())
        for method, per in record["results"].items():
            rows.append((model, method, {b: r["pass@1"] for b, r in per.items()}))
            names += [b for b in per if b not in names]
    cols = [b for b in PAPER_ORDER if b in names] + [b for b in names if b not in PAPER_ORDER]
    lines = ["| model | method | " + " | ".join(cols) + " | average |"]
    lines.append("|---" * (len(cols) + 3) + "|")
    for model, method, per in rows:
        cells = [_pct(per[b]) if b in per else "-" for b in cols]
        mean = _pct(sum(per[b] for b in cols) / len(cols)) if set(cols) <= set(per) else "-"
        lines.append(f"| {model} | {method} | " + " | ".join(cells) + f" | {mean} |")
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
