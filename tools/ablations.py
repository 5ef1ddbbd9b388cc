"""ablations.py: the paper's ablations in miniature, on the tiny world, with several seeds, at equal
budgets.

Every run is `python train.py config/tiny.py` plus a few overrides (`runs()` below), so a run here
and the tiny default differ only in what that table says. All runs start from the same SFT cold
start (out/tiny-sft, which train.py makes when it is missing), except `separate`, which starts from
two role-specific ones (out/tiny-sft-separate/designer and executor, which train.py makes the same
way); the seed varies the RL run. One run per (name, seed) goes to ROOT/<name>-s<seed>/: its
metrics.jsonl, checkpoints, final_table.json and train.log.

Equal budgets: every arm makes `--budget` (default 20) updates of each role it trains. A stagewise
arm trains one role a step, so it runs 2 x budget steps; coupled trains both each step (budget
steps); designer-only, executor-only and single-agent GRPO train one role (budget steps) and are
compared on that role's row only.

    hierarchy     (paper Table 3) metaagent (the tiny default, M=4 x N=2) vs flat8 (8 x 1: as many
                  executions a query) and flat16 (16 x 1: twice as many). With N=1 the designer
                  and executor advantages coincide: no decomposed credit assignment.
    schedule      (Table 4, Figure 3) stagewise (metaagent) vs coupled, designer-only,
                  executor-only
    policy        (Table 5) shared (metaagent) vs separate policies
    stage_length  (Figure 4) K = 30 (metaagent: budget/2, two stages of each role), 10 and 1,
                  scaled: each K divides the budget, so both roles get it exactly (stage_length())
    single_agent  metaagent vs single-agent GRPO (--template=single --mode=executor: no Designer)
    pairings      did both roles improve? {SFT, RL} designer x {SFT, RL} executor of the metaagent
                  run reduces, on the exact rows, to two differences: `suited` depends on the
                  Designer's model alone, `executor` on the Executor's alone

    python tools/ablations.py --jobs 2              # every run, seeds 0,1,2, 20 updates a role,
                                                    # into out/ablations
    python tools/ablations.py --seeds 3,4 --only metaagent,executor
                                                    # more seeds of some runs, the same root
    python tools/ablations.py report out/ablations  # ROOT/RESULTS.md
    python tools/ablations.py publish out/ablations # the numbers (no checkpoints) into
                                                    # results/ablations, its RESULTS.md, and the
                                                    # README's Results

A finished run is skipped and an unfinished one resumed from its last checkpoint, so the same
command continues an interrupted set across sittings; runs go seed by seed, and the report names
what is missing.

What the report computes, from each run's metrics.jsonl and final_table.json
(tests/test_ablations.py checks that the committed results/ablations/RESULTS.md and the README's
Results are what `report` makes of the committed numbers). Every measure is a gain, the RL model
minus the run's own cold start on the same tasks:

    suited, executor      primary: the final table's exact rows (teacher forcing, per held-out
                          task): the Designer's P(suited template), the Executor's P(oracle reply)
                          in its own contexts
    oracle, accuracy      secondary: the single agent's exact P(oracle reply); the sampled "RL:
                          learned designs" row (single-agent GRPO: "RL: single agent")
    train change          secondary: reward/mean over the last 20% of steps minus the first 20%
    A > B                 paired (paired()): per seed d_s = mean over tasks of A's gain - B's
                          (the same seed means the same held-out tasks, checked by id);
                          D = mean_s d_s, SE = sd(d_s)/sqrt(S); Student's t at S - 1 degrees of
                          freedom. One rule (verdict()): held or reversed when the 95% t interval
                          excludes 0, else within noise; the report counts its tests and marks the
                          verdicts that also pass Bonferroni

Needs: train.py (run as a program; tools/ablations.py imports no project module) and what train.py's
Needs line names
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

# the project root: train.py runs there
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SFT_DIR = "out/tiny-sft"  # config/tiny.py's init_from: the shared cold start (relative to the repo)
TAIL = 0.2  # the last 20% of steps summarise a run
RESULTS_DIR = os.path.join(REPO, "results", "ablations")
README = os.path.join(REPO, "README.md")  # its Results block is written by publish


# --------------------------------------------------------------------------------------------------
# the runs: train.py overrides on top of config/tiny.py


def stage_length(paper_k, budget):
    """The paper's stage length K (out of 1, 10, 30) scaled to a run of `budget` updates per role:
    K=30 is the tiny default's budget/2 (two stages of each role); the others the K that divides the
    budget (so that both roles get exactly `budget` updates) nearest to paper_k * (budget/2) /
    30."""
    return min(
        (k for k in range(1, budget + 1) if budget % k == 0),
        key=lambda k: (abs(k - paper_k * budget / 60), k),
    )


def runs(budget):
    """{run name: {config key: value}}: what each run sets on top of config/tiny.py, `budget`
    updates of each role it trains. A stagewise run trains one role a step (2 * budget steps),
    coupled both (budget steps), designer-only, executor-only and single-agent GRPO one role (budget
    steps)."""
    base = {"M": 4, "N": 2, "K": stage_length(30, budget), "steps": 2 * budget}  # the tiny default
    # single-agent GRPO
    return {
        "metaagent": base,
        "flat8": {**base, "M": 8, "N": 1},
        "flat16": {**base, "M": 16, "N": 1},
        "coupled": {**base, "mode": "coupled", "steps": budget},
        "designer": {**base, "mode": "designer", "steps": budget},
        "executor": {**base, "mode": "executor", "steps": budget},
        "separate": {**base, "policy": "separate", "init_from": "out/tiny-sft-separate"},
        "k1": {**base, "K": stage_length(1, budget)},
        "k10": {**base, "K": stage_length(10, budget)},
        "single": {**base, "template": "single", "mode": "executor", "steps": budget},
    }


RUN_NAMES = list(runs(20))

# name: (title, claims (A, B, primary rows) = "the paper found A better than B" on those rows, the
# paper's finding, a note). A one-role arm is compared on its role's row only.
BOTH, DESIGNER, EXECUTOR = ("suited", "executor"), ("suited",), ("executor",)
COMPARISONS = {
    "hierarchy": (
        "Hierarchical M×N vs flat M×1 (paper Table 3)",
        [("metaagent", "flat8", BOTH), ("metaagent", "flat16", BOTH)],
        "hierarchical > flat",
        "metaagent is the tiny default's 4×2; flat8 (8×1) runs as many executions a query, flat16 "
        "(16×1) twice as many. With N = 1 the executor advantage is the designer advantage.",
    ),
    "schedule": (
        "Stagewise vs coupled vs single-role training (paper Table 4, Figure 3)",
        [
            ("metaagent", "coupled", BOTH),
            ("metaagent", "designer", DESIGNER),
            ("metaagent", "executor", EXECUTOR),
        ],
        "stagewise > coupled > single-role",
        "metaagent is the stagewise run; designer-only is compared on suited and executor-only on "
        "executor, each per update of its role.",
    ),
    "policy": (
        "Shared vs separate policies (paper Table 5)",
        [("metaagent", "separate", BOTH)],
        "shared >= separate",
        "separate starts from its own two role-specific cold starts: gains "
        "compare what RL added to each.",
    ),
    "stage_length": (
        "Stage length K in {1, 10, 30}, scaled to the budget (paper Figure 4)",
        [("metaagent", "k10", BOTH), ("metaagent", "k1", BOTH)],
        "K=30 best",
        "metaagent is the K=30 point (K = budget/2), k10 K = 4, k1 K = 1.",
    ),
    "single_agent": (
        "MetaAgent-X vs single-agent GRPO",
        [("metaagent", "single", EXECUTOR)],
        "MetaAgent-X > single-agent GRPO",
        "single: no Designer (the single template), its "
        "Executor trained on the same 8 executions a query, compared per Executor update.",
    ),
}
PAIRINGS = (
    "## {SFT, RL} designer x {SFT, RL} executor (metaagent)\n\n`suited` depends on the Designer's "
    "model alone and `executor` on the Executor's alone (its contexts and weights are fixed), so "
    "on "
    "the exact rows the four pairings reduce to two differences. Paper: both roles improve. Here:\n"
)


def out_dir(root, run, seed):
    return os.path.join(root, f"{run}-s{seed}")


def train_command(run, seed, budget, root):
    """The train.py command line (run from the repo root) of one run."""
    return [
        sys.executable,
        "train.py",
        "config/tiny.py",
        f"--out_dir={out_dir(root, run, seed)}",
        f"--seed={seed}",
        *(f"--{k}={v}" for k, v in runs(budget)[run].items()),
    ]


# --------------------------------------------------------------------------------------------------
# running: train.py subprocesses, `jobs` at a time, finished runs skipped, unfinished ones resumed


def read_metrics(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [json.loads(ln) for ln in f if ln.strip()]
    # (a step-0 line holds the held-out curve's start alone)
    return [r for r in rows if r["step"] > 0]


def is_finished(run_dir, steps):
    """All steps logged and the final table written (train.py's last act)."""
    rows = read_metrics(run_dir)
    return (
        bool(rows) and rows[-1]["step"] == steps and os.path.exists(f"{run_dir}/final_table.json")
    )


# the trampoline that pins a program to some cores before it starts: python -c PIN 0,1 train.py ...
PIN = (
    "import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')}); "
    "os.execv(sys.executable, [sys.executable] + sys.argv[2:])"
)


def launch(cmd, log_path, cpus=None, echo=True):
    """Run cmd (a Python program: cmd[0] is sys.executable) in the repo root, on the cores `cpus`
    when given; its output is appended to log_path and, with echo, printed too. Returns rc."""
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        argv = [cmd[0], "-c", PIN, ",".join(map(str, cpus)), *cmd[1:]] if cpus else cmd
        p = subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
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
            raise SystemExit(
                f"ablations.py: {d} was made by a different command:\n  {' '.join(before[1:])}\n"
                f"now:\n  {' '.join(cmd[1:])}\nuse another --root or delete {d}"
            )
    if is_finished(d, runs(budget)[run]["steps"]):
        print(f"== {run} seed {seed}: finished, skipped ({d})", flush=True)
        return "skipped"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/run.json", "w") as f:
        json.dump({"cmd": cmd}, f)
    print(
        f"== {run} seed {seed}: {' '.join(cmd[1:])}" + (f" (cores {cpus})" if cpus else ""),
        flush=True,
    )
    # an interrupted run continues from its last checkpoint (train.py refuses a fresh run into its
    # folder)
    resume = ["--resume"] if os.path.exists(f"{d}/metrics.jsonl") else []
    rc = launch(cmd + resume, f"{d}/train.log", cpus, echo)
    print(f"== {run} seed {seed}: {'ok' if rc == 0 else f'failed (rc {rc})'}", flush=True)
    return "ok" if rc == 0 else f"failed (rc {rc})"


def run_all(a):
    """Every (run, seed), seed by seed, a.jobs at a time: with one job on every core, its output
    printed; with more, each on a free one of a.jobs disjoint sets of cores (usable[k::jobs]), its
    output in its log only (train.py sizes its threads to the cores it may use). A run whose cold
    start is missing makes it (train.py): the runs that need the same one wait for it instead of
    making it twice at once."""
    names = [r for r in RUN_NAMES if not a.only or r in a.only]
    print(
        f"ablations.py: runs {', '.join(names)}; seeds {a.seeds}; {a.budget} updates per role; "
        f"root {a.root}; {a.jobs} at a time",
        flush=True,
    )
    usable = sorted(os.sched_getaffinity(0))
    if a.jobs > len(usable):
        raise SystemExit(f"ablations.py: --jobs {a.jobs}, but this process has {len(usable)} cores")
    free, building = queue.Queue(), {}
    for k in range(a.jobs):
        free.put(usable[k :: a.jobs] if a.jobs > 1 else None)

    def one(run_seed):
        (run, seed), cpus = run_seed, free.get()
        init = os.path.join(REPO, runs(a.budget)[run].get("init_from", SFT_DIR))
        try:
            if not os.path.isdir(init):
                with building.setdefault(init, threading.Lock()):
                    if not os.path.isdir(init):  # the first run here makes it
                        return run_one(run, seed, a.budget, a.root, cpus, a.jobs == 1)
            return run_one(run, seed, a.budget, a.root, cpus, a.jobs == 1)
        except SystemExit as e:  # a refused folder: the others go on, the summary names it
            return f"failed ({e})"
        finally:
            free.put(cpus)

    work = []  # seed by seed
    for seed in a.seeds:
        work += [(run, seed) for run in names]
    with ThreadPoolExecutor(a.jobs) as pool:
        status = dict(zip((f"{run}-s{seed}" for run, seed in work), pool.map(one, work)))
    print(
        "\n".join(f"  {k}: {v}" for k, v in status.items()),
        f"\nthen: python tools/ablations.py report {a.root}",
    )
    return 1 if any(v.startswith("failed") for v in status.values()) else 0


# --------------------------------------------------------------------------------------------------
# the report: ROOT/RESULTS.md


def summarize(run_dir, run):
    """One run's numbers: its training curve from metrics.jsonl and, per held-out task, its final
    table's exact and sampled measures for the RL model and the SFT cold start (None without a
    metrics.jsonl). The sampled rows that stand for a run: its learned designs, or for single-agent
    GRPO the single agent."""
    rows = read_metrics(run_dir)
    if not rows:
        return None
    n = max(1, math.ceil(TAIL * len(rows)))

    def mean(key, part):
        return sum(r.get(key, 0.0) for r in part) / len(part)

    tail_keys = set()  # the keys of the last steps' lines
    for r in rows[-n:]:
        tail_keys |= set(r)
    out = {
        "steps": len(rows),
        "train_change": mean("reward/mean", rows[-n:]) - mean("reward/mean", rows[:n]),
        "structures": {
            k[len("structure/") :]: mean(k, rows[-n:])
            for k in tail_keys
            if k.startswith("structure/")
        },
        "ids": None,
        "gain": {},
    }
    sampled = (
        ("RL: single agent", "SFT: single agent")
        if run == "single"
        else ("RL: learned designs", "SFT: designs")
    )
    try:
        with open(os.path.join(run_dir, "final_table.json")) as f:
            table = json.load(f)
        exact, correct = table["per_task"]["exact"], table["per_task"]["correct"]
        out["gain"] = {
            key: [r - c for r, c in zip(exact["RL"][key], exact["SFT"][key], strict=True)]
            for key in ("suited", "executor", "oracle")
        }
        out["gain"]["accuracy"] = [
            r - c for r, c in zip(correct[sampled[0]], correct[sampled[1]], strict=True)
        ]
        out["sft"] = {
            key: sum(exact["SFT"][key]) / len(exact["SFT"][key]) for key in ("suited", "executor")
        }
        out["ids"] = table["ids"]
    except (OSError, ValueError, KeyError, TypeError):
        out[
            "gain"
        ] = {}  # no (readable) final table yet: the run has a curve but no held-out measures
    return out


def collect(root, unfinished=None):
    """{run: {seed: summary}} for every ROOT/<run>-s<seed> with a metrics.jsonl and a final table; a
    run without its final table yet is left out and named in `unfinished`."""
    out = {}
    for name in sorted(os.listdir(root)):
        m = re.fullmatch(r"(.+)-s(\d+)", name)
        if not (m and m[1] in RUN_NAMES and (s := summarize(os.path.join(root, name), m[1]))):
            continue
        if s["gain"]:  # train.py writes the final table after its last step
            out.setdefault(m[1], {})[int(m[2])] = s
        elif unfinished is not None:
            unfinished.append(f"{name} ({s['steps']} steps, no final table)")
    return out


# statistics: one rule for every difference in the report


def t_pvalue(t, df):
    """Two-sided p-value of Student's t with df degrees of freedom. With x = sqrt(df) tan(u) the
    tail integral of the density becomes c * integral_{atan(|t|/sqrt(df))}^{pi/2} cos(u)^(df-1) du,
    c = Gamma((df+1)/2) / (sqrt(pi) Gamma(df/2)): a smooth integrand, Simpson's rule on 400
    intervals."""
    lo, n = math.atan(abs(t) / math.sqrt(df)), 400
    h = (math.pi / 2 - lo) / n
    f = [math.cos(lo + i * h) ** (df - 1) for i in range(n + 1)]
    integral = h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
    return (
        2
        * math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2))
        / math.sqrt(math.pi)
        * integral
    )


