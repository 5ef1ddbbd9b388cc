"""ablations.py: the paper's ablations in miniature, on the tiny world, with several seeds (issue 9).

Every run is `python train.py config/tiny.py` plus a few overrides (the table `runs()` below), so a run here
and the tiny default differ only in what the table says. All runs start from the same SFT cold start
(init_from = out/tiny-sft; train.py's sft_if_missing makes it when it is missing), except `separate`, which
needs two cold-started models: train.py runs `python sft.py --roles separate --out out/tiny-sft-separate`
itself the first time (the same traces and SFT settings, split by role). One run per (name, seed) goes to
ROOT/<name>-s<seed>/ (its metrics.jsonl, checkpoints, and train.log: everything train.py printed).

The comparisons (COMPARISONS below) and what each tests:

    hierarchy     metaagent (M=4 x N=4) vs flat8 (M=8 x N=1) and flat16 (M=16 x N=1)          (paper Table 3)
                  flat8 runs half as many executions per query as 4x4; flat16 is the control with the same
                  number. With N=1 the designer and executor advantages coincide (one execution per design),
                  so the flat runs lose the decomposed credit assignment. Paper: hierarchical > flat.
    schedule      stagewise (metaagent) vs coupled, designer-only, executor-only     (Table 4, Figure 3)
                  Paper: stagewise > coupled > single-role.
    policy        shared (metaagent) vs separate policies                                    (Table 5)
    stage_length  K = 1, 10, 30 (metaagent), scaled to the run length                      (Figure 4)
                  Paper: K=30 best.
    single_agent  metaagent vs single-agent GRPO (--template=single --mode=executor: no Designer, the same
                  16 executions per query). Paper: MetaAgent-X > single-agent GRPO.
    pairings      {SFT, RL} designer x {SFT, RL} executor for the metaagent run (evaluate.py --pairings on
                  held-out tiny tasks): did both roles improve? Paper: each RL role beats its SFT version.
                  Run after the training runs, one evaluate.py per seed: 4 pairings x --pairings-tasks (100)
                  problems, about the cost of 4 final tables (on a busy 2-core machine ~3 s a problem).

Stage length: the paper uses K=30 (its default) against 1 and 10. A tiny run has far fewer steps, so K is
scaled as K(paper_K) = max(1, round(paper_K * steps / 90)): K30 = steps/3 (three stages: designer, executor,
designer; the tiny preset's K=10 in 30 steps), K10 = steps/9, K1 = 1. K = steps would be the designer-only run
(the schedule comparison has it). Every other run uses K30, so `metaagent` is also the K=30 point.

Run it (one train.py at a time; a finished run is skipped, an unfinished one resumed from its last
checkpoint, so the same command continues an interrupted set; runs are seed-major, so a partial set has every
run of its first seeds):

    python ablations.py                                   # every run, seeds 0,1,2, --steps 30, out/ablations
    python ablations.py --seeds 0,1 --steps 90 --root out/abl90
    python ablations.py --only metaagent,flat8            # only these runs (names: see `runs()`)
    python ablations.py --cut policy,stage_length         # drop comparisons (and the runs only they need)
    python ablations.py -- --eval_tasks=50                # anything after `--` goes to every train.py
    python ablations.py report out/ablations              # ROOT/RESULTS.md + ROOT/plots/*.png
    python ablations.py publish out/ablations             # the numbers -> results/ablations, report there,
                                                          # and the README's Results section rewritten
    python ablations.py report results/ablations --readme README.md    # the same from the committed numbers

Two at once on a 2-core machine, each on its own core (train.py sizes its threads to the cores it may use):

    taskset -c 0 python ablations.py --only metaagent,flat8,coupled,designer,executor &
    taskset -c 1 python ablations.py --only flat16,separate,k1,k10,single --cut pairings &

Budget on this 2-core machine, one core a run, two runs at once, 30 steps and the 200-task final table (see
results/ablations/RESULTS.md for each run's RL minutes): metaagent (4x4) about 6.5 min, flat16 about 11.
The README's Results section is made from results/ablations/ (`publish`): each run's metrics.jsonl, run.json
and final_table.json (no checkpoints), and the sampled pairings' results.json.

What the report computes (every number from the committed files; tests/test_ablations.py checks that the
committed RESULTS.md and README section are what `report` makes of them):
    P(suited template)        primary: train.py's final table, exact by teacher forcing, per held-out task: the
    P(oracle reply)           Designer's probability of the template suited to the task's kind, and the single
                              agent's probability of the oracle reply (final_table.json "per_task")
    held-out accuracy         secondary: the "RL: learned designs" row, sampled 1 x 1 at T=1 (the "RL: single
                              agent" row for single-agent GRPO), per task
    training reward           secondary: metrics.jsonl's reward/mean over the last 20% of steps (change: minus
                              the first 20%)
    RL - SFT                  a run's RL model minus its own cold start on the same tasks
    A - B                     paired: the same seed means the same training queries and the same held-out tasks
                              (checked by task id), so per seed d_s = mean over tasks of A - B with its paired
                              SE w_s; D = mean_s d_s, SE = max(std_s(d_s) / sqrt(S), sqrt(sum_s w_s^2) / S).
                              One rule: beyond noise when |D| > 2 SE ("held" in the paper's direction,
                              "reversed" against it), else "within noise".
    pairings                  exact: P(suited template) depends on the Designer's model alone and P(oracle reply)
                              on the Executor's alone, so {SFT, RL} x {SFT, RL} reduces to the metaagent runs'
                              two RL - SFT differences; sampled: evaluate.py --pairings, paired per problem

Needs: train.py, settings.py, rundir.py, plot.py, advantage.py, stagewise.py, grpo.py, chunked.py, shared_prompts.py, speed.py, engine.py, decode.py, sft.py, evaluate.py, tiny.py, rollout.py, mas.py, sandbox.py, reward.py, data.py (it runs train.py and evaluate.py as programs)
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys

import evaluate
import rundir

REPO = os.path.dirname(os.path.abspath(__file__))
SFT_DIR = "out/tiny-sft"      # config/tiny.py's init_from: the shared cold start (relative to the repo)
TAIL = 0.2                    # the last 20% of steps summarise a run


# ----------------------------------------------------------------------------------------------------------
# the runs: train.py overrides on top of config/tiny.py


def k_scaled(paper_k, steps):
    """The paper's stage length K (out of 1, 10, 30) scaled to a run of `steps` steps."""
    return max(1, round(paper_k * steps / 90))


