"""logprob_rows.py's chunked head: the lm head a chunk at a time gives the reference's log-probs
and gradients (tied or not, any chunk size), keeps no full logits for the backward, and works under
FSDP2's root call."""

import copy
import subprocess
import sys

import pytest
import torch
from qwen_helpers import LOGP, batch, grad_tol, grads_of, naive_token_logprobs, tiny_qwen3

from machinery.logprob_rows import chunked_logprobs
from machinery.logprob_rows import chunked_token_logprobs as token_logprobs


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("chunk_size", [1024, 7])
def test_token_logprobs_matches_naive(tie, chunk_size):
    model = tiny_qwen3(tie)
    ids, mask, w = batch()
    got = token_logprobs(model, ids, mask, chunk_size=chunk_size)
    assert got.shape == (3, 20) and got.dtype == torch.float32
    assert (got[mask[:, 1:] == 0] == 0).all() and (got[mask[:, 1:] == 1] < 0).all()
    got_grads = grads_of(model, got, w)
    want = naive_token_logprobs(model, ids, mask)
    want_grads = grads_of(model, want, w)
    # no mask against a mask, chunked head against full logits
    torch.testing.assert_close(got, want, **LOGP)
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)
    with torch.no_grad():  # scoring old / reference log-probs
        torch.testing.assert_close(
            token_logprobs(model, ids, mask, chunk_size), want.detach(), **LOGP
        )


def test_token_logprobs_left_padding_keeps_its_mask():
    # right padding runs without a mask (a real token's causal past holds no padding: the test
    # above); left padding does not, and keeps it: without one, real tokens would attend to the
    # padding before them
    model = tiny_qwen3(True)
    ids, _, _ = batch()
    mask = torch.ones_like(ids)
    mask[0, :6] = 0
    mask[2, :2] = 0
    got = token_logprobs(model, ids, mask)
    torch.testing.assert_close(got, naive_token_logprobs(model, ids, mask), **LOGP)
    assert (got - token_logprobs(model, ids, torch.ones_like(ids))).abs()[
        mask[:, 1:] == 1
    ].max() > 1e-3


def test_chunked_logprobs_gradcheck():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(9, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (9,), generator=g)
    assert torch.autograd.gradcheck(lambda h, w: chunked_logprobs(h, w, targets, 4), (h, w))


def test_lm_head_gradient_is_summed_over_chunks_in_fp32():
    """1024 chunks of one token each, all the same token: dL/dW is 1024 times one token's, bit for
    bit. Each chunk adds the same bf16 product x; an fp32 sum of 1024 of them is exact (8
    significant bits times 2^10 fits fp32's 24) and so is its cast to bf16 (a power-of-two
    multiple). A bf16 running sum would stall near 256 x: from there an addend of x is below half
    its unit in the last place (2^-8 of the sum)."""
    g = torch.Generator().manual_seed(5)
    h1 = torch.randn(1, 16, generator=g).bfloat16()
    w = (0.5 * torch.randn(300, 16, generator=g)).bfloat16().requires_grad_()
    target = torch.randint(0, 300, (1,), generator=g)
    (one,) = torch.autograd.grad(chunked_logprobs(h1, w, target, 1).sum(), (w,))
    many = chunked_logprobs(h1.expand(1024, 16).contiguous(), w, target.expand(1024), 1)
    (gw,) = torch.autograd.grad(many.sum(), (w,))
    assert torch.equal(gw, 1024 * one)


def test_backward_keeps_no_full_logits():
    """Autograd saves no [tokens x vocab] tensor, not even chunk by chunk: the backward recomputes
    each chunk's logits; and nothing at all without a gradient."""
    vocab = 3001
    model = tiny_qwen3(True, vocab=vocab)
    ids, mask, _ = batch(vocab)
    n_tokens = int(mask[:, 1:].sum())
    for fn, full in (
        (lambda *a: token_logprobs(*a, chunk_size=16), False),
        (naive_token_logprobs, True),
    ):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t, saved=saved: saved.append(t) or t, lambda t: t
        ):
            fn(model, ids, mask)
        assert (max(t.numel() for t in saved) >= n_tokens * vocab) == full
        if not full:
            chunks = [t for t in saved if t.dim() == 2 and t.shape[1] == vocab and t.shape[0] <= 16]
            assert chunks == []
    model.zero_grad()
    with (
        torch.no_grad(),
        torch.autograd.graph.saved_tensors_hooks(lambda t: pytest.fail("saved"), lambda t: t),
    ):
        token_logprobs(model, ids, mask, chunk_size=16)


def test_fsdp2_root_call(tmp_path):
    """Under fully_shard the parameters outside a forward are sharded DTensors; token_logprobs (and
    logprob_rows.shared_prompt_logprobs, through the same root call) must still work."""
    import torch.distributed as dist
    from test_shared_prompts import shared_batch, shared_logprobs
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # an earlier test (vLLM) owns this process's group: run in a fresh interpreter
    if dist.is_initialized():
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"{__file__}::test_fsdp2_root_call",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        return
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ref = tiny_qwen3(True)
        model = copy.deepcopy(ref)
        mesh = init_device_mesh("cpu", (1,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        ids, mask, w = batch()
        got = token_logprobs(model, ids, mask, chunk_size=5)
        got_grads = {n: g.full_tensor() for n, g in grads_of(model, got, w).items()}
        want = token_logprobs(ref, ids, mask, chunk_size=5)
        want_grads = grads_of(ref, want, w)
        # one rank: the same kernels on the same shapes (FSDP2 only all-gathers, i.e. copies, and
        # reduce-scatters over one rank); in case its gradient reduction reorders a sum, the same
        # tolerances as any two computations
        torch.testing.assert_close(got, want, **LOGP)
        for name, g in want_grads.items():
            torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)
        with pytest.raises(RuntimeError, match="DTensor"):  # why we go through the root module
            model.model(input_ids=ids, attention_mask=mask)
        # shared prompts: the same root call, with a 4D mask and position ids
        rows, _ = shared_batch()
        # before the forward: between forward and backward the root's parameters are unsharded
        model.zero_grad()
        got = shared_logprobs(model, rows, chunk_size=5)
        w = torch.randn(got.shape, generator=torch.Generator().manual_seed(0))
        got_grads = {n: g.full_tensor() for n, g in grads_of(model, got, w).items()}
        want = shared_logprobs(ref, rows, chunk_size=5)
        want_grads = grads_of(ref, want, w)
        torch.testing.assert_close(got, want, **LOGP)
        for name, g in want_grads.items():
            torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)
    finally:
        dist.destroy_process_group()


def test_bench_train_runs_on_a_tiny_shape(capsys):
    """`python tools/bench.py train` on a tiny Qwen3: each variant's update (its log-probs as
    train.rows_for picks them, grpo_loss, backward) in a process of its own for its peak memory,
    then both in turn for their speed; a row each."""
    from tools import bench

    bench.bench_train(reps=1, quick=True)
    out = capsys.readouterr().out
    assert "vocabulary 512, 126 tokens an update" in out and "skipped" not in out
    for variant in ("plain", "chunked"):
        assert f"  {variant} " in out and "tokens/s" in out
