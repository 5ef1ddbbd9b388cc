"""logprob_rows.py's shared rows: one row [prompt, c_1, ..., c_k] per prompt, block attention,
position ids restarting: the layout, and the log-probs, gradients and GRPO loss of one sample a
row."""

import copy

import pytest
import torch
from qwen_helpers import EPS32, LOGP, grad_tol, grads_of, tiny_qwen3

from grpo import grpo_loss
from machinery.logprob_rows import chunked_token_logprobs as token_logprobs
from machinery.logprob_rows import shared_prompt_logprobs, shared_prompt_mask, shared_prompt_rows


def test_shared_prompt_rows_layout():
    b = shared_prompt_rows([([5, 6, 7], [[8, 9], [10]]), ([11], [[12, 13, 14]])], pad_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 0, 0]]
    assert b["segment"].tolist() == [[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, -1, -1]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 3, 0, 0]]
    # c_1 = [8, 9]: 8 predicted at the prompt's last position (2), 9 at 8's (3); c_2 = [10] at
    # position 2 again
    assert b["targets"].tolist() == [8, 9, 10, 12, 13, 14]
    assert b["positions"].tolist() == [2, 3, 2, 6 + 0, 6 + 1, 6 + 2]
    mask = shared_prompt_mask(b["segment"])
    attend = mask[0, 0].int().tolist()
    assert attend[5] == [1, 1, 1, 0, 0, 1]  # c_2 sees the prompt and itself, not c_1
    assert attend[4] == [1, 1, 1, 1, 1, 0]  # c_1's second token: the prompt and c_1
    assert attend[1] == [1, 1, 0, 0, 0, 0]  # the prompt is causal
    assert mask.shape == (2, 1, 6, 6) and mask.dtype == torch.bool
    assert mask[1, 0, 5].int().tolist() == [1, 0, 0, 0, 1, 1]  # padding sees something: no NaN


def shared_batch(vocab=257, seed=2):
    """Groups with a repeated prompt (one of them cut in two rows), as (prompt, [completion, ...])
    and as the unshared samples, completions in the same order."""
    g = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    p1, p2, p3 = ids(6), ids(9), ids(4)
    rows = [(p1, [ids(5), ids(3), ids(7)]), (p2, [ids(4)]), (p1, [ids(6)]), (p3, [ids(2), ids(8)])]
    samples = [(p, c) for p, cs in rows for c in cs]
    return rows, samples


def unshared_logprobs(model, samples, **kw):
    """token_logprobs on the samples one a row, right-padded: each sample's completion log-probs,
    concatenated."""
    T = max(len(p) + len(c) for p, c in samples)
    ids, mask, sel = (
        torch.zeros(len(samples), T, dtype=torch.long),
        torch.zeros(len(samples), T, dtype=torch.long),
        torch.zeros(len(samples), T - 1, dtype=torch.bool),
    )
    for r, (p, c) in enumerate(samples):
        ids[r, : len(p) + len(c)] = torch.tensor(p + c)
        mask[r, : len(p) + len(c)] = 1
        sel[r, len(p) - 1 : len(p) + len(c) - 1] = True
    return token_logprobs(model, ids, mask, **kw)[sel]


def shared_logprobs(model, rows, **kw):
    b = shared_prompt_rows(rows, pad_id=0)
    return shared_prompt_logprobs(
        model, b["input_ids"], b["segment"], b["position_ids"], b["positions"], b["targets"], **kw
    )


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("options", [{}, {"chunk_size": 5}])
def test_shared_prompts_match_unshared(tie, attn, options):
    """Each prompt forwarded once gives every completion token the log-prob (and gradient) it gets
    in its own row: the same keys at the same positions."""
    model = tiny_qwen3(tie)
    model.config._attn_implementation = attn
    rows, samples = shared_batch()
    got = shared_logprobs(model, rows, **options)
    want = unshared_logprobs(model, samples, **options)
    assert got.shape == want.shape == (sum(len(c) for _, c in samples),)
    w = torch.randn(got.shape, generator=torch.Generator().manual_seed(0))
    got_grads, want_grads = grads_of(model, got, w), grads_of(model, want, w)
    # a block mask and other rows: two fp32 computations
    torch.testing.assert_close(got, want, **LOGP)
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)


def test_shared_rows_of_one_completion_match_unshared():
    # no row holds a second completion: the block mask is the causal one, and the forward runs
    # without a mask
    model = tiny_qwen3(False)
    rows, _ = shared_batch()
    rows = [(p, cs[:1]) for p, cs in rows]
    samples = [(p, cs[0]) for p, cs in rows]
    b = shared_prompt_rows(rows, pad_id=0)
    # right padding in the batch too
    assert int(b["segment"].max()) == 1 and (b["segment"] == -1).any()
    # what the model is called with: no mask, on both paths (right padding needs none either)
    masks = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kw: masks.append(kw.get("attention_mask")), with_kwargs=True
    )
    got, want = shared_logprobs(model, rows), unshared_logprobs(model, samples)
    hook.remove()
    assert masks == [None, None]
    w = torch.randn(got.shape, generator=torch.Generator().manual_seed(0))
    got_grads, want_grads = grads_of(model, got, w), grads_of(model, want, w)
    torch.testing.assert_close(got, want, **LOGP)  # other rows and padding: two fp32 computations
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)


