"""ablations.py: a pre-registered set of RL runs on the tiny world: its arms, several seeds, each
from its own cold start, at equal budgets; running it across sittings, and publishing it. The
report that judges the set by one rule is tools/ablation_report.py's.

Every run is `python train.py config/tiny.py` plus the overrides of its arm (runs()), so it differs
from the tiny default only in what that table says; it goes to ROOT/<arm>-s<seed>/ (metrics.jsonl,
checkpoints, final table, train.log, train.py's run.json, this script's ablations.json). Seed s's
runs start from its own cold start ROOT/sft-s{s}, built first (sft_command(): once, the seed's
other runs waiting for it). A finished run is skipped and an unfinished one resumed from its last
checkpoint, so the same command continues a set across sittings; --jobs runs go side by side, each
on its own cores.

    python tools/ablations.py --jobs 2              # the set (SET: issue #56's five arms),
                                                    # seeds 0,1,2, into out/ablations
    python tools/ablations.py --jobs 2 --split val --seeds 100,101 --root out/pilot
                                                    # a pilot, judged on the val split
    python tools/ablations.py power out/pilot --split val
                                                    # the seeds the set needs, and their compute
    python tools/ablations.py --seeds 3,4 --only metaagent,executor
                                                    # more seeds, other arms, the same root
    python tools/ablations.py report out/ablations  # ROOT/RESULTS.md (--split val: RESULTS_val.md)
    python tools/ablations.py publish out/ablations # the numbers (no checkpoints) into
                                                    # results/ablations (adding, never deleting),
                                                    # its RESULTS.md, RESULTS_fixed.md (a run's
                                                    # table from results/retable56 where it has
                                                    # one) and the README's Results, from those
    python tools/ablations.py publish results/ablations
                                                    # the same from what is published: no copy
    python tools/ablations.py publish out/new --dest results/new
                                                    # another set, into its own folder
    python tools/ablations.py table results/main    # a run's final_table.json, its primary rows

The report (tools/ablation_report.py) judges each comparison of SET, A's RL − SFT gain minus B's
paired by seed and task, by one rule: held, reversed, equivalent within PLAN's margin, or
inconclusive with the power the test had; it counts a run only when its provenance passes (every
start at or after the commit in ROOT/PREREGISTERED, from a clean tree). This file is the set it
judges: it passes itself in as the report's `the_set`. Beside the verdicts, SET's unregistered
comparisons (the paper's, which the pre-registration did not make) with their intervals alone.
Issue #56's registered tables ran under a sandbox that timed out right programs under load; its
tables made again at the fix (results/retable56, FIXED_DIR) are what the README reads.

A new set: edit SET (its arms, comparisons and words), and after its pilot's `power` PLAN and
REFERENCE_SD; commit that before the set's first run and write the commit into
ROOT/PREREGISTERED (the report checks that this file's PLAN block is that commit's); the sets
before it stay in their own folders as they were written (issue #45's results/ablations45, #34's
results/ablations34). The other arms of runs() (issue #34's: flat8, flat16, coupled, designer,
executor, separate, k1, k10) run with --only.

Needs: machinery/cpu_bits.py, machinery/provenance.py, machinery/rundir.py (a cold start's folders),
sft.py and world/final_table.py (run as programs) and what their Needs lines name,
tools/ablation_report.py; train.py"""

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

# run by path (python tools/ablations.py): the project's root first on the path, for machinery/ and
# tools/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from machinery import rundir
from machinery.provenance import CLOCK, git_state
from tools import ablation_report
from tools.ablation_report import (
    STAMP,
    SUITED,
    cold_start,
    most_likely,
    out_dir,
    read_json,
    read_metrics,
    run_cmd,
    sft_args,
    table_name,
)

# the project root: train.py runs there
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# this module, as the report takes the set it judges (ablation_report's `the_set`)
THIS_SET = sys.modules[__name__]
SPLITS = ["eval", "val"]  # the held-out splits a run may be judged on (world/heldout.py's)
RESULTS_DIR = os.path.join(REPO, "results", "ablations")
# the set's tables made again at the fixed sandbox (docs/NOTES.md, issue #56: the old one timed
# out right programs under load), one a run, RUN-COMMIT.json; publish reads a run's from here
# where it has one
# (docs/NOTES.md: decided after designer_frozen s4's fixed table was seen)
FIXED_DIR = os.path.join(REPO, "results", "retable56")
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
    """{arm: {config key: value}}: what each arm sets on top of config/tiny.py, `budget` updates of
    each role it trains. A stagewise arm trains one role a step (2 * budget steps), coupled both
    (budget steps), designer-only, executor-only and single-agent GRPO one role (budget steps)."""
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
        # issue #56's mechanism arms: two separate policies, so that a Designer update never moves
        # the Executor; designer-only over the frozen cold-start Executor, and both roles learning
        # (each from the seed's own separate cold start: separate_start)
        "designer_frozen": {**base, "policy": "separate", "mode": "designer", "steps": budget},
        "metaagent_separate": {**base, "policy": "separate"},
        # the positive control: executor-only on the tester, whose repairs show the habit; 10
        # queries x 8 runs x ~1.4 calls ~ metaagent's 113 executor samples an update
        "executor_tester": {
            **base,
            "template": "tester",
            "mode": "executor",
            "steps": budget,
            "executor_batch_size": 10,
        },
        # single-agent GRPO, at metaagent's executor samples an update (SET's arms_text)
        "single": {
            **base,
            "template": "single",
            "mode": "executor",
            "steps": budget,
            "executor_batch_size": 16,
        },
    }


