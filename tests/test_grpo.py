import copy
import math
import subprocess
import sys

import pytest
import torch

from grpo import (
    chunked_logprobs,
    grpo_loss,
    shared_prompt_logprobs,
    shared_prompt_mask,
    shared_prompt_rows,
    token_logprobs,
)

EPS32 = 2.0 ** -23   # fp32 machine epsilon
# Two fp32 computations of the same log-probs (another kernel, mask, batch layout, chunking or trace), on any CPU:
# logp = z/T - logsumexp(z/T) is a difference of numbers up to S = max|z/T| + log V (<= ~8 + 5.5 for tiny_qwen3
# on these batches), and an fp32 forward lands within ~8 ulps of S of the exact value (test_engine.logp_tol, which
# checks that against fp64): two of them within 16·eps·S.
LOGP = dict(rtol=0.0, atol=16 * EPS32 * 14)


def grad_tol(g):
    """A gradient entry sums the contributions of a batch's ~35-60 tokens and of the positions they attend to
    (n <~ 80 terms); two computations give terms that differ as the log-probs do, summed in other orders: ~n·eps of
    the largest (80·eps ~ 1e-5) apart, i.e. 1e-5 of max|g| (and of each entry)."""
    return dict(rtol=1e-5, atol=1e-5 * g.abs().max().item())


def naive_loss(logp, old, adv, mask, eps=0.2, eps_high=None, kl_coef=0.0, ref=None, engine=None, cap=2.0,
               num_tokens=None):
    """The formula token by token, with torch scalar ops so autograd can differentiate it."""
    eps_high = eps if eps_high is None else eps_high
    total, count = 0.0, 0
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            a = adv[b] if adv.dim() == 1 else adv[b, t]
            ratio = torch.exp(logp[b, t] - old[b, t])
            term = -torch.min(ratio * a, torch.clamp(ratio, 1 - eps, 1 + eps_high) * a)
            if engine is not None:
                term = term * min(math.exp(old[b, t].item() - engine[b, t].item()), cap)
            if ref is not None:
                r = ref[b, t] - logp[b, t]
                term = term + kl_coef * (torch.exp(r) - r - 1)
            total, count = total + term, count + 1
    return total / (num_tokens if num_tokens is not None else max(count, 1))


def random_batch(seed, B=4, T=7, per_token_adv=False):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = (old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(B, T, generator=g, dtype=torch.float64) if per_token_adv else torch.randn(B, generator=g,
                                                                                                 dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.7
    ref = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    engine = old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    return logp, old, adv, mask, ref, engine


def test_hand_computed():
    old = torch.zeros(2, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1], [0.9, 0.5, 7.0]])).requires_grad_()
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, stats = grpo_loss(logp, old, adv, mask)
    # fp32 against exact decimals: each rho = exp(log(x)) is within ~2 ulps of x (<= 1.5: 2.4e-7), clipped values
    # are the exact bounds rounded once; 5 terms summed and divided: |error| <= 5·2.4e-7 / 5 + a few ulps ~ 5e-7
    # (and alike for ratio_mean, the k3 and IS figures below): abs=1e-6
    # per token: -min(rho*A, clip(rho)*A) = -1.2 (clipped), -0.5, -1.1 | 0.9, 0.8 (clipped); last masked out
    assert loss.item() == pytest.approx((-1.2 - 0.5 - 1.1 + 0.9 + 0.8) / 5, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(2 / 5)   # a count (2) over 5: 0.4 rounded to fp32, 2^-24 relative
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.9 + 0.5) / 5, abs=1e-6)
    assert stats["kl"] == 0.0 and stats["tokens"] == 5
    loss.backward()
    # d/dlogp of -rho*A is -rho*A / 5 where unclipped, 0 where clipped or masked
    expected = torch.tensor([[0.0, -0.5, -1.1], [0.9, 0.0, 0.0]]) / 5
    torch.testing.assert_close(logp.grad, expected)   # rho·A/5: ~3 ulps, within the fp32 default rtol 1.3e-6
    # clip-higher (DAPO): with eps_high = 0.6, rho = 1.5 is no longer clipped
    loss, stats = grpo_loss(logp, old, adv, mask, clip_eps_high=0.6)
    assert loss.item() == pytest.approx((-1.5 - 0.5 - 1.1 + 0.9 + 0.8) / 5, abs=1e-6)


