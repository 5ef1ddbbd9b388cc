"""ablations.py: the paper's ablations in miniature, on the tiny world, with several seeds.

Every run is `python train.py config/tiny.py` plus a few overrides (`runs()` below), so a run here and the
tiny default differ only in what that table says. All runs start from the same SFT cold start (out/tiny-sft,
which train.py makes when it is missing), except `separate`, which starts from two role-specific ones
(out/tiny-sft-separate/designer and executor, which train.py makes the same way). One run per (name, seed)
goes to ROOT/<name>-s<seed>/: its metrics.jsonl, checkpoints, final_table.json and train.log.

The comparisons (COMPARISONS) and what each tests:

    hierarchy     metaagent (M=4 x N=4) vs flat8 (M=8 x N=1) and flat16 (M=16 x N=1)          (paper Table 3)
                  flat8 runs half as many executions per query, flat16 as many. With N=1 the designer and
                  executor advantages coincide: the flat runs lose the decomposed credit assignment.
    schedule      stagewise (metaagent) vs coupled, designer-only, executor-only     (Table 4, Figure 3)
    policy        shared (metaagent) vs separate policies                                    (Table 5)
    stage_length  K = 1, 10, 30 (metaagent), scaled to the run length                      (Figure 4)
    single_agent  metaagent vs single-agent GRPO (--template=single --mode=executor: no Designer, the same 16
                  executions per query)
    pairings      did both roles improve? {SFT, RL} designer x {SFT, RL} executor of the metaagent run
                  reduces, on the exact rows, to two differences: P(suited template) depends on the Designer's
                  model alone, P(oracle reply) on the Executor's alone

Stage length: a tiny run has far fewer steps than the paper's, so K(paper_K) = max(1, round(paper_K * steps /
90)): K30 = steps/3 (three stages), K10 = steps/9, K1 = 1. Every other run uses K30, so `metaagent` is also
the K=30 point.

    python ablations.py                          # every run, seeds 0,1,2, --steps 30, into out/ablations
    python ablations.py --jobs 2                 # two runs at a time, each pinned to its own cores
    python ablations.py --seeds 0,1 --steps 90 --root out/abl90 --only metaagent,flat8
    python ablations.py report out/ablations     # ROOT/RESULTS.md
    python ablations.py publish out/ablations    # the numbers (no checkpoints) into results/ablations, and
                                                 # RESULTS.md there

A finished run is skipped and an unfinished one resumed from its last checkpoint, so the same command
continues an interrupted set; runs go seed by seed, so a partial set has every run of its first seeds.

What the report computes, from each run's metrics.jsonl and final_table.json (tests/test_ablations.py checks
that the committed results/ablations/RESULTS.md is what `report` makes of the committed numbers):

    P(suited template)    primary, exact by teacher forcing per held-out task: the Designer's probability of
    P(oracle reply)       the template suited to the task's kind, the single agent's of the oracle reply
    held-out accuracy     secondary: the final table's sampled "RL: learned designs" row (single-agent GRPO:
                          its "RL: single agent" row), per task
    training reward       secondary: reward/mean over the last 20% of steps (change: minus the first 20%)
    RL - SFT              a run's RL model minus its own cold start on the same tasks
    A - B                 paired: the same seed means the same training queries and the same held-out tasks
                          (checked by task id), so per seed d_s = mean over tasks of A - B with its paired
                          standard error w_s; D = mean_s d_s, SE = max(std_s(d_s) / sqrt(S),
                          sqrt(sum_s w_s^2) / S). One rule: beyond noise when |D| > 2 SE ("held" in the
                          paper's direction, "reversed" against it), else "within noise"

Needs: evaluate.py, engine.py, decode.py, chunked.py, tiny.py, rollout.py, mas.py, sandbox.py, isolation.py,
reward.py, data.py; and it runs train.py as a program
"""

import argparse
import json
import math
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import evaluate

REPO = os.path.dirname(os.path.abspath(__file__))
SFT_DIR = "out/tiny-sft"      # config/tiny.py's init_from: the shared cold start (relative to the repo)
TAIL = 0.2                    # the last 20% of steps summarise a run
RESULTS_DIR = os.path.join(REPO, "results", "ablations")


# ----------------------------------------------------------------------------------------------------------
# the runs: train.py overrides on top of config/tiny.py