def runs(steps):
    """{run name: {config key: value}}: what each run sets on top of config/tiny.py."""
    base = {"M": 4, "N": 4, "K": k_scaled(30, steps)}
    return {
        "metaagent": base,                                           # the method: 4x4, stagewise, K30
        "flat8": {**base, "M": 8, "N": 1},                           # flat, half the executions
        "flat16": {**base, "M": 16, "N": 1},                         # flat, the same number of executions
        "coupled": {**base, "mode": "coupled"},                      # both roles every step
        "designer": {**base, "mode": "designer"},                    # designer-only
        "executor": {**base, "mode": "executor"},                    # executor-only
        "separate": {**base, "policy": "separate", "init_from": "out/tiny-sft-separate"},
        "k1": {**base, "K": k_scaled(1, steps)},
        "k10": {**base, "K": k_scaled(10, steps)},
        "single": {**base, "template": "single", "mode": "executor"},   # single-agent GRPO
    }


RUN_NAMES = list(runs(90))

# claims (A, B) read "the paper found A better than B"
COMPARISONS = {
    "hierarchy": {
        "title": "Hierarchical 4x4 vs flat (paper Table 3)",
        "runs": ["metaagent", "flat8", "flat16"],
        "claims": [("metaagent", "flat8"), ("metaagent", "flat16")],
        "paper": "hierarchical M=4xN=4 > flat M=8xN=1",
        "note": "flat8 runs half as many executions per query as 4x4 (8 vs 16); flat16 is the control with the "
                "same number. With N=1 the designer and executor advantages coincide.",
    },
    "schedule": {
        "title": "Stagewise vs coupled vs single-role training (paper Table 4, Figure 3)",
        "runs": ["metaagent", "coupled", "designer", "executor"],
        "claims": [("metaagent", "coupled"), ("coupled", "designer"), ("coupled", "executor")],
        "paper": "stagewise > coupled > single-role (designer-only, executor-only)",
        "note": "metaagent is the stagewise run.",
    },
    "policy": {
        "title": "Shared vs separate policies (paper Table 5)",
        "runs": ["metaagent", "separate"],
        "claims": [("metaagent", "separate")],
        "paper": "shared >= separate (one shared policy is the paper's default)",
        "note": "separate starts from two role-specific SFT models (out/tiny-sft-separate), the others from "
                "the shared out/tiny-sft.",
    },
    "stage_length": {
        "title": "Stage length K in {1, 10, 30}, scaled to the run (paper Figure 4)",
        "runs": ["metaagent", "k10", "k1"],
        "claims": [("metaagent", "k10"), ("metaagent", "k1")],
        "paper": "K=30 best",
        "note": "K(paper K) = max(1, round(K * steps / 90)); metaagent is the K=30 point.",
    },
    "single_agent": {
        "title": "MetaAgent-X vs single-agent GRPO",
        "runs": ["metaagent", "single"],
        "claims": [("metaagent", "single")],
        "paper": "MetaAgent-X > single-agent GRPO",
        "note": "single: --template=single --mode=executor, the same 16 executions per query; its held-out "
                "accuracy is the single-agent row of its final table.",
    },
    "pairings": {
        "title": "{SFT, RL} designer x {SFT, RL} executor (metaagent)",
        "runs": ["metaagent"],
        "claims": [],
        "paper": "both roles improve: RL designer x SFT executor > SFT x SFT, and SFT designer x RL executor "
                 "> SFT x SFT",
        "note": "evaluate.py --pairings on held-out tiny tasks, 1 design x 1 execution each, T=1.",
    },
}


