"""Every program a user runs, given a path that is not there, ends in one line on stderr that names
the path and says what makes it, with exit status 1: no traceback, no hub message about repo ids.
Each runs as the README runs it, in a fresh interpreter from the project's root."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GONE = "/nonexistent/metaagent-x"

CASES = [  # (argv, what the one line says, in order)
    (
        ["evaluate.py", "--model", GONE, "--tasks", "tiny"],
        ["evaluate.py: --model: no model folder", GONE, "train.py writes"],
    ),
    (
        ["evaluate.py", "--designer", GONE, "--executor", GONE, "--tasks", "tiny"],
        ["evaluate.py: --designer: no model folder", GONE, "train.py writes"],
    ),
    (
        ["tools/ask.py", "Compute 1+1.", "--model", GONE],
        ["--model: no model folder", GONE, "sft.py writes"],
    ),
    (
        ["sft.py", "--model", GONE],
        ["sft.py: --model: no model folder", GONE, "Hugging Face model folder"],
    ),
    (
        ["sft.py", "--data", GONE],
        ["sft.py: --data: no", f"{GONE}/designer.jsonl", "tools/distill.py"],
    ),
    (["tools/show.py", GONE], ["show.py: no run folder", GONE, "train.py makes it"]),
    (["tools/plot.py", GONE], ["plot.py: no run folder", GONE, "train.py makes it"]),
    (["world/final_table.py", GONE], ["final_table.py: no run folder", GONE, "train.py makes it"]),
    (
        ["tools/first_gpu_run.py", f"{GONE}.py"],
        ["first_gpu_run.py: no preset", f"{GONE}.py", "config/"],
    ),
    (["train.py", f"{GONE}.py"], ["train.py: config file", f"{GONE}.py", "not found"]),
    (
        [
            "tools/distill.py",
            "--teacher",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--tasks",
            f"{GONE}.jsonl",
        ],
        ["distill.py: no task file", f"{GONE}.jsonl", "machinery/data.py prepare"],
    ),
]


@pytest.fixture(scope="module")
def ended():
    """Each case's program, run from the project's root in a fresh interpreter, as many at once as
    this process may use cores (at most 4): {argv as a tuple: its CompletedProcess}."""

    def one(argv):
        cmd = [sys.executable, *argv]
        try:
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as e:  # this case fails, saying so
            return subprocess.CompletedProcess(cmd, None, "", f"{e}")

    argvs = [tuple(argv) for argv, _ in CASES]
    with ThreadPoolExecutor(max_workers=min(4, len(os.sched_getaffinity(0)))) as pool:
        return dict(zip(argvs, pool.map(one, argvs), strict=True))


@pytest.mark.parametrize("argv,says", CASES, ids=[" ".join(c[0][:2]) for c in CASES])
def test_a_missing_path_ends_the_program_in_one_line(argv, says, ended):
    p = ended[tuple(argv)]
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, (p.returncode, p.stderr[-2000:])
    at = 0
    for part in says:  # each piece in the line, in this order
        at = lines[0].find(part, at)
        assert at >= 0, (part, lines[0])


def test_a_folder_that_holds_no_model_is_named(tmp_path):
    """A folder that is there but holds no config.json is not mistaken for a hub id either."""
    p = subprocess.run(
        [sys.executable, "evaluate.py", "--model", str(tmp_path), "--tasks", "tiny"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 1 and p.stderr.strip() == (
        f"evaluate.py: --model: {tmp_path} holds no config.json (train.py writes RUN/step_N/model, "
        "or its "
        "designer/ and executor/; sft.py writes out/tiny-sft; or a hub id: Qwen/Qwen3-8B)"
    )


def test_what_names_a_model(tmp_path, monkeypatch):
    """engine.missing_model: a folder with config.json, or a hub id whose org is no local folder."""
    from machinery import engine

    (tmp_path / "m").mkdir()
    assert engine.missing_model(tmp_path / "m") == f"{tmp_path / 'm'} holds no config.json"
    (tmp_path / "m" / "config.json").write_text("{}")
    assert engine.missing_model(tmp_path / "m") is None
    assert engine.missing_model("Qwen/Qwen3-8B") is None  # a hub id: from_pretrained's
    assert engine.missing_model(f"{tmp_path}/gone") == f"no model folder {tmp_path}/gone"
    monkeypatch.chdir(tmp_path)
    # m/ is a local folder: not a hub id
    assert engine.missing_model("m/gone") == "no model folder m/gone"
