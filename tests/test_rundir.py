"""machinery/rundir.py's checkpoint layout, on a tiny model in this process: the HF folder is what
transformers and vLLM load as it is (sharded safetensors in the weights' dtype, the index naming
every tensor), and a checkpoint of the format before state/ stops a resume with one line that says
what to do. (The state/ folder, saving and resuming at 1 and 2 ranks, bit for bit:
tests/test_train.py.)"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from machinery import rundir
from world import tiny

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_model_folder_is_sharded_safetensors_that_transformers_loads(tmp_path, dtype):
    model, tok = tiny.build_model(seed=0, hidden_size=64, num_layers=2)
    state = {k: v.to(dtype) for k, v in model.state_dict().items()}
    one, sharded = tmp_path / "one", tmp_path / "sharded"
    rundir.save_hf(str(one), state, model, tok)
    rundir.save_hf(str(sharded), state, model, tok, max_shard_size="100KB")
    assert (one / "model.safetensors").is_file() and not (
        one / "model.safetensors.index.json"
    ).exists()
    shards = sorted(p.name for p in sharded.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and (sharded / "model.safetensors.index.json").is_file()
    for folder in (one, sharded):
        loaded = AutoModelForCausalLM.from_pretrained(folder)  # the config's dtype: the weights'
        assert loaded.dtype == dtype
        got = loaded.state_dict()
        for k, v in state.items():
            assert torch.equal(got[k], v), (folder.name, k)
    assert next(model.parameters()).dtype == torch.float32  # the trainer's model keeps its own


def test_vllm_loads_the_sharded_model_folder_as_it_is(tmp_path):
    """A checkpoint's model folder in shards, read by vLLM as it is: its greedy tokens are those of
    transformers on the folder the weights came from (fp32 on both: test_engine's tolerance-free
    comparison)."""
    pytest.importorskip("vllm", reason="vLLM is not installed: the vLLM engine tests are skipped")
    from test_engine import save_tiny

    from machinery.engine import Sampling, make_engine

    src = save_tiny(tmp_path / "src")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src)
    dst = tmp_path / "step" / "model"
    rundir.save_hf(str(dst), model.state_dict(), model, tok, max_shard_size="100KB")
    assert len(list(dst.glob("model-*-of-*.safetensors"))) > 1
    prompt = [{"role": "user", "content": "Compute 17*23 and write it in the answer tags."}]
    greedy = Sampling(temperature=0, max_tokens=16)
    ref = make_engine(str(src), backend="hf", dtype=torch.float32)
    eng = make_engine(str(dst), backend="vllm", dtype="float32", kv_cache_gib=0.25)
    got, want = (e.generate([prompt], greedy)[0][0] for e in (eng, ref))
    assert got.token_ids == want.token_ids and len(got.token_ids) > 0
    eng.close()


def test_an_old_checkpoint_stops_the_resume_with_one_line_that_says_what_to_do(tmp_path):
    old = tmp_path / "step_000002"
    (old / "model").mkdir(parents=True)
    torch.save({}, old / "optimizer.pt")
    torch.save({"step": 2}, old / "trainer_state.pt")
    with pytest.raises(rundir.RunFolderError, match="old format .* before state/ .* --overwrite"):
        rundir.latest(str(tmp_path))
    p = subprocess.run(
        [sys.executable, "train.py", f"--out_dir={tmp_path}", "--resume"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0, p.stderr[-2000:]
    assert p.stderr.startswith("train.py: ") and "old format" in p.stderr
    assert rundir.trainer_state(str(old)) == {"step": 2}  # a reader of its config still reads it
    (old / "optimizer.pt").unlink()  # neither format: a damaged folder, named
    with pytest.raises(rundir.RunFolderError, match="no state/ folder"):
        rundir.latest(str(tmp_path))


def test_a_save_keeps_the_two_newest_and_the_benchmark_curve_s_steps():
    """What `evaluate.py --run RUN --step N` reads stays: every multiple of val_every (the steps
    whose benchmark score the curve shows) besides the 2 newest; without a curve, the 2 newest."""
    names = [f"step_{s:06d}" for s in range(20, 320, 20)]  # save_every 20, 300 steps
    gone = rundir.stale(names, 2, val_every=100)
    kept = [int(d[5:]) for d in names if d not in gone]
    assert kept == [100, 200, 280, 300]
    assert [int(d[5:]) for d in names if d not in rundir.stale(names, 2)] == [280, 300]
    assert rundir.stale(names[:2], 2, val_every=100) == []
