"""chunked.py: per-token log-probs through the lm head a chunk of tokens at a time (the same numbers
as grpo.token_logprobs, without the full-vocabulary logits in memory).

    logp_t = z_t[x_{t+1}] - logsumexp_v z_tv,    z_t = W h_t

With Qwen3's ~151k vocabulary the logits are where training memory goes, and chunking only the
forward does not help: autograd would keep every chunk for the backward. So an autograd.Function
computes lm_head + log-softmax + gather `chunk_size` tokens at a time, saves only h, W and the
per-token logsumexp, and recomputes each chunk's logits in the backward:

    d logp_t / d z_tv = 1[v = x_{t+1}] - softmax(z_t)_v
    dL/dh_t = sum_v g_tv W_v,   dL/dW = sum_t g_t h_t^T,   g_tv = dL/dlogp_t * d logp_t / d z_tv

Peak extra memory is one [chunk_size x vocab] fp32 block, forward and backward alike; in bf16 the
lm_head's gradient is summed over the chunks in fp32 (an fp32 [vocab x hidden] accumulator beside
one chunk's bf16 product). Logits are computed in the weight's dtype and then upcast, exactly like
`model(...).logits.float()`.

FSDP2 installs its all-gather/reshard hooks on module __call__, so the model is called through its
root module (with logits_to_keep=1: it computes one position's logits only) and the chunked head
runs in a forward hook on the decoder body, while the root's parameters (embeddings, norm, the tied
lm_head) are unsharded. FSDP2 never reshards the root after its forward, so the weight saved for the
backward stays valid, and its gradient is reduce-scattered like any other root parameter's. Wrap the
lm_head in the root group (fully_shard each layer, then the model: speed.prepare); tied embeddings
require that anyway.

Usage (train.py's Config.logprobs="chunked", the Qwen3 presets'):
    logp = token_logprobs(model, ids, attn)                  # [B, T-1], as grpo.token_logprobs
    logp = head_logprobs(model, select, targets, input_ids=ids, ...)
                                                             # [N]: any rows (shared_prompts.py)

Needs: no other file of this project (torch only).
"""

import torch

CHUNK = 1024  # tokens a chunk


class _ChunkedLogprob(torch.autograd.Function):
    """log_softmax(h @ W.T).gather(targets), chunk by chunk, recomputed for the backward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size):
        # bf16 -> fp32; fp64 stays (gradcheck)
        acc = torch.promote_types(hidden.dtype, torch.float32)
        out = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)
        lse = torch.empty_like(out)
        for s in range(0, hidden.shape[0], chunk_size):
            z, t = hidden[s : s + chunk_size] @ weight.T, targets[s : s + chunk_size]
            # in place: a single [chunk x vocab] buffer alive (logsumexp would allocate two more)
            z = z.to(acc)
            out[s : s + chunk_size] = z.gather(-1, t[:, None]).squeeze(-1)
            zmax = z.amax(dim=-1, keepdim=True)
            lse[s : s + chunk_size] = z.sub_(zmax).exp_().sum(dim=-1).log_().add_(zmax.squeeze(-1))
        out -= lse
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        # dL/dW summed over the chunks in fp32 (up to 64 bf16 partial sums would lose the small
        # ones), each chunk's product in the weight's dtype (its matmul accumulates in fp32 itself)
        acc = torch.promote_types(weight.dtype, torch.float32)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        for s in range(0, hidden.shape[0], ctx.chunk_size):
            h, t = hidden[s : s + ctx.chunk_size], targets[s : s + ctx.chunk_size]
            g_out = grad_out[s : s + ctx.chunk_size, None].to(lse.dtype)
            z = (h @ weight.T).to(lse.dtype)
            g = z.sub_(lse[s : s + ctx.chunk_size, None]).exp_().mul_(-g_out)  # -g * softmax
            g = g.scatter_add_(-1, t[:, None], g_out).to(weight.dtype)  # + g * onehot
            if need_h:
                grad_h[s : s + ctx.chunk_size] = g @ weight
            if need_w:
                if acc == weight.dtype:
                    grad_w.addmm_(g.T, h)
                else:
                    grad_w.add_(g.T @ h)  # a [V, H] product in bf16, added in fp32
        if need_w:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None


def chunked_logprobs(hidden, weight, targets, chunk_size=CHUNK):
    """Log-probs [N] of targets [N] under softmax(hidden [N, H] @ weight[V, H].T)."""
    return _ChunkedLogprob.apply(hidden, weight, targets, int(chunk_size))


def head_logprobs(model, select, targets, chunk_size=CHUNK, **inputs):
    """Log-probs [N] of targets [N] under the model's head at the hidden rows select(h [B, T, H]) ->
    [N, H], from one root forward of model(**inputs) (FSDP2: see the module docstring)."""
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("chunked log-probs support an lm_head without bias (as in Qwen3)")
    result = {}

    # inside the root forward: FSDP2's root parameters are unsharded here
    def hook(module, args, output):
        result["logp"] = chunked_logprobs(select(output[0]), head.weight, targets, chunk_size)

    handle = model.get_decoder().register_forward_hook(hook)
    try:
        model(**inputs, use_cache=False, logits_to_keep=1)
    finally:
        handle.remove()
    return result["logp"]


def token_logprobs(model, input_ids, attention_mask=None, chunk_size=CHUNK):
    """[B, T-1] fp32 (fp64 for an fp64 model) log-probs of input_ids[:, 1:]; 0 where the target is
    padding."""
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    real = attention_mask[:, 1:].bool()
    # right padding only: a real token's causal past holds no padding, so the attention needs no
    # mask (sdpa's is_causal kernels skip the blocks above the diagonal)
    right_padded = bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())
    logp = head_logprobs(
        model,
        lambda h: h[:, :-1][real],
        input_ids[:, 1:][real],
        chunk_size,
        input_ids=input_ids,
        attention_mask=None if right_padded else attention_mask,
    )
    return torch.zeros(real.shape, dtype=logp.dtype, device=input_ids.device).masked_scatter(
        real, logp
    )
