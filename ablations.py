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

Run it (sequentially, one train.py at a time; a finished run is skipped, an unfinished one resumed from its
last checkpoint, so the same command continues an interrupted set):

    python ablations.py                                   # every run, seeds 0,1,2, --steps 60, out/ablations
    python ablations.py --seeds 0,1 --steps 90 --root out/abl90
    python ablations.py --only metaagent,flat8            # only these runs (names: see `runs()`)
    python ablations.py --cut policy,stage_length         # drop comparisons (and the runs only they need)
    python ablations.py -- --eval_tasks=50                # anything after `--` goes to every train.py
    python ablations.py report out/ablations              # ROOT/RESULTS.md + ROOT/plots/*.png

Budget, measured for 45 steps of RL plus the held-out table on a quiet 2-core machine at commit c909bfd
(AdamW cold start, RL lr 1e-4, a 100-task table; the table is 200 tasks now, about a minute more a run): metaagent
(4x4) 11-13 min, flat8 10-11 min, flat16 19-21 min (16 designs of ~400 tokens per query), single 5-7 min; so
the hierarchy and single-agent comparisons cost about 50 minutes per seed, and all 10 runs more than two hours per
seed. The issue's budget is about two hours: cut comparisons before steps, and say in the README which
were cut (RESULTS.md lists the comparisons that have no runs). The README's results came from

    python ablations.py --root out/ablations --seeds 0,1,2 --steps 45 --cut schedule,policy,stage_length

with the third seed of flat8 and flat16 left out for time.

The README's Results section is ROOT/RESULTS.md with its plots. The repository keeps a copy in results/ablations/:
RESULTS.md, plots/, and each run's metrics.jsonl, final_table.json and run.json, without the checkpoints. So
`python ablations.py report results/ablations` redraws it from the committed numbers.