def test_hand_computed_kl_and_is():
    logp = torch.zeros(1, 2)
    ref = torch.log(torch.tensor([[2.0, 0.5]]))
    mask = torch.ones(1, 2)
    loss, stats = grpo_loss(logp, logp, torch.zeros(1), mask, kl_coef=0.1, ref_logprobs=ref)
    k3 = [2 - math.log(2) - 1, 0.5 - math.log(0.5) - 1]  # exp(r) - r - 1; fp32: ulps of 2 (2.4e-7) each
    assert stats["kl"] == pytest.approx(sum(k3) / 2, abs=1e-6)
    assert loss.item() == pytest.approx(0.1 * sum(k3) / 2, abs=1e-6)
    # truncated IS: weights exp(old - engine) = [e^2 -> capped at 2, 0.5]; rho = 1, A = 1 -> -w per token
    engine = torch.tensor([[-2.0, math.log(2)]])
    loss, stats = grpo_loss(logp, logp, torch.ones(1), mask, engine_logprobs=engine, is_cap=2.0)
    assert loss.item() == pytest.approx(-(2.0 + 0.5) / 2, abs=1e-6)
    assert stats["is_weight_mean"] == pytest.approx(1.25, abs=1e-6)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_random_against_naive_loop_and_gradients(seed, per_token_adv):
    logp, old, adv, mask, ref, engine = random_batch(seed, per_token_adv=per_token_adv)
    kw = dict(clip_eps=0.15, clip_eps_high=0.25, kl_coef=0.05)
    for extra in ({}, {"ref_logprobs": ref}, {"ref_logprobs": ref, "engine_logprobs": engine, "is_cap": 1.5}):
        loss, _ = grpo_loss(logp, old, adv, mask, **kw, **extra)
        (grad,) = torch.autograd.grad(loss, logp)
        want = naive_loss(logp, old, adv, mask, eps=0.15, eps_high=0.25, kl_coef=0.05, ref=extra.get("ref_logprobs"),
                          engine=extra.get("engine_logprobs"), cap=extra.get("is_cap", 2.0))
        (want_grad,) = torch.autograd.grad(want, logp)
        # float64 both (eps 2.2e-16), ~20 terms of size <~ 3 summed in another order: ~1e-14; 1e-12 / 1e-10
        torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


def test_micro_batches_sum_to_one_batch():
    logp, old, adv, mask, ref, engine = random_batch(7, B=6, T=9)
    kw = dict(kl_coef=0.1, ref_logprobs=ref, engine_logprobs=engine)
    full, _ = grpo_loss(logp, old, adv, mask, **kw)
    (full_grad,) = torch.autograd.grad(full, logp)
    n = mask.sum()
    total, total_grad = 0.0, torch.zeros_like(logp)
    for sl in (slice(0, 1), slice(1, 4), slice(4, 6)):  # uneven micro-batches, as ranks would have
        part, _ = grpo_loss(logp[sl], old[sl], adv[sl], mask[sl], num_tokens=n, kl_coef=0.1, ref_logprobs=ref[sl],
                            engine_logprobs=engine[sl])
        (g,) = torch.autograd.grad(part, logp)
        total, total_grad = total + part.detach(), total_grad + g
    # float64: ~35 terms of size <~ 5 in three partial sums instead of one: ~35·5·eps64 ~ 4e-14
    torch.testing.assert_close(total, full.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(total_grad, full_grad, rtol=1e-12, atol=1e-12)


def test_degenerate_inputs_no_nan():
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, stats = grpo_loss(logp, logp.detach(), torch.zeros(2), torch.zeros(2, 3))  # nothing to train on
    loss.backward()
    # exact, on any IEEE arithmetic: a sum of masked zeros; below, exp(0) = 1 and the mean of ones is 1
    assert loss.item() == 0.0 and torch.isfinite(logp.grad).all() and stats["tokens"] == 0
    assert all(math.isfinite(v) for v in stats.values())
    loss, stats = grpo_loss(logp, None, torch.zeros(2), torch.ones(2, 3))  # old=None: on-policy, zero advantage
    assert loss.item() == 0.0 and stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0
    far = torch.tensor([[0.0, -300.0, 0.0]], requires_grad=True)  # a stale or mismatched old log-prob
    loss, stats = grpo_loss(far, torch.tensor([[0.0, 0.0, -300.0]]), torch.tensor([-1.0]), torch.ones(1, 3),
                            kl_coef=0.1, ref_logprobs=torch.zeros(1, 3), engine_logprobs=torch.zeros(1, 3))
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(far.grad).all()


def tiny_qwen3(tie, seed=0, vocab=257):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                      tie_word_embeddings=tie, initializer_range=0.2)
    model = Qwen3ForCausalLM(cfg).float()
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    return model