def t_critical(alpha, df):
    """t such that t_pvalue(t, df) = alpha (bisection: the p-value falls as t grows)."""
    lo, hi = 0.0, 1e6
    for _ in range(200):
        lo, hi = ((lo + hi) / 2, hi) if t_pvalue((lo + hi) / 2, df) > alpha else (lo, (lo + hi) / 2)
    return (lo + hi) / 2


ALPHA = 0.05


def paired(pairs):
    """pairs: per seed, two lists over the same held-out tasks (x_s, y_s), or two one-number lists.
    Returns {"D", "SE", "S", "ds", "p", "lo", "hi"} (None without pairs):

        d_s  = mean over tasks of (x_st - y_st)                     (the seed's paired difference)
        D    = mean_s d_s,   SE = sd_s(d_s) / sqrt(S)                (sd: S - 1 in the denominator)
        t    = D / SE,  p = two-sided Student's t at S - 1 degrees of freedom
        [lo, hi] = D -+ t(1 - ALPHA/2, S - 1) * SE                   (the 95% interval)

    The seeds are the unit: each seed's d_s already averages its tasks, and their spread holds both
    the training run's randomness and the draw of tasks. One seed has no spread: no SE, p or
    interval."""
    if not pairs:
        return None
    ds = [sum(x) / len(x) - sum(y) / len(y) for x, y in pairs]
    S, D = len(ds), sum(ds) / len(ds)
    out = {"D": D, "S": S, "ds": ds, "SE": None, "p": None, "lo": None, "hi": None}
    if S > 1:
        se = math.sqrt(sum((d - D) ** 2 for d in ds) / (S - 1) / S)
        half = t_critical(ALPHA, S - 1) * se
        out.update(
            SE=se,
            p=(t_pvalue(D / se, S - 1) if se > 0 else 0.0 if D else 1.0),
            lo=D - half,
            hi=D + half,
        )
    return out