def stage_length(paper_k, budget):
    """The paper's stage length K (out of 1, 10, 30) scaled to a run of `budget` updates per role: K=30 is the
    tiny default's budget/2 (two stages of each role); the others the K that divides the budget (so that both
    roles get exactly `budget` updates) nearest to paper_k * (budget/2) / 30."""
    return min((k for k in range(1, budget + 1) if budget % k == 0),
               key=lambda k: (abs(k - paper_k * budget / 60), k))


def runs(budget):
    """{run name: {config key: value}}: what each run sets on top of config/tiny.py, `budget` updates of each
    role it trains. A stagewise run trains one role a step (2 * budget steps), coupled both (budget steps),
    designer-only, executor-only and single-agent GRPO one role (budget steps)."""
    base = {"M": 4, "N": 2, "K": stage_length(30, budget), "steps": 2 * budget}   # the tiny default
    return {"metaagent": base, "flat8": {**base, "M": 8, "N": 1}, "flat16": {**base, "M": 16, "N": 1},
            "coupled": {**base, "mode": "coupled", "steps": budget},
            "designer": {**base, "mode": "designer", "steps": budget},
            "executor": {**base, "mode": "executor", "steps": budget},
            "separate": {**base, "policy": "separate", "init_from": "out/tiny-sft-separate"},
            "k1": {**base, "K": stage_length(1, budget)}, "k10": {**base, "K": stage_length(10, budget)},
            "single": {**base, "template": "single", "mode": "executor", "steps": budget}}  # single-agent GRPO


RUN_NAMES = list(runs(20))

# name: (title, claims (A, B) = "the paper found A better than B", the paper's finding, a note)
COMPARISONS = {
    "hierarchy": ("Hierarchical 4x4 vs flat (paper Table 3)",
                  [("metaagent", "flat8"), ("metaagent", "flat16")], "hierarchical M=4xN=4 > flat M=8xN=1",
                  "flat8 runs half the executions of 4x4, flat16 as many."),
    "schedule": ("Stagewise vs coupled vs single-role training (paper Table 4, Figure 3)",
                 [("metaagent", "coupled"), ("coupled", "designer"), ("coupled", "executor")],
                 "stagewise > coupled > single-role", "metaagent is the stagewise run."),
    "policy": ("Shared vs separate policies (paper Table 5)", [("metaagent", "separate")],
               "shared >= separate", "separate starts from its own two role-specific SFT models."),
    "stage_length": ("Stage length K in {1, 10, 30}, scaled to the run (paper Figure 4)",
                     [("metaagent", "k10"), ("metaagent", "k1")], "K=30 best",
                     "metaagent is the K=30 point."),
    "single_agent": ("MetaAgent-X vs single-agent GRPO", [("metaagent", "single")],
                     "MetaAgent-X > single-agent GRPO", "single: no Designer, 16 executions a query."),
}
PAIRINGS = ("## {SFT, RL} designer x {SFT, RL} executor (metaagent)\n\nP(suited template) depends on the "
            "Designer's model alone and P(oracle reply) on the Executor's alone, so on the exact rows the "
            "four pairings reduce to two differences. Paper: both roles improve. Here:\n")


def out_dir(root, run, seed):
    return os.path.join(root, f"{run}-s{seed}")


def train_command(run, seed, budget, root):
    """The train.py command line (run from the repo root) of one run."""
    return [sys.executable, "train.py", "config/tiny.py", f"--out_dir={out_dir(root, run, seed)}",
            f"--seed={seed}", *(f"--{k}={v}" for k, v in runs(budget)[run].items())]


# ----------------------------------------------------------------------------------------------------------
# running: train.py subprocesses, `jobs` at a time, finished runs skipped, unfinished ones resumed