def naive_token_logprobs(model, ids, mask, temperature):
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1) * mask[:, 1:]


def batch(vocab=257, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (3, 21), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 15:] = 0  # right padding
    mask[2, 19:] = 0
    return ids, mask, torch.randn(3, 20, generator=g)


def grads_of(model, logp, weights):
    model.zero_grad()
    (logp * weights).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


# The options of token_logprobs. compile uses torch.compile's "aot_eager" backend here: it traces the plain
# element-wise functions through dynamo and AOT autograd exactly as inductor would receive them, without
# generating C++ (seconds instead of minutes on two shared cores); the inductor kernels themselves run in
# `python bench.py gpu`.
OPTIONS = [{}, {"compile": "aot_eager"}, {"keep_logits": True}, {"compile": "aot_eager", "keep_logits": True}]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "+".join(o) or "reference")
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("temperature, chunk_size", [(1.0, 1024), (0.7, 7)])
def test_token_logprobs_matches_naive(tie, temperature, chunk_size, options):
    model = tiny_qwen3(tie)
    ids, mask, w = batch()
    got = token_logprobs(model, ids, mask, temperature=temperature, chunk_size=chunk_size, **options)
    assert got.shape == (3, 20) and got.dtype == torch.float32
    assert (got[mask[:, 1:] == 0] == 0).all() and (got[mask[:, 1:] == 1] < 0).all()
    got_grads = grads_of(model, got, w)
    want = naive_token_logprobs(model, ids, mask, temperature)
    want_grads = grads_of(model, want, w)
    torch.testing.assert_close(got, want, **LOGP)   # no mask against a mask, chunked head against full logits
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)
    with torch.no_grad():  # scoring old / reference log-probs
        torch.testing.assert_close(token_logprobs(model, ids, mask, temperature, chunk_size, **options),
                                   want.detach(), **LOGP)


def test_token_logprobs_left_padding_keeps_its_mask():
    # right padding runs without a mask (a real token's causal past holds no padding: the test above); left
    # padding does not, and keeps it: without one, real tokens would attend to the padding before them
    model = tiny_qwen3(True)
    ids, _, _ = batch()
    mask = torch.ones_like(ids)
    mask[0, :6] = 0
    mask[2, :2] = 0
    got = token_logprobs(model, ids, mask)
    torch.testing.assert_close(got, naive_token_logprobs(model, ids, mask, 1.0), **LOGP)
    assert (got - token_logprobs(model, ids, torch.ones_like(ids))).abs()[mask[:, 1:] == 1].max() > 1e-3


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "+".join(o) or "reference")
def test_chunked_logprobs_gradcheck(options):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(9, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (9,), generator=g)
    assert torch.autograd.gradcheck(lambda h, w: chunked_logprobs(h, w, targets, 0.8, 4, **options), (h, w))