RUN_NAMES = list(runs(20))


def own_start(run):
    """Whether an arm starts from its seed's own cold start (ROOT/sft-s{s}; for two policies
    ROOT/sft-separate-s{s}: separate_start): every arm without an init_from of its own."""
    return "init_from" not in runs(1)[run]


def separate_start(run):
    """Whether an arm starts from its seed's own separate cold start (ROOT/sft-separate-s{s}:
    `sft.py --roles separate`, a Designer and an Executor model): an own_start arm of two
    policies."""
    return own_start(run) and runs(1)[run].get("policy") == "separate"


def updates(run):
    """(Designer updates, Executor updates) of an arm, per the budget (runs()'s docstring)."""
    return {"designer": (1, 0), "executor": (0, 1)}.get(runs(1)[run].get("mode"), (1, 1))


# --------------------------------------------------------------------------------------------------
# the pre-registered set: its arms, its comparisons and their margins, its report's words. A new set
# edits SET, PLAN and REFERENCE_SD and commits them before its first run (that commit goes into
# ROOT/PREREGISTERED; the report checks every run against it)

# A comparison is (plan key or None, label, A, B, measure): A's RL − SFT gain on the measure minus
# B's, paired by seed and task (B None: A's gain against 0); the plan key names the PLAN entry that
# holds its margin and planned seeds (None: no margin, so no equivalence test and no power).
SET = {
    # the runner's default --only; each seed's runs start from ROOT/sft-s{s}, the two arms of two
    # policies from ROOT/sft-separate-s{s}
    "arms": ["metaagent", "single", "designer_frozen", "metaagent_separate", "executor_tester"],
    "primary": [
        (
            "ceiling",
            "P1 ceiling: metaagent_separate − designer_frozen, gain on accuracy_code",
            "metaagent_separate",
            "designer_frozen",
            "accuracy_code",
        ),
        (
            "habit",
            "P2 habit: single − metaagent, gain on copy_own (metaagent's fall the larger)",
            "single",
            "metaagent",
            "copy_own",
        ),
        ("accuracy", "P3 accuracy: metaagent's gain, at least +8", "metaagent", None, "accuracy"),
    ],
    # each arm's gains (copy_own and repair_own: the habit, predicted to fall where the Executor
    # trains on the tester's repairs; a fall reads "reversed"), and the two policies' difference
    "secondary": [
        (None, "accuracy_code: metaagent", "metaagent", None, "accuracy_code"),
        (None, "accuracy_code: designer_frozen", "designer_frozen", None, "accuracy_code"),
        (None, "accuracy_code: metaagent_separate", "metaagent_separate", None, "accuracy_code"),
        (None, "accuracy: metaagent_separate", "metaagent_separate", None, "accuracy"),
        (None, "accuracy: designer_frozen", "designer_frozen", None, "accuracy"),
        (None, "accuracy: single", "single", None, "accuracy"),
        (None, "suited: metaagent", "metaagent", None, "suited"),
        (None, "suited: designer_frozen", "designer_frozen", None, "suited"),
        (None, "suited: metaagent_separate", "metaagent_separate", None, "suited"),
        (None, "copy_own: metaagent", "metaagent", None, "copy_own"),
        (None, "copy_own: single", "single", None, "copy_own"),
        (None, "copy_own: executor_tester (the control)", "executor_tester", None, "copy_own"),
        (None, "copy_own: metaagent_separate", "metaagent_separate", None, "copy_own"),
        (None, "copy_own: designer_frozen", "designer_frozen", None, "copy_own"),
        (None, "repair_own: metaagent", "metaagent", None, "repair_own"),
        (None, "repair_own: single", "single", None, "repair_own"),
        (None, "repair_own: executor_tester", "executor_tester", None, "repair_own"),
        (None, "train_change: metaagent", "metaagent", None, "train_change"),
    ],
    # the pre-registration's predictions of the primaries (docs/NOTES.md), set beside each verdict
    "predicted": {"ceiling": "held", "habit": "held", "accuracy": "reversed"},
    # two comparisons the paper makes that the pre-registration did not (label, A, B, measures:
    # where the arms end after RL, the gains' difference and where they start, A − B; the paper
    # compares end points, so "after RL" first): reported with their intervals, labelled
    # unregistered, no verdict. Each paper figure beside its own baseline, as the paper's material
    # gives them: MetaAgent-X 38.33 against single-agent GRPO's 29.10 at 8B (its +11.17 and +12.80
    # are over the untrained single agent)
    "unregistered": [
        (
            "MetaAgent-X − single-agent GRPO (paper at 8B: +9.23, 38.33 against 29.10; at 4B not "
            "in this project's material)",
            "metaagent",
            "single",
            ["rl_accuracy", "accuracy", "sft_accuracy"],
        ),
        (
            "two policies − one, metaagent_separate − metaagent (paper's Table 5: one ahead by "
            "6.7)",
            "metaagent_separate",
            "metaagent",
            ["rl_accuracy", "sft_accuracy", "accuracy"],
        ),
    ],
    # the paper's Table 6 (the Designer routes by kind), unregistered: each arm's gain on the
    # measure per kind of task, P(tester | code) and P(ensemble | math) (ablation_report.by_kind)
    "by_kind": ("suited", ["metaagent", "designer_frozen", "metaagent_separate"]),
    # the report's section: its title, and what the arms are and what is equal between them
    "title": (
        "Issue #56's pre-registered comparisons: the frozen-executor ceiling (two policies, the "
        "Executor frozen or trained), the habit only the tester exposes (MetaAgent-X against "
        "single-agent GRPO), and the accuracy gain"
    ),
    "arms_text": (
        "Arms: `metaagent` (the tiny default: one policy, 20 updates of each role); `single` "
        "(single-agent GRPO, 20 Executor updates of 16 queries); `designer_frozen` and "
        "`metaagent_separate` (two policies from the seed's separate cold start "
        "ROOT/sft-separate-s{s}: 20 Designer updates over the frozen cold-start Executor, or 20 "
        "of each role); `executor_tester` (the positive control: 20 Executor updates of 10 queries "
        "on the tester template). Each seed s from its own cold starts (ROOT/sft-s{s}, "
        "ROOT/sft-separate-s{s}), the Designer's samples drawn from the flat prior."
    ),
    # the README's Results: the line before the primaries ({seeds}: the seeds counted), and the
    # line after them and the cold starts' priors
    "readme": (
        "Issue #56's pre-registered set, seeds {seeds}, RL − SFT, "
        "{tables} ([every row](results/ablations/{report})):"
    ),
    "readme_end": "",
}