def read_metrics(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def is_finished(run_dir, steps):
    """All steps logged and the final table written (train.py's last act)."""
    rows = read_metrics(run_dir)
    return bool(rows) and rows[-1]["step"] == steps and os.path.exists(f"{run_dir}/final_table.json")


# the trampoline that pins a program to some cores before it starts: python -c PIN 0,1 train.py ...
PIN = ("import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')}); "
       "os.execv(sys.executable, [sys.executable] + sys.argv[2:])")


def launch(cmd, log_path, cpus=None, echo=True):
    """Run cmd (a Python program: cmd[0] is sys.executable) in the repo root, on the cores `cpus` when
    given; its output is appended to log_path and, with echo, printed too. Returns rc."""
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        argv = [cmd[0], "-c", PIN, ",".join(map(str, cpus)), *cmd[1:]] if cpus else cmd
        p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in p.stdout:
            log.write(line)
            if echo:
                sys.stdout.write(line)
        return p.wait()


def run_one(run, seed, budget, root, cpus=None, echo=True):
    """'skipped' | 'ok' | 'failed (rc N)'. run.json records the command; a different one in the same
    out_dir is an error (resuming with other settings would mix two runs)."""
    d, cmd = out_dir(root, run, seed), train_command(run, seed, budget, root)
    if os.path.exists(f"{d}/run.json"):
        with open(f"{d}/run.json") as f:
            before = json.load(f)["cmd"]
        if before[1:] != cmd[1:]:
            raise SystemExit(f"ablations.py: {d} was made by a different command:\n  {' '.join(before[1:])}\n"
                             f"now:\n  {' '.join(cmd[1:])}\nuse another --root or delete {d}")
    if is_finished(d, runs(budget)[run]["steps"]):
        print(f"== {run} seed {seed}: finished, skipped ({d})", flush=True)
        return "skipped"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/run.json", "w") as f:
        json.dump({"cmd": cmd}, f)
    print(f"== {run} seed {seed}: {' '.join(cmd[1:])}" + (f" (cores {cpus})" if cpus else ""), flush=True)
    # an interrupted run continues from its last checkpoint (train.py refuses a fresh run into its folder)
    resume = ["--resume"] if os.path.exists(f"{d}/metrics.jsonl") else []
    rc = launch(cmd + resume, f"{d}/train.log", cpus, echo)
    print(f"== {run} seed {seed}: {'ok' if rc == 0 else f'failed (rc {rc})'}", flush=True)
    return "ok" if rc == 0 else f"failed (rc {rc})"


def run_all(a):
    """Every (run, seed), seed by seed, a.jobs at a time: with one job on every core, its output printed;
    with more, each on a free one of a.jobs disjoint sets of cores (usable[k::jobs]), its output in its log
    only (train.py sizes its threads to the cores it may use). A run whose cold start is missing makes it
    (train.py): the runs that need the same one wait for it instead of making it twice at once."""
    names = [r for r in RUN_NAMES if not a.only or r in a.only]
    print(f"ablations.py: runs {', '.join(names)}; seeds {a.seeds}; {a.budget} updates per role; root {a.root}; "
          f"{a.jobs} at a time", flush=True)
    usable = sorted(os.sched_getaffinity(0))
    if a.jobs > len(usable):
        raise SystemExit(f"ablations.py: --jobs {a.jobs}, but this process has {len(usable)} cores")
    free, building = queue.Queue(), {}
    for k in range(a.jobs):
        free.put(usable[k::a.jobs] if a.jobs > 1 else None)

    def one(run_seed):
        (run, seed), cpus = run_seed, free.get()
        init = os.path.join(REPO, runs(a.budget)[run].get("init_from", SFT_DIR))
        try:
            if not os.path.isdir(init):
                with building.setdefault(init, threading.Lock()):
                    if not os.path.isdir(init):     # the first run here makes it
                        return run_one(run, seed, a.budget, a.root, cpus, a.jobs == 1)
            return run_one(run, seed, a.budget, a.root, cpus, a.jobs == 1)
        except SystemExit as e:   # a refused folder: the others go on, the summary names it
            return f"failed ({e})"
        finally:
            free.put(cpus)
    work = [(run, seed) for seed in a.seeds for run in names]
    with ThreadPoolExecutor(a.jobs) as pool:
        status = dict(zip((f"{run}-s{seed}" for run, seed in work), pool.map(one, work)))
    print("\n".join(f"  {k}: {v}" for k, v in status.items()), f"\nthen: python ablations.py report {a.root}")
    return 1 if any(v.startswith("failed") for v in status.values()) else 0


# ----------------------------------------------------------------------------------------------------------
# the report: ROOT/RESULTS.md


def summarize(run_dir, run):
    """One run's numbers: its training curve from metrics.jsonl and, per held-out task, its final table's
    exact and sampled measures for the RL model and the SFT cold start (None without a metrics.jsonl). The
    sampled rows that stand for a run: its learned designs, or for single-agent GRPO the single agent."""
    rows = read_metrics(run_dir)
    if not rows:
        return None
    n = max(1, math.ceil(TAIL * len(rows)))
    mean = lambda key, part: sum(r.get(key, 0.0) for r in part) / len(part)
    out = {"steps": len(rows), "train_reward": mean("reward/mean", rows[-n:]),
           "train_change": mean("reward/mean", rows[-n:]) - mean("reward/mean", rows[:n]),   # did it learn?
           "structures": {k[len("structure/"):]: mean(k, rows[-n:]) for k in {k for r in rows[-n:] for k in r}
                          if k.startswith("structure/")},
           "ids": None, "tasks": {}}
    sampled = ("RL: single agent", "SFT: single agent") if run == "single" else \
        ("RL: learned designs", "SFT: designs")
    try:
        with open(os.path.join(run_dir, "final_table.json")) as f:
            table = json.load(f)
        per = table["per_task"]
        out["tasks"] = {who: {"suited": per["exact"][who]["suited"], "oracle": per["exact"][who]["oracle"],
                              "accuracy": per["correct"][row]} for who, row in zip(("RL", "SFT"), sampled)}
        out["ids"] = table["ids"]
    except (OSError, ValueError, KeyError, TypeError):
        pass   # no (readable) final table yet: the run has a curve but no held-out measures
    return out


def collect(root, unfinished=None):
    """{run: {seed: summary}} for every ROOT/<run>-s<seed> with a metrics.jsonl and a final table; a run
    without its final table yet is left out and named in `unfinished`."""
    out = {}
    for name in sorted(os.listdir(root)):
        m = re.fullmatch(r"(.+)-s(\d+)", name)
        if not (m and m[1] in RUN_NAMES and (s := summarize(os.path.join(root, name), m[1]))):
            continue
        if s["tasks"]:   # train.py writes the final table after its last step
            out.setdefault(m[1], {})[int(m[2])] = s
        elif unfinished is not None:
            unfinished.append(f"{name} ({s['steps']} steps, no final table)")
    return out


# statistics: one rule for every difference in the report

def paired(pairs):
    """pairs: per seed, two lists over the same held-out tasks (x_s, y_s). Returns (D, SE, seeds):

        d_s  = mean_t (x_st - y_st),  w_s its paired standard error over tasks   (evaluate.paired_margin)
        D    = mean_s d_s
        SE   = max(std_s(d_s) / sqrt(S),  sqrt(sum_s w_s^2) / S)        (S = 1: SE = w_1)

    The first term is the seed-to-seed spread: it holds both the training run's own randomness and the draw
    of tasks (each seed has its own held-out tasks). The second is the task-sampling error alone; the larger
    of the two is taken, so that three seeds that happen to agree cannot make a difference look sharper than
    its tasks allow. A one-number-per-seed measure (the training reward) has w_s = 0."""
    if not pairs:
        return None, None, 0
    ds, ws = zip(*(evaluate.paired_margin(x, y) for x, y in pairs))
    S, D = len(ds), sum(ds) / len(ds)
    task_se = math.sqrt(sum(w * w for w in ws)) / S
    if S == 1:
        return D, task_se, 1
    return D, max(math.sqrt(sum((d - D) ** 2 for d in ds) / (S - 1) / S), task_se), S


def verdict(D, SE, S):
    """The report's one rule: A - B is beyond noise when |D| > 2 SE. One seed says nothing about the run's own
    randomness (SE holds the draw of tasks alone), so it gets no verdict."""
    if D is None:
        return "missing"
    if S < 2:
        return "undecided (1 seed)"
    return "held" if D > 2 * SE else "reversed" if D < -2 * SE else "within noise"


def measure(results, a, b, key, who_a="RL", who_b="RL"):
    """(D, SE, seeds) of run a's `who_a` model minus run b's `who_b` on per-task measure `key` ("suited",
    "oracle", "accuracy"), or of the training reward ("train_reward"), over the seeds both runs have and on
    which they saw the same held-out tasks. who = "gain": the RL model minus the run's own cold start, task by
    task, so that runs from different cold starts (separate policies) compare what RL added."""
    def per_task(s, who):
        t = s["tasks"]
        return [r - c for r, c in zip(t["RL"][key], t["SFT"][key])] if who == "gain" else t[who][key]
    pairs = []
    for seed in sorted(set(results.get(a, {})) & set(results.get(b, {}))):
        sa, sb = results[a][seed], results[b][seed]
        if key == "train_reward":
            pairs.append(([sa[key]], [sb[key]]))
        elif sa["ids"] == sb["ids"]:
            pairs.append((per_task(sa, who_a), per_task(sb, who_b)))
    return paired(pairs)


MEASURES = [("suited", "P(suited template)", 100), ("oracle", "P(oracle reply)", 100),   # (key, label, scale)
            ("accuracy", "held-out accuracy (sampled)", 100), ("train_reward", "training reward", 1)]


def diff_text(D, SE, S, scale, digits=1):
    if D is None:
        return "n/a"
    return f"{scale * D:+.{digits}f} ± {scale * SE:.{digits}f}" + ("" if S > 1 else " (1 seed)")


def mean_of(results, run, who, key):
    """Mean over a run's seeds and tasks of a per-task measure (a probability, an accuracy), in percent."""
    per = [sum(s["tasks"][who][key]) / len(s["tasks"][who][key]) for s in results.get(run, {}).values()]
    return 100 * sum(per) / len(per) if per else float("nan")


def claim_sentence(a, b, results):
    """One line per claim: A - B in RL's gain over the cold start on each measure (the same as RL - RL where
    both runs start from one cold start), with its SE and verdict (exact rows first: they decide)."""
    parts = []
    for key, label, scale in MEASURES:
        D, SE, S = measure(results, a, b, key, "gain", "gain")
        if D is not None:
            parts.append(f"{label} {diff_text(D, SE, S, scale, 1 if scale == 100 else 3)}, "
                         f"{verdict(D, SE, S)}")
    seeds = len(set(results.get(a, {})) & set(results.get(b, {})))
    return f"{a} > {b} (seeds: {seeds}): " + ("; ".join(parts) if parts else "missing runs") + "."


def run_row(results, r):
    """A run's row of the table: its RL model and RL − SFT on the same tasks, over its seeds."""
    per = list(results[r].values())
    avg = lambda f: sum(map(f, per)) / len(per)
    setting = " ".join(f"{k}={v}" for k, v in runs(per[0]["steps"])[r].items() if k != "init_from")
    cells = [c for key in ("suited", "oracle", "accuracy") for c in (
        f"{mean_of(results, r, 'RL', key):.1f}%", diff_text(*measure(results, r, r, key, "RL", "SFT"), 100))]
    shares = {k: avg(lambda s, k=k: s["structures"].get(k, 0.0)) for s in per for k in s["structures"]}
    structures = ", ".join(f"{k} {v:.0%}" for k, v in sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))
                           if v >= 0.005) or "-"
    return " | ".join([f"| {r}", f"`{setting}`", str(len(per)), *cells,
                       f"{avg(lambda s: s['train_reward']):.3f}",
                       f"{avg(lambda s: s['train_change']):+.3f}", f"{structures} |"])