def verdict(r, tests=1):
    """The report's one rule, on paired()'s result: "held" (the paper's direction, A - B > 0) or
    "reversed" when the 95% t interval excludes 0, else "within noise"; with `tests` > 1, a verdict
    that also survives Bonferroni (p < ALPHA / tests) is marked so. One seed gets no verdict."""
    if r is None:
        return "missing"
    if r["S"] < 2:
        return "undecided (1 seed)"
    if r["p"] >= ALPHA:
        return "within noise"
    word = "held" if r["D"] > 0 else "reversed"
    return word + (f" (also at α/{tests})" if tests > 1 and r["p"] < ALPHA / tests else "")


def measure(results, a, b, key):
    """paired() of run a's RL − SFT gain minus run b's on `key` (per task: "suited", "executor",
    "oracle", "accuracy"; per run: "train_change"), over the seeds both runs have and on which they
    saw the same held-out tasks (checked by id). b = None: run a's gain itself (RL − SFT)."""
    pairs = []
    for seed in sorted(set(results.get(a, {})) & set(results.get(b or a, {}))):
        sa, sb = results[a][seed], results[b or a][seed]
        x = [sa[key]] if key == "train_change" else sa["gain"][key]
        if b is None:
            pairs.append((x, [0.0] * len(x)))
        elif sa["ids"] == sb["ids"]:
            pairs.append((x, [sb[key]] if key == "train_change" else sb["gain"][key]))
    return paired(pairs)


