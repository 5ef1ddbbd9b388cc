"""plot.py: the curves of one or more train.py runs as PNG files, in the style of the paper's Figure 3.

    python plot.py out/tiny-rl [out/other ...]     # -> out/tiny-rl/plots/

Two figures from the runs' metrics.jsonl: training.png (reward, accuracy, parseable scripts, script errors;
smoothed over 5 steps, the Designer's stages shaded) and structures.png (the structure shares of the first
run's designs).

Needs: no other file of this project (numpy, matplotlib).
"""

import json
import os
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")   # files, no display
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen


def plot(dirs):
    if not dirs:
        sys.exit("usage: python plot.py OUT_DIR [OUT_DIR ...]")
    runs = {}
    for d in dirs:
        path = os.path.join(d, "metrics.jsonl")
        if not os.path.exists(path):
            sys.exit(f"no metrics.jsonl in {d}")
        with open(path) as f:
            runs[os.path.basename(os.path.normpath(d))] = [json.loads(ln) for ln in f if ln.strip()]
    out = os.path.join(dirs[0], "plots")
    os.makedirs(out, exist_ok=True)

    def smooth(y, k=5):
        y = np.asarray(y, dtype=float)
        return np.convolve(y, np.ones(k) / k, mode="valid") if len(y) > k else y

    panels = [("reward/mean", "reward"), ("accuracy", "accuracy"), ("parse_rate", "parseable scripts"),
              ("script_error_rate", "script error rate")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2))
    for ax, (key, title) in zip(axes, panels):
        for name, rows in runs.items():
            xs = [r["step"] for r in rows if key in r]
            ys = smooth([r[key] for r in rows if key in r])
            ax.plot(xs[len(xs) - len(ys):], ys, label=name, lw=1.6)
        for r in next(iter(runs.values())):   # Figure 3 style: the Designer's training stages shaded
            if r.get("active") == "designer":
                ax.axvspan(r["step"] - 1, r["step"], color="tab:blue", alpha=0.07, lw=0)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "training.png"), dpi=130)

    rows = next(iter(runs.values()))
    names = sorted({k for r in rows for k in r if k.startswith("structure/")})
    fig, ax = plt.subplots(figsize=(6, 3.4))
    xs = [r["step"] for r in rows]
    ax.stackplot(xs, *[smooth([r.get(k, 0.0) for r in rows], 1) for k in names],
                 labels=[k.split("/", 1)[1] for k in names], alpha=0.85)
    ax.set_ylim(0, 1)
    ax.set_title("structure shares of the designs")
    ax.set_xlabel("step")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "structures.png"), dpi=130)
    print(f"wrote {out}/training.png, structures.png")


if __name__ == "__main__":
    plot(sys.argv[1:])