# The set's pre-registered numbers: one dict to edit after the pilot (`power`), committed before
# the set runs. In points: "delta" is the margin (the effect the seeds are sized to detect with
# power 0.80, and equivalence is judged within ±delta), "sd" the SD of d_s it was sized at,
# "seeds" the count, "null" (P3 alone) the threshold the gain is tested against instead of 0. The
# report says whether this block is the pre-registration commit's.
PLAN = {
    # issue #56's pre-registration (docs/NOTES.md), from the pilot `python tools/ablations.py power
    # out/pilot56 --split val` (seeds 100, 101 on the val split): delta the pilot's own effect (P3:
    # its distance from the threshold), at the larger of the pilot's and the reference SD; 10
    # seeds for every comparison, the most any needs (P1 10, P2 5, P3 10); in points
    "ceiling": {"delta": 9.87, "sd": 9.72, "seeds": 10},
    "habit": {"delta": 10.42, "sd": 6.19, "seeds": 10},
    "accuracy": {"delta": 5.25, "sd": 5.12, "seeds": 10, "null": 8},
}
# the SD of d_s seen before, in points: metaagent's val gains at seeds 0 (the chosen setting),
# 100 and 101 (the pilot's first arm; docs/NOTES.md): ceiling, on accuracy_code (+23.5, +5.5,
# +9.0); habit, on copy_own (−24.2, −12.1, −15.9); accuracy (+11.5, +1.8, +3.8)
REFERENCE_SD = {"ceiling": 9.54, "habit": 6.19, "accuracy": 5.12}


# --------------------------------------------------------------------------------------------------
# the command lines


def sft_command(seed, root, separate=False):
    """The sft.py command line (run from the repo root) that makes seed s's cold start: the
    Designer's SFT samples drawn from the flat prior (--prior flat: a prior shown mostly `single`,
    75%, left 1-4% on the suited ones and RL never found them in issue #45's pilot: NOTES);
    separate: two models (--roles separate), ROOT/sft-separate-s{s}."""
    args = ["--no_eval", "--seed", str(seed), "--prior", "flat"]
    args += ["--roles", "separate"] * separate + ["--out", cold_start(root, seed, separate)]
    return [sys.executable, "sft.py", *args]


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
    if own_start(run):
        cmd.append(f"--init_from={cold_start(root, seed, separate_start(run))}")
    if split != "eval":
        cmd.append("--eval_tasks=0")
    return cmd