def test_options_agree_with_the_reference_in_bf16():
    """In bf16 (the GPU dtype) every option gives the reference's values and gradients: the same bf16 logits,
    fp32 arithmetic after them, the same cast of dL/dz back to bf16 before the two matmuls."""
    g = torch.Generator().manual_seed(3)
    h = torch.randn(40, 16, generator=g).bfloat16().requires_grad_()
    w = (0.5 * torch.randn(300, 16, generator=g)).bfloat16().requires_grad_()
    targets, g_out = torch.randint(0, 300, (40,), generator=g), torch.randn(40, generator=g)
    results = []
    for options in OPTIONS:
        logp = chunked_logprobs(h, w, targets, 0.7, 16, **options)
        results.append((logp.detach(), *torch.autograd.grad((logp * g_out).sum(), (h, w))))
    # logp: fp32 arithmetic after the same bf16 logits (|z/T| <= ~13, V = 300): LOGP's 16·eps·S bound, S ~ 19.
    # Gradients: dL/dz is the same fp32 math in another op order (a few ulps), then rounded to bf16 (8 significant
    # bits: one ulp is 2^-8 to 2^-7 of the value); an entry within those ulps of a rounding boundary can round the
    # other way. Each bf16 result then differs by at most: its own rounding flipped (<= 2^-7), one flipped input
    # term (<= 2^-7 of one product, <~ 2^-7·max), and grad_w's bf16 accumulator over the 3 chunks rounds 3 times:
    # <= 3 ulps, 3·2^-7 ~ 0.023 of the entry or of max|g|.
    bf16 = 3 * 2.0 ** -7
    for options, (logp, gh, gw) in zip(OPTIONS[1:], results[1:]):
        torch.testing.assert_close(logp, results[0][0], rtol=0.0, atol=16 * EPS32 * 19, msg=str(options))
        torch.testing.assert_close(gh, results[0][1], rtol=bf16, atol=bf16 * gh.abs().max().item(), msg=str(options))
        torch.testing.assert_close(gw, results[0][2], rtol=bf16, atol=bf16 * gw.abs().max().item(), msg=str(options))


@pytest.mark.parametrize("options, keeps", [({}, 0), ({"compile": "aot_eager"}, 0), ({"keep_logits": True}, 1)],
                         ids=["reference", "compile", "keep_logits"])
def test_backward_keeps_no_full_logits(options, keeps):
    """Autograd saves no [tokens x vocab] tensor: the backward recomputes each chunk's logits. keep_logits saves
    them instead, chunk by chunk, in the model's dtype (tokens x vocab in all), and only when a gradient is needed."""
    vocab = 3001
    model = tiny_qwen3(True, vocab=vocab)
    ids, mask, _ = batch(vocab)
    n_tokens = int(mask[:, 1:].sum())
    for fn, full in ((lambda *a: token_logprobs(*a, chunk_size=16, **options), False), (naive_token_logprobs, True)):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: saved.append(t) or t, lambda t: t):
            fn(model, ids, mask, 1.0)
        assert (max(t.numel() for t in saved) >= n_tokens * vocab) == full
        if not full:
            chunks = [t for t in saved if t.dim() == 2 and t.shape[1] == vocab and t.shape[0] <= 16]
            assert sum(t.numel() for t in chunks) == keeps * n_tokens * vocab
    model.zero_grad()
    with torch.no_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: pytest.fail("saved"), lambda t: t):
        token_logprobs(model, ids, mask, chunk_size=16, **options)