PRIMARY = [("suited", "suited"), ("executor", "executor")]  # (key, label)
SECONDARY = [
    ("oracle", "oracle"),
    ("accuracy", "accuracy (sampled)"),
    ("train_change", "training-reward change"),
]
SCALE = {"train_change": 1}  # the rest in points (x100)


def diff_text(r, key, interval=True):
    """'+1.2 [−0.4, +2.8]' (primary: the 95% t interval) or '+1.2 ± 0.6' (secondary: the SE), in
    points (reward units for the training-reward change)."""
    if r is None:
        return "n/a"
    sc, dg = SCALE.get(key, 100), 3 if key in SCALE else 2
    if r["SE"] is None:
        return f"{sc * r['D']:+.{dg}f} (1 seed)"
    if interval:
        return f"{sc * r['D']:+.{dg}f} [{sc * r['lo']:+.{dg}f}, {sc * r['hi']:+.{dg}f}]"
    return f"{sc * r['D']:+.{dg}f} ± {sc * r['SE']:.{dg}f}"


def n_tests():
    """How many primary tests the report makes: each claim's rows, and the two pairings."""
    n = len(PRIMARY)
    for _, claims, _, _ in COMPARISONS.values():
        n += sum(len(rows) for _, _, rows in claims)
    return n


def claim_sentence(a, b, rows, results):
    """One line per claim "a > b": on its primary rows the paired gain difference, its 95% interval
    and the verdict; then the secondary gains' differences with their SE."""
    prim = [
        f"{label} {diff_text(r := measure(results, a, b, key), key)}, {verdict(r, n_tests())}"
        + (
            f" (per seed: {', '.join(f'{100 * d:+.2f}' for d in r['ds'])})"
            if r and r["S"] > 1
            else ""
        )
        for key, label in PRIMARY
        if key in rows
    ]
    sec = [
        f"{label} {diff_text(measure(results, a, b, key), key, False)}" for key, label in SECONDARY
    ]
    seeds = len(set(results.get(a, {})) & set(results.get(b, {})))
    return (
        f"{a} > {b} (seeds: {seeds}): " + "; ".join(prim) + "; secondary: " + ", ".join(sec) + "."
    )


