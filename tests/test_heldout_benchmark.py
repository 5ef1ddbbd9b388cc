"""The benchmark curve during RL (world/heldout.py's Benchmark; Config.val_tasks / val_every): a
2-step tiny run writes it under heldout/NAME/ in metrics.jsonl at step 0 and every val_every steps,
a resume keeps its rows and adds the next, and tools/plot.py draws it."""

import json
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

from tools import plot  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def train(args):
    p = subprocess.run(
        [sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def lines(out):
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny run of 2 steps with the curve every step on 3 of 5 held-out tiny tasks, then resumed
    to 3 steps: (out_dir, the lines before the resume, after it)."""
    from world import tiny

    tmp = tmp_path_factory.mktemp("bench")
    model = tiny.save_tiny(tmp / "cold", seed=0)
    tiny.main(["tasks", "--n", "5", "--out", str(tmp / "tiny.jsonl")])
    out = tmp / "rl"
    args = ["config/tiny.py", f"--init_from={model}", f"--out_dir={out}", "--backend=hf"]
    args += ["--save_every=1", "--batch_size=2", "--M=2", "--N=1", "--K=1", "--max_tokens=12"]
    args += ["--designer_max_tokens=24", "--logprobs=plain", "--eval_tasks=0", "--probe_tasks=0"]
    args += [f"--val_tasks={tmp / 'tiny.jsonl'}", "--val_every=1", "--val_size=3"]
    train([*args, "--steps=2"])
    before = lines(out)
    train([*args, "--steps=3", "--resume"])
    return out, before, lines(out)


def test_the_curve_is_in_metrics_and_a_resume_keeps_it(run):
    out, before, after = run
    keys = ("heldout/tiny/accuracy", "heldout/tiny/accuracy_se", "heldout/tiny/unparsed")
    assert [m["step"] for m in before] == [0, 1, 2]
    for m in before:
        assert all(k in m for k in keys), m
        # 3 tasks, 1 greedy draw each: accuracy k/3, the unparsed share j/3
        assert round(3 * m[keys[0]]) == pytest.approx(3 * m[keys[0]], abs=1e-9)
        assert 0.0 <= m[keys[2]] <= 1.0
    assert before[0] == {"step": 0, **{k: before[0][k] for k in keys}}  # the cold start's line
    assert [m["step"] for m in after] == [0, 1, 2, 3] and after[:3] == before
    assert all(k in after[3] for k in keys)
    cfg = json.loads((out / "run.json").read_text())["config"]  # recorded with the run
    assert (cfg["val_every"], cfg["val_size"]) == (1, 3)


def test_plot_draws_the_curve(run):
    out, _, after = run
    fig, ax = plt.subplots()
    plot.heldout(ax, {"rl": after})
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "rl: tiny"]
    assert list(line.get_xdata()) == [0, 1, 2, 3]
    assert list(line.get_ydata()) == [m["heldout/tiny/accuracy"] for m in after]
    assert ax.get_title() == "held-out: tiny"
    plt.close(fig)
    plot.plot([str(out)])
    assert (out / "plots" / "training.png").stat().st_size > 0
