"""machinery/plans.py's disk arithmetic: what a run writes, against the figures it is checked by
(Qwen3-8B: a checkpoint of 16.4 GB bf16 weights, 32.8 GB fp32 masters and two 65.5 GB Adam
states; six on disk at once at step 400; SFT's output, checkpoints and download), and `--plan`
printing it beside the memory. A real checkpoint's size against checkpoint_bytes:
tests/test_first_gpu_run.py's save part."""

import subprocess
import sys
from pathlib import Path

import pytest

import settings
from machinery import plans

ROOT = Path(__file__).resolve().parents[1]
P8 = plans.qwen3_params("8b")


def test_the_8b_checkpoint_and_how_many_are_kept():
    cfg = settings.parse_config([str(ROOT / "config/qwen3_8b.py")])
    one = plans.checkpoint_bytes(cfg, P8)
    assert one == pytest.approx(2 * P8 + 4 * P8 + 2 * 8 * P8)
    assert one / 1e9 == pytest.approx(180.2, abs=0.1)
    # before the first stage switch one Adam state has stepped: the check before step 20's save
    assert plans.checkpoint_bytes(cfg, P8, states=1) / 1e9 == pytest.approx(114.7, abs=0.1)
    # saves at 20, 40, ..., 400; kept: the 2 newest and 100, 200, 300; at step 400's save 100,
    # 200, 300, 360, 380 and the one written
    assert plans.checkpoints_on_disk(cfg) == (6, 400)
    d = plans.rl_disk(cfg, P8)
    assert d["total"] / 1e12 == pytest.approx(1.081, abs=0.001)
    sft = plans.sft_disk("Qwen/Qwen3-8B", P8)
    assert sft["output"] / 1e9 == pytest.approx(32.8, abs=0.1)  # fp32, as sft.py saves it
    assert sft["checkpoints"] / 1e9 == pytest.approx(262.1, abs=0.1)
    assert sft["hub"] / 1e9 == pytest.approx(16.4, abs=0.1)
    assert (d["total"] + sft["total"]) / 1e12 == pytest.approx(1.39, abs=0.01)


def test_kept_checkpoints_follow_the_settings(tmp_path):
    base = settings.Config(steps=10, save_every=1, val_every=0)
    assert plans.checkpoints_on_disk(base) == (3, 10)  # the 2 newest and the one being written
    cfg = settings.Config(steps=10, save_every=1, val_every=3)  # and steps 3, 6 and 9
    assert plans.checkpoints_on_disk(cfg) == (5, 10)
    cfg = settings.Config(steps=7, save_every=3, val_every=0)  # 3, 6 and the last, 7
    assert plans.checkpoints_on_disk(cfg) == (3, 7)
    assert plans.newest_kept() == 2
    # a CPU run saves fp32 weights; separate policies: two models, each its own state
    cpu = settings.Config(device="cpu", policy="shared", mode="stagewise")
    assert plans.checkpoint_bytes(cpu, 100) == (4 + 4 + 16) * 100
    two = settings.Config(device="cuda", policy="separate", mode="stagewise")
    assert plans.checkpoint_bytes(two, 200) == (2 + 4) * 200 + 2 * 8 * 100
    folder = tmp_path / "model"  # a local --model downloads nothing
    folder.mkdir()
    assert plans.sft_disk(str(folder), 100)["hub"] == 0


def test_plan_prints_the_disk_beside_the_memory():
    run = [sys.executable, "train.py", "config/qwen3_8b.py", "--plan", "--ranks=8"]
    p = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("disk (out/qwen3-8b-rl)")]
    assert "= 180.2 GB" in line and "at most 6 on disk at once" in line and "1081 GB" in line
    run = [sys.executable, "sft.py", "--model", "Qwen/Qwen3-8B", "--plan", "--ranks", "8"]
    p = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("disk: ")]
    assert "32.8 GB (fp32)" in line and "262 GB" in line and "16.4 GB (bf16)" in line