def table_command(run, seed, root, split):
    """world/final_table.py on a trained run: its table on `split`'s 200 tasks; on eval, the table
    train.py's last act writes (the run's eval_tasks), for a run stopped while writing it."""
    d = out_dir(root, run, seed)
    if split == "eval":
        return [sys.executable, "world/final_table.py", d]
    return [sys.executable, "world/final_table.py", d, "--split", split, "--tasks", "200"]


# --------------------------------------------------------------------------------------------------
# running: train.py subprocesses, `jobs` at a time, finished runs skipped, unfinished ones resumed


def trained(run_dir, steps):
    """All steps logged."""
    rows = read_metrics(run_dir)
    return bool(rows) and rows[-1]["step"] == steps


def is_finished(run_dir, steps, split="eval"):
    """All steps logged and the split's final table written (train.py's last act for eval)."""
    return trained(run_dir, steps) and os.path.exists(os.path.join(run_dir, table_name(split)))


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


def build_cold_start(seed, root, cpus=None, echo=True, separate=False):
    """'ok' | 'failed (cold start rc N)': seed s's cold start, made by sft.py unless it is there.
    sft.py renames each finished model folder into place (rundir.cold_start_dirs: a separate
    build stopped between its two roles has designer/ alone, and is made again); its log grows
    beside it (ROOT/sft-s{s}.log) and moves in as sft.log, with build.json (the command,
    start and end clock times, the commit and whether the tree was dirty: machinery/provenance.py).
    Callers hold the seed's lock (run_all). separate: the seed's separate cold start."""
    path = cold_start(root, seed, separate)
    cmd, log = sft_command(seed, root, separate), path + ".log"
    if os.path.isdir(path):
        before = (read_json(os.path.join(path, "build.json")) or {}).get("cmd")
        if before and sft_args(before) != sft_args(cmd):  # another set's: never reused silently
            print(f"== cold start seed {seed}: {path} was made by {' '.join(before[1:])}")
            return "failed (cold start made by another command)"
        if rundir.cold_start_whole(path, separate):
            return "ok"
        print(f"== cold start seed {seed}: {path} unfinished (stopped between roles): made again")
    print(f"== cold start seed {seed}: {' '.join(cmd[1:])}", flush=True)
    os.makedirs(root, exist_ok=True)  # a new set's root: its first cold start's log goes there
    start = time.strftime(CLOCK)
    rc = launch(cmd, log, cpus, echo)
    if rc != 0 or not rundir.cold_start_whole(path, separate):
        print(f"== cold start seed {seed}: failed (rc {rc}; its log: {log})", flush=True)
        return f"failed (cold start rc {rc})"
    if os.path.exists(log):
        os.replace(log, os.path.join(path, "sft.log"))
    record = {"cmd": cmd, "start": start, "end": time.strftime(CLOCK), **git_state(REPO)}
    with open(os.path.join(path, "build.json"), "w") as f:
        json.dump(record, f)
    return "ok"


