"""plot.py: the curves of one or more train.py runs as PNG files, in the style of the paper's Figure
3.

    python tools/plot.py out/tiny-rl [out/other ...]     # -> out/tiny-rl/plots/

Three figures from the runs' metrics.jsonl:
- training.png: the training reward and accuracy (smoothed over 5 steps), parseable scripts, the
  held-out curves (heldout/: the tiny world's sampled accuracy of the learned designs with +-1 SE,
  the exact rows `suited`, `executor`, `tester_code` and `copy`, at step 0 and every checkpoint; a
  benchmark's accuracy +-1 SE, heldout/NAME/, at step 0 and every val_every steps: train.py's
  val_tasks), the tester's share of the designs and the repairs' copy rate, the Designer's stages
  shaded;
- diagnostics.png: what an RL auditor opens first: each role's clip fraction, mean ratio,
  engine/trainer log-prob gap and grad norm, the policy's entropy per sampled token, and where the
  signal goes (the share of query groups whose advantages are all zero);
- structures.png: the structure shares of the first run's designs.

Needs: no other file of this project (numpy, matplotlib).
"""

import json
import os
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files, no display
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

ROLES = ("designer", "executor")
# the tiny curve's exact rows and their dashes: P(suited template), the Executor's row, P(tester |
# code task), P(the repair copies the failed program)
EXACT_ROWS = (("suited", "--"), ("executor", ":"), ("tester_code", "-."), ("copy", (0, (1, 3))))