def updates(run):
    """(Designer updates, Executor updates) of a run, per the budget (runs()'s docstring)."""
    return {"designer": (1, 0), "executor": (0, 1)}.get(runs(1)[run].get("mode"), (1, 1))


def run_row(results, r, budget):
    """A run's row: its setting, updates per role, seeds, and each measure's RL − SFT gain (95%
    interval for the primary rows, SE for the rest)."""
    per = list(results[r].values())
    setting = " ".join(f"{k}={v}" for k, v in runs(budget)[r].items() if k != "init_from")
    nd, ne = updates(r)
    cells = [
        diff_text(measure(results, r, None, key), key, key in dict(PRIMARY))
        for key, _ in PRIMARY + SECONDARY
    ]
    names = []  # every structure a seed's run ended with, in the order they first appear
    for s in per:
        names += [k for k in s["structures"] if k not in names]
    shares = {k: sum(s["structures"].get(k, 0.0) for s in per) / len(per) for k in names}
    structures = (
        ", ".join(
            f"{k} {v:.0%}"
            for k, v in sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))
            if v >= 0.005
        )
        or "-"
    )
    return " | ".join(
        [
            f"| {r}",
            f"`{setting}`",
            f"{nd * budget} + {ne * budget}",
            str(len(per)),
            *cells,
            f"{structures} |",
        ]
    )


