"""cpu_bits.py: the tiny world's CPU numerics pinned, so that every x86 CPU computes the same bits.

The fingerprint is the check a new machine kind makes: the bits of the operations the tiny cold
start's first steps use, under the pins, against those recorded here (tests/fixtures/cpu_bits.json,
made on the developers' Intel Xeon; docs/NOTES.md lists every CPU kind that has matched them). A
machine that computes other bits fails here, by name, instead of printing another table.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from machinery import cpu_bits

ROOT = Path(__file__).resolve().parent.parent
RECORDED = json.loads((ROOT / "tests" / "fixtures" / "cpu_bits.json").read_text())["pinned"]


def unpinned_env():
    """This environment without the pins, and without the test suite's opt-out (conftest.py)."""
    pins = {*cpu_bits.PINS, "METAAGENT_CPU_BITS"}
    return {k: v for k, v in os.environ.items() if k not in pins}


def cpu_model():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def script(tmp_path, body):
    """A script that pins itself, then runs body; run from the project folder."""
    path = tmp_path / "pinned.py"
    head = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from machinery import cpu_bits\n"
    path.write_text(head + "cpu_bits.restart_pinned(__file__)\n" + body)
    return [sys.executable, str(path)]


def test_restart_sets_the_pins_before_torch_loads(tmp_path):
    body = "import os, torch\n"
    body += "print(os.environ['MKL_CBWR'], torch.backends.cpu.get_cpu_capability(), "
    body += "torch.get_num_threads())\n"
    run = subprocess.run(
        script(tmp_path, body), cwd=ROOT, env=unpinned_env(), capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith(
        "cpu bits: ATen AVX2, MKL compatible"
    )  # said once, after the restart
    assert lines[1:] == [f"COMPATIBLE AVX2 {cpu_bits.THREADS}"]


def test_a_pin_the_user_set_otherwise_is_kept_and_named(tmp_path):
    env = dict(unpinned_env(), MKL_CBWR="AUTO")
    body = "import os; print(os.environ['MKL_CBWR'])\n"
    run = subprocess.run(script(tmp_path, body), cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("cpu bits: MKL_CBWR=AUTO kept")  # named, and not said again
    assert lines[1].startswith("cpu bits: ATen AVX2") and lines[2:] == ["AUTO"]


def test_a_caller_that_is_not_the_script_is_not_restarted(tmp_path):
    body = "import os; print('MKL_CBWR' in os.environ)\n"
    other = tmp_path / "other.py"
    other.write_text("")
    cmd = script(tmp_path, body)
    text = (tmp_path / "pinned.py").read_text().replace("(__file__)", f"({str(other)!r})")
    (tmp_path / "pinned.py").write_text(text)
    run = subprocess.run(cmd, cwd=ROOT, env=unpinned_env(), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["False"]  # a test calling train.main runs as it is


def test_train_py_restarts_for_the_tiny_world_before_its_checks():
    cmd = [sys.executable, "train.py", "--M=0"]  # a setting validate refuses, after the restart
    run = subprocess.run(cmd, cwd=ROOT, env=unpinned_env(), capture_output=True, text=True)
    assert run.returncode != 0 and "M must be >= 1" in run.stderr
    assert run.stdout.startswith("cpu bits: ATen AVX2, MKL compatible")


def test_the_native_opt_out_skips_the_pins(tmp_path):
    env = dict(unpinned_env(), METAAGENT_CPU_BITS="native")
    body = "import os; print('MKL_CBWR' in os.environ)\n"
    run = subprocess.run(script(tmp_path, body), cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["False"]


def test_this_cpu_computes_the_recorded_bits():
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "cpu_fingerprint.py")],
        cwd=ROOT,
        env=unpinned_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    got = {}
    for line in run.stdout.splitlines()[1:]:
        digest, what = line.split("  ", 1)
        got[what] = digest
    assert set(got) == set(RECORDED)
    differ = [what for what in RECORDED if got[what] != RECORDED[what]]
    assert not differ, (
        f"{cpu_model()} computes other bits than the recorded CPU kinds under the pins, in: "
        f"{', '.join(differ)}. The main job's table will differ from results/main here: "
        "machinery/cpu_bits.py names the pins; docs/NOTES.md the kinds checked"
    )
