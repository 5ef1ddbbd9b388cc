"""ablations.py: the paper's ablations in miniature, on the tiny world, with several seeds, at equal
budgets.

Every run is `python train.py config/tiny.py` plus a few overrides (`runs()` below), so a run here
and the tiny default differ only in what that table says. One run per (name, seed) goes to
ROOT/<name>-s<seed>/: its metrics.jsonl, checkpoints, final table, train.log and run.json.

Issue #45's set (the default, `--only metaagent,single`): two arms, each seed from its own cold
start.

    metaagent     the tiny default (M=4 x N=2, stagewise, K = budget/2)
    single        single-agent GRPO: --template=single --mode=executor, budget steps, and
                  --executor_batch_size=16 queries a step

    What is equal per arm: 20 Executor updates each (budget 20); the Executor samples an update
    trains on, single 16 queries x M*N = 8 single-call executions = 128 against metaagent's 8
    queries x 8 executions x ~2.1 calls an execution = ~136; one AdamW state per role. What is
    not: metaagent also makes 20 Designer updates (single has no Designer).

    Per-seed cold starts: seed s starts from ROOT/sft-s{s}, which this script makes first (when
    missing) with `python sft.py --no-eval --seed s --prior flat --out ROOT/sft-s{s}` (its log:
    ROOT/sft-s{s}/sft.log). The Designer's SFT samples show the four templates equally often on
    every kind, so the cold start does not already prefer the suited template; the Executor's
    traces are the usual ones. The seed so varies the cold start as well as the RL run; the runs of
    one seed wait for the one that builds its cold start (never two builds of one at once).

    --split val (the pilot): train.py runs with --eval_tasks=0, then `python world/final_table.py
    RUN_DIR --split val --tasks 200` writes RUN_DIR/final_table_val.json; --split eval (default):
    train.py's own final_table.json. A run is finished when its split's table exists.

The other arms (issue #34's set) stay runnable with --only; they also start from ROOT/sft-s{s},
except `separate`, which starts from two role-specific ones (out/tiny-sft-separate, made by
train.py). Equal budgets: every arm makes `--budget` (default 20) updates of each role it trains. A
stagewise arm trains one role a step, so it runs 2 x budget steps; coupled trains both each step
(budget steps); designer-only, executor-only and single-agent GRPO train one role (budget steps)
and are compared on that role's row only.

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

    python tools/ablations.py --jobs 2              # metaagent and single, seeds 0,1,2, 20
                                                    # updates a role, into out/ablations
    python tools/ablations.py --jobs 2 --split val --seeds 0,1,2,3 --root out/pilot
                                                    # the pilot, on the val split
    python tools/ablations.py power out/pilot --split val
                                                    # the seeds the set needs, and their compute
    python tools/ablations.py --seeds 3,4 --only metaagent,executor
                                                    # more seeds of some runs, the same root
    python tools/ablations.py report out/ablations  # ROOT/RESULTS.md (--split val: RESULTS_val.md)
    python tools/ablations.py publish out/ablations # the numbers (no checkpoints) into
                                                    # results/ablations, its RESULTS.md, and the
                                                    # README's Results

A finished run is skipped and an unfinished one resumed from its last checkpoint, so the same
command continues an interrupted set across sittings; runs go --jobs seeds at a time, and the
report names what is missing. publish adds to results/ablations and never deletes a run it does
not bring.

What the report computes, from each run's metrics.jsonl and final table (tests/test_ablations.py
checks that the committed results/ablations/RESULTS.md and the README's Results are what `report`
makes of the committed numbers). Every measure is a gain, the RL model minus the run's own cold
start on the same tasks (per task; `repair` and `repair_own` are None where the context does not
occur, and a mean over them is over the tasks where both are not None):

    issue #45, primary (PRIMARY45; pre-registered in PLAN, the commit in ROOT/PREREGISTERED)
    P1 designer           metaagent's gain on `suited` (the Designer's exact P(suited template)),
                          one sample over seeds against 0
    P2 repair             metaagent's gain on `repair_own` (P(oracle reply) after the cold start's
                          own wrong program, frozen) minus single's, paired by seed
    secondary             accuracy (sampled), executor, executor_answer, executor_steps per arm and
                          metaagent - single; P2 on `repair` (after tiny.wrong_reply's program)
    verdict45()           held / reversed (the 95% t interval excludes 0 on that side), equivalent
                          within +-delta (the 90% interval inside it: TOST at 0.05), else
                          inconclusive with the power the test had (t_power())
    provenance            every start in run.json at or after the pre-registration commit, from a
                          clean tree; a run that fails is named and left out of every verdict

    issue #34's set
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

Needs: train.py, sft.py and world/final_table.py (run as programs; tools/ablations.py imports no
project module) and what their Needs lines name; git, for the provenance check
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
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

# the project root: train.py runs there
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_ONLY = ["metaagent", "single"]  # issue #45's set
SPLITS = ["eval", "val"]  # the held-out splits a run may be judged on (world/heldout.py's)
# world/tiny.py's SUITED: the template each kind's tasks are suited to (no project module imported)
SUITED = {"math": "ensemble", "code": "tester"}
CLOCK = "%Y-%m-%dT%H:%M:%S%z"  # run.json's clock times (machinery/rundir.py's)
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
        # single-agent GRPO, at metaagent's executor samples an update (the module docstring)
        "single": {
            **base,
            "template": "single",
            "mode": "executor",
            "steps": budget,
            "executor_batch_size": 16,
        },
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


def cold_start(root, seed):
    """Seed s's own SFT cold start: ROOT/sft-s{s}."""
    return os.path.join(root, f"sft-s{seed}")


def sft_command(seed, root):
    """The sft.py command line (run from the repo root) that makes seed s's cold start: the
    Designer's SFT samples show every template equally often on every kind (--prior flat: a
    prior shown mostly `single`, 75%, left 1-4% on the suited ones and RL never found them in the
    pilot: NOTES)."""
    return [
        sys.executable,
        "sft.py",
        "--no-eval",
        "--seed",
        str(seed),
        "--prior",
        "flat",
        "--out",
        cold_start(root, seed),
    ]


def train_command(run, seed, budget, root, split="eval"):
    """The train.py command line (run from the repo root) of one run: its overrides, the seed's own
    cold start (`separate` keeps its two role-specific ones), and with split val no final table
    (table_command() writes the val one)."""
    over = runs(budget)[run]
    cmd = [
        sys.executable,
        "train.py",
        "config/tiny.py",
        f"--out_dir={out_dir(root, run, seed)}",
        f"--seed={seed}",
        *(f"--{k}={v}" for k, v in over.items()),
    ]
    if "init_from" not in over:
        cmd.append(f"--init_from={cold_start(root, seed)}")
    if split != "eval":
        cmd.append("--eval_tasks=0")
    return cmd


