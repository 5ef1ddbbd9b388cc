"""grpo.py: per-token log-probabilities and the clipped GRPO loss, written out by hand.

1) token_logprobs(model, input_ids, attention_mask) -> [B, T-1], the reference computation:

       logp_t = log softmax(W h_t)[x_{t+1}] = (W h_t)[x_{t+1}] - logsumexp_v (W h_t)_v

   It holds the full-vocabulary logits of the batch at once, which is fine for a small vocabulary
   and not for Qwen3's ~151k (16k tokens x 151k x 4 bytes is ~10 GB, kept again for the backward).
   machinery/logprob_rows.py computes the same numbers a chunk of tokens at a time (the presets for
   large models use it), or forwards a prompt once for all the samples that share it (the tiny
   preset). Both are tested equal to this one (train.rows_for names the tests).

2) grpo_loss: the clipped surrogate, a token-mean over the trained tokens of the (global) batch

       rho_t = exp(logp_t - logp_old_t)
       l_t   = -min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t)        eps: Config.clip_eps
       L     = sum_t mask_t l_t / num_tokens

   (log rho is clamped to +-20 before exp, as verl does, so a stale log-prob cannot give inf.)
   On-policy (one optimizer step per rollout; the paper does not say how many, the authors' verl
   config takes several) the old log-probs are the current ones, detached: rho = 1 and the gradient
   is A_t * grad logp_t; with several minibatches the clip acts. num_tokens is the token count of
   the whole batch, so the micro-batch losses (and gradients) add up to the one-batch loss; under
   FSDP, which averages gradients over ranks, pass the global count / world size. The engine's
   log-probs, when given, are only measured against the trainer's (stats: logprob_gap), never
   weighted into the loss: rollouts sample untruncated, so the two differ by float rounding.

Usage:
    logp = token_logprobs(model, ids, attn)                                   # [B, T-1]
    loss, stats = grpo_loss(logp, None, adv, loss_mask[:, 1:], num_tokens=n_total, clip_eps=0.2)
    loss.backward()

Needs: no other file of this project (torch only).
"""

import torch


def token_logprobs(model, input_ids, attention_mask=None):
    """[B, T-1] fp32 log-probs of input_ids[:, 1:] (fp64 for an fp64 model); padding scores finite
    values."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[
        :, :-1
    ]
    logp = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def grpo_loss(
    logprobs,
    old_logprobs,
    advantages,
    mask,
    num_tokens=None,
    engine_logprobs=None,
    *,
    clip_eps,
):
    """The clipped GRPO surrogate, token-mean. Returns (loss, stats).

    logprobs, old_logprobs (None: on-policy), mask and engine_logprobs: [B, T]; advantages [B] (one
    a sequence) or [B, T]. Masked positions must hold finite values: 0 * inf is NaN. stats: tokens,
    ratio_mean, clip_frac and, with engine log-probs, logprob_gap(_max) = |logp_old - logp_engine|
    (engine vs trainer)."""
    mask = mask.to(logprobs.dtype)
    old = logprobs.detach() if old_logprobs is None else old_logprobs
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    ratio = torch.exp((logprobs - old).clamp(-20.0, 20.0))
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps)
    surr, surr_clipped = ratio * adv, clipped * adv
    per_token = -torch.minimum(surr, surr_clipped)
    n = mask.sum()
    loss = (per_token * mask).sum() / (n.clamp(min=1) if num_tokens is None else num_tokens)
    with torch.no_grad():

        def mean(x):
            return ((x * mask).sum() / n.clamp(min=1)).item()

        clip_frac = mean((surr_clipped < surr).float())
        stats = {"tokens": int(n.item()), "ratio_mean": mean(ratio), "clip_frac": clip_frac}
        if engine_logprobs is not None:
            gap = (old - engine_logprobs).abs() * mask
            stats.update(
                logprob_gap=mean(gap), logprob_gap_max=gap.max().item() if gap.numel() else 0.0
            )
    return loss, stats