def report(root):
    """ROOT/RESULTS.md from the runs under ROOT: one table of every run, then each comparison's claims."""
    unfinished = []
    if not (results := collect(root, unfinished)):
        raise SystemExit(f"ablations.py report: no finished <run>-s<seed> (metrics.jsonl and final table) "
                         f"under {root}" + (f"; unfinished: {', '.join(unfinished)}" if unfinished else ""))
    steps = max(s["steps"] for per in results.values() for s in per.values())
    seeds = sorted({seed for per in results.values() for seed in per})
    md = ["# Ablations on the tiny world", "",
          f"Made by `python ablations.py report` from the runs in this folder: {steps} RL steps each, seeds "
          f"{', '.join(map(str, seeds))} (`python ablations.py --seeds {','.join(map(str, seeds))} --steps "
          f"{steps} --jobs 2`, then `python ablations.py publish out/ablations`). P(suited template) and "
          "P(oracle reply), exact by teacher forcing on train.py's final table, decide; sampled accuracy and "
          "training reward are secondary (ablations.py's docstring says how each is made). A claim \"A > B\" "
          "compares the runs' RL − SFT gains task by task, paired by seed and task: D is the mean of the "
          "seeds' differences d_s (paired standard errors w_s) and SE = max(std(d_s)/sqrt(S), "
          "sqrt(sum w_s²)/S), in points (reward units for the training reward). **A difference is beyond "
          "noise when |D| > 2 SE**: *held* (the paper's direction) or *reversed*; otherwise *within noise*.",
          "", "## All runs", "", "| run | setting | seeds | P(suited) | RL − SFT | P(oracle) | RL − SFT | "
          "held-out acc. | RL − SFT | train reward | change | structures (end) |", "|" + "---|" * 12,
          *(run_row(results, r) for r in RUN_NAMES if r in results), ""]
    missing = []
    for cname, (title, claims, paper, note) in COMPARISONS.items():
        if absent := [r for r in dict.fromkeys(r for claim in claims for r in claim) if r not in results]:
            missing.append(f"{cname} (needs {', '.join(absent)})")
        else:
            md += [f"## {title}", "", note, "", f"Paper: {paper}. Here:", "",
                   *(f"- {claim_sentence(a, b, results)}" for a, b in claims), ""]
    if "metaagent" in results:
        md.append(PAIRINGS)
        for (key, label, _), role in zip(MEASURES, ("Designer", "Executor")):
            D, SE, S = measure(results, "metaagent", "metaagent", key, "RL", "SFT")
            md.append(f"- the {role} ({label}): SFT {mean_of(results, 'metaagent', 'SFT', key):.1f}%, RL "
                      f"{mean_of(results, 'metaagent', 'RL', key):.1f}%, RL − SFT "
                      f"{diff_text(D, SE, S, 100)}, {verdict(D, SE, S)}.")
        md.append("")
    if missing:
        md.append(f"Not yet run (or fewer than the runs they compare): {'; '.join(missing)}.\n")
    if unfinished:
        md.append(f"Unfinished, left out: {', '.join(unfinished)}.\n")
    with open(os.path.join(root, "RESULTS.md"), "w") as f:
        f.write("\n".join(md))
    print(f"wrote {root}/RESULTS.md")
    return os.path.join(root, "RESULTS.md")