def run_one(run, seed, budget, root, cpus=None, echo=True, split="eval"):
    """'skipped' | 'ok' | 'failed (rc N)'. ablations.json records the command (train.py records its
    starts in run.json); a different one in the same out_dir is an error (resuming with other
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
    cores = f" (cores {cpus})" if cpus else ""
    print(f"== {run} seed {seed}: {' '.join(cmd[1:])}{cores}", flush=True)
    rc, stopped_in_table = 0, trained(d, steps)
    if not stopped_in_table:
        # an interrupted run continues from its last checkpoint (train.py refuses a fresh run into
        # its folder)
        resume = []
        if any(re.fullmatch(r"step_\d+", x) for x in os.listdir(d)):
            resume = ["--resume"]
        elif os.path.exists(f"{d}/run.json"):  # killed before its first checkpoint: nothing to keep
            resume = ["--overwrite"]
        rc = launch(cmd + resume, f"{d}/train.log", cpus, echo)
    # val: train.py writes no table; eval: its last act, so a run with every step logged (and, not
    # finished, no table) was stopped in it
    if rc == 0 and (split != "eval" or stopped_in_table):
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
            init = None if own_start(run) else os.path.join(REPO, over["init_from"])
            if init is None and not done:  # the seed's own cold start, built once
                sep = separate_start(run)
                with building.setdefault(("seed", seed, sep), threading.Lock()):
                    built = build_cold_start(seed, a.root, cpus, echo, sep)
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
# publish: into results/ablations (another set: its own folder, --dest) and the README's Results


README_BLOCK = (
    "<!-- results: by `python tools/ablations.py publish results/ablations` -->",
    "<!-- /results -->",
)


def unsuited_priors(results, seeds):
    """How many of the seeds' cold starts do not prefer the suited template on at least one kind
    (their most likely template is another), of how many have a prior in their tables."""
    n = known = 0
    for seed in seeds:
        pr = ablation_report.seed_prior(THIS_SET, results, seed)
        if pr is None:
            continue
        known += 1
        n += any(most_likely(ps) != SUITED.get(kind) for kind, ps in pr.items())
    return n, known


def readme_block(root, fixed=None):
    """The README's Results, from the runs under root that pass the provenance check (fixed: a
    folder of tables made again, read where a run has one; each line names the registered tables
    it falls back on): the set's primary verdicts (once ROOT/PREREGISTERED names the
    pre-registration) beside their registered predictions, the cold starts' priors, and SET's
    pointers. The unregistered comparisons, `suited` by kind, the secondary rows and each arm's
    dose are in the report the first line links (RESULTS.md; read with `fixed`,
    RESULTS_fixed.md), from which the README's claims table quotes them: the README stays under
    12 KB."""
    results, _ = ablation_report.counted(THIS_SET, root, fixed=fixed)
    results, _ = ablation_report.own_cold_starts(results, SET["arms"])
    seeds = set()
    for a in SET["arms"]:
        seeds |= set(results.get(a, {}))
    seeds = sorted(seeds)

    def tables(arms, r, key):
        """Where a fixed reading falls back on registered tables: " (registered tables at single
        s0-5)"; "" where it does not."""
        reg = ablation_report.registered_tables(results, arms, r) if fixed and r else {}
        if not reg or key == "train_change":
            return ""
        at = "; ".join(f"{a} s{ablation_report.seeds_text(seeds)}" for a, seeds in reg.items())
        return f" (registered tables at {at})"

    lines = []
    if ablation_report.preregistered(root):
        predicted = SET.get("predicted", {})
        for plan_key, label, a, b, key in SET["primary"]:
            arms = [a] if b is None else [a, b]
            r, said = ablation_report.judged(THIS_SET, results, plan_key, a, b, key)
            text = f"{ablation_report.diff_text(r, key)}, {said}"
            if plan_key in predicted:
                text += f", predicted {predicted[plan_key]}"
            lines.append(f"- **{label}**: {text}{tables(arms, r, key)}.")
    n, known = unsuited_priors(results, seeds)
    suited = []  # each cold start's P(suited template | code)
    for seed in seeds:
        code = (ablation_report.seed_prior(THIS_SET, results, seed) or {}).get("code", {})
        if SUITED["code"] in code:
            suited.append(100 * code[SUITED["code"]])
    spread = ""
    if suited:
        spread = f"; P({SUITED['code']} | code) {min(suited):.1f}-{max(suited):.1f}%"
    where = "from the registered tables"
    if fixed:
        where = f"a run's table remade in {ablation_report.shown(fixed)} where it has one"
    return "\n".join(
        [
            README_BLOCK[0],
            "",
            SET["readme"].format(
                seeds=ablation_report.seeds_text(seeds) if seeds else "none yet",
                tables=where,
                report=ablation_report.report_name("eval", fixed),
            ),
            "",
            *lines,
            f"- Cold starts whose most likely template is not the suited one on some kind: {n} of "
            f"{known}{spread}.",
            "",
            *[SET["readme_end"], ""] * bool(SET["readme_end"]),
            README_BLOCK[1],
        ]
    )


def numbers_only(folder, files):
    """shutil.copytree's ignore: all but a run's numbers (no checkpoints, no logs)."""
    keep = ("metrics.jsonl", "run.json", STAMP)
    return [f for f in files if f not in keep and not re.fullmatch(r"final_table(_\w+)?\.json", f)]


# what publish copies of a cold start: its build record and the frozen own first replies that the
# repair_own row repairs (world/final_table.py's OWN_REPLIES: in a separate cold start, its
# Executor's folder)
COLD_START_FILES = ("build.json", "own_first_replies.json", "executor/own_first_replies.json")


