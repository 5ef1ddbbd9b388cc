"""machinery/rundir.py on real small disks: a checkpoint's estimated bytes are within 10% of what
it takes on disk (and not above it: a disk with room for exactly one takes it); a disk with too
little room is refused before a byte is written; a disk that fills while a checkpoint is written
leaves no temp folder and keeps the last complete checkpoint; a full disk in a plain write ends the
program in one line. The disks are tmpfs mounts made here (root); where mounting is refused, the
tests say so and skip. (A train.py run on such a disk, stopped and resumed: tests/test_train.py.)"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from machinery import rundir
from world import tiny


def disk_bytes(folder):
    """What a folder's files take on their disk (allocated blocks)."""
    return sum(p.stat().st_blocks * 512 for p in Path(folder).rglob("*") if p.is_file())


def mount_small_disk(path, size):
    """A tmpfs of `size` bytes at path; pytest.skip with the reason where mounting is refused."""
    os.makedirs(path, exist_ok=True)
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        pytest.skip(f"no small disk: mounting a tmpfs was refused ({p.stderr.strip()})")


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) -> a fresh tmpfs folder of that many bytes, unmounted at the end."""
    mounted = []

    def mount(size):
        path = tmp_path / f"disk{len(mounted)}"
        mount_small_disk(path, size)
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], check=False)


def filled(folder, free):
    """Fill folder's disk until `free` bytes are left (a filler file)."""
    have = shutil.disk_usage(folder).free
    with open(Path(folder) / "filler", "wb") as f:
        f.write(b"\0" * max(0, have - free))
    return Path(folder) / "filler"


def stepped_policy():
    """A tiny model and its AdamW after one step: train.py's policies, one policy."""
    model, tok = tiny.build_model(seed=0, hidden_size=64, num_layers=2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    return {"model": {"name": "model", "model": model, "opt": {"both": opt}}}, tok


def test_the_estimate_is_within_ten_percent_under_the_checkpoint_on_disk(tmp_path):
    policies, tok = stepped_policy()
    need = rundir.checkpoint_bytes(policies)
    rundir.write_checkpoint(str(tmp_path), 1, policies, tok, {"step": 1}, 0)
    real = disk_bytes(tmp_path / "step_000001")
    assert 0.9 * real <= need <= real, (need, real)


def test_too_little_room_is_refused_before_a_byte_is_written(small_disk):
    policies, tok = stepped_policy()
    need = rundir.checkpoint_bytes(policies)
    disk = small_disk(3 * need)
    rundir.write_checkpoint(str(disk), 1, policies, tok, {"step": 1}, 0)
    filled(disk, need // 2)
    with pytest.raises(rundir.DiskFull) as e:
        rundir.write_checkpoint(str(disk), 2, policies, tok, {"step": 2}, 0)
    line = str(e.value)
    assert "step_000002 needs" in line and str(disk) in line and "\n" not in line, line
    assert sorted(os.listdir(disk)) == ["filler", "step_000001"]
    assert (disk / "step_000001" / "model").is_dir() and (disk / "step_000001" / "state").is_dir()


def test_a_disk_that_fills_mid_save_leaves_nothing_partial(small_disk, tmp_path):
    """Room for the estimate but not for the checkpoint's real bytes: the check passes, a write
    meets the full disk (torch's archive writer says only "unexpected pos"), and the same DiskFull
    comes out; the temp folder is gone and the checkpoint before it stays whole."""
    policies, tok = stepped_policy()
    need = rundir.checkpoint_bytes(policies)
    rundir.write_checkpoint(str(tmp_path), 1, policies, tok, {"step": 1}, 0)
    real = disk_bytes(tmp_path / "step_000001")
    disk = small_disk(4 * real)
    rundir.write_checkpoint(str(disk), 1, policies, tok, {"step": 1}, 0)
    filled(disk, (need + real) // 2)  # above the estimate, under the real size
    with pytest.raises(rundir.DiskFull) as e:
        rundir.write_checkpoint(str(disk), 2, policies, tok, {"step": 2}, 0)
    assert "disk full: step_000002" in str(e.value)
    assert sorted(os.listdir(disk)) == ["filler", "step_000001"]  # no .tmp_step_000002
    assert rundir.latest(str(disk))[1]["step"] == 1


def test_a_full_disk_in_a_plain_write_ends_the_program_in_one_line(small_disk):
    disk = small_disk(1 << 20)
    with pytest.raises(SystemExit) as e:
        with rundir.full_disk_exits("train.py", str(disk), "metrics.jsonl"):
            with open(disk / "metrics.jsonl", "w") as f:
                f.write("x" * (2 << 20))
                f.flush()
    line = e.value.code
    assert line.startswith("train.py: disk full: metrics.jsonl") and str(disk) in line, line
    assert "\n" not in line