def out_dir(root, run, seed):
    return os.path.join(root, f"{run}-s{seed}")


def train_command(run, seed, steps, root, extra=()):
    """The train.py command line (run from the repo root) of one run."""
    if run not in RUN_NAMES:
        raise ValueError(f"unknown run {run!r}; runs: {', '.join(RUN_NAMES)}")
    flags = [f"--{k}={v}" for k, v in runs(steps)[run].items()]
    return [sys.executable, "train.py", "config/tiny.py", f"--out_dir={out_dir(root, run, seed)}",
            f"--seed={seed}", f"--steps={steps}", *flags, *extra]


# ----------------------------------------------------------------------------------------------------------
# running: sequential subprocesses, finished runs skipped, unfinished ones resumed


def read_metrics(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def is_finished(run_dir, steps):
    """All steps logged and the final table written (train.py's last act; a run resumed at its last step only
    writes the table)."""
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    return (len(rows) >= steps and rows[-1].get("step") == steps
            and os.path.exists(os.path.join(run_dir, "final_table.json")))


# the trampoline that pins a program to some cores before it starts: python -c PIN 0,1 train.py ...
PIN = ("import os, sys; os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')}); "
       "os.execv(sys.executable, [sys.executable] + sys.argv[2:])")


def launch(cmd, log_path, cpus=None, echo=True):
    """Run cmd (a Python program: cmd[0] is sys.executable) in the repo root, on the cores `cpus` when given;
    its output is appended to log_path and, with echo, printed too. Returns rc."""
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        argv = [cmd[0], "-c", PIN, ",".join(map(str, cpus)), *cmd[1:]] if cpus else cmd
        p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        try:
            for line in p.stdout:
                if echo:
                    sys.stdout.write(line)
                log.write(line)
            return p.wait()
        except BaseException:
            p.terminate()
            p.wait()
            raise


def run_one(run, seed, steps, root, extra, cpus=None, echo=True):
    """'skipped' | 'ok' | 'failed (rc N)'. run.json records the command; a different one in the same
    out_dir is an error (resuming with other settings would mix two runs)."""
    d = out_dir(root, run, seed)
    cmd = train_command(run, seed, steps, root, extra)
    stamp = os.path.join(d, "run.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            before = json.load(f)["cmd"]
        if before[1:] != cmd[1:]:
            raise SystemExit(f"ablations.py: {d} was made by a different command:\n  {' '.join(before[1:])}\n"
                             f"now:\n  {' '.join(cmd[1:])}\nuse another --root or delete {d}")
    if is_finished(d, steps):
        print(f"== {run} seed {seed}: finished, skipped ({d})", flush=True)
        return "skipped"
    os.makedirs(d, exist_ok=True)
    with open(stamp, "w") as f:
        json.dump({"cmd": cmd}, f)
    print(f"== {run} seed {seed}: {' '.join(cmd[1:])}" + (f" (cores {cpus})" if cpus else ""), flush=True)
    # an interrupted run: from its last checkpoint (train.py refuses a fresh run into a folder with metrics)
    resume = ["--resume"] if rundir.checkpoints(d) or os.path.exists(os.path.join(d, "metrics.jsonl")) else []
    rc = launch(cmd + resume, os.path.join(d, "train.log"), cpus, echo)
    if not echo:
        print(f"== {run} seed {seed}: {'ok' if rc == 0 else f'failed (rc {rc})'}", flush=True)
    return "ok" if rc == 0 else f"failed (rc {rc})"


def latest_model(run_dir):
    """The shared model folder of a run's last checkpoint (None when there is none)."""
    steps = rundir.checkpoints(run_dir)
    return os.path.join(run_dir, steps[-1], "model") if steps else None


def pairings_command(root, seed, n_tasks=100):
    """evaluate.py's {SFT, RL} x {SFT, RL} pairings of the metaagent run, with the tiny world's sampling."""
    rl = latest_model(out_dir(root, "metaagent", seed))
    return [sys.executable, "evaluate.py", "--pairings", f"sft={SFT_DIR}", f"rl={rl}", "--tasks", "tiny",
            "--n-tiny", str(n_tasks),
            "--mode", "auto", "--short-prompt", "--temperature", "1.0", "--top-p", "1.0", "--max-tokens", "128",
            "--designer-max-tokens", "400", "--seed", str(seed), "--out", os.path.join(root, f"pairings-s{seed}")]


def pairings_one(root, seed, steps, n_tasks, cpus=None, echo=True):
    d = os.path.join(root, f"pairings-s{seed}")
    if os.path.exists(os.path.join(d, "results.json")):
        return "skipped"
    if not is_finished(out_dir(root, "metaagent", seed), steps):
        return "no finished metaagent run"
    os.makedirs(d, exist_ok=True)
    cmd = pairings_command(root, seed, n_tasks)
    print(f"== pairings seed {seed}: {' '.join(cmd[1:])}", flush=True)
    rc = launch(cmd, os.path.join(d, "evaluate.log"), cpus, echo)
    return "ok" if rc == 0 else f"failed (rc {rc})"


def in_parallel(work, jobs):
    """Run work = [(key, fn)] with `jobs` at a time, in order; fn(cpus, echo) -> status. jobs = 1: one after
    the other on every core, output printed. jobs > 1: worker k owns the cores usable[k::jobs] and its runs go
    there, output to the logs. On the tiny model a second core buys a run little (the SFT cold start ran at
    3225 tokens/s on one core, 3541 on two), so two runs at a time nearly double the throughput."""
    if jobs == 1:
        return {key: fn(None, True) for key, fn in work}
    import queue
    import threading
    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if usable and jobs > len(usable):
        raise SystemExit(f"ablations.py: --jobs {jobs} is more than the {len(usable)} cores this process may use")
    todo, status = queue.Queue(), {}
    for item in work:
        todo.put(item)

    def worker(k):
        cpus = usable[k::jobs] or None
        while True:
            try:
                key, fn = todo.get_nowait()
            except queue.Empty:
                return
            try:
                status[key] = fn(cpus, False)
            except SystemExit as e:   # a refused folder: the others go on, the summary names it
                status[key] = f"failed ({e})"
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {key: status[key] for key, _ in work}


def run_all(a):
    import functools
    import threading
    wanted = [c for c in COMPARISONS if c not in a.cut]
    names = [r for r in RUN_NAMES if any(r in COMPARISONS[c]["runs"] for c in wanted)]
    if a.only:
        names = [r for r in names if r in a.only]
    if not names:
        raise SystemExit("ablations.py: --only/--cut leave no run")
    print(f"ablations.py: runs {', '.join(names)}; seeds {a.seeds}; {a.steps} steps; root {a.root}; "
          f"{a.jobs} at a time", flush=True)
    # a run whose cold start is missing builds it (train.py's sft_if_missing): the runs that need the same one
    # wait for it instead of building it twice at once
    building = {}

    def train(run, seed, cpus, echo):
        init = os.path.join(REPO, runs(a.steps)[run].get("init_from", SFT_DIR))
        if not os.path.isdir(init):
            with building.setdefault(init, threading.Lock()):
                if not os.path.isdir(init):     # the first run here builds it
                    return run_one(run, seed, a.steps, a.root, a.extra, cpus, echo)
        return run_one(run, seed, a.steps, a.root, a.extra, cpus, echo)
    # seed-major: a partial set still has every run of its first seeds
    status = in_parallel([(f"{run}-s{seed}", functools.partial(train, run, seed)) for seed in a.seeds
                          for run in names], a.jobs)
    if "pairings" in wanted and "metaagent" in names:
        status.update(in_parallel([(f"pairings-s{seed}", functools.partial(pairings_one, a.root, seed, a.steps,
                                                                           a.pairings_tasks)) for seed in a.seeds], a.jobs))
    print("\n".join(f"  {k}: {v}" for k, v in status.items()))
    print(f"then: python ablations.py report {a.root}")
    return 1 if any(v.startswith("failed") for v in status.values()) else 0


# ----------------------------------------------------------------------------------------------------------
# the report: ROOT/RESULTS.md and ROOT/plots/<comparison>.png

def read_table(run_dir):
    """train.py's final table of a run (its final_table.json), or {} when there is none or it is unreadable."""
    try:
        with open(os.path.join(run_dir, "final_table.json")) as f:
            table = json.load(f)
        return table if isinstance(table, dict) else {}
    except (OSError, ValueError):
        return {}


def rows_of(run):
    """The sampled rows of the final table that stand for a run's RL model and its SFT cold start: the learned
    designs, or for single-agent GRPO (no Designer) the single agent."""
    return ("RL: single agent", "SFT: single agent") if run == "single" else ("RL: learned designs", "SFT: designs")


def summarize(run_dir, run):
    """One run's numbers: its training curve from metrics.jsonl and, per held-out task, its final table's exact
    and sampled measures for the RL model and the SFT cold start (None without a metrics.jsonl)."""
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    if not rows:
        return None
    n_tail = max(1, math.ceil(TAIL * len(rows)))
    tail, head = rows[-n_tail:], rows[:n_tail]
    mean = lambda key, part=tail: sum(r.get(key, 0.0) for r in part) / len(part)
    shares = {k.split("/", 1)[1]: mean(k) for k in sorted({k for r in tail for k in r if k.startswith("structure/")})}
    out = {"steps": len(rows), "reward": [r["reward/mean"] for r in rows], "train_reward": mean("reward/mean"),
           "train_change": mean("reward/mean") - mean("reward/mean", head),   # did the run itself learn?
           "structures": shares, "minutes": sum(r.get("time/step", 0.0) for r in rows) / 60,
           "ids": None, "kinds": None, "tasks": {}}
    table = read_table(run_dir)
    try:
        per = table["per_task"]
        out["tasks"] = {who: {"suited": per["exact"][who]["suited"], "oracle": per["exact"][who]["oracle"],
                              "choice": per["exact"][who]["choice"], "accuracy": per["correct"][row]}
                        for who, row in zip(("RL", "SFT"), rows_of(run))}
        out["ids"], out["kinds"] = table["ids"], table["kinds"]
    except (KeyError, TypeError):
        pass   # no final table (or one from before per-task vectors): the run has a curve but no held-out measures
    return out


def target_steps(run_dir):
    """The --steps its run.json command asked for (None without one: a run made by hand)."""
    try:
        with open(os.path.join(run_dir, "run.json")) as f:
            flags = [x for x in json.load(f)["cmd"] if isinstance(x, str) and x.startswith("--steps=")]
        return int(flags[-1].split("=", 1)[1]) if flags else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def collect(root, unfinished=None):
    """{run: {seed: summary}} for every ROOT/<run>-s<seed> with a metrics.jsonl. A run still short of the steps
    its command asked for, or without its final table yet, is left out and, if a list is given, named in it."""
    out = {}
    for name in sorted(os.listdir(root)):
        m = re.fullmatch(r"(.+)-s(\d+)", name)
        if m and m[1] in RUN_NAMES:
            s = summarize(os.path.join(root, name), m[1])
            if s is None:
                continue
            target = target_steps(os.path.join(root, name))
            if target is not None and s["steps"] < target:
                if unfinished is not None:
                    unfinished.append(f"{name} ({s['steps']}/{target} steps)")
            elif not s["tasks"]:
                if unfinished is not None:
                    unfinished.append(f"{name} (no final table)")
            else:
                out.setdefault(m[1], {})[int(m[2])] = s
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
    ds, ws = [], []
    for x, y in pairs:
        d, w = evaluate.paired_margin(x, y)
        ds.append(d)
        ws.append(w)
    S = len(ds)
    if S == 0:
        return None, None, 0
    D = sum(ds) / S
    task_se = math.sqrt(sum(w * w for w in ws)) / S
    if S == 1:
        return D, task_se, 1
    seed_se = math.sqrt(sum((d - D) ** 2 for d in ds) / (S - 1) / S)
    return D, max(seed_se, task_se), S


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
    """Mean over a run's seeds and tasks of a per-task measure (a probability or accuracy), as a percentage."""
    per = [sum(s["tasks"][who][key]) / len(s["tasks"][who][key]) for s in results.get(run, {}).values()]
    return 100 * sum(per) / len(per) if per else float("nan")


def claim_sentence(a, b, results):
    """One line per claim: A - B in RL's gain over the cold start on each measure (the same as RL - RL where
    both runs start from one cold start), with its SE and verdict (exact rows first: they decide)."""
    parts = []
    for key, label, scale in MEASURES:
        D, SE, S = measure(results, a, b, key, "gain", "gain")
        if D is not None:
            digits = 1 if scale == 100 else 3
            parts.append(f"{label} {diff_text(D, SE, S, scale, digits)}, {verdict(D, SE, S)}")
    seeds = len(set(results.get(a, {})) & set(results.get(b, {})))
    return f"{a} > {b} (seeds: {seeds}): " + ("; ".join(parts) if parts else "missing runs") + "."


def structure_text(summaries):
    keys = sorted({k for s in summaries for k in s["structures"]})
    avg = {k: sum(s["structures"].get(k, 0.0) for s in summaries) / len(summaries) for k in keys}
    return ", ".join(f"{k} {v:.0%}" for k, v in sorted(avg.items(), key=lambda kv: -kv[1]) if v >= 0.005) or "-"


def plot_comparison(path, title, results, names):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name in names:
        curves = [s["reward"] for s in results.get(name, {}).values()]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        w = max(1, n // 10)                       # a trailing moving average over ~10% of the run
        sm = np.array([np.convolve(c[:n], np.ones(w) / w, mode="valid") for c in curves])
        x = np.arange(w, n + 1)
        mu, sd = sm.mean(0), sm.std(0, ddof=1) if len(sm) > 1 else np.zeros(sm.shape[1])
        ax.plot(x, mu, label=f"{name} ({len(curves)} seeds)", lw=1.6)
        ax.fill_between(x, mu - sd, mu + sd, alpha=0.2)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel("training reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pairings_section(root, results):
    """Markdown lines: did each role improve? Exact (from the metaagent runs' final tables: P(suited template)
    depends on the Designer's model alone, P(oracle reply) on the Executor's alone, so the {SFT, RL} x {SFT, RL}
    pairings reduce to two paired differences), then evaluate.py's sampled pairings (ROOT/pairings-s*/)."""
    lines = ["Exact (teacher-forced, the metaagent runs' final tables):", "",
             "| role: measure | SFT | RL | RL − SFT | verdict |", "|---|---|---|---|---|"]
    for role, key, label in (("Designer", "suited", "P(suited template)"), ("Executor", "oracle", "P(oracle reply)")):
        D, SE, S = measure(results, "metaagent", "metaagent", key, "RL", "SFT")
        lines.append(f"| {role}: {label} | {mean_of(results, 'metaagent', 'SFT', key):.1f}% | "
                     f"{mean_of(results, 'metaagent', 'RL', key):.1f}% | {diff_text(D, SE, S, 100)} | {verdict(D, SE, S)} |")
    found = {}
    for name in sorted(os.listdir(root)):
        p = os.path.join(root, name, "results.json")
        if re.fullmatch(r"pairings-s\d+", name) and os.path.exists(p):
            try:
                with open(p) as f:
                    res = json.load(f)["results"]
                for d in ("sft", "rl"):
                    for e in ("sft", "rl"):
                        found.setdefault(f"{d}/{e}", []).append(res[f"designer {d} x executor {e}"]["tiny"]["per_problem"])
            except (OSError, ValueError, KeyError, TypeError):
                continue   # a half-written or foreign file: not a pairings result
    lines += ["", "Sampled (evaluate.py --pairings: held-out tiny tasks, 1 design x 1 execution each, T=1; secondary):", ""]
    if not found:
        return lines + ["No sampled pairings (ROOT/pairings-s*/results.json): `python ablations.py` runs them after "
                        "the metaagent runs, or by hand:", "", "    python " + " ".join(pairings_command(root, 0)[1:])]
    pct = lambda xs: f"{100 * sum(map(sum, xs)) / max(1, sum(map(len, xs))):.1f}%"
    lines += ["| designer \\ executor | SFT | RL |", "|---|---|---|"]
    lines += [f"| {d.upper()} | {pct(found.get(d + '/sft', []))} | {pct(found.get(d + '/rl', []))} |" for d in ("sft", "rl")]
    lines.append("")
    for a, b, role in (("rl/sft", "sft/sft", "Designer"), ("sft/rl", "sft/sft", "Executor")):
        D, SE, S = paired(list(zip(found.get(a, []), found.get(b, []))))
        lines.append(f"- {role} improved ({a} − {b}, pass@1): {diff_text(D, SE, S, 100)}, {verdict(D, SE, S)}.")
    return lines


def run_table(results, names):
    """Markdown rows, one per run: its RL model, and RL − SFT on the same tasks, over its seeds."""
    md = ["| run | setting | seeds | P(suited) | RL − SFT | P(oracle) | RL − SFT | held-out acc. | RL − SFT "
          "| train reward | change | structures (end) | RL min |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in names:
        per = list(results[r].values())
        setting = " ".join(f"{k}={v}" for k, v in runs(per[0]["steps"])[r].items() if not k.endswith("init")
                           and k != "init_from")
        cells = []
        for key in ("suited", "oracle", "accuracy"):
            cells += [f"{mean_of(results, r, 'RL', key):.1f}%", diff_text(*measure(results, r, r, key, "RL", "SFT"), 100)]
        tr = [s["train_reward"] for s in per]
        ch = [s["train_change"] for s in per]
        md.append(f"| {r} | `{setting}` | {len(per)} | " + " | ".join(cells) + f" | {sum(tr) / len(tr):.3f} | "
                  f"{sum(ch) / len(ch):+.3f} | {structure_text(per)} | {sum(s['minutes'] for s in per) / len(per):.1f} |")
    return md


def template_table(results, names):
    """P(each template | kind) of every run's RL model (mean over seeds and tasks), with the cold starts'."""
    first = next(iter(results[names[0]].values()))
    kinds = sorted(set(first["kinds"]))
    templates = list(first["tasks"]["RL"]["choice"])
    md = ["| model | " + " | ".join(f"{t} \\| {k}" for k in kinds for t in templates) + " |",
          "|---|" + "---|" * (len(kinds) * len(templates))]

    def row(label, run, who):
        cells = []
        for k in kinds:
            for t in templates:
                vals = [v for s in results[run].values() for v, kk in zip(s["tasks"][who]["choice"][t], s["kinds"]) if kk == k]
                cells.append(f"{100 * sum(vals) / max(1, len(vals)):.1f}")
        return f"| {label} | " + " | ".join(cells) + " |"
    md.append(row("SFT cold start", names[0], "SFT"))
    if "separate" in names:
        md.append(row("SFT cold start (separate)", "separate", "SFT"))
    md += [row(r, r, "RL") for r in names]
    return md


RULE = ("Every difference is paired: runs with the same seed draw the same training queries and are measured on "
        "the same 200 held-out tasks (the eval split), so each seed gives a per-task difference d_s with its own "
        "standard error w_s; D is the mean of d_s over seeds and SE = max(std(d_s)/sqrt(S), sqrt(sum w_s²)/S). "
        "**A difference is beyond noise when |D| > 2 SE**: *held* (the paper's direction) or *reversed*; "
        "otherwise *within noise*.")


def report(root, readme=None):
    """ROOT/RESULTS.md and ROOT/plots/*.png from the runs under ROOT; with readme, also that file's Results
    section (between the results:start/end markers)."""
    if not os.path.isdir(root):
        raise SystemExit(f"ablations.py report: {root} is not a folder")
    unfinished = []
    results = collect(root, unfinished)
    if not results:
        raise SystemExit(f"ablations.py report: no finished <run>-s<seed> (metrics.jsonl and final_table.json) "
                         f"under {root}" + (f"; unfinished: {', '.join(unfinished)}" if unfinished else ""))
    os.makedirs(os.path.join(root, "plots"), exist_ok=True)
    steps = sorted({s["steps"] for per in results.values() for s in per.values()})
    seeds = sorted({seed for per in results.values() for seed in per})
    names = [r for r in RUN_NAMES if r in results]
    md = ["# Ablations on the tiny world", "",
          f"Made by `python ablations.py report` from the runs in this folder: {steps[-1]} RL steps each, seeds "
          f"{', '.join(map(str, seeds))}, every run from the same SFT cold start (separate: its own two). "
          "**Primary measures, exact by teacher forcing** on the 200 held-out tasks of train.py's final table: "
          "P(suited template), the probability that the Designer writes the template that suits the task's kind "
          "(the tester on code, the vote on math), and P(oracle reply), the probability that the single agent "
          "writes the oracle's worked reply. Secondary: held-out accuracy sampled with 1 design x 1 execution "
          "at T=1 (the single agent for single-agent GRPO), and the training reward over the last "
          f"{TAIL:.0%} of steps (change: minus the first {TAIL:.0%}). RL − SFT: the run's RL model minus its own "
          "cold start on the same tasks. A claim \"A > B\" compares the two runs' RL − SFT gains task by task "
          "(with one cold start, the same as comparing the RL models; separate policies start from their own). "
          "All differences in points (reward units for the training reward), ± one SE.", "", RULE, "",
          "Regenerate:", "", f"    python ablations.py --seeds {','.join(map(str, seeds))} --steps {steps[-1]} --jobs 2",
          "    python ablations.py publish out/ablations     # copies the numbers here and runs report", "",
          "## All runs", ""] + run_table(results, names) + [
          "", "P(each template | kind), %, mean over seeds and held-out tasks:", ""] + template_table(results, names) + [""]
    summary, missing = [], []
    for cname, c in COMPARISONS.items():
        present = [r for r in c["runs"] if r in results]
        if len(present) < (1 if cname == "pairings" else 2):
            missing.append(f"{cname} (needs {', '.join(r for r in c['runs'] if r not in results)})")
            continue
        md += [f"## {c['title']}", "", c["note"], ""]
        if cname == "pairings":
            lines = pairings_section(root, results)
            md += lines + ["", f"Paper: {c['paper']}.", ""]
            dd, sd, nd = measure(results, "metaagent", "metaagent", "suited", "RL", "SFT")
            de, se, ne = measure(results, "metaagent", "metaagent", "oracle", "RL", "SFT")
            summary.append(f"- **{c['title']}**. Paper: {c['paper']}. Here, RL − SFT (seeds: {nd}): the Designer's "
                           f"suited {diff_text(dd, sd, nd, 100)} ({verdict(dd, sd, nd)}), the Executor's oracle "
                           f"{diff_text(de, se, ne, 100)} ({verdict(de, se, ne)}).")
            continue
        md += run_table(results, present)
        plot_comparison(os.path.join(root, "plots", f"{cname}.png"), c["title"], results, present)
        md += ["", f"![{cname}](plots/{cname}.png)", "", f"Paper: {c['paper']}. Here:", ""]
        md += [f"- {claim_sentence(a, b, results)}" for a, b in c["claims"]] + [""]
        here = []
        for a, b in c["claims"]:
            cells = []
            for key in ("suited", "oracle"):
                D, SE, S = measure(results, a, b, key, "gain", "gain")
                cells.append(f"{key} {diff_text(D, SE, S, 100)} ({verdict(D, SE, S)})")
            here.append(f"{a} − {b} (seeds: {S}): " + ", ".join(cells))
        summary.append(f"- **{c['title']}**. Paper: {c['paper']}. Here: " + "; ".join(here) + ".")
    tail = []
    if missing:
        tail.append(f"Not yet run (or fewer than the runs they compare): {'; '.join(missing)}.")
    if unfinished:
        tail.append(f"Unfinished, left out: {', '.join(unfinished)}.")
    md += [t + "\n" for t in tail]
    path = os.path.join(root, "RESULTS.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    print(f"wrote {path} and {os.path.join(root, 'plots')}/*.png")
    if readme:
        write_readme_section(readme, summary, tail, steps[-1], seeds)
    return path


START, END = "<!-- results:start (made by ablations.py report; see results/ablations/RESULTS.md) -->", "<!-- results:end -->"


def write_readme_section(readme, summary, tail, steps, seeds):
    """Replace the README's Results section (between START and END) with the comparisons' verdicts."""
    with open(readme) as f:
        text = f.read()
    if START not in text or END not in text:
        raise SystemExit(f"ablations.py report: {readme} has no results section ({START} ... {END})")
    body = [START,
            f"The paper's ablations in miniature, on the tiny world: {steps} RL steps a run, seeds "
            f"{', '.join(map(str, seeds))}, judged by the exact rows of train.py's final table: *suited* = "
            "P(suited template), the Designer; *oracle* = P(oracle reply), the Executor. A − B is the difference "
            "of the two runs' RL − SFT gains in points ± one paired SE; beyond noise when |D| > 2 SE. Every "
            "table, the sampled accuracy and the training reward: "
            "[results/ablations/RESULTS.md](results/ablations/RESULTS.md).", ""] + summary + [""] + \
           [t + "\n" for t in tail] + [
            "    python ablations.py --jobs 2                 # every run, seeds 0-2, two at a time, into out/ablations",
            "    python ablations.py publish out/ablations    # the numbers into results/ablations, and this section",
            END]
    a, b = text.index(START), text.index(END) + len(END)
    with open(readme, "w") as f:
        f.write(text[:a] + "\n".join(body) + text[b:])
    print(f"wrote the Results section of {readme}")


KEEP = ("metrics.jsonl", "final_table.json", "run.json", "results.json")   # what publish copies (no checkpoints)


RESULTS_DIR, README = os.path.join(REPO, "results", "ablations"), os.path.join(REPO, "README.md")


def publish(src, dest=RESULTS_DIR, readme=README):
    """Copy every finished run's numbers from src to dest (replacing what dest held; checkpoints and logs stay
    behind), then report there and rewrite the README's Results section."""
    import shutil
    if not os.path.isdir(src):
        raise SystemExit(f"ablations.py publish: {src} is not a folder")
    # finished runs only (train.py writes final_table.json last; evaluate.py its results.json)
    names = [n for n in sorted(os.listdir(src)) if re.fullmatch(r"(.+)-s(\d+)", n)
             and any(os.path.exists(os.path.join(src, n, k)) for k in ("final_table.json", "results.json"))]
    if not names:
        raise SystemExit(f"ablations.py publish: no runs under {src}")
    if os.path.abspath(src) != os.path.abspath(dest):
        if os.path.isdir(dest):
            shutil.rmtree(dest)
        for n in names:
            os.makedirs(os.path.join(dest, n))
            for k in KEEP:
                if os.path.exists(os.path.join(src, n, k)):
                    shutil.copy2(os.path.join(src, n, k), os.path.join(dest, n, k))
    return report(dest, readme)

# ----------------------------------------------------------------------------------------------------------
# command line


def _names(text, allowed, what):
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in allowed]
    if bad or not names:
        raise SystemExit(f"ablations.py: unknown {what} {', '.join(bad) or repr(text)}; "
                         f"choose from {', '.join(allowed)}")
    return names


def parse_args(argv):
    argv = list(argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    for x in extra:
        if not x.startswith("--") or "=" not in x:
            raise SystemExit(f"ablations.py: after `--` give train.py overrides like --eval_tasks=50, got {x!r}")
    p = argparse.ArgumentParser(description="the paper's ablations on the tiny world (see the docstring)")
    p.add_argument("--root", default="out/ablations", help="one folder for every run (default out/ablations)")
    p.add_argument("--seeds", default="0,1,2", help="comma list of seeds (default 0,1,2)")
    p.add_argument("--steps", type=int, default=30, help="RL steps per run (default 30)")
    p.add_argument("--only", default="", help=f"comma list of runs to run: {', '.join(RUN_NAMES)}")
    p.add_argument("--cut", default="", help=f"comma list of comparisons to drop: {', '.join(COMPARISONS)}")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, each on its own cores (default 1)")
    p.add_argument("--pairings-tasks", type=int, default=100,
                   help="held-out tiny tasks for the pairings (4 pairings x this many; default 100)")
    a = p.parse_args(argv)
    if a.jobs < 1:
        raise SystemExit(f"ablations.py: --jobs must be >= 1, got {a.jobs}")
    if a.pairings_tasks < 1:
        raise SystemExit(f"ablations.py: --pairings-tasks must be >= 1, got {a.pairings_tasks}")
    try:
        a.seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"ablations.py: --seeds must be a comma list of integers, got {a.seeds!r}") from None
    if not a.seeds or len(set(a.seeds)) != len(a.seeds) or min(a.seeds) < 0:
        raise SystemExit("ablations.py: --seeds must be distinct integers >= 0")
    if a.steps < 1:
        raise SystemExit(f"ablations.py: --steps must be >= 1, got {a.steps}")
    a.only = _names(a.only, RUN_NAMES, "run") if a.only else []
    a.cut = _names(a.cut, list(COMPARISONS), "comparison") if a.cut else []
    a.root = os.path.abspath(a.root)
    a.extra = extra
    return a


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["report"]:
        if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--readme"):
            raise SystemExit("usage: python ablations.py report ROOT [--readme README.md]")
        report(argv[1], argv[3] if len(argv) == 4 else None)
        return 0
    if argv[:1] == ["publish"]:
        if len(argv) != 2:
            raise SystemExit("usage: python ablations.py publish ROOT   (copies into results/ablations)")
        publish(argv[1])
        return 0
    return run_all(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