def summary_lines(results):
    """Per comparison one sentence: the paper's direction and how its primary tests came out
    here."""
    lines = []
    for title, claims, paper, _ in COMPARISONS.values():
        tests = []  # each claim's primary rows
        for a, b, rows in claims:
            tests += [verdict(measure(results, a, b, key)) for key, _ in PRIMARY if key in rows]
        if any(v in ("missing", "undecided (1 seed)") for v in tests):
            lines.append(f"- **{title}**: paper {paper}; not yet run with two or more seeds here.")
            continue
        count = {
            w: sum(v.startswith(w) for v in tests) for w in ("held", "reversed", "within noise")
        }
        lines.append(
            f"- **{title}**: paper {paper}; here "
            + ", ".join(f"{n} {w}" for w, n in count.items() if n)
            + f" of its {len(tests)} primary tests."
        )
    if "metaagent" in results:
        v = [verdict(measure(results, "metaagent", None, key), n_tests()) for key, _ in PRIMARY]
        lines.append(
            "- **Both roles improve** (metaagent RL − SFT): paper yes; here the Designer (suited) "
            f"{v[0]}, "
            f"the Executor (executor) {v[1]}."
        )
    return lines


def report(root):
    """ROOT/RESULTS.md from the runs under ROOT: one table of every run, each comparison's claims,
    the pairings, and what is missing. Returns its path."""
    unfinished = []
    if not (results := collect(root, unfinished)):
        raise SystemExit(
            f"ablations.py report: no finished <run>-s<seed> (metrics.jsonl and final table) "
            f"under {root}" + (f"; unfinished: {', '.join(unfinished)}" if unfinished else "")
        )
    budget = next(s["steps"] for s in results.get("metaagent", {0: {"steps": 40}}).values()) // 2
    # expected of every run
    seeds = {0, 1, 2}
    for per in results.values():
        seeds |= set(per)
    seeds = sorted(seeds)
    m = n_tests()
    sft = next(iter(results.get("metaagent", next(iter(results.values()))).values())).get("sft", {})
    md = [
        "# Ablations on the tiny world",
        "",
        "Made by `python tools/ablations.py report` from the runs in this folder (`python "
        "tools/ablations.py --jobs 2 "
        f"--budget {budget}`, then `python tools/ablations.py publish out/ablations`). Every arm "
        f"makes {budget} "
        "updates of each role it trains (stagewise arms 2 × that many steps, coupled that many, "
        "the one-role "
        "arms that many of their role), from the tiny default's cold start (separate: its own "
        "two); the seed "
        "varies the RL run. Every number is a **gain**: the RL model minus its own cold start on "
        "the same 200 "
        "held-out tasks, in points. Primary: `suited` (the Designer's exact P(suited template)) "
        "and "
        "`executor` (the Executor's exact probability of the oracle reply in its own contexts)"
        + (
            f"; the cold start has suited {100 * sft['suited']:.1f}%, executor "
            f"{100 * sft['executor']:.1f}%"
            if sft
            else ""
        )
        + ". Secondary: `oracle` (the single agent's exact P(oracle reply)), sampled "
        "accuracy of the learned designs (single: the single agent), the training reward's change "
        "(last "
        "20% of steps minus the first 20%).",
        "",
        '**The rule.** A claim "A > B" is the paper\'s direction. Per seed s, d_s = the mean over '
        "the held-out "
        "tasks of A's gain minus B's (paired: a seed's runs see the same tasks); D = mean_s d_s, "
        "SE = "
        "sd(d_s)/√S, and the 95% interval D ± t(0.975, S − 1)·SE (Student's t at S − 1 degrees of "
        "freedom; "
        "4.30 at S = 3). *Held* or *reversed* when the interval excludes 0, else *within noise*. "
        "The report "
        f"makes {m} primary tests: by chance alone about {ALPHA * m:.2f} would be held or "
        "reversed; those that "
        f"also pass Bonferroni (p < {ALPHA}/{m}) are marked. An arm that trains one role by design "
        "is "
        "compared on that role's row only, per update of that role. Secondary differences are D ± "
        "SE.",
        "",
        "## Summary",
        "",
        *summary_lines(results),
        "",
        "## All runs (RL − SFT; primary rows with their 95% t interval, the rest ± SE)",
        "",
        "| run | setting | updates D + E | seeds | suited | executor | oracle | accuracy | train "
        "change | "
        "structures (end) |",
        "|" + "---|" * 10,
        *(run_row(results, r, budget) for r in RUN_NAMES if r in results),
        "",
    ]
    for title, claims, paper, note in COMPARISONS.values():
        md += [
            f"## {title}",
            "",
            note,
            "",
            f"Paper: {paper}. Here:",
            "",
            *(f"- {claim_sentence(a, b, rows, results)}" for a, b, rows in claims),
            "",
        ]
    if "metaagent" in results:
        md.append(PAIRINGS)
        for (key, label), role in zip(PRIMARY, ("Designer", "Executor")):
            r = measure(results, "metaagent", None, key)
            md.append(f"- the {role} ({label}): RL − SFT {diff_text(r, key)}, {verdict(r, m)}.")
        md.append("")
    missing = []
    for r in RUN_NAMES:
        missing += [f"{r}-s{seed}" for seed in seeds if seed not in results.get(r, {})]
    md.append(
        f"Missing (seeds {', '.join(map(str, seeds))} of every run): "
        f"{', '.join(missing) or 'none'}.\n"
    )
    if unfinished:
        md.append(f"Unfinished, left out: {', '.join(unfinished)}.\n")
    with open(os.path.join(root, "RESULTS.md"), "w") as f:
        f.write("\n".join(md))
    print(f"wrote {root}/RESULTS.md")
    return os.path.join(root, "RESULTS.md")


