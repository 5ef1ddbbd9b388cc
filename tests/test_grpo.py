"""grpo.py: the clipped GRPO loss against hand-computed values and a token-by-token loop, and the
reference token_logprobs against the full-logits formula."""

import math

import pytest
import torch
from qwen_helpers import LOGP, batch, grad_tol, grads_of, naive_token_logprobs, tiny_qwen3

from grpo import grpo_loss, token_logprobs


def naive_loss(logp, old, adv, mask, eps=0.2, num_tokens=None):
    """The formula token by token, with torch scalar ops so autograd can differentiate it."""
    total, count = 0.0, 0
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            a = adv[b] if adv.dim() == 1 else adv[b, t]
            ratio = torch.exp(logp[b, t] - old[b, t])
            term = -torch.min(ratio * a, torch.clamp(ratio, 1 - eps, 1 + eps) * a)
            total, count = total + term, count + 1
    return total / (num_tokens if num_tokens is not None else max(count, 1))


def random_batch(seed, B=4, T=7, per_token_adv=False):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = (old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    shape = (B, T) if per_token_adv else (B,)
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.7
    engine = old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    return logp, old, adv, mask, engine


def test_hand_computed():
    old = torch.zeros(2, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1], [0.9, 0.5, 7.0]])).requires_grad_()
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, stats = grpo_loss(logp, old, adv, mask, clip_eps=0.2)
    # fp32 against exact decimals: each rho = exp(log(x)) is within ~2 ulps of x (<= 1.5: 2.4e-7),
    # clipped values are the exact bounds rounded once; 5 terms summed and divided: |error| <=
    # 5·2.4e-7 / 5 + a few ulps ~ 5e-7 (and alike for ratio_mean and the gap below): abs=1e-6
    # per token: -min(rho*A, clip(rho)*A) = -1.2 (clipped), -0.5, -1.1 | 0.9, 0.8 (clipped); last
    # masked out
    assert loss.item() == pytest.approx((-1.2 - 0.5 - 1.1 + 0.9 + 0.8) / 5, abs=1e-6)
    # a count (2) over 5: 0.4 rounded to fp32, 2^-24 relative
    assert stats["clip_frac"] == pytest.approx(2 / 5)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.9 + 0.5) / 5, abs=1e-6)
    assert stats["tokens"] == 5 and "logprob_gap" not in stats
    loss.backward()
    # d/dlogp of -rho*A is -rho*A / 5 where unclipped, 0 where clipped or masked
    expected = torch.tensor([[0.0, -0.5, -1.1], [0.9, 0.0, 0.0]]) / 5
    # rho·A/5: ~3 ulps, within the fp32 default rtol 1.3e-6
    torch.testing.assert_close(logp.grad, expected)