def table_name(split):
    """The final table a split's run is judged by: train.py's final_table.json (eval), or
    final_table_{split}.json (world/final_table.py --split)."""
    return "final_table.json" if split == "eval" else f"final_table_{split}.json"


def table_command(run, seed, root, split):
    """world/final_table.py on a trained run: its table on `split`'s 200 tasks."""
    d = out_dir(root, run, seed)
    return [sys.executable, "world/final_table.py", d, "--split", split, "--tasks", "200"]


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


def trained(run_dir, steps):
    """All steps logged."""
    rows = read_metrics(run_dir)
    return bool(rows) and rows[-1]["step"] == steps


def is_finished(run_dir, steps, split="eval"):
    """All steps logged and the split's final table written (train.py's last act for eval)."""
    return trained(run_dir, steps) and os.path.exists(os.path.join(run_dir, table_name(split)))


def read_json(path):
    """The JSON in path, or None when there is none (or it is unreadable)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


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
        # unbuffered: the log grows line by line, as the program prints
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        p = subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        for line in p.stdout:
            log.write(line)
            if echo:
                sys.stdout.write(line)
        return p.wait()


def build_cold_start(seed, root, cpus=None, echo=True):
    """'ok' | 'failed (cold start rc N)': seed s's cold start, made by sft.py unless it is there.
    sft.py renames the finished model folder into place, so the folder exists only once built; its
    log grows beside it (ROOT/sft-s{s}.log) and moves in as sft.log, with build.json (the command,
    start and end clock times). Callers hold the seed's lock (run_all)."""
    path = cold_start(root, seed)
    cmd, log = sft_command(seed, root), path + ".log"
    if os.path.isdir(path):
        before = (read_json(os.path.join(path, "build.json")) or {}).get("cmd")
        if before and sft_args(before) != sft_args(cmd):  # another set's: never reused silently
            print(f"== cold start seed {seed}: {path} was made by {' '.join(before[1:])}")
            return "failed (cold start made by another command)"
        return "ok"
    print(f"== cold start seed {seed}: {' '.join(cmd[1:])}", flush=True)
    start = time.strftime(CLOCK)
    rc = launch(cmd, log, cpus, echo)
    if rc != 0 or not os.path.isdir(path):
        print(f"== cold start seed {seed}: failed (rc {rc}; its log: {log})", flush=True)
        return f"failed (cold start rc {rc})"
    if os.path.exists(log):
        os.replace(log, os.path.join(path, "sft.log"))
    record = {"cmd": cmd, "start": start, "end": time.strftime(CLOCK), **git_state()}
    with open(os.path.join(path, "build.json"), "w") as f:
        json.dump(record, f)
    return "ok"


def git_state(repo=REPO):
    """{"commit", "dirty"} of repo's work tree (None, None without git): a cold start's provenance,
    as train.py records a run's in run.json."""
    git = ["git", "-C", repo]
    try:
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
        changes = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except OSError:
        return {"commit": None, "dirty": None}
    if head.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(changes.stdout.strip())}


STAMP = "ablations.json"  # in a run folder: {"cmd": the train.py command this script ran}


def run_cmd(run_dir):
    """The train.py command this script ran in run_dir (issue #34's runs kept it in run.json's
    "cmd"), or None."""
    for name in (STAMP, "run.json"):
        cmd = (read_json(os.path.join(run_dir, name)) or {}).get("cmd")
        if cmd:
            return cmd
    return None


def run_one(run, seed, budget, root, cpus=None, echo=True, split="eval"):
    """'skipped' | 'ok' | 'failed (rc N)'. run.json records the command ("cmd", next to the starts
    train.py records there); a different one in the same out_dir is an error (resuming with other
    settings would mix two runs). With split val a trained run gets its val table."""
    d, cmd = out_dir(root, run, seed), train_command(run, seed, budget, root, split)
    before, steps = run_cmd(d), runs(budget)[run]["steps"]
    if before and before[1:] != cmd[1:]:
        raise SystemExit(
            f"ablations.py: {d} was made by a different command:\n  {' '.join(before[1:])}\n"
            f"now:\n  {' '.join(cmd[1:])}\nuse another --root or delete {d}"
        )
    if is_finished(d, steps, split):
        print(f"== {run} seed {seed}: finished, skipped ({d})", flush=True)
        return "skipped"
    os.makedirs(d, exist_ok=True)
    # this script's own record (train.py refuses a fresh run into a folder that holds run.json)
    with open(f"{d}/{STAMP}", "w") as f:
        json.dump({"cmd": cmd}, f, indent=1)
    print(
        f"== {run} seed {seed}: {' '.join(cmd[1:])}" + (f" (cores {cpus})" if cpus else ""),
        flush=True,
    )
    rc = 0
    if not trained(d, steps):
        # an interrupted run continues from its last checkpoint (train.py refuses a fresh run into
        # its folder)
        resume = []
        if any(re.fullmatch(r"step_\d+", x) for x in os.listdir(d)):
            resume = ["--resume"]
        elif os.path.exists(f"{d}/run.json"):  # killed before its first checkpoint: nothing to keep
            resume = ["--overwrite"]
        rc = launch(cmd + resume, f"{d}/train.log", cpus, echo)
    if rc == 0 and split != "eval":
        rc = launch(table_command(run, seed, root, split), f"{d}/train.log", cpus, echo)
    print(f"== {run} seed {seed}: {'ok' if rc == 0 else f'failed (rc {rc})'}", flush=True)
    return "ok" if rc == 0 else f"failed (rc {rc})"