def test_shared_prompts_grpo_loss_matches_unshared():
    """The clipped loss, on a batch with repeated prompts: packed ([1, N],
    per-token advantages) and one sample a row ([S, T-1], per-sample advantages) give the same loss,
    statistics and gradients."""
    model = tiny_qwen3(False)
    rows, samples = shared_batch()
    g = torch.Generator().manual_seed(3)
    adv = torch.randn(len(samples), generator=g)
    n = torch.tensor([len(c) for _, c in samples])
    with torch.no_grad():
        old = shared_logprobs(model, rows) + 0.1 * torch.randn(int(n.sum()), generator=g)
    engine = old + 0.3 * torch.randn(old.shape, generator=g)
    kw = dict(clip_eps=0.1, num_tokens=40.0)

    packed = shared_logprobs(model, rows)
    adv_t = adv.repeat_interleave(n)
    loss, stats = grpo_loss(
        packed[None],
        old[None],
        adv_t[None],
        torch.ones(1, len(packed)),
        engine_logprobs=engine[None],
        **kw,
    )
    (dloss,) = torch.autograd.grad(loss, packed, retain_graph=True)  # dL/dlogp_t
    model.zero_grad()
    loss.backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}

    lp = unshared_logprobs(model, samples)

    def rowwise(x):
        return torch.nn.utils.rnn.pad_sequence(x.split(n.tolist()), batch_first=True)  # [S, max L]

    mask = rowwise(torch.ones_like(lp))
    loss2, stats2 = grpo_loss(
        rowwise(lp), rowwise(old), adv, mask, engine_logprobs=rowwise(engine), **kw
    )
    model.zero_grad()
    loss2.backward()
    assert stats["clip_frac"] > 0  # the clip is in play
    # Both are sums of the same S per-token terms l_t, in two orders ([1, S] packed, [S, L] padded),
    # of log-probs that differ by d_t (within LOGP): |loss - loss2| <= Σ|dL/dlogp_t|·d_t + (S +
    # 2)·eps·Σ|l_t| / num_tokens (the sums, and an ulp of each exp), and a mean of S positive terms
    # f_t by <= (S + 2)·eps + Σ|f_t'|·d_t / Σ f_t relative.
    torch.testing.assert_close(packed, lp, **LOGP)
    S, d = len(packed), (packed - lp).abs().detach()
    with torch.no_grad():
        rho = (packed - old).exp()
        l_abs = torch.maximum(rho, torch.tensor(1.1)) * adv_t.abs()
    tol = (dloss.abs() * d).sum().item() + (S + 2) * EPS32 * l_abs.sum().item() / kw["num_tokens"]
    torch.testing.assert_close(loss, loss2, rtol=0.0, atol=tol)
    # clip_frac and tokens are counts: equal while no rho is within its d_t of a clip bound (1 -
    # 0.1, 1 + 0.1)
    assert (torch.minimum((rho - 0.9).abs(), (rho - 1.1).abs()) > 2 * rho * d).all()
    base = (S + 2) * EPS32
    # the gap |old - engine| does not depend on the trainer's log-probs: only the sums' order
    rel = {
        "tokens": 0.0,
        "clip_frac": 0.0,
        "ratio_mean": base + d.max().item(),
        "logprob_gap": base,
        "logprob_gap_max": 0.0,
    }
    assert stats.keys() == stats2.keys() == rel.keys()
    assert all(stats[k] == pytest.approx(stats2[k], rel=rel[k], abs=0) for k in stats), (
        stats,
        stats2,
    )
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, **grad_tol(p.grad), msg=name)


@pytest.mark.parametrize("mode, compile", [("full", False), ("off", "aot_eager")])
def test_shared_prompts_with_checkpointing_and_compile(mode, compile):
    """speed.prepare's layers (checkpointed, compiled) take the 4D mask and the position ids as they
    are."""
    from machinery import speed

    torch._dynamo.reset()
    ref = tiny_qwen3(True)
    model = speed.prepare(
        copy.deepcopy(ref), checkpointing=mode, compile=bool(compile), backend=compile or "inductor"
    )
    rows, _ = shared_batch()
    got, want = shared_logprobs(model, rows), shared_logprobs(ref, rows)
    w = torch.randn(got.shape, generator=torch.Generator().manual_seed(0))
    got_grads, want_grads = grads_of(model, got, w), grads_of(ref, want, w)
    # the same aten ops on the same shapes (checkpointing replays them; aot_eager traces without
    # fusing): in practice bit for bit; the tolerances of any two computations in case a trace
    # reorders a sum (as test_speed.py)
    torch.testing.assert_close(got, want, **LOGP)
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, **grad_tol(g), msg=name)


def test_shared_prompts_refuse_other_attention():
    model = tiny_qwen3(True)
    model.config._attn_implementation = "flash_attention_2"
    rows, _ = shared_batch()
    with pytest.raises(ValueError, match="sdpa or eager"):
        shared_logprobs(model, rows)