def read(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isdir(run_dir):
        sys.exit(f"plot.py: no run folder {run_dir} (train.py makes it: its --out_dir)")
    if not os.path.exists(path):
        sys.exit(f"plot.py: no metrics.jsonl in {run_dir} (train.py writes one a run)")
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def smooth(y, k=5):
    y = np.asarray(y, dtype=float)
    if len(y) <= k:
        return y
    return np.convolve(y, np.ones(k) / k, mode="valid")


def curve(ax, rows, key, label, k=5, **style):
    """One metric over the steps that have it, smoothed over k steps (the x of each mean: its last
    step)."""
    xs = [r["step"] for r in rows if key in r]
    ys = smooth([r[key] for r in rows if key in r], k)
    if len(ys):
        ax.plot(xs[len(xs) - len(ys) :], ys, label=label, lw=1.6, **style)


def shade_designer(ax, rows):
    """The Designer's training stages shaded (Figure 3's style)."""
    for r in rows:
        if r.get("active") == "designer":
            ax.axvspan(r["step"] - 1, r["step"], color="tab:blue", alpha=0.07, lw=0)


def benchmark_names(rows):
    """The benchmarks of a run's curve during RL (train.py's val_tasks): heldout/NAME/accuracy."""
    names = set()
    for r in rows:
        for k in r:
            parts = k.split("/")
            if len(parts) == 3 and parts[0] == "heldout" and parts[2] == "accuracy":
                names.add(parts[1])
    return sorted(names)


def heldout(ax, runs):
    """The held-out curves: the tiny world's sampled accuracy +- 1 SE and its two exact rows
    (dashed, dotted); each benchmark's accuracy +- 1 SE (squares: val_tasks, val_every)."""
    drawn = []
    for name, rows in runs.items():
        probes = [r for r in rows if "heldout/accuracy" in r]
        if probes:
            drawn.append("tiny val: accuracy and exact rows")
            xs = np.array([r["step"] for r in probes])
            acc = np.array([r["heldout/accuracy"] for r in probes])
            se = np.array([r["heldout/accuracy_se"] for r in probes])
            line = ax.plot(xs, acc, marker="o", ms=3, lw=1.6, label=f"{name}: accuracy")[0]
            ax.fill_between(xs, acc - se, acc + se, color=line.get_color(), alpha=0.2, lw=0)
            for key, dash in EXACT_ROWS:
                if f"heldout/{key}" in probes[0]:  # older runs lack tester_code and copy
                    ys = [r[f"heldout/{key}"] for r in probes]
                    style = dict(ls=dash, color=line.get_color(), lw=1.2)
                    ax.plot(xs, ys, **style, label=f"{name}: {key}")
        for bench in benchmark_names(rows):
            key = f"heldout/{bench}/accuracy"
            probes = [r for r in rows if key in r]
            drawn.append(bench)
            xs = np.array([r["step"] for r in probes])
            acc = np.array([r[key] for r in probes])
            se = np.array([r.get(f"heldout/{bench}/accuracy_se", 0.0) for r in probes])
            line = ax.plot(xs, acc, marker="s", ms=3, lw=1.6, label=f"{name}: {bench}")[0]
            ax.fill_between(xs, acc - se, acc + se, color=line.get_color(), alpha=0.2, lw=0)
    ax.set_title("held-out: " + ("; ".join(dict.fromkeys(drawn)) or "none"))


def panels(runs, spec, path, shade=True):
    """One figure, a panel per (title, [(key, label)]), every run's curves in each."""
    cols = min(len(spec), 4) if len(spec) != 6 else 3
    rows_n = -(-len(spec) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 3.2 * rows_n), squeeze=False)
    first = next(iter(runs.values()))
    for ax, (title, keys) in zip(axes.flat, spec):
        if title == "heldout":
            heldout(ax, runs)
        else:
            for name, rows in runs.items():
                for key, label in keys:
                    curve(
                        ax,
                        rows,
                        key,
                        f"{name}: {label}" if len(runs) > 1 or len(keys) > 1 else name,
                    )
            ax.set_title(title)
        if shade:
            shade_designer(ax, first)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a run without the panel's keys draws nothing
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def structures(rows, path):
    names = set()  # every structure that some step's line has
    for r in rows:
        names |= {k for k in r if k.startswith("structure/")}
    names = sorted(names)
    steps = [r for r in rows if r["step"] > 0]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    shares = [[r.get(k, 0.0) for r in steps] for k in names]
    ax.stackplot(
        [r["step"] for r in steps], *shares, labels=[k.split("/", 1)[1] for k in names], alpha=0.85
    )
    ax.set_ylim(0, 1)
    ax.set_title("structure shares of the designs")
    ax.set_xlabel("step")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(dirs):
    if not dirs:
        sys.exit("usage: python tools/plot.py OUT_DIR [OUT_DIR ...]")
    runs = {os.path.basename(os.path.normpath(d)): read(d) for d in dirs}
    out = os.path.join(dirs[0], "plots")
    os.makedirs(out, exist_ok=True)
    training = [
        ("reward", [("reward/mean", "reward")]),
        ("accuracy", [("accuracy", "accuracy")]),
        ("parseable scripts", [("parse_rate", "parse rate")]),
        ("heldout", []),
        ("designs on the tester template", [("structure/tester", "tester share")]),
        ("repairs that copy the failed program", [("repair/copy_rate", "copy rate")]),
    ]
    panels(runs, training, os.path.join(out, "training.png"))
    diagnostics = []
    for stat, title in (
        ("clip_frac", "clip fraction"),
        ("ratio_mean", "mean ratio"),
        ("logprob_gap", "engine/trainer log-prob gap"),
        ("grad_norm", "grad norm"),
    ):
        diagnostics.append((title, [(f"{r}/{stat}", r) for r in ROLES]))
    diagnostics.append(("entropy per sampled token", [(f"entropy/{r}_tokens", r) for r in ROLES]))
    diagnostics.append(("groups with no advantage", [(f"{r}/dead_groups", r) for r in ROLES]))
    panels(runs, diagnostics, os.path.join(out, "diagnostics.png"))
    structures(next(iter(runs.values())), os.path.join(out, "structures.png"))
    print(f"wrote {out}/training.png, diagnostics.png, structures.png")


if __name__ == "__main__":
    plot(sys.argv[1:])