def run_all(a):
    """Every (run, seed), a.jobs seeds at a time, a.jobs runs at once: with one job on every core,
    its output printed; with more, each on a free one of a.jobs disjoint sets of cores
    (usable[k::jobs]), its output in its log only (train.py sizes its threads to the cores it may
    use). Before a seed's run, that seed's cold start (build_cold_start()), under the seed's lock:
    the other runs of the seed wait for it instead of making it twice at once (a finished run needs
    none: it is skipped). `separate`'s cold start, made by train.py, the same way under its path's
    lock."""
    names = [r for r in RUN_NAMES if r in a.only]
    print(
        f"ablations.py: runs {', '.join(names)}; seeds {a.seeds}; {a.budget} updates per role; "
        f"split {a.split}; root {a.root}; {a.jobs} at a time",
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
        echo, over = a.jobs == 1, runs(a.budget)[run]
        try:
            done = is_finished(out_dir(a.root, run, seed), over["steps"], a.split)
            init = os.path.join(REPO, over["init_from"]) if "init_from" in over else None
            if init is None and not done:  # the seed's own cold start, built once
                with building.setdefault(("seed", seed), threading.Lock()):
                    built = build_cold_start(seed, a.root, cpus, echo)
                if built != "ok":
                    return built
            elif init is not None and not os.path.isdir(init):
                with building.setdefault(init, threading.Lock()):
                    if not os.path.isdir(init):  # the first run here makes it (train.py)
                        return run_one(run, seed, a.budget, a.root, cpus, echo, a.split)
            return run_one(run, seed, a.budget, a.root, cpus, echo, a.split)
        except SystemExit as e:  # a refused folder: the others go on, the summary names it
            return f"failed ({e})"
        finally:
            free.put(cpus)

    # a.jobs seeds at a time, each arm of them in turn: the first arm of each seed builds its cold
    # start, side by side with the other seeds' (seed by seed, the other jobs would wait for it)
    work = []
    for i in range(0, len(a.seeds), a.jobs):
        for run in names:
            work += [(run, seed) for seed in a.seeds[i : i + a.jobs]]
    with ThreadPoolExecutor(a.jobs) as pool:
        status = dict(zip((f"{run}-s{seed}" for run, seed in work), pool.map(one, work)))
    split = "" if a.split == "eval" else f" --split {a.split}"
    print(
        "\n".join(f"  {k}: {v}" for k, v in status.items()),
        f"\nthen: python tools/ablations.py report {a.root}{split}",
    )
    return 1 if any(v.startswith("failed") for v in status.values()) else 0


# --------------------------------------------------------------------------------------------------
# the report: ROOT/RESULTS.md


# the exact rows a final table may hold per task (older tables hold the first three)
EXACT_KEYS = (
    "suited",
    "executor",
    "oracle",
    "executor_answer",
    "executor_steps",
    "repair",
    "repair_own",
)


def task_gain(rl, sft):
    """RL − SFT per task; None where either is None (the context does not occur for that task)."""
    return [None if r is None or c is None else r - c for r, c in zip(rl, sft, strict=True)]


def prior(choice, kinds):
    """The cold start's prior over templates per kind of task, from its exact P(template) per task
    (choice = {template: [P per task]}): {kind: {template: mean over the kind's tasks}}. None
    without them."""
    if not choice or not kinds:
        return None
    out = {}
    for kind in sorted(set(kinds)):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        out[kind] = {t: sum(p[i] for i in idx) / len(idx) for t, p in sorted(choice.items())}
    return out


def summarize(run_dir, run, split="eval"):
    """One run's numbers: its training curve from metrics.jsonl and, per held-out task, its final
    table's exact and sampled measures for the RL model and the SFT cold start (None without a
    metrics.jsonl). The sampled rows that stand for a run: its learned designs, or for single-agent
    GRPO the single agent. An exact row the table lacks (an older table) is left out of "gain"."""
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
        "prior": None,
        "sft_rows": {},
        "cmd": run_cmd(run_dir),
    }
    sampled = (
        ("RL: single agent", "SFT: single agent")
        if run == "single"
        else ("RL: learned designs", "SFT: designs")
    )
    table = read_json(os.path.join(run_dir, table_name(split)))
    try:
        exact, correct = table["per_task"]["exact"], table["per_task"]["correct"]
        rl, sft = exact["RL"], exact["SFT"]
        gain = {"suited": task_gain(rl["suited"], sft["suited"])}  # required: a table has it
        for key in EXACT_KEYS:
            if key in rl and key in sft:
                gain[key] = task_gain(rl[key], sft[key])
        gain["accuracy"] = task_gain(correct[sampled[0]], correct[sampled[1]])
        out["sft"] = {key: sum(sft[key]) / len(sft[key]) for key in ("suited", "executor")}
        out["ids"] = table["ids"]
        out["prior"] = prior(sft.get("choice"), table.get("kinds"))
        # the cold start's own rows, to check that two arms of a seed scored the same programs
        out["sft_rows"] = {"repair_own": sft.get("repair_own")}
        out["gain"] = gain
    except (ValueError, KeyError, TypeError):
        pass  # no (readable) final table yet: the run has a curve but no held-out measures
    return out


def collect(root, unfinished=None, split="eval"):
    """{run: {seed: summary}} for every ROOT/<run>-s<seed> with a metrics.jsonl and its split's
    final table; a run without its final table yet is left out and named in `unfinished`."""
    out = {}
    for name in sorted(os.listdir(root)):
        m = re.fullmatch(r"(.+)-s(\d+)", name)
        if not (
            m and m[1] in RUN_NAMES and (s := summarize(os.path.join(root, name), m[1], split))
        ):
            continue
        if s["gain"]:  # the final table comes after the last step
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
    """pairs: per seed, two lists over the same held-out tasks (x_s, y_s), or two one-number lists;
    None in either list marks a task where that measure's context does not occur. Returns {"D",
    "SE", "S", "ds", "p", "lo", "hi"} (None without a pair that has a task):

        d_s  = mean over tasks t of (x_st - y_st),  t where neither is None
                                                                    (the seed's paired difference)
        D    = mean_s d_s,   SE = sd_s(d_s) / sqrt(S)                (sd: S - 1 in the denominator)
        t    = D / SE,  p = two-sided Student's t at S - 1 degrees of freedom
        [lo, hi] = D -+ t(1 - ALPHA/2, S - 1) * SE                   (the 95% interval)

    The seeds are the unit: each seed's d_s already averages its tasks, and their spread holds both
    the training run's randomness and the draw of tasks. One seed has no spread: no SE, p or
    interval."""
    ds = []
    for x, y in pairs:  # a task counts where both are not None
        both = [(u, v) for u, v in zip(x, y, strict=True) if u is not None and v is not None]
        if both:
            ds.append(sum(u for u, _ in both) / len(both) - sum(v for _, v in both) / len(both))
    if not ds:
        return None
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