def test_fsdp2_root_call(tmp_path):
    """Under fully_shard the parameters outside a forward are sharded DTensors; token_logprobs (and
    shared_prompt_logprobs) must still work."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if dist.is_initialized():   # an earlier test (vLLM) owns this process's group: run in a fresh interpreter
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               f"{__file__}::test_fsdp2_root_call"], capture_output=True, text=True, timeout=600)
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
        got = token_logprobs(model, ids, mask, temperature=0.7, chunk_size=5)
        got_grads = {n: g.full_tensor() for n, g in grads_of(model, got, w).items()}
        want = token_logprobs(ref, ids, mask, temperature=0.7, chunk_size=5)
        want_grads = grads_of(ref, want, w)
        # one rank: the same kernels on the same shapes (FSDP2 only all-gathers, i.e. copies, and reduce-scatters
        # over one rank); in case its gradient reduction reorders a sum, the same tolerances as any two computations
        torch.testing.assert_close(got, want, **LOGP)
        for name, g in want_grads.items():
            torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)
        with pytest.raises(RuntimeError, match="DTensor"):  # why we go through the root module
            model.model(input_ids=ids, attention_mask=mask)
        rows, _ = shared_batch()   # shared prompts: the same root call, with a 4D mask and position ids
        model.zero_grad()   # before the forward: between forward and backward the root's parameters are unsharded
        got = shared_logprobs(model, rows, 0.7, chunk_size=5)
        w = torch.randn(got.shape, generator=torch.Generator().manual_seed(0))
        got_grads = {n: g.full_tensor() for n, g in grads_of(model, got, w).items()}
        want = shared_logprobs(ref, rows, 0.7, chunk_size=5)
        want_grads = grads_of(ref, want, w)
        torch.testing.assert_close(got, want, **LOGP)
        for name, g in want_grads.items():
            torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------------
# shared prompts: one row [prompt, c_1, ..., c_k] per prompt, block attention, position ids restarting


def test_shared_prompt_rows_layout():
    b = shared_prompt_rows([([5, 6, 7], [[8, 9], [10]]), ([11], [[12, 13, 14]])], pad_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 0, 0]]
    assert b["segment"].tolist() == [[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, -1, -1]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 3, 0, 0]]
    # c_1 = [8, 9]: 8 predicted at the prompt's last position (2), 9 at 8's (3); c_2 = [10] at position 2 again
    assert b["targets"].tolist() == [8, 9, 10, 12, 13, 14]
    assert b["positions"].tolist() == [2, 3, 2, 6 + 0, 6 + 1, 6 + 2]
    mask = shared_prompt_mask(b["segment"])
    attend = mask[0, 0].int().tolist()
    assert attend[5] == [1, 1, 1, 0, 0, 1]   # c_2 sees the prompt and itself, not c_1
    assert attend[4] == [1, 1, 1, 1, 1, 0]   # c_1's second token: the prompt and c_1
    assert attend[1] == [1, 1, 0, 0, 0, 0]   # the prompt is causal
    assert mask.shape == (2, 1, 6, 6) and mask.dtype == torch.bool
    assert mask[1, 0, 5].int().tolist() == [1, 0, 0, 0, 1, 1]   # padding sees something: no NaN
    # an empty prompt: the first token of each completion has no predictor and is left out
    b = shared_prompt_rows([([], [[3, 4], [5, 6]])], pad_id=0)
    assert b["targets"].tolist() == [4, 6] and b["positions"].tolist() == [0, 2]


def shared_batch(vocab=257, seed=2):
    """Groups with a repeated prompt (one of them cut in two rows), as (prompt, [completion, ...]) and as the
    unshared samples, completions in the same order."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()
    p1, p2, p3 = ids(6), ids(9), ids(4)
    rows = [(p1, [ids(5), ids(3), ids(7)]), (p2, [ids(4)]), (p1, [ids(6)]), (p3, [ids(2), ids(8)])]
    samples = [(p, c) for p, cs in rows for c in cs]
    return rows, samples


def unshared_logprobs(model, samples, temperature, **kw):
    """token_logprobs on the samples one a row, right-padded: each sample's completion log-probs, concatenated."""
    T = max(len(p) + len(c) for p, c in samples)
    ids, mask, sel = torch.zeros(len(samples), T, dtype=torch.long), torch.zeros(len(samples), T, dtype=torch.long), \
        torch.zeros(len(samples), T - 1, dtype=torch.bool)
    for r, (p, c) in enumerate(samples):
        ids[r, :len(p) + len(c)] = torch.tensor(p + c)
        mask[r, :len(p) + len(c)] = 1
        sel[r, len(p) - 1:len(p) + len(c) - 1] = True
    return token_logprobs(model, ids, mask, temperature=temperature, **kw)[sel]