What the report computes:
    train reward / accuracy   mean of metrics.jsonl's reward/mean / accuracy over the last 20% of steps
    change                    that training reward minus the one over the first 20% of steps
    held-out accuracy         from train.py's final table (final_table.json; for older runs the table printed
                              in train.log): the "RL: learned designs" row (the "RL: single agent" row for
                              the single-agent GRPO run)
    gain over SFT             that row minus its SFT row in the same table ("SFT: designs", or "SFT: single
                              agent"): the same tasks and sampling seed, a paired difference
    structures                mean shares of structure/* over the last 20% of steps
Every number is mean +- std over seeds (sample std). A paper direction "A > B" is "held" when mean(A) - mean(B)
exceeds the combined std sqrt(std_A^2 + std_B^2), "reversed" when it is below minus that, "within noise"
otherwise, and "undecided" with fewer than two seeds on either side.

Needs: train.py, settings.py, rundir.py, plot.py, advantage.py, stagewise.py, grpo.py, speed.py, engine.py, decode.py, sft.py, evaluate.py, tiny.py, rollout.py, mas.py, sandbox.py, reward.py, data.py (it runs train.py and evaluate.py as programs)
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys

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
        "separate": {**base, "policy": "separate", "init_from": "out/tiny-sft-separate/designer",
                     "executor_init": "out/tiny-sft-separate/executor"},
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
        "paper": "shared >= separate (the paper's default is one shared policy; check the direction against "
                 "its Table 5)",
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
            f"--seed={seed}", f"--steps={steps}", *flags, *extra, "--progress=False"]


# ----------------------------------------------------------------------------------------------------------
# running: sequential subprocesses, finished runs skipped, unfinished ones resumed


def read_metrics(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def is_finished(run_dir, steps):
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    return len(rows) >= steps and rows[-1].get("step") == steps


def launch(cmd, log_path):
    """Run cmd in the repo root; its output goes to the console and is appended to log_path. Returns rc."""
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        try:
            for line in p.stdout:
                sys.stdout.write(line)
                log.write(line)
            return p.wait()
        except BaseException:
            p.terminate()
            p.wait()
            raise


def run_one(run, seed, steps, root, extra):
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
    print(f"== {run} seed {seed}: {' '.join(cmd[1:])}", flush=True)
    # an interrupted run: from its last checkpoint (train.py refuses a fresh run into a folder with metrics)
    resume = ["--resume"] if rundir.checkpoints(d) or os.path.exists(os.path.join(d, "metrics.jsonl")) else []
    rc = launch(cmd + resume, os.path.join(d, "train.log"))
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


def run_all(a):
    wanted = [c for c in COMPARISONS if c not in a.cut]
    names = [r for r in RUN_NAMES if any(r in COMPARISONS[c]["runs"] for c in wanted)]
    if a.only:
        names = [r for r in names if r in a.only]
    if not names:
        raise SystemExit("ablations.py: --only/--cut leave no run")
    print(f"ablations.py: runs {', '.join(names)}; seeds {a.seeds}; {a.steps} steps; root {a.root}", flush=True)
    status = {}
    for seed in a.seeds:            # seed-major: a partial set still has every run once
        for run in names:
            status[f"{run}-s{seed}"] = run_one(run, seed, a.steps, a.root, a.extra)
    if "pairings" in wanted and "metaagent" in names:
        for seed in a.seeds:
            d = os.path.join(a.root, f"pairings-s{seed}")
            if os.path.exists(os.path.join(d, "results.json")):
                status[f"pairings-s{seed}"] = "skipped"
            elif not is_finished(out_dir(a.root, "metaagent", seed), a.steps):
                status[f"pairings-s{seed}"] = "no finished metaagent run"
            else:
                os.makedirs(d, exist_ok=True)
                cmd = pairings_command(a.root, seed, a.pairings_tasks)
                print(f"== pairings seed {seed}: {' '.join(cmd[1:])}", flush=True)
                rc = launch(cmd, os.path.join(d, "evaluate.log"))
                status[f"pairings-s{seed}"] = "ok" if rc == 0 else f"failed (rc {rc})"
    print("\n".join(f"  {k}: {v}" for k, v in status.items()))
    print(f"then: python ablations.py report {a.root}")
    return 1 if any(v.startswith("failed") for v in status.values()) else 0


# ----------------------------------------------------------------------------------------------------------
# the report: ROOT/RESULTS.md and ROOT/plots/<comparison>.png

FINAL_ROW = re.compile(r"^((?:RL|SFT): [a-z ]+?)\s+(-?\d+\.\d+)\s+(\d+(?:\.\d+)?)%\s*(.*)$")


def final_table(log_path):
    """{row name: {"reward", "accuracy", "structures"}} of train.py's final table: its final_table.json next to
    the log, else the table as printed in the log (runs from before train.py wrote the file)."""
    js = os.path.join(os.path.dirname(log_path), "final_table.json")
    if os.path.exists(js):
        try:
            with open(js) as f:
                return json.load(f)["rows"]
        except (ValueError, KeyError, TypeError):
            pass   # a half-written or foreign file: fall back to the log
    rows = {}
    if os.path.exists(log_path):
        with open(log_path, errors="replace") as f:
            for line in f:
                m = FINAL_ROW.match(line.strip())
                if m:   # a resumed run printed it again: the last one wins
                    rows[m[1]] = {"reward": float(m[2]), "accuracy": float(m[3]) / 100, "structures": m[4]}
    return rows


def summarize(run_dir, run):
    """One run's numbers (None where it has none)."""
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    if not rows:
        return None
    n_tail = max(1, math.ceil(TAIL * len(rows)))
    tail, head = rows[-n_tail:], rows[:n_tail]
    mean = lambda key, part=tail: sum(r.get(key, 0.0) for r in part) / len(part)
    shares = {k.split("/", 1)[1]: mean(k) for k in sorted({k for r in tail for k in r if k.startswith("structure/")})}
    table = final_table(os.path.join(run_dir, "train.log"))
    held = table.get("RL: single agent" if run == "single" else "RL: learned designs")
    # the same held-out tasks and sampling seed before RL: the paired difference leaves out which tasks a seed drew
    base = table.get("SFT: single agent" if run == "single" else "SFT: designs")
    return {"steps": len(rows), "reward": [r["reward/mean"] for r in rows],
            "train_reward": mean("reward/mean"), "train_acc": mean("accuracy"),
            "train_change": mean("reward/mean") - mean("reward/mean", head),   # did the run itself learn?
            "heldout_acc": held["accuracy"] if held else None,
            "heldout_gain": held["accuracy"] - base["accuracy"] if held and base else None,
            "sft_heldout_acc": table["SFT: designs"]["accuracy"] if "SFT: designs" in table else None,
            "structures": shares, "minutes": sum(r.get("time/step", 0.0) for r in rows) / 60}


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
    its command asked for is left out (its last 20% would be some other part of training) and, if a list is
    given, named in it as "run-sN (done/target steps)"."""
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
            else:
                out.setdefault(m[1], {})[int(m[2])] = s
    return out


def mean_std(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None, 0
    mu = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return mu, sd, len(xs)


def fmt(xs, pct=False, sign=False):
    mu, sd, n = mean_std(xs)
    if mu is None:
        return "n/a"
    f = (lambda v: f"{100 * v:.1f}%") if pct else (lambda v: f"{v:.3f}")
    m = f(mu) if not sign or mu < 0 else "+" + f(mu)
    return f"{m} ± {f(sd)}" if n > 1 else f"{m} (1 seed)"


def verdict(a, b):
    """(word, difference, combined std) for the claim mean(a) > mean(b)."""
    ma, sa, na = mean_std(a)
    mb, sb, nb = mean_std(b)
    if ma is None or mb is None:
        return "missing", None, None
    d, s = ma - mb, math.hypot(sa, sb)
    if na < 2 or nb < 2:
        return "undecided (fewer than 2 seeds)", d, s
    return ("held" if d > s else "reversed" if d < -s else "within noise"), d, s


def claim_sentence(a, b, results):
    parts = []
    for key, label in (("train_reward", "training reward"), ("heldout_acc", "held-out accuracy"),
                       ("heldout_gain", "held-out gain over SFT")):
        va = [s[key] for s in results.get(a, {}).values()]
        vb = [s[key] for s in results.get(b, {}).values()]
        word, d, s = verdict(va, vb)
        if d is not None:
            parts.append(f"{word} on {label} ({d:+.3f} vs combined std {s:.3f})")
    return f"{a} > {b}: " + ("; ".join(parts) if parts else "missing runs") + "."


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


def pairings_section(root):
    """Markdown lines for evaluate.py's pairings results (ROOT/pairings-s*/results.json)."""
    found = {}
    for name in sorted(os.listdir(root)):
        p = os.path.join(root, name, "results.json")
        if re.fullmatch(r"pairings-s\d+", name) and os.path.exists(p):
            with open(p) as f:
                for key, per in json.load(f).get("pairings", {}).items():
                    found.setdefault(key, []).append(sum(per.values()) / len(per))
    if not found:
        return ["No pairings results (ROOT/pairings-s*/results.json): run `python ablations.py` with the "
                "metaagent run, or by hand:", "", "    python " + " ".join(pairings_command(root, 0)[1:])]
    lines = ["| designer \\ executor | SFT | RL |", "|---|---|---|"]
    for d in ("sft", "rl"):
        lines.append(f"| {d.upper()} | " + " | ".join(fmt(found.get(f"{d}/{e}", []), pct=True)
                                                       for e in ("sft", "rl")) + " |")
    lines.append("")
    for a, b, role in (("rl/sft", "sft/sft", "designer"), ("sft/rl", "sft/sft", "executor")):
        word, d, s = verdict(found.get(a, []), found.get(b, []))
        diff = f" ({d:+.3f} vs combined std {s:.3f})" if d is not None else ""
        lines.append(f"- {role} improved ({a} > {b} in held-out pass@1): {word}{diff}.")
    return lines


def run_table(results, names):
    """Markdown rows, one per run: mean ± std over its seeds."""
    md = ["| run | setting | seeds | train reward | change | train accuracy | held-out accuracy | gain over SFT "
          "| structures (end) | RL minutes |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in names:
        per = list(results[r].values())
        setting = " ".join(f"{k}={v}" for k, v in runs(per[0]["steps"])[r].items())
        md.append(f"| {r} | `{setting}` | {len(per)} | {fmt([s['train_reward'] for s in per])} | "
                  f"{fmt([s['train_change'] for s in per], sign=True)} | "
                  f"{fmt([s['train_acc'] for s in per], pct=True)} | "
                  f"{fmt([s['heldout_acc'] for s in per], pct=True)} | "
                  f"{fmt([s['heldout_gain'] for s in per], pct=True, sign=True)} | {structure_text(per)} | "
                  f"{mean_std([s['minutes'] for s in per])[0]:.1f} |")
    return md


def report(root):
    if not os.path.isdir(root):
        raise SystemExit(f"ablations.py report: {root} is not a folder")
    unfinished = []
    results = collect(root, unfinished)
    if not results:
        raise SystemExit(f"ablations.py report: no <run>-s<seed>/metrics.jsonl under {root}")
    os.makedirs(os.path.join(root, "plots"), exist_ok=True)
    steps = sorted({s["steps"] for per in results.values() for s in per.values()})
    seeds = sorted({seed for per in results.values() for seed in per})
    sft = [s["sft_heldout_acc"] for per in results.values() for s in per.values()]
    shown = os.path.relpath(root, REPO) if os.path.abspath(root).startswith(REPO + os.sep) else root
    md = ["# Ablations on the tiny world", "",
          f"Runs under `{shown}`: steps {', '.join(map(str, steps))}; seeds {', '.join(map(str, seeds))}. "
          f"Numbers are mean ± std over seeds. Training reward and accuracy: mean over the last {TAIL:.0%} of "
          f"steps (metrics.jsonl); change: that reward minus the one over the first {TAIL:.0%}. "
          "Held-out accuracy: train.py's final table (100 held-out tiny tasks, 1 design x 1 execution, T=1; "
          "the held-out tasks depend on the seed). Gain over SFT: that accuracy minus the SFT row of the same "
          "table (the same tasks and sampling seed, so the draw of tasks cancels; single agent vs single agent "
          "for the single run). A paper direction A > B *held* when mean(A) - mean(B) exceeds "
          "sqrt(std_A² + std_B²), is *reversed* below minus that, and is *within noise* otherwise.", "",
          f"SFT cold start, held-out accuracy with its own designs: {fmt(sft, pct=True)}.", "",
          "Regenerate:", "", f"    python ablations.py --root {shown} --seeds {','.join(map(str, seeds))} "
          f"--steps {steps[-1]}", f"    python ablations.py report {shown}", "",
          "## All runs", ""] + run_table(results, [r for r in RUN_NAMES if r in results]) + [""]
    missing = []
    for cname, c in COMPARISONS.items():
        present = [r for r in c["runs"] if r in results]
        if len(present) < (1 if cname == "pairings" else 2):
            missing.append(cname)
            continue
        md += [f"## {c['title']}", "", c["note"], ""]
        if cname == "pairings":
            md += pairings_section(root) + ["", f"Paper: {c['paper']}.", ""]
            continue
        md += run_table(results, present)
        plot_comparison(os.path.join(root, "plots", f"{cname}.png"), c["title"], results, present)
        md += ["", f"![{cname}](plots/{cname}.png)", "",
               f"Paper: {c['paper']}. Here (mechanical, from the numbers above):", ""]
        md += [f"- {claim_sentence(a, b, results)}" for a, b in c["claims"]] + [""]
    if missing:
        md += [f"Not run (cut, or fewer than the runs they compare): {', '.join(missing)}.", ""]
    if unfinished:
        md += [f"Unfinished, left out: {', '.join(unfinished)}.", ""]
    path = os.path.join(root, "RESULTS.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    print(f"wrote {path} and {os.path.join(root, 'plots')}/*.png")
    return path


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
    p.add_argument("--steps", type=int, default=60, help="RL steps per run (default 60)")
    p.add_argument("--only", default="", help=f"comma list of runs to run: {', '.join(RUN_NAMES)}")
    p.add_argument("--cut", default="", help=f"comma list of comparisons to drop: {', '.join(COMPARISONS)}")
    p.add_argument("--pairings-tasks", type=int, default=100,
                   help="held-out tiny tasks for the pairings (4 pairings x this many; default 100)")
    a = p.parse_args(argv)
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
        if len(argv) != 2:
            raise SystemExit("usage: python ablations.py report ROOT")
        report(argv[1])
        return 0
    return run_all(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