def publish(src, dest=RESULTS_DIR):
    """Copy every finished run's metrics.jsonl, final_table.json and run.json from src to dest (replacing what
    dest held; checkpoints and logs stay behind), then report there."""
    names = [n for n in sorted(os.listdir(src)) if re.fullmatch(r"(.+)-s(\d+)", n)
             and os.path.exists(os.path.join(src, n, "final_table.json"))] if os.path.isdir(src) else []
    if not names:
        raise SystemExit(f"ablations.py publish: no finished runs under {src}")
    if os.path.abspath(src) != os.path.abspath(dest):
        shutil.rmtree(dest, ignore_errors=True)
        for n in names:   # no checkpoints, no logs
            shutil.copytree(os.path.join(src, n), os.path.join(dest, n), ignore=lambda d, files: [
                f for f in files if f not in ("metrics.jsonl", "final_table.json", "run.json")])
    return report(dest)


# ----------------------------------------------------------------------------------------------------------
# command line


def parse_args(argv):
    p = argparse.ArgumentParser(description="the paper's ablations on the tiny world (see the docstring)")
    p.add_argument("--root", default="out/ablations", help="one folder for every run (default out/ablations)")
    p.add_argument("--seeds", default="0,1,2", help="comma list of seeds (default 0,1,2)")
    p.add_argument("--budget", type=int, default=20, help="updates of each role a run trains (default 20)")
    p.add_argument("--only", default="", help=f"comma list of runs to run: {', '.join(RUN_NAMES)}")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, each on its own cores (default 1)")
    a = p.parse_args(argv)
    if min(a.budget, a.jobs) < 1:
        raise SystemExit(f"ablations.py: --budget and --jobs must be >= 1, got {a.budget} and {a.jobs}")
    if not re.fullmatch(r"\d+(,\d+)*", a.seeds) or len(set(a.seeds.split(","))) != len(a.seeds.split(",")):
        raise SystemExit(f"ablations.py: --seeds must be a comma list of distinct integers, got {a.seeds!r}")
    a.only = [x for x in a.only.split(",") if x]
    if bad := [x for x in a.only if x not in RUN_NAMES]:
        raise SystemExit(f"ablations.py: unknown run {', '.join(bad)}; choose from {', '.join(RUN_NAMES)}")
    a.seeds, a.root = [int(s) for s in a.seeds.split(",")], os.path.abspath(a.root)
    return a


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] not in (["report"], ["publish"]):
        return run_all(parse_args(argv))
    if len(argv) != 2:
        raise SystemExit(f"usage: python ablations.py {argv[0]} ROOT")
    (report if argv[0] == "report" else publish)(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