def publish(src, dest=RESULTS_DIR, readme=README, fixed=None):
    """Copy every finished run's metrics.jsonl, final tables, run.json and ablations.json from src
    to dest, each replacing that run's folder there (checkpoints and logs stay behind; a run dest
    holds that src lacks is kept: a set continued across sittings on fresh machines publishes what
    each finished), each cold start's COLD_START_FILES (not its model) and PREREGISTERED; then
    report there (RESULTS.md; with `fixed`, a folder of tables made again, RESULTS_fixed.md too)
    and rewrite the Results block of `readme` from dest (readme_block(): this set's words and
    dest's verdicts, read with `fixed`)."""
    names, priors = [], []
    for n in sorted(os.listdir(src)) if os.path.isdir(src) else []:
        if re.fullmatch(r"sft-(separate-)?s\d+", n):
            priors.append(n)
        elif re.fullmatch(r"(.+)-s(\d+)", n):
            if os.path.exists(os.path.join(src, n, "final_table.json")):
                names.append(n)
            else:
                print(f"ablations.py publish: {n} has no final table yet: left behind")
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
                    os.makedirs(os.path.dirname(os.path.join(dest, n, f)), exist_ok=True)
                    shutil.copyfile(os.path.join(src, n, f), os.path.join(dest, n, f))
        if os.path.isfile(os.path.join(src, "PREREGISTERED")):
            shutil.copyfile(os.path.join(src, "PREREGISTERED"), os.path.join(dest, "PREREGISTERED"))
    path = ablation_report.report(THIS_SET, dest)
    if fixed:
        ablation_report.report(THIS_SET, dest, fixed=fixed)
    with open(readme) as f:
        text = f.read()
    start, end = text.find(README_BLOCK[0]), text.find(README_BLOCK[1])
    if start < 0 or end < start:
        raise SystemExit(
            f"ablations.py publish: {readme} has no Results block ({README_BLOCK[0]} ... "
            f"{README_BLOCK[1]}) to rewrite"
        )
    with open(readme, "w") as f:
        f.write(text[:start] + readme_block(dest, fixed) + text[end + len(README_BLOCK[1]) :])
    print(f"rewrote the Results of {readme}")
    return path


# --------------------------------------------------------------------------------------------------
# power: the seeds a set needs, from its pilot


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


def power_text(root, split="eval", repo=REPO, jobs=2):
    """What a pilot under root says of the seeds the set needs, as lines of text. Per primary
    comparison: the pilot's S, D and sd of d_s; the reference SD (REFERENCE_SD); delta, the effect
    to detect: the size of the pilot's own D (with PLAN's "null", its distance from it), or where
    the pilot lacks the comparison half the size of the set's first arm's gain on its measure; and
    the smallest S with power >= 0.80 (ablation_report.seeds_needed()) at SD = max(pilot sd,
    reference SD). (Issue #45's plan used half the first arm's gain throughout; at issue #56's
    pilot that asked for 59 seeds for P1: results/ablations45, docs/NOTES.md.) Then the
    compute: the mean wall time of a run and of a cold start (run.json's starts, a cold start's
    build.json), and what S seeds take with `jobs` runs at a time: a seed's cold start first (its
    runs wait for it), then its arms, `jobs` at a time,

        hours(S) = S * (cold starts * cold start + ceil(arms / jobs) * run)

    (cold starts: 2 when an arm starts from the separate one, else 1; the pilot's runs were timed
    at `jobs` at a time, so `run` already holds their sharing)."""
    results, prov = ablation_report.counted(THIS_SET, root, split, None, repo)
    arms, first = SET["arms"], SET["arms"][0]
    lines = [f"power: pilot {root} (split {split}); provenance {prov[2]}"]
    if prov[1]:
        lines.append(f"  not counted: {', '.join(sorted(prov[1]))}")
    needs = []
    for plan_key, label, a, b, key in SET["primary"]:
        r = ablation_report.measure(results, a, b, key)
        gain = ablation_report.measure(results, first, None, key)
        S = r["S"] if r else 0
        sd = 100 * r["SE"] * math.sqrt(S) if r and r["SE"] is not None else None
        ref = REFERENCE_SD[plan_key]
        null = ablation_report.threshold(PLAN, plan_key)
        delta, what = None, "the pilot's D" + (f", from {null:+g}" if null else "")
        if r:
            delta = abs(100 * r["D"] - null)
        elif gain:
            delta, what = abs(100 * gain["D"]) / 2, f"half {first}'s {key} gain"
        use = max(sd or 0.0, ref)
        need = None
        if delta is not None and delta > 0:
            need = ablation_report.seeds_needed(delta / use)
        needs.append(need)
        mean_d = f"{100 * r['D']:+.2f}" if r else "n/a"
        lines.append(
            f"  {label}: S={S}, D={mean_d}, sd={'n/a' if sd is None else f'{sd:.2f}'}, "
            f"reference SD {ref:.2f}, delta {'n/a' if delta is None else f'{delta:+.2f}'} "
            f"({what}), SD used {use:.2f}: seeds for power 0.80: "
            + (str(need) if need else "n/a (no positive delta)")
        )
    runs_h = []
    for r in arms:
        for seed in sorted(results.get(r, {})):
            rec = read_json(os.path.join(out_dir(root, r, seed), "run.json")) or {}
            if (h := wall_hours(rec)) is not None:
                runs_h.append(h)
    cold_h = []
    for n in sorted(os.listdir(root)):
        if re.fullmatch(r"sft-(separate-)?s\d+", n):
            rec = read_json(os.path.join(root, n, "build.json")) or {}
            if (h := wall_hours(rec)) is not None:
                cold_h.append(h)
    if not runs_h:
        lines.append("  compute: no run.json start and end times here: n/a")
        return lines
    run_h = sum(runs_h) / len(runs_h)
    cs_h = sum(cold_h) / len(cold_h) if cold_h else 0.0
    starts = 1 + any(separate_start(a) for a in arms)  # a seed's cold starts: shared, separate
    per_seed = starts * cs_h + math.ceil(len(arms) / jobs) * run_h
    lines.append(
        f"  compute: a run {run_h:.2f} h (mean of {len(runs_h)}), a cold start "
        + (f"{cs_h:.2f} h (mean of {len(cold_h)})" if cold_h else "n/a (counted as 0)")
        + f"; a seed of {', '.join(arms)} with --jobs {jobs}: {per_seed:.2f} h"
    )
    for need in sorted({n for n in needs if n}):
        lines.append(f"  {need} seeds: {need * per_seed:.1f} h on this machine")
    return lines