def test_engine_gap_is_measured_never_weighted():
    """The engine's log-probs give the gap stats and change neither the loss nor its gradient."""
    logp, mask = torch.zeros(1, 2, requires_grad=True), torch.ones(1, 2)
    engine = torch.tensor([[-2.0, math.log(2)]])
    loss, stats = grpo_loss(logp, None, torch.ones(1), mask, engine_logprobs=engine, clip_eps=0.2)
    plain, _ = grpo_loss(logp, None, torch.ones(1), mask, clip_eps=0.2)
    assert loss.item() == plain.item() == -1.0  # exact: -(1 + 1) / 2
    # the engine/trainer gap |old - engine|: 2 and log 2 (fp32: a few ulps of 2)
    assert stats["logprob_gap"] == pytest.approx((2 + math.log(2)) / 2, abs=1e-6)
    assert stats["logprob_gap_max"] == pytest.approx(2.0, abs=1e-6)
    (g,) = torch.autograd.grad(loss, logp)
    (g_plain,) = torch.autograd.grad(plain, logp)
    assert torch.equal(g, g_plain)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_random_against_naive_loop_and_gradients(seed, per_token_adv):
    logp, old, adv, mask, engine = random_batch(seed, per_token_adv=per_token_adv)
    for extra in ({}, {"engine_logprobs": engine}):
        loss, _ = grpo_loss(logp, old, adv, mask, clip_eps=0.15, **extra)
        (grad,) = torch.autograd.grad(loss, logp)
        want = naive_loss(logp, old, adv, mask, eps=0.15)
        (want_grad,) = torch.autograd.grad(want, logp)
        # float64 both (eps 2.2e-16), ~20 terms of size <~ 3 summed in another order: ~1e-14; 1e-12
        # / 1e-10
        torch.testing.assert_close(loss, want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


def test_micro_batches_sum_to_one_batch():
    logp, old, adv, mask, engine = random_batch(7, B=6, T=9)
    full, _ = grpo_loss(logp, old, adv, mask, engine_logprobs=engine, clip_eps=0.2)
    (full_grad,) = torch.autograd.grad(full, logp)
    n = mask.sum()
    total, total_grad = 0.0, torch.zeros_like(logp)
    for sl in (slice(0, 1), slice(1, 4), slice(4, 6)):  # uneven micro-batches, as ranks would have
        part, _ = grpo_loss(
            logp[sl],
            old[sl],
            adv[sl],
            mask[sl],
            num_tokens=n,
            engine_logprobs=engine[sl],
            clip_eps=0.2,
        )
        (g,) = torch.autograd.grad(part, logp)
        total, total_grad = total + part.detach(), total_grad + g
    # float64: ~35 terms of size <~ 5 in three partial sums instead of one: ~35·5·eps64 ~ 4e-14
    torch.testing.assert_close(total, full.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(total_grad, full_grad, rtol=1e-12, atol=1e-12)


def test_degenerate_inputs_no_nan():
    logp = torch.zeros(2, 3, requires_grad=True)
    # nothing to train on
    loss, stats = grpo_loss(logp, logp.detach(), torch.zeros(2), torch.zeros(2, 3), clip_eps=0.2)
    loss.backward()
    # exact, on any IEEE arithmetic: a sum of masked zeros; below, exp(0) = 1 and the mean of ones
    # is 1
    assert loss.item() == 0.0 and torch.isfinite(logp.grad).all() and stats["tokens"] == 0
    assert all(math.isfinite(v) for v in stats.values())
    # old=None: on-policy, zero advantage
    loss, stats = grpo_loss(logp, None, torch.zeros(2), torch.ones(2, 3), clip_eps=0.2)
    assert loss.item() == 0.0 and stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0
    # a stale or mismatched old log-prob
    far = torch.tensor([[0.0, -300.0, 0.0]], requires_grad=True)
    loss, stats = grpo_loss(
        far,
        torch.tensor([[0.0, 0.0, -300.0]]),
        torch.tensor([-1.0]),
        torch.ones(1, 3),
        engine_logprobs=torch.zeros(1, 3),
        clip_eps=0.2,
    )
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(far.grad).all()


@pytest.mark.parametrize("tie", [True, False])
def test_token_logprobs_is_the_full_logits_formula(tie):
    """The reference: log_softmax of the model's logits at the target, right or left padding (the
    mask)."""
    model = tiny_qwen3(tie)
    ids, mask, w = batch()
    # right, then left padding
    for m in (
        mask,
        torch.ones_like(mask).index_fill_(1, torch.tensor([0, 1]), 0),
    ):
        got = token_logprobs(model, ids, m) * m[:, 1:]
        assert (
            got.shape == (3, 20) and got.dtype == torch.float32 and (got[m[:, 1:] == 1] < 0).all()
        )
        got_grads = grads_of(model, got, w)
        want = naive_token_logprobs(model, ids, m)
        # the same formula on the same logits, summed and exponentiated in another order: LOGP
        torch.testing.assert_close(got, want, **LOGP)
        for name, g in grads_of(model, want, w).items():
            torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)