README_BLOCK = (
    "<!-- results: written by `python tools/ablations.py publish`, from results/ablations -->",
    "<!-- /results -->",
)


def readme_block(root):
    """The README's Results, from the runs under root: the summary sentences and a pointer to
    RESULTS.md."""
    results = collect(root)
    seeds = set()
    for per in results.values():
        seeds |= set(per)
    seeds = sorted(seeds)
    return "\n".join(
        [
            README_BLOCK[0],
            "",
            f"The paper's comparisons in miniature at equal update budgets, seeds "
            f"{', '.join(map(str, seeds))}, every number an RL − SFT gain on the exact rows "
            "`suited` and "
            "`executor`, judged by Student's t at S − 1 degrees of freedom "
            "([results/ablations/RESULTS.md](results/ablations/RESULTS.md) has the rule, every run "
            "and every interval):",
            "",
            *summary_lines(results),
            "",
            README_BLOCK[1],
        ]
    )


def publish(src, dest=RESULTS_DIR, readme=README):
    """Copy every finished run's metrics.jsonl, final_table.json and run.json from src to dest
    (replacing what dest held; checkpoints and logs stay behind), report there, and rewrite the
    Results block of `readme`."""
    names = (
        [
            n
            for n in sorted(os.listdir(src))
            if re.fullmatch(r"(.+)-s(\d+)", n)
            and os.path.exists(os.path.join(src, n, "final_table.json"))
        ]
        if os.path.isdir(src)
        else []
    )
    if not names:
        raise SystemExit(f"ablations.py publish: no finished runs under {src}")
    if os.path.abspath(src) != os.path.abspath(dest):
        shutil.rmtree(dest, ignore_errors=True)
        for n in names:  # no checkpoints, no logs
            shutil.copytree(
                os.path.join(src, n),
                os.path.join(dest, n),
                ignore=lambda d, files: [
                    f for f in files if f not in ("metrics.jsonl", "final_table.json", "run.json")
                ],
            )
    path = report(dest)
    with open(readme) as f:
        text = f.read()
    start, end = text.find(README_BLOCK[0]), text.find(README_BLOCK[1])
    if start < 0 or end < start:
        raise SystemExit(
            f"ablations.py publish: {readme} has no Results block ({README_BLOCK[0]} ... "
            f"{README_BLOCK[1]}) to rewrite"
        )
    with open(readme, "w") as f:
        f.write(text[:start] + readme_block(dest) + text[end + len(README_BLOCK[1]) :])
    print(f"rewrote the Results of {readme}")
    return path