# --------------------------------------------------------------------------------------------------
# command line

# --------------------------------------------------------------------------------------------------
# table: a run's final_table.json, its primary rows (the main job's, results/main)


def table_lines(run_dir):
    """What a run's final_table.json (train.py's, on eval) says of the primary rows, as lines: the
    learned designs' sampled accuracy SFT -> RL and RL − SFT (paired SE), per kind; the exact
    rows `suited` (on code: P(tester | code); its gain per kind, P(tester | code) and
    P(ensemble | math)) and `copy_own`, levels and gain; the Designer's P(tester) per kind, SFT
    -> RL, where the table has it (whether it routes by kind); the training change; and the CPU
    and the day of each start in the run's run.json, where there is one."""
    t = read_json(os.path.join(run_dir, "final_table.json"))
    if t is None:
        raise SystemExit(
            f"ablations.py table: no readable final_table.json in {run_dir} (train.py writes it "
            "at the end of a run)"
        )
    gains, rows, per = t["rl_minus_sft"], t["rows"], t["per_task"]["exact"]

    def gain(key):
        g = gains[key]
        return f"{g['points']:+.1f} ({g['stderr']:.1f})"

    def level(who, key, kind=None):  # an exact row's mean over the tasks (of a kind) it has
        vals = [v for v, k in zip(per[who][key], t["kinds"]) if v is not None and kind in (None, k)]
        return 100 * sum(vals) / len(vals)

    def tester(who, kind):  # the Designer's exact P(tester), mean over a kind's tasks
        vals = [v for v, k in zip(per[who]["choice"]["tester"], t["kinds"]) if k == kind]
        return 100 * sum(vals) / len(vals)

    where = ", ".join(ablation_report.cpus(run_dir)) or "no run.json"
    starts = (read_json(os.path.join(run_dir, "run.json")) or {}).get("starts") or []
    days = sorted({st["start"][:10] for st in starts if st.get("start")})
    where = ", ".join([where, *days])
    sft, rl = rows["SFT: designs"]["accuracy"], rows["RL: learned designs"]["accuracy"]
    kinds = ", ".join(
        f"{k} {gains[f'accuracy/{k}']['points']:+.1f}" for k in sorted(set(t["kinds"]))
    )
    # the Designer's routing: P(tester) on each kind's tasks, SFT -> RL (exact, its "choice")
    routing = []
    if all("choice" in per[who] for who in ("SFT", "RL")):
        cells = []
        for k in sorted(set(t["kinds"])):
            cells.append(f"{k} {tester('SFT', k):.1f} -> {tester('RL', k):.1f}%")
        routing = [f"  P(tester) by kind: {', '.join(cells)}"]
    # suited per kind: P(tester | code), P(ensemble | math), RL − SFT
    suited = ", ".join(
        f"{k} {level('RL', 'suited', k) - level('SFT', 'suited', k):+.1f}"
        for k in sorted(set(t["kinds"]))
    )
    return [
        f"{run_dir}: {t['split']}, {t['tasks']} tasks x {t['samples']} draws; CPU: {where}",
        f"  learned designs: {100 * sft:.1f} -> {100 * rl:.1f}%, RL - SFT {gain('learned designs')}"
        f" ({kinds})",
        f"  suited: P(tester | code) {level('SFT', 'suited', 'code'):.1f} -> "
        f"{level('RL', 'suited', 'code'):.1f}%, RL - SFT {gain('suited')} ({suited})",
        *routing,
        f"  copy_own: {level('SFT', 'copy_own'):.1f} -> {level('RL', 'copy_own'):.1f}%, "
        f"RL - SFT {gain('copy_own')}",
        f"  training accuracy, last 10% - first 10%: {t['train_change']:+.3f}",
    ]


