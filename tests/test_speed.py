"""speed.prepare: every activation-checkpointing mode, eager and compiled, alone and under FSDP2,
gives the plain model's log-probs and gradients (through logprob_rows.chunked_token_logprobs, the
large presets' path), keeps parameter and state-dict names, and `full` really replays the layer's
matmuls in the backward while `off` does not.

compile uses torch.compile's "aot_eager" backend: dynamo traces the checkpointed layer exactly as
inductor would receive it, without generating C++ (seconds instead of minutes on two shared cores).
The inductor kernels themselves run in `python tools/bench.py gpu`.
"""

import copy
import subprocess
import sys
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from machinery import speed
from machinery.logprob_rows import chunked_token_logprobs as token_logprobs


def tiny_qwen3(seed=0, layers=3):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=257,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    model = Qwen3ForCausalLM(cfg).float()
    model.config.use_cache = False
    return model


def batch(T=21, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 257, (3, T), generator=g)
    mask = torch.ones_like(ids)
    mask[0, T - 6 :] = 0  # right padding, as rollout.samples_to_tensors packs
    return ids, mask, torch.randn(3, T - 1, generator=g)


def logprobs_and_grads(model, ids, mask, w):
    model.zero_grad(set_to_none=True)
    logp = token_logprobs(model, ids, mask, chunk_size=8)
    (logp * w).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return logp.detach(), {
        n: g.full_tensor() if hasattr(g, "full_tensor") else g for n, g in grads.items()
    }


def assert_same(got, want):
    """Every mode runs the same aten ops on the same shapes (checkpointing replays the forward;
    aot_eager traces the ops without fusing them; FSDP2 over one rank copies): the same numbers, in
    practice bit for bit. What a CPU could still change is the order of a sum (a gradient
    accumulated from several uses, a traced reduction), so the tolerances are those of two fp32
    computations (tests/test_grpo.py): log-probs within 16·eps·S, S = max|z/T| + log V <~ 7 + 5.5
    here; a gradient entry, a sum of <~ 80 token terms, within ~80·eps ~ 1e-5 of max|g|."""
    torch.testing.assert_close(got[0], want[0], rtol=0.0, atol=16 * 2.0**-23 * 13)
    assert got[1].keys() == want[1].keys()
    for name, g in want[1].items():
        torch.testing.assert_close(
            got[1][name], g, rtol=1e-5, atol=1e-5 * g.abs().max().item(), msg=name
        )


@pytest.mark.parametrize("compile", [False, "aot_eager"], ids=["eager", "compiled"])
@pytest.mark.parametrize("mode", speed.MODES)
def test_every_mode_matches_the_plain_model(mode, compile):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    ref = tiny_qwen3()
    model = speed.prepare(
        copy.deepcopy(ref), checkpointing=mode, compile=bool(compile), backend=compile or "inductor"
    )
    assert model.state_dict().keys() == ref.state_dict().keys()
    for T in (21, 17):  # a second length: the compiled layer recompiles once, with dynamic shapes
        ids, mask, w = batch(T)
        assert_same(logprobs_and_grads(model, ids, mask, w), logprobs_and_grads(ref, ids, mask, w))
        # compiled: one graph, shared by the three layers (and one more for the new length)
        assert counters["stats"]["unique_graphs"] == (0 if not compile else 1 if T == 21 else 2)
    with torch.no_grad():  # scoring the old log-probs: checkpointing has nothing to save
        # as assert_same, at T = 1: S = max|z| + log V <~ 4.5 + 5.5
        torch.testing.assert_close(
            token_logprobs(model, ids, mask),
            token_logprobs(ref, ids, mask),
            rtol=0.0,
            atol=16 * 2.0**-23 * 10,
        )


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func] += 1
        return func(*args, **(kwargs or {}))


def test_full_replays_the_forward_and_off_does_not():
    ref, (ids, mask, w) = tiny_qwen3(), batch()
    counts = {}
    for mode in speed.MODES:
        model = speed.prepare(copy.deepcopy(ref), checkpointing=mode)
        logp = token_logprobs(model, ids, mask)
        with CountOps() as c:  # the backward, with whatever it replays of the forward
            (logp * w).sum().backward()
        counts[mode] = c.ops
    # matmuls; RMSNorm (element-wise)
    mm, rsqrt = (
        torch.ops.aten.mm.default,
        torch.ops.aten.rsqrt.default,
    )
    assert counts["off"][mm] < counts["full"][mm]
    assert counts["off"][rsqrt] == 0 < counts["full"][rsqrt]


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="checkpointing must be one of"):
        speed.prepare(tiny_qwen3(layers=1), checkpointing="some")


def test_fsdp2_with_checkpointing_and_compile(tmp_path):
    """train.load_model's layout (fully_shard per layer, then the root) around checkpointed,
    compiled layers."""
    import torch.distributed as dist

    # an earlier test owns this process's group: run in a fresh interpreter
    if dist.is_initialized():
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"{__file__}::test_fsdp2_with_checkpointing_and_compile",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        return
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ref, (ids, mask, w) = tiny_qwen3(), batch()
        want = logprobs_and_grads(ref, ids, mask, w)
        for mode, compile in (("full", False), ("full", True), ("off", True)):
            model = speed.prepare(
                copy.deepcopy(ref),
                checkpointing=mode,
                compile=compile,
                shard=True,
                backend="aot_eager",
            )
            assert model.state_dict().keys() == ref.state_dict().keys()
            assert_same(logprobs_and_grads(model, ids, mask, w), want)
    finally:
        dist.destroy_process_group()