# --------------------------------------------------------------------------------------------------
# command line


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="the paper's ablations on the tiny world (see the docstring)"
    )
    p.add_argument(
        "--root", default="out/ablations", help="one folder for every run (default out/ablations)"
    )
    p.add_argument("--seeds", default="0,1,2", help="comma list of seeds (default 0,1,2)")
    p.add_argument(
        "--budget", type=int, default=20, help="updates of each role a run trains (default 20)"
    )
    p.add_argument("--only", default="", help=f"comma list of runs to run: {', '.join(RUN_NAMES)}")
    p.add_argument(
        "--jobs", type=int, default=1, help="runs at a time, each on its own cores (default 1)"
    )
    a = p.parse_args(argv)
    if min(a.budget, a.jobs) < 1:
        raise SystemExit(
            f"ablations.py: --budget and --jobs must be >= 1, got {a.budget} and {a.jobs}"
        )
    if not re.fullmatch(r"\d+(,\d+)*", a.seeds) or len(set(a.seeds.split(","))) != len(
        a.seeds.split(",")
    ):
        raise SystemExit(
            f"ablations.py: --seeds must be a comma list of distinct integers, got {a.seeds!r}"
        )
    a.only = [x for x in a.only.split(",") if x]
    if bad := [x for x in a.only if x not in RUN_NAMES]:
        raise SystemExit(
            f"ablations.py: unknown run {', '.join(bad)}; choose from {', '.join(RUN_NAMES)}"
        )
    a.seeds, a.root = [int(s) for s in a.seeds.split(",")], os.path.abspath(a.root)
    return a


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] not in (["report"], ["publish"]):
        return run_all(parse_args(argv))
    if len(argv) != 2:
        raise SystemExit(f"usage: python tools/ablations.py {argv[0]} ROOT")
    (report if argv[0] == "report" else publish)(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