def shared_logprobs(model, rows, temperature, **kw):
    b = shared_prompt_rows(rows, pad_id=0)
    return shared_prompt_logprobs(model, b["input_ids"], b["segment"], b["position_ids"], b["positions"],
                                  b["targets"], temperature=temperature, **kw)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("temperature, options", [(1.0, {}), (0.7, {"chunk_size": 5, "keep_logits": True})])
def test_shared_prompts_match_unshared(tie, attn, temperature, options):
    """Each prompt forwarded once gives every completion token the log-prob (and gradient) it gets in its own
    row: the same keys at the same positions."""
    model = tiny_qwen3(tie)
    model.config._attn_implementation = attn
    rows, samples = shared_batch()
    got = shared_logprobs(model, rows, temperature, **options)
    want = unshared_logprobs(model, samples, temperature, **options)
    assert got.shape == want.shape == (sum(len(c) for _, c in samples),)
    w = torch.randn(got.shape, generator=torch.Generator().manual_seed(0))
    got_grads, want_grads = grads_of(model, got, w), grads_of(model, want, w)
    torch.testing.assert_close(got, want, **LOGP)   # a block mask and other rows: two fp32 computations
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)


def test_shared_rows_of_one_completion_match_unshared():
    # no row holds a second completion: the block mask is the causal one, and the forward runs without a mask
    model = tiny_qwen3(False)
    rows, _ = shared_batch()
    rows = [(p, cs[:1]) for p, cs in rows]
    samples = [(p, cs[0]) for p, cs in rows]
    b = shared_prompt_rows(rows, pad_id=0)
    assert int(b["segment"].max()) == 1 and (b["segment"] == -1).any()   # right padding in the batch too
    masks = []   # what the model is called with: no mask, on both paths (right padding needs none either)
    hook = model.register_forward_pre_hook(lambda m, args, kw: masks.append(kw.get("attention_mask")), with_kwargs=True)
    got, want = shared_logprobs(model, rows, 0.7), unshared_logprobs(model, samples, 0.7)
    hook.remove()
    assert masks == [None, None]
    w = torch.randn(got.shape, generator=torch.Generator().manual_seed(0))
    got_grads, want_grads = grads_of(model, got, w), grads_of(model, want, w)
    torch.testing.assert_close(got, want, **LOGP)   # other rows and padding: two fp32 computations
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)


