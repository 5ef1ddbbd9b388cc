"""What the tests of grpo.py and logprob_rows.py share: a tiny Qwen3, a batch,
tolerances."""

import torch

EPS32 = 2.0**-23  # fp32 machine epsilon
# Two fp32 computations of the same log-probs (another kernel, mask, batch layout, chunking or
# trace), on any CPU: logp = z - logsumexp(z) is a difference of numbers up to S = max|z| + log V
# (<= ~8 + 5.5 for tiny_qwen3 on these batches), and an fp32 forward lands within ~8 ulps of S of
# the exact value (test_engine.logp_tol, which checks that against fp64): two of them within
# 16·eps·S.
LOGP = dict(rtol=0.0, atol=16 * EPS32 * 14)


def grad_tol(g):
    """A gradient entry sums the contributions of a batch's ~35-60 tokens and of the positions they
    attend to (n <~ 80 terms); two computations give terms that differ as the log-probs do, summed
    in other orders: ~n·eps of the largest (80·eps ~ 1e-5) apart, i.e. 1e-5 of max|g| (and of each
    entry)."""
    return dict(rtol=1e-5, atol=1e-5 * g.abs().max().item())


def tiny_qwen3(tie, seed=0, vocab=257):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        initializer_range=0.2,
    )
    model = Qwen3ForCausalLM(cfg).float()
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    return model


def naive_token_logprobs(model, ids, mask):
    """log_softmax of the full logits, gathered: 0 where the target is padding."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
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