def normal_cdf(x):
    """Phi(x) = (1 + erf(x / sqrt 2)) / 2."""
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def t_power(S, effect, alpha=ALPHA):
    """The power of a two-sided one-sample t test at level alpha with S seeds when the true mean is
    effect x the SD (effect = delta / sd), by numeric integration of the noncentral t (no scipy):

        T = (Z + lam) / (U / sqrt(nu)),  Z ~ N(0, 1),  U ~ chi(nu),  nu = S - 1,
        lam = effect * sqrt(S),  c = t(1 - alpha/2, nu)
        power = P(|T| > c) = integral_0^inf f_nu(u) [Phi(lam - c u/sqrt(nu))
                                                     + Phi(-lam - c u/sqrt(nu))] du
        f_nu(u) = u^(nu-1) exp(-u^2/2) / (2^(nu/2-1) Gamma(nu/2))      (the chi density)

    Simpson's rule on [0, sqrt(nu) + 12] (the chi density is smooth there, even at nu = 1, and past
    it below 1e-30), 2000 intervals. At effect 0 it is alpha; pwr.t.test(n=10, d=1,
    type="one.sample") gives 0.8031."""
    nu, lam, c = S - 1, effect * math.sqrt(S), t_critical(alpha, S - 1)
    top, n = math.sqrt(nu) + 12, 2000
    h = top / n
    log_norm = (nu / 2 - 1) * math.log(2) + math.lgamma(nu / 2)

    def f(u):
        if u == 0:
            dens = math.exp(-log_norm) if nu == 1 else 0.0
        else:
            dens = math.exp((nu - 1) * math.log(u) - u * u / 2 - log_norm)
        q = c * u / math.sqrt(nu)
        return dens * (normal_cdf(lam - q) + normal_cdf(-lam - q))

    ys = [f(i * h) for i in range(n + 1)]
    return h / 3 * (ys[0] + ys[-1] + 4 * sum(ys[1:-1:2]) + 2 * sum(ys[2:-1:2]))


def seeds_needed(effect, target=0.80, most=100000):
    """The smallest S >= 2 with t_power(S, effect) >= target (the power grows with S: doubling,
    then bisection); None for effect <= 0 or past `most`."""
    if effect <= 0:
        return None
    hi = 2
    while t_power(hi, effect) < target:
        if hi > most:
            return None
        hi *= 2
    lo = hi // 2  # power(lo) < target unless lo < 2
    if lo < 2:
        return 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if t_power(mid, effect) < target else (lo, mid)
    return hi


# the pre-registration of issue #45's set: one dict to edit after the pilot (`power`), committed
# before the set runs (that commit goes into ROOT/PREREGISTERED). In points: "delta" is the margin
# (the effect the seeds are sized to detect with power 0.80, and equivalence is judged within
# ±delta), "sd" the SD of d_s it was sized at, "seeds" the count. None: not yet set.
PLAN = {
    # issue #45's pre-registration (docs/NOTES.md), from the pilot `python tools/ablations.py power
    # out/pilot --split val` (seeds 100, 101 on the val split): delta, half of the pilot's
    # metaagent gain, is both the effect the seeds are planned to detect (power 0.80 at the larger
    # of the pilot's and the reference SD) and the equivalence margin; in points
    "designer": {"delta": 5.23, "sd": 3.65, "seeds": 7},
    "repair": {"delta": 0.95, "sd": 0.68, "seeds": 7},
}
# the SD of d_s seen before, in points: designer, issue #43's three seeds of metaagent's suited
# gain; repair, issue #45's text (metaagent − single repair gains of seeds 0-2: −0.18, −0.10,
# +0.77)
REFERENCE_SD = {"designer": 3.65, "repair": 0.53}

# issue #45's primary comparisons: (plan key, label, A, B, measure): A's RL − SFT gain minus B's
# (B None: against 0), paired by seed
PRIMARY45 = [
    ("designer", "P1 designer: metaagent's gain on suited", "metaagent", None, "suited"),
    (
        "repair",
        "P2 repair: metaagent − single, gain on repair_own",
        "metaagent",
        "single",
        "repair_own",
    ),
]


def secondary45():
    """Issue #45's secondary rows, (plan key or None, label, A, B, measure): each arm's gain and
    metaagent − single on accuracy (sampled: metaagent's learned designs, single's single agent),
    executor, executor_answer and executor_steps; and P2 on repair (tiny.wrong_reply's programs)."""
    rows = []
    for key in ("accuracy", "executor", "executor_answer", "executor_steps"):
        rows.append((None, f"{key}: metaagent", "metaagent", None, key))
        rows.append((None, f"{key}: single", "single", None, key))
        rows.append((None, f"{key}: metaagent − single", "metaagent", "single", key))
    rows.append(("repair", "repair: metaagent − single", "metaagent", "single", "repair"))
    return rows


def margin(plan_key):
    """The pre-registered margin of a comparison, as a fraction (PLAN holds points); None unset."""
    delta = PLAN.get(plan_key, {}).get("delta") if plan_key else None
    return None if delta is None else delta / 100


def planned(plan_key, r, text):
    """A verdict with fewer seeds than the plan asked for is an interim one: it says so (the set
    continues across sittings; the pre-registered verdict is the one at the planned seeds)."""
    want = PLAN.get(plan_key, {}).get("seeds") if plan_key else None
    if want and r is not None and r["S"] < want:
        return f"interim, {r['S']} of {want} seeds: {text}"
    return text


def verdict45(r, delta):
    """Issue #45's rule on paired()'s result, delta the pre-registered margin (a fraction):

        half(a) = t(1 - a/2, S - 1) * SE
        held         D - half(0.05) > 0          (the 95% interval above 0: the predicted side)
        reversed     D + half(0.05) < 0
        equivalent   -delta < D - half(0.10) and D + half(0.10) < delta
                     (the 90% interval inside ±delta: TOST, two one-sided tests at 0.05)
        inconclusive otherwise, with the power the test had: t_power(S, delta / sd),
                     sd = SE sqrt(S) the observed SD of d_s

    No margin: no equivalence test and no power. One seed gets no verdict."""
    if r is None:
        return "missing"
    if r["S"] < 2:
        return "undecided (1 seed)"
    D, se, S = r["D"], r["SE"], r["S"]
    half95 = t_critical(ALPHA, S - 1) * se
    if D - half95 > 0:
        return "held"
    if D + half95 < 0:
        return "reversed"
    if delta is None:
        return "inconclusive (no margin pre-registered)"
    half90 = t_critical(2 * ALPHA, S - 1) * se
    if -delta < D - half90 and D + half90 < delta:
        return f"equivalent within ±{100 * delta:.2f}"
    sd = se * math.sqrt(S)
    power = 1.0 if sd == 0 else t_power(S, delta / sd)
    return f"inconclusive (power {power:.2f})"


# provenance: which commit made each run, from a clean tree, after the pre-registration


def preregistered(root):
    """The pre-registration commit in ROOT/PREREGISTERED (one line, 40 hex digits), or None."""
    try:
        with open(os.path.join(root, "PREREGISTERED")) as f:
            line = f.read().strip()
    except OSError:
        return None
    return line.lower() if re.fullmatch(r"[0-9a-fA-F]{40}", line) else None