def test_shared_prompts_grpo_loss_matches_unshared():
    """The clipped loss with a reference model (k3 KL) and truncated IS, on a batch with repeated prompts: packed
    ([1, N], per-token advantages) and one sample a row ([S, T-1], per-sample advantages) give the same loss,
    statistics and gradients."""
    model, ref_model = tiny_qwen3(False), tiny_qwen3(False, seed=5)
    rows, samples = shared_batch()
    g = torch.Generator().manual_seed(3)
    adv = torch.randn(len(samples), generator=g)
    n = torch.tensor([len(c) for _, c in samples])
    with torch.no_grad():
        ref = shared_logprobs(ref_model, rows, 0.7)
        old = shared_logprobs(model, rows, 0.7) + 0.1 * torch.randn(int(n.sum()), generator=g)
    engine = old + 0.3 * torch.randn(old.shape, generator=g)
    kw = dict(clip_eps=0.1, clip_eps_high=0.15, kl_coef=0.05, num_tokens=40.0, is_cap=1.5)

    packed = shared_logprobs(model, rows, 0.7)
    adv_t = adv.repeat_interleave(n)
    loss, stats = grpo_loss(packed[None], old[None], adv_t[None], torch.ones(1, len(packed)),
                            ref_logprobs=ref[None], engine_logprobs=engine[None], **kw)
    (dloss,) = torch.autograd.grad(loss, packed, retain_graph=True)   # dL/dlogp_t
    model.zero_grad()
    loss.backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}

    lp = unshared_logprobs(model, samples, 0.7)
    rowwise = lambda x: torch.nn.utils.rnn.pad_sequence(x.split(n.tolist()), batch_first=True)   # [S, max L]
    mask = rowwise(torch.ones_like(lp))
    loss2, stats2 = grpo_loss(rowwise(lp), rowwise(old), adv, mask, ref_logprobs=rowwise(ref),
                              engine_logprobs=rowwise(engine), **kw)
    model.zero_grad()
    loss2.backward()
    assert stats["clip_frac"] > 0 and stats["kl"] > 0   # the clip, KL and IS terms are all in play
    # Both are sums of the same S per-token terms l_t, in two orders ([1, S] packed, [S, L] padded), of log-probs
    # that differ by d_t (within LOGP): |loss - loss2| <= Σ|dL/dlogp_t|·d_t + (S + 2)·eps·Σ|l_t| / num_tokens (the
    # sums, and an ulp of each exp), and a mean of S positive terms f_t by <= (S + 2)·eps + Σ|f_t'|·d_t / Σ f_t
    # relative.
    torch.testing.assert_close(packed, lp, **LOGP)
    S, d = len(packed), (packed - lp).abs().detach()
    with torch.no_grad():
        rho, r = (packed - old).exp(), ref - packed
        k3 = r.exp() - r - 1
        l_abs = torch.maximum(rho, torch.tensor(1.15)) * adv_t.abs() * (old - engine).exp().clamp(max=1.5) + 0.05 * k3
    tol = (dloss.abs() * d).sum().item() + (S + 2) * EPS32 * l_abs.sum().item() / kw["num_tokens"]
    torch.testing.assert_close(loss, loss2, rtol=0.0, atol=tol)
    # clip_frac and tokens are counts: equal while no rho is within its d_t of a clip bound (1 - 0.1, 1 + 0.15)
    assert (torch.minimum((rho - 0.9).abs(), (rho - 1.15).abs()) > 2 * rho * d).all()
    base = (S + 2) * EPS32
    rel = {"tokens": 0.0, "clip_frac": 0.0, "is_weight_mean": base, "ratio_mean": base + d.max().item(),
           "kl": base + ((r.exp() - 1).abs() * d).sum().item() / k3.sum().item()}
    assert stats.keys() == stats2.keys() == rel.keys()
    assert all(stats[k] == pytest.approx(stats2[k], rel=rel[k], abs=0) for k in stats), (stats, stats2)
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, **grad_tol(p.grad), msg=name)


@pytest.mark.parametrize("mode, compile", [("full", False), ("selective", "aot_eager")])
def test_shared_prompts_with_checkpointing_and_compile(mode, compile):
    """speed.prepare's layers (checkpointed, compiled) take the 4D mask and the position ids as they are."""
    import speed

    torch._dynamo.reset()
    ref = tiny_qwen3(True)
    model = speed.prepare(copy.deepcopy(ref), checkpointing=mode, compile=bool(compile), backend=compile or "inductor")
    rows, _ = shared_batch()
    got, want = shared_logprobs(model, rows, 0.7), shared_logprobs(ref, rows, 0.7)
    w = torch.randn(got.shape, generator=torch.Generator().manual_seed(0))
    got_grads, want_grads = grads_of(model, got, w), grads_of(ref, want, w)
    # the same aten ops on the same shapes (checkpointing replays them; aot_eager traces without fusing): in
    # practice bit for bit; the tolerances of any two computations in case a trace reorders a sum (as test_speed.py)
    torch.testing.assert_close(got, want, **LOGP)
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)


def test_shared_prompts_refuse_other_attention():
    model = tiny_qwen3(True)
    model.config._attn_implementation = "flash_attention_2"
    rows, _ = shared_batch()
    with pytest.raises(ValueError, match="sdpa or eager"):
        shared_logprobs(model, rows, 1.0)