SUBCOMMANDS = {
    "report": "ROOT/RESULTS.md (--split val: RESULTS_val.md; --fixed DIR: RESULTS_fixed.md) from "
    "the runs under ROOT",
    "power": "the seeds the set needs and their compute, from a pilot's runs under ROOT",
    "publish": "the numbers of the finished runs under ROOT (no checkpoints) into "
    "results/ablations (--dest: another folder), its RESULTS.md and RESULTS_fixed.md, and the "
    "README's Results",
    "table": "the primary rows of the final_table.json in each folder named (the main job's: "
    "results/main, results/main-separate)",
}


def parse_args(argv):
    epilog = ["subcommands, each with its --help:"]
    for cmd, what in SUBCOMMANDS.items():
        epilog.append(f"  python tools/ablations.py {cmd} ROOT: {what}")
    p = argparse.ArgumentParser(
        description="run the pre-registered set (SET; see the module docstring)",
        epilog="\n".join(epilog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        default=",".join(SET["arms"]),
        help=f"comma list of arms to run (default the set's, {','.join(SET['arms'])}): "
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
    seeds = a.seeds.split(",")
    if not re.fullmatch(r"\d+(,\d+)*", a.seeds) or len(set(seeds)) != len(seeds):
        raise SystemExit(
            f"ablations.py: --seeds must be a comma list of distinct integers, got {a.seeds!r}"
        )
    a.only = [x for x in a.only.split(",") if x]
    if bad := [x for x in a.only if x not in RUN_NAMES]:
        raise SystemExit(
            f"ablations.py: unknown run {', '.join(bad)}; choose from {', '.join(RUN_NAMES)}"
        )
    a.seeds, a.root = [int(s) for s in seeds], os.path.abspath(a.root)
    return a


def parse_subcommand(cmd, argv):
    """report ROOT [--split] [--fixed], power ROOT [--split], publish ROOT [--dest] [--fixed],
    table ROOT...: each ROOT must be a folder."""
    p = argparse.ArgumentParser(prog=f"ablations.py {cmd}", description=SUBCOMMANDS[cmd])
    if cmd == "table":
        p.add_argument("root", nargs="+", help="run folders, each with its final_table.json")
        a = p.parse_args(argv)
        if bad := [r for r in a.root if not os.path.isdir(r)]:
            raise SystemExit(
                f"ablations.py table: no folder {', '.join(bad)} (`python train.py --out_dir=DIR` "
                "makes a run's)"
            )
        return a
    p.add_argument("root", help="the set's folder (the runs' --root)")
    if cmd in ("publish", "report"):
        p.add_argument(
            "--fixed",
            default=None,
            help="a folder of tables made again, RUN-COMMIT.json, read where a run has one "
            "(publish's default: results/retable56 when --dest is results/ablations; '': none)",
        )
    if cmd == "publish":
        p.add_argument(
            "--dest",
            default=RESULTS_DIR,
            help="the folder to publish into, adding to what it holds (default the project's "
            "results/ablations; another set: its own folder)",
        )
    else:
        p.add_argument(
            "--split",
            default="eval",
            choices=SPLITS,
            help="the held-out split the runs were judged on (default eval)",
        )
    a = p.parse_args(argv)
    if not os.path.isdir(a.root):
        raise SystemExit(
            f"ablations.py {cmd}: no folder {a.root} (`python tools/ablations.py --root "
            f"{a.root}` makes its runs)"
        )
    if cmd == "publish" and a.fixed is None:  # the set's own fixed tables, for its own folder
        same = os.path.abspath(a.dest) == os.path.abspath(RESULTS_DIR)
        a.fixed = FIXED_DIR if same else None
    if getattr(a, "fixed", None) is not None and a.fixed and not os.path.isdir(a.fixed):
        raise SystemExit(f"ablations.py {cmd}: no folder {a.fixed} (--fixed)")
    if getattr(a, "fixed", None) == "":
        a.fixed = None
    return a


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] not in [[cmd] for cmd in SUBCOMMANDS]:
        return run_all(parse_args(argv))
    cmd = argv[0]
    a = parse_subcommand(cmd, argv[1:])
    if cmd == "report":
        ablation_report.report(THIS_SET, a.root, a.split, fixed=a.fixed)
    elif cmd == "power":
        print("\n".join(power_text(a.root, a.split)))
    elif cmd == "table":
        for r in a.root:
            print("\n".join(table_lines(r)))
    else:
        publish(a.root, a.dest, fixed=a.fixed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