def is_after(prereg, commit, repo):
    """True when commit is prereg or a descendant (git merge-base --is-ancestor PREREG COMMIT: rc 0
    yes, 1 no); None when git cannot tell (no git, not a repository, an unknown commit)."""
    try:
        p = subprocess.run(
            ["git", "-C", repo, "merge-base", "--is-ancestor", prereg, commit],
            capture_output=True,
        )
    except OSError:
        return None
    return {0: True, 1: False}.get(p.returncode)


def plan_block(text):
    """The `PLAN = {...}` block of ablations.py's text (to its closing brace at the line start), or
    None."""
    start = text.find("\nPLAN = {")
    end = text.find("\n}\n", start)
    return None if start < 0 or end < 0 else text[start : end + 3]


def plan_as_registered(prereg, repo=REPO):
    """Whether this file's PLAN (the margins and planned seeds) is the one committed at the
    pre-registration; None when git cannot show that commit's tools/ablations.py."""
    try:
        p = subprocess.run(
            ["git", "-C", repo, "show", f"{prereg}:tools/ablations.py"],
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    if p.returncode != 0:
        return None
    with open(os.path.abspath(__file__)) as f:
        return plan_block(p.stdout) == plan_block(f.read())


def git_works(repo):
    """Whether git runs and repo is a repository."""
    try:
        p = subprocess.run(["git", "-C", repo, "rev-parse", "--git-dir"], capture_output=True)
    except OSError:
        return False
    return p.returncode == 0


def provenance(root, names, repo=REPO):
    """(rows, excluded, note) for the run folders `names` under root: a row per start recorded in
    run.json (run, commit, dirty, start, end, CPU); {run: why} for the runs that fail the check
    (every start at or after ROOT/PREREGISTERED's commit in repo's history, from a clean tree; a
    run without run.json starts fails it too); and a sentence on what was checked. Without the
    file or git nothing is checked and nothing excluded (the note says so)."""
    prereg = preregistered(root)
    checked = prereg is not None and git_works(repo)
    rows, excluded, after = [], {}, {}
    for name in names:
        starts = (read_json(os.path.join(root, name, "run.json")) or {}).get("starts") or []
        why = [] if starts else ["no run.json"]
        if not starts:
            rows.append((name, "-", "-", "-", "-", "no run.json starts"))
        for st in starts:
            commit, cpu = st.get("commit") or "", (st.get("machine") or {}).get("cpu", "?")
            rows.append(
                (name, commit[:7] or "?", st.get("dirty"), st.get("start"), st.get("end"), cpu)
            )
            if not checked:
                continue
            if commit and commit not in after:
                after[commit] = is_after(prereg, commit, repo)
            ok = after.get(commit) if commit else None
            if ok is False:
                why.append("before the pre-registration")
            elif ok is None:
                why.append("commit unknown to the repository")
            if st.get("dirty") is not False:
                why.append("dirty tree")
        if checked and why:
            excluded[name] = ", ".join(dict.fromkeys(why))
    note_plan = ""
    if checked:
        same = plan_as_registered(prereg, repo)
        plan = {True: "the same as", False: "NOT the same as", None: "not comparable with"}[same]
        note_plan = f"; PLAN (the margins and seeds) is {plan} the pre-registration's"
    if prereg is None:
        note = "not checked: no PREREGISTERED file (a 40-hex commit) here; no run counts as checked"
    elif not checked:
        note = f"not checked: git cannot read {repo}; no run counts as checked"
    else:
        note = (
            f"checked against the pre-registration commit {prereg[:7]} (PREREGISTERED): every "
            f"start at or after it, from a clean tree{note_plan}"
        )
    return rows, excluded, note


def wall_hours(record):
    """Hours between start and end clock times, summed over run.json's starts (or one build.json
    record); the starts without an end are left out. None when none has both."""
    spans = []
    for st in record.get("starts") or [record]:
        try:
            a = datetime.strptime(st["start"], CLOCK)
            b = datetime.strptime(st["end"], CLOCK)
        except (KeyError, TypeError, ValueError):
            continue
        spans.append((b - a).total_seconds() / 3600)
    return sum(spans) if spans else None


def values(summary, key):
    """A run's per-task gains on `key` (per run: [train_change]); None when its table lacks it."""
    return [summary[key]] if key == "train_change" else summary["gain"].get(key)


def measure(results, a, b, key):
    """paired() of run a's RL − SFT gain minus run b's on `key` (per task: "suited", "executor",
    "oracle", "accuracy", and in newer tables "executor_answer", "executor_steps", "repair",
    "repair_own"; per run: "train_change"), over the seeds both runs have and on which they saw the
    same held-out tasks (checked by id). b = None: run a's gain itself (RL − SFT). A seed whose
    table lacks the measure is left out; None when no seed has it."""
    pairs = []
    for seed in sorted(set(results.get(a, {})) & set(results.get(b or a, {}))):
        sa, sb = results[a][seed], results[b or a][seed]
        x = values(sa, key)
        y = [0.0] * len(x or []) if b is None else values(sb, key)
        if x is None or y is None or (b is not None and sa["ids"] != sb["ids"]):
            continue
        pairs.append((x, y))
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


def setting_of(results, r, budget):
    """A run's setting: the overrides of the command its first seed ran (run.json's "cmd"), less
    the folder, seed, cold start and table switches; runs()'s when no command was recorded."""
    cmd = next((s["cmd"] for _, s in sorted(results[r].items()) if s.get("cmd")), None)
    if not cmd:
        return " ".join(f"{k}={v}" for k, v in runs(budget)[r].items() if k != "init_from")
    skip = ("--out_dir=", "--seed=", "--init_from=", "--eval_tasks=", "--resume")
    return " ".join(x[2:] for x in cmd[3:] if x.startswith("--") and not x.startswith(skip))


def row45(results, plan_key, label, a, b, key):
    """One comparison's table row: seeds, D with its 95% t interval, d_s per seed, the margin, the
    verdict (verdict45())."""
    r, delta = measure(results, a, b, key), margin(plan_key)
    per = ", ".join(f"{100 * d:+.2f}" for d in r["ds"]) if r else "-"
    cells = [
        label,
        str(r["S"] if r else 0),
        diff_text(r, key),
        per,
        f"±{100 * delta:.2f}" if delta is not None else "not set",
        planned(plan_key, r, verdict45(r, delta)),
    ]
    return "| " + " | ".join(cells) + " |"


def prior_lines(results, seeds):
    """The cold start's prior per seed and kind: mean exact P(template) and whether the most
    likely template is the suited one (SUITED), from the first arm of the seed whose table has
    it (`separate` has cold starts of its own)."""
    rows, templates = [], []
    for seed in seeds:
        arms = [a for a in RUN_NAMES if a != "separate" and seed in results.get(a, {})]
        pr = next((results[a][seed]["prior"] for a in arms if results[a][seed]["prior"]), None)
        if pr is None:
            continue
        for kind, ps in pr.items():
            templates += [t for t in ps if t not in templates]
            rows.append((seed, kind, ps))
    if not rows:
        return ["No final table here holds the cold start's P(template) (choice): missing.", ""]
    head = " | ".join(templates)
    md = [
        f"| seed | kind | {head} | most likely | suited |",
        "|" + "---|" * (len(templates) + 4),
    ]
    for seed, kind, ps in rows:
        top = max(sorted(ps), key=ps.get)
        cells = [f"{100 * ps[t]:.1f}" if t in ps else "-" for t in templates]
        suited = SUITED.get(kind, "?")
        mark = "yes" if top == suited else "no"
        md.append(f"| {seed} | {kind} | {' | '.join(cells)} | {top} | {suited}: {mark} |")
    return [*md, ""]


def provenance_lines(prov):
    """The provenance table, the runs without a record, and the runs not counted."""
    rows, excluded, note = prov
    md = [f"Provenance {note}.", ""]
    if rows:
        md += ["| run | commit | dirty | start | end | CPU |", "|---|---|---|---|---|---|"]
        for run, commit, dirty, start, end, cpu in rows:
            md.append(f"| {run} | {commit} | {dirty} | {start} | {end or '-'} | {cpu} |")
        md.append("")
    if excluded:
        md.append(
            "Not counted (left out of every verdict): "
            + "; ".join(f"{n} ({why})" for n, why in sorted(excluded.items()))
            + "."
        )
    else:
        md.append("Not counted: none.")
    return [*md, ""]


def older_runs(results):
    """The default set's runs not started from their seed's own cold start (older runs, issue
    #34's: all from out/tiny-sft), by their run.json command."""
    out = []
    for a in DEFAULT_ONLY:
        for seed, s in sorted(results.get(a, {}).items()):
            own = os.path.basename(cold_start("", seed))  # sft-s{seed}
            inits = [x for x in s["cmd"] or [] if x.startswith("--init_from=")]
            if not any(x.endswith(own) for x in inits):
                out.append(f"{a}-s{seed}")
    return out


def own_cold_starts(results):
    """results without the default set's runs that did not start from their seed's own cold start
    (older_runs(): issue #34's, from the shared cold start that already prefers the suited
    template), which issue #45's comparisons must not judge."""
    older = set(older_runs(results))
    out = {}
    for r, per in results.items():
        out[r] = {seed: s for seed, s in per.items() if f"{r}-s{seed}" not in older}
    return out


def same_frozen_programs(results):
    """The seeds whose two arms scored different programs: the cold start's SFT row on repair_own,
    per task, must be the same in metaagent's table and single's (one cold start, one frozen
    sample of its own programs, world/final_table.py's own_first_replies); [] when they agree."""
    bad = []
    for seed in sorted(set(results.get("metaagent", {})) & set(results.get("single", {}))):
        rows = [results[a][seed].get("sft_rows", {}).get("repair_own") for a in DEFAULT_ONLY]
        if rows[0] != rows[1]:
            bad.append(seed)
    return bad


def section45(results, prov, seeds, split):
    """Issue #45's section: the primary comparisons, the secondary rows, the cold start's prior and
    the provenance. Runs not from their seed's own cold start are named and left out."""
    older = older_runs(results)
    results = own_cold_starts(results)
    seeds = [s for s in seeds if any(s in results.get(a, {}) for a in DEFAULT_ONLY)]
    note = (
        f"Not from their seed's own cold start, left out of this section (older runs): "
        f"{', '.join(older)}."
        if older
        else "Every run here started from its seed's own cold start."
    )
    bad = same_frozen_programs(results)
    frozen = (
        f"The two arms' cold-start rows on repair_own differ at seeds {bad}: not the same programs."
        if bad
        else "At every seed both arms scored the same frozen programs (the cold start's repair_own "
        "row is the same, task by task, in both tables)."
    )
    head = [
        "| comparison | seeds | D [95% t interval] | d_s per seed | margin | verdict |",
        "|---|---|---|---|---|---|",
    ]
    return [
        "## Issue #45's pre-registered comparisons: the mechanism (a cold start that does not "
        "prefer the suited template; the repair of the model's own programs, MetaAgent-X against "
        "single-agent GRPO)",
        "",
        "Arms: `metaagent` (the tiny default) and `single` (single-agent GRPO, 16 queries an "
        "Executor update: 128 executor samples an update against metaagent's ~136; 20 Executor "
        "updates each, metaagent also 20 Designer updates), each seed s from its own cold start "
        "(ROOT/sft-s{s}, whose Designer was shown the four templates equally often). Split: "
        f"{split}. Per seed d_s (the mean over tasks of the gain, or of the gain difference "
        "paired by task id; `repair` and `repair_own` over the tasks where their context "
        "occurs), D = mean_s d_s, SE = sd(d_s)/√S, Student's t at S − 1 degrees of freedom. "
        "*Held*: the 95% interval above 0 (the predicted side); *reversed*: below 0; else "
        "*equivalent within ±X* when the 90% interval lies inside ±X, X the pre-registered "
        "margin (TOST at 0.05); else *inconclusive*, with the power the test had to detect X at "
        "the observed SD. In points.",
        "",
        *head,
        *(row45(results, *c) for c in PRIMARY45),
        "",
        note,
        frozen,
        "",
        "Secondary:",
        "",
        *head,
        *(row45(results, *c) for c in secondary45()),
        "",
        "### The cold start's prior (exact P(template), % mean over each kind's tasks)",
        "",
        *prior_lines(results, seeds),
        "### Provenance",
        "",
        *provenance_lines(prov),
    ]


def run_row(results, r, budget):
    """A run's row: its setting, updates per role, seeds, and each measure's RL − SFT gain (95%
    interval for the primary rows, SE for the rest)."""
    per = list(results[r].values())
    setting = setting_of(results, r, budget)
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


def sft_args(cmd):
    """An sft.py command's arguments less the interpreter and the --out folder (a published cold
    start's record names the folder it was built in); None for no command."""
    if not cmd:
        return None
    args = list(cmd[1:])
    if "--out" in args:
        k = args.index("--out")
        del args[k : k + 2]
    return args


def cold_start_problems(root, results, repo=REPO):
    """{run: why} for the default set's runs whose seed's cold start (ROOT/sft-s{s}/build.json:
    build_cold_start's record) fails the provenance check: no record, another command than
    sft_command(), a commit before the pre-registration or unknown, a dirty tree. Nothing without
    PREREGISTERED or git (provenance() says so)."""
    prereg = preregistered(root)
    if prereg is None or not git_works(repo):
        return {}
    out = {}
    for r in DEFAULT_ONLY:
        for seed in results.get(r, {}):
            rec = read_json(os.path.join(cold_start(root, seed), "build.json"))
            if rec is None:
                why = "its cold start has no build.json"
            elif sft_args(rec.get("cmd")) != sft_args(sft_command(seed, root)):
                why = "its cold start was made by another command"
            elif not rec.get("commit") or is_after(prereg, rec["commit"], repo) is not True:
                why = (
                    "its cold start was built before the pre-registration (or at an unknown commit)"
                )
            elif rec.get("dirty") is not False:
                why = "its cold start was built from a dirty tree"
            else:
                continue
            out[f"{r}-s{seed}"] = why
    return out


def counted(root, split="eval", unfinished=None, repo=REPO):
    """(results, provenance): collect()'s finished runs less those that fail the provenance check
    (provenance()), and that check's (rows, excluded, note)."""
    results = collect(root, unfinished, split)
    names = []
    for r, per in results.items():
        names += [f"{r}-s{seed}" for seed in sorted(per)]
    prov = provenance(root, sorted(names), repo)
    # a seed's cold start is part of its runs: one built before the pre-registration, from a dirty
    # tree or by another command than sft_command's leaves its runs out too
    for name, why in cold_start_problems(root, results, repo).items():
        prov[1][name] = why
    kept = {}
    for r, per in results.items():
        kept[r] = {seed: s for seed, s in per.items() if f"{r}-s{seed}" not in prov[1]}
    return {r: per for r, per in kept.items() if per}, prov


def report_name(split):
    """RESULTS.md (eval) or RESULTS_{split}.md."""
    return "RESULTS.md" if split == "eval" else f"RESULTS_{split}.md"


def report(root, split="eval", repo=REPO):
    """ROOT/RESULTS.md (split val: RESULTS_val.md) from the runs under ROOT: issue #45's section
    (the primary and secondary comparisons, the cold start's prior, the provenance), then one
    table of every run, each of issue #34's comparisons, the pairings, and what is missing. The
    runs that fail the provenance check are named and left out of every number. Returns its
    path."""
    unfinished = []
    if not collect(root, unfinished, split):
        raise SystemExit(
            f"ablations.py report: no finished <run>-s<seed> (metrics.jsonl and final table) "
            f"under {root}" + (f"; unfinished: {', '.join(unfinished)}" if unfinished else "")
        )
    results, prov = counted(root, split, None, repo)
    budget = next(s["steps"] for s in results.get("metaagent", {0: {"steps": 40}}).values()) // 2
    # expected of every run
    seeds = {0, 1, 2}
    for per in results.values():
        seeds |= set(per)
    seeds = sorted(seeds)
    m = n_tests()
    first = results.get("metaagent") or next(iter(results.values()), {})
    sft = next(iter(first.values()), {}).get("sft", {})
    md = [
        "# Ablations on the tiny world",
        "",
        *section45(results, prov, seeds, split),
        "## The other arms (issue #34's set)",
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
    # expected: the default set's arms, and every arm begun here
    begun = set(results)
    for name in os.listdir(root):
        if (m := re.fullmatch(r"(.+)-s(\d+)", name)) and m[1] in RUN_NAMES:
            begun.add(m[1])
    missing = []
    for r in RUN_NAMES:
        if r in DEFAULT_ONLY or r in begun:
            missing += [f"{r}-s{seed}" for seed in seeds if seed not in results.get(r, {})]
    md.append(
        f"Missing (seeds {', '.join(map(str, seeds))} of {', '.join(DEFAULT_ONLY)} and of every "
        f"arm begun here): {', '.join(missing) or 'none'}.\n"
    )
    if unfinished:
        md.append(f"Unfinished, left out: {', '.join(unfinished)}.\n")
    path = os.path.join(root, report_name(split))
    with open(path, "w") as f:
        f.write("\n".join(md))
    print(f"wrote {path}")
    return path


README_BLOCK = (
    "<!-- results: written by `python tools/ablations.py publish`, from results/ablations -->",
    "<!-- /results -->",
)


def unsuited_priors(results, seeds):
    """How many of the seeds' cold starts do not prefer the suited template on at least one kind
    (their most likely template is another), of how many have a prior in their tables."""
    n = known = 0
    for seed in seeds:
        arms = [a for a in DEFAULT_ONLY if seed in results.get(a, {})]
        pr = next((results[a][seed]["prior"] for a in arms if results[a][seed]["prior"]), None)
        if pr is None:
            continue
        known += 1
        tops = {kind: max(sorted(ps), key=ps.get) for kind, ps in pr.items()}
        n += any(top != SUITED.get(kind) for kind, top in tops.items())
    return n, known


def readme_block(root):
    """The README's Results, from the runs under root that pass the provenance check: issue #45's
    primary verdicts (once ROOT/PREREGISTERED names the pre-registration), the cold starts' priors,
    and pointers to RESULTS.md and to issue #34's set."""
    results, _ = counted(root)
    results = own_cold_starts(results)
    seeds = set()
    for a in DEFAULT_ONLY:
        seeds |= set(results.get(a, {}))
    seeds = sorted(seeds)
    primary = []
    if preregistered(root):
        for plan_key, label, a, b, key in PRIMARY45:
            r = measure(results, a, b, key)
            said = planned(plan_key, r, verdict45(r, margin(plan_key)))
            primary.append(f"- **{label}**: {diff_text(r, key)}, {said}.")
    n, known = unsuited_priors(results, seeds)
    return "\n".join(
        [
            README_BLOCK[0],
            "",
            "Issue #45's pre-registered set: MetaAgent-X against single-agent GRPO at 20 Executor "
            f"updates each, seeds {', '.join(map(str, seeds)) or 'none yet'}, each from its own "
            "cold start whose Designer was shown the four templates equally often; RL − SFT "
            "gains in points with their 95% t intervals "
            "([results/ablations/RESULTS.md](results/ablations/RESULTS.md): the rule, the power, "
            "every run and its provenance):",
            "",
            *primary,
            f"- The cold start's most likely template was not the suited one on at least one kind "
            f"at {n} of {known} seeds.",
            "",
            "Issue #34's set (ten arms from one cold start, 3 seeds): "
            "[results/ablations34/RESULTS.md](results/ablations34/RESULTS.md).",
            "",
            README_BLOCK[1],
        ]
    )


def numbers_only(folder, files):
    """shutil.copytree's ignore: all but a run's numbers (no checkpoints, no logs)."""
    keep = ("metrics.jsonl", "run.json", STAMP)
    return [f for f in files if f not in keep and not re.fullmatch(r"final_table(_\w+)?\.json", f)]


# what publish copies of a cold start: its build record and the frozen own first replies that the
# repair_own row repairs (world/final_table.py's OWN_REPLIES)
COLD_START_FILES = ("build.json", "own_first_replies.json")


def publish(src, dest=RESULTS_DIR, readme=README):
    """Copy every finished run's metrics.jsonl, final tables and run.json from src to dest, each
    replacing that run's folder there (checkpoints and logs stay behind; a run dest holds that src
    lacks is kept: a set continued across sittings on fresh machines publishes what each
    finished), each cold start's COLD_START_FILES (not its model) and
    PREREGISTERED; then report there and rewrite the Results block of `readme`."""
    names, priors = [], []
    for n in sorted(os.listdir(src)) if os.path.isdir(src) else []:
        if re.fullmatch(r"sft-s\d+", n):
            priors.append(n)
        elif re.fullmatch(r"(.+)-s(\d+)", n) and os.path.exists(
            os.path.join(src, n, "final_table.json")
        ):
            names.append(n)
    if not names:
        raise SystemExit(f"ablations.py publish: no finished runs under {src}")
    if os.path.abspath(src) != os.path.abspath(dest):
        os.makedirs(dest, exist_ok=True)
        for n in names:
            shutil.rmtree(os.path.join(dest, n), ignore_errors=True)
            shutil.copytree(os.path.join(src, n), os.path.join(dest, n), ignore=numbers_only)
        for n in priors:  # a cold start's record, not its model: COLD_START_FILES
            for f in COLD_START_FILES:
                if os.path.isfile(os.path.join(src, n, f)):
                    os.makedirs(os.path.join(dest, n), exist_ok=True)
                    shutil.copyfile(os.path.join(src, n, f), os.path.join(dest, n, f))
        if os.path.isfile(os.path.join(src, "PREREGISTERED")):
            shutil.copyfile(os.path.join(src, "PREREGISTERED"), os.path.join(dest, "PREREGISTERED"))
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


def power_text(root, split="eval", repo=REPO, jobs=2):
    """What a pilot under root says of the seeds issue #45's set needs, as lines of text. Per
    primary comparison: the pilot's S, D and sd of d_s; the reference SD (REFERENCE_SD); delta =
    half of the pilot's metaagent gain on the comparison's measure; and the smallest S with power
    >= 0.80 (seeds_needed()) at SD = max(pilot sd, reference SD). Then the compute: the mean wall
    time of a run and of a cold start (run.json's starts, a cold start's build.json), and what S
    seeds take with `jobs` runs at a time: a seed's cold start first (its runs wait for it), then
    its arms, `jobs` at a time,

        hours(S) = S * (cold start + ceil(arms / jobs) * run)

    (the pilot's runs were timed at `jobs` at a time, so `run` already holds their sharing)."""
    results, prov = counted(root, split, None, repo)
    lines = [f"power: pilot {root} (split {split}); provenance {prov[2]}"]
    if prov[1]:
        lines.append(f"  not counted: {', '.join(sorted(prov[1]))}")
    needs = []
    for plan_key, label, a, b, key in PRIMARY45:
        r, gain = measure(results, a, b, key), measure(results, "metaagent", None, key)
        S = r["S"] if r else 0
        sd = 100 * r["SE"] * math.sqrt(S) if r and r["SE"] is not None else None
        ref = REFERENCE_SD[plan_key]
        delta = 100 * gain["D"] / 2 if gain else None
        use = max(sd or 0.0, ref)
        need = seeds_needed(delta / use) if delta is not None and delta > 0 else None
        needs.append(need)
        mean_d = f"{100 * r['D']:+.2f}" if r else "n/a"
        lines.append(
            f"  {label}: S={S}, D={mean_d}, sd={'n/a' if sd is None else f'{sd:.2f}'}, "
            f"reference SD {ref:.2f}, delta {'n/a' if delta is None else f'{delta:+.2f}'} "
            f"(half metaagent's {key} gain), SD used {use:.2f}: seeds for power 0.80: "
            + (str(need) if need else "n/a (no positive delta)")
        )
    runs_h = []
    for r in DEFAULT_ONLY:
        for seed in sorted(results.get(r, {})):
            rec = read_json(os.path.join(out_dir(root, r, seed), "run.json")) or {}
            if (h := wall_hours(rec)) is not None:
                runs_h.append(h)
    cold_h = []
    for n in sorted(os.listdir(root)):
        if re.fullmatch(r"sft-s\d+", n):
            rec = read_json(os.path.join(root, n, "build.json"))
            rec = rec or read_json(os.path.join(root, n, "run.json")) or {}
            if (h := wall_hours(rec)) is not None:
                cold_h.append(h)
    if not runs_h:
        lines.append("  compute: no run.json start and end times here: n/a")
        return lines
    run_h = sum(runs_h) / len(runs_h)
    cs_h = sum(cold_h) / len(cold_h) if cold_h else 0.0
    per_seed = cs_h + math.ceil(len(DEFAULT_ONLY) / jobs) * run_h
    lines.append(
        f"  compute: a run {run_h:.2f} h (mean of {len(runs_h)}), a cold start "
        + (f"{cs_h:.2f} h (mean of {len(cold_h)})" if cold_h else "n/a (counted as 0)")
        + f"; a seed of {', '.join(DEFAULT_ONLY)} with --jobs {jobs}: {per_seed:.2f} h"
    )
    for need in sorted({n for n in needs if n}):
        lines.append(f"  {need} seeds: {need * per_seed:.1f} h on this machine")
    return lines


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
    p.add_argument(
        "--only",
        default=",".join(DEFAULT_ONLY),
        help=f"comma list of runs to run (default {','.join(DEFAULT_ONLY)}): "
        f"{', '.join(RUN_NAMES)}",
    )
    p.add_argument(
        "--split",
        default="eval",
        choices=SPLITS,
        help="the held-out split the runs are judged on (val: the pilot; default eval)",
    )
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
    if argv[:1] not in (["report"], ["publish"], ["power"]):
        return run_all(parse_args(argv))
    cmd, rest = argv[0], argv[1:]
    split = "eval"
    if cmd != "publish" and len(rest) == 3 and rest[1] == "--split" and rest[2] in SPLITS:
        rest, split = rest[:1], rest[2]
    if len(rest) != 1:
        extra = "" if cmd == "publish" else f" [--split {'|'.join(SPLITS)}]"
        raise SystemExit(f"usage: python tools/ablations.py {cmd} ROOT{extra}")
    if cmd == "report":
        report(rest[0], split)
    elif cmd == "power":
        print("\n".join(power_text(rest[0], split)))
    else:
        publish(rest[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
