"""grpo.py: per-token log-probabilities (chunked) and the clipped GRPO loss, written out by hand.

1) token_logprobs(model, input_ids, attention_mask, temperature) -> [B, T-1]

       logp_t = log softmax(W h_t / tau)[x_{t+1}] = (W h_t / tau)[x_{t+1}] - logsumexp_v (W h_t / tau)_v

   With Qwen3's ~151k vocabulary the logits are where training memory goes: 16k tokens x 151k x 4 bytes is
   ~10 GB in fp32, and autograd would keep it (and the log-softmax) for the backward. Chunking only the
   forward does not help, because autograd keeps every chunk. So a small autograd.Function computes the
   lm_head + log-softmax + gather `chunk_size` tokens at a time, saves only h, W and the per-token
   logsumexp, and recomputes each chunk's logits in the backward:

       d logp_t / d z_tv = (1[v = x_{t+1}] - softmax(z_t)_v) / tau,   z_t = W h_t
       dL/dh_t = Σ_v g_tv W_v,   dL/dW = Σ_t g_t h_t^T,   g_tv = dL/dlogp_t * d logp_t / d z_tv

   Peak extra memory is one [chunk_size x vocab] fp32 block, forward and backward alike. Logits are computed
   in the weight's dtype and then upcast, exactly like `model(...).logits.float()`, so the result equals the
   naive log_softmax(...).gather(...). Tied embeddings (Qwen3-4B) stay correct because the gradient goes to
   the one Parameter object that both `embed_tokens` and `lm_head` hold.

   FSDP2: fully_shard installs its all-gather/reshard hooks on module __call__, so the model must be called
   through its ROOT module; calling model.model(...) directly would skip the root's hooks and leave the
   embedding/lm_head weights as sharded DTensors. We therefore call the root model (with logits_to_keep=1,
   so it computes the logits of one position only) and do our chunked head inside a forward hook on the
   decoder body (model.get_decoder()), i.e. while the root's forward is running and its parameters
   (embed_tokens, norm, lm_head) are unsharded. FSDP2 never reshards the root after forward (it would be
   all-gathered again immediately for backward), so the weight saved for our backward stays valid, and its
   gradient is reduce-scattered by FSDP's end-of-backward callback like any other root parameter. Wrap
   lm_head in the root's group (the usual `fully_shard(layer)` for each layer, then `fully_shard(model)`);
   tied embeddings require that anyway. tests/test_grpo.py checks values and gradients under fully_shard.

   Two options, off by default (the in-place eager loop above is the reference; tests/test_grpo.py checks
   both, alone and together, against the naive log_softmax in values and gradients, at temperature != 1 and
   with tied embeddings; `python bench.py gpu` measures them against the naive full-logits computation):

   compile=True     the element-wise part of each chunk, written as plain math (chunk_logprobs: upcast,
                    /tau, logsumexp, gather; chunk_grad: g * (onehot - softmax) / tau, cast back), runs
                    under torch.compile: one or two fused kernels that read the [chunk x vocab] logits in the
                    model's dtype, instead of ~8 fp32 passes over them (on a GPU those passes cost about as
                    much as the matmul itself). The matmuls stay cuBLAS.
   keep_logits=True the forward keeps each chunk's logits z = W h (model dtype, 2 bytes/entry in bf16) for
                    the backward instead of recomputing them: 3 matmuls instead of 4, for tokens x vocab x
                    2 bytes of memory (2.5 GB at 8k tokens x 151,936): half of what the naive version keeps
                    (its fp32 log-softmax output), about a sixth of its peak (fp32 logits, that output and
                    two fp32 gradients). The kept logits are the very ones the recompute would give.
                    Only when a gradient is needed; scoring under no_grad keeps nothing.

   Why not Liger's trick of computing the gradient in the forward: it needs dL/dlogp_t, which is one scalar
   for a mean cross-entropy but a per-token weight here (the GRPO loss comes later, and depends on logp
   itself), and dL/dW = Σ_t g_t (onehot_t - softmax_t) h_t^T cannot be formed without it.

2) grpo_loss: the clipped surrogate, token-mean over all unmasked tokens of the (global) batch

       rho_t = exp(logp_t - logp_old_t)
       l_t   = -min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps_high) A_t) * w_t  +  beta * KL_t
       KL_t  = exp(logp_ref_t - logp_t) - (logp_ref_t - logp_t) - 1          (k3, unbiased, >= 0)
       w_t   = min(exp(logp_old_t - logp_engine_t), cap)  (detached; truncated IS, only if engine logprobs
               are given: corrects for the gap between the engine that sampled and the trainer)
       L     = Σ_t mask_t l_t / num_tokens
   (log rho and log(ref/pi) are clamped to ±20 before exp, as verl does, so a stale log-prob cannot give inf.)

   num_tokens defaults to this call's mask.sum(). Pass the token count of the whole batch instead and the
   micro-batch losses (and gradients) sum to exactly the one-batch loss. Under DDP/FSDP, which average
   gradients over ranks, pass num_tokens = global_count / world_size. The training loop takes one such
   token-mean per role and adds them with weights, so thousands of executor tokens do not drown a few
   hundred designer tokens.

3) shared_prompt_rows + shared_prompt_logprobs: each prompt forwarded once for all the samples that share it

   A GRPO group is k completions of one prompt (the M designs of a query; the agent calls of a script's N runs
   that see the same context), and one sample a row forwards that prompt k times. One row [p, c_1, ..., c_k]
   instead, with block (tree) attention and position ids that restart for every completion:

       attend(q, j) = j <= q  and  (seg_j = prompt  or  seg_j = seg_q)      seg: prompt, c_1, ..., c_k, pad
       pos(p[t]) = t,   pos(c_i[t]) = len(p) + t

   gives c_i[t] exactly the keys, at exactly the positions, it has in its own row [p, c_i], so its log-prob
   and gradient are the same up to float rounding (a masked key weighs exp(-inf) = 0). c_i[0] is predicted at
   p's last position, c_i[t] at c_i[t-1]'s; the hidden rows at those positions go through the same chunked
   head (it works on [N, H] rows and [N] targets): [N] log-probs in row, completion, token order. The mask
   (shared_prompt_mask, made on the model's device from the segment ids) is 4D bool [B, 1, T, T], which
   transformers passes through unchanged (sdpa: True = attend; eager gets 0/-inf), with position_ids; the call
   is the root call of 1), so FSDP2 works the same. The price: the mask is dense,
   so a row's attention costs T_row^2 whatever it hides; train.py caps a row's length (share_row_cap).
   A micro-batch in which no row holds a second completion needs no mask (its block mask is the causal one),
   and neither does right padding in token_logprobs (a real token's past holds none): both then run without
   one, i.e. sdpa's is_causal kernel (on a GPU the flash kernel; on a CPU about 10% faster at T ~ 400; the same
   numbers, bit for bit, on this CPU).

Usage:
    logp = token_logprobs(model, ids, attn, temperature=1.0)                 # [B, T-1]
    logp = token_logprobs(model, ids, attn, compile=True, keep_logits=True)  # the same, faster on a GPU
    loss, stats = grpo_loss(logp, old_logp, adv, loss_mask[:, 1:], num_tokens=n_total)
    loss.backward()
    b = shared_prompt_rows([(prompt, [c1, c2, c3])], pad_id)                  # one row for three samples
    logp = shared_prompt_logprobs(model, b["input_ids"], b["segment"], b["position_ids"], b["positions"],
                                  b["targets"])                              # [N]: c1, c2, c3's tokens
    loss, stats = grpo_loss(logp[None], old[None], adv_per_token[None], torch.ones(1, N))

Needs: no other file of this project (torch only).
"""

import functools

import torch


def chunk_logprobs(z, targets, temperature):
    """(logp [n], lse [n]) of one chunk from its logits z [n, V]: the compile=True element-wise part."""
    z = z.to(torch.promote_types(z.dtype, torch.float32)) / temperature
    lse = torch.logsumexp(z, dim=-1)
    return z.gather(-1, targets[:, None]).squeeze(-1) - lse, lse


def chunk_grad(z, lse, targets, grad_out, temperature):
    """dL/dz [n, V] in z's dtype, g * (onehot(target) - softmax(z / tau)) / tau: the compile=True backward part."""
    p = torch.exp(z.to(lse.dtype) / temperature - lse[:, None])
    onehot = (torch.arange(z.shape[-1], device=z.device) == targets[:, None]).to(lse.dtype)
    return (grad_out[:, None].to(lse.dtype) * (onehot - p) / temperature).to(z.dtype)


@functools.cache
def _compiled(backend):
    return torch.compile(chunk_logprobs, backend=backend), torch.compile(chunk_grad, backend=backend)


class _ChunkedLogprob(torch.autograd.Function):
    """log_softmax(h @ W.T / tau).gather(targets), chunk by chunk, recomputed (or kept) for the backward.
    fused: None (the in-place eager reference) or the compiled (chunk_logprobs, chunk_grad)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk_size, fused, keep_logits):
        acc = torch.promote_types(hidden.dtype, torch.float32)  # bf16 -> fp32; fp64 stays (gradcheck)
        out = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)
        lse = torch.empty_like(out)
        kept = []
        for s in range(0, hidden.shape[0], chunk_size):
            z = hidden[s : s + chunk_size] @ weight.T
            if keep_logits:
                kept.append(z)
            if fused is not None:
                out[s : s + chunk_size], lse[s : s + chunk_size] = fused[0](z, targets[s : s + chunk_size], temperature)
                continue
            # In-place ops keep a single [chunk x vocab] buffer alive (logsumexp would allocate two more).
            z = z.to(acc, copy=keep_logits).div_(temperature)
            out[s : s + chunk_size] = z.gather(-1, targets[s : s + chunk_size, None]).squeeze(-1)
            zmax = z.amax(dim=-1, keepdim=True)
            lse[s : s + chunk_size] = z.sub_(zmax).exp_().sum(dim=-1).log_().add_(zmax.squeeze(-1))
        if fused is None:
            out -= lse
        ctx.save_for_backward(hidden, weight, targets, lse, *kept)
        ctx.temperature, ctx.chunk_size, ctx.fused = temperature, chunk_size, fused
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, targets, lse, *kept = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        # Accumulated in the weight's dtype, as Liger's fused linear cross-entropy does (fp32 when W is fp32).
        grad_w = torch.zeros_like(weight) if need_w else None
        for i, s in enumerate(range(0, hidden.shape[0], ctx.chunk_size)):
            h, t = hidden[s : s + ctx.chunk_size], targets[s : s + ctx.chunk_size]
            z = kept[i] if kept else h @ weight.T
            if ctx.fused is not None:
                g = ctx.fused[1](z, lse[s : s + ctx.chunk_size], t, grad_out[s : s + ctx.chunk_size], ctx.temperature)
            else:
                g_out = grad_out[s : s + ctx.chunk_size, None].to(lse.dtype)
                z = z.to(lse.dtype, copy=bool(kept)).div_(ctx.temperature)   # a kept chunk is never overwritten
                g = z.sub_(lse[s : s + ctx.chunk_size, None]).exp_().mul_(-g_out)  # -g * softmax, in place
                g.scatter_add_(-1, t[:, None], g_out)  # + g * onehot
                g = g.div_(ctx.temperature).to(weight.dtype)
            if need_h:
                grad_h[s : s + ctx.chunk_size] = g @ weight
            if need_w:
                grad_w.addmm_(g.T, h)
        return grad_h, grad_w, None, None, None, None, None


def chunked_logprobs(hidden, weight, targets, temperature=1.0, chunk_size=1024, compile=False, keep_logits=False):
    """Log-probs [N] of targets [N] under softmax(hidden [N, H] @ weight[V, H].T / temperature).
    compile: False, True (inductor) or a torch.compile backend name; keep_logits: see the module docstring."""
    fused = _compiled("inductor" if compile is True else compile) if compile else None
    keep = bool(keep_logits) and torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _ChunkedLogprob.apply(hidden, weight, targets, float(temperature), int(chunk_size), fused, keep)


def _head_logprobs(model, select, targets, temperature, chunk_size, compile, keep_logits, **inputs):
    """Log-probs [N] of targets [N] under the model's head at the hidden rows select(h [B, T, H]) -> [N, H],
    for one root forward of model(**inputs) (FSDP2: see the module docstring)."""
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("token_logprobs supports an lm_head without bias (as in Qwen3)")
    result = {}

    def hook(module, args, output):
        # Runs inside the root forward (FSDP2 root params are unsharded here); only real targets are scored.
        result["logp"] = chunked_logprobs(select(output[0]), head.weight, targets, temperature, chunk_size, compile,
                                          keep_logits)

    handle = model.get_decoder().register_forward_hook(hook)
    try:
        model(**inputs, use_cache=False, logits_to_keep=1)
    finally:
        handle.remove()
    return result["logp"]


def token_logprobs(model, input_ids, attention_mask, temperature=1.0, chunk_size=1024, compile=False,
                   keep_logits=False):
    """[B, T-1] fp32 (fp64 for an fp64 model) log-probs of input_ids[:, 1:]; 0 where the target is padding."""
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    targets_mask = attention_mask[:, 1:].bool()
    # Right padding only: a real token's causal past holds no padding, so the causal attention needs no mask
    # (sdpa's is_causal kernels may skip the blocks above the diagonal; with a mask they compute all of them).
    right_padded = bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())
    logp = _head_logprobs(model, lambda h: h[:, :-1][targets_mask], input_ids[:, 1:][targets_mask], temperature,
                          chunk_size, compile, keep_logits, input_ids=input_ids,
                          attention_mask=None if right_padded else attention_mask)
    out = torch.zeros(targets_mask.shape, dtype=logp.dtype, device=input_ids.device)
    return out.masked_scatter(targets_mask, logp)


def shared_prompt_rows(rows, pad_id):
    """Tensors of packed rows, one per prompt: rows = [(prompt ids, [completion ids, ...]), ...] (lists of ints).

    Row = [prompt, c_1, ..., c_k], right-padded. segment: 0 on the prompt, i on c_i, -1 on padding (the
    attention follows from it: shared_prompt_mask); position ids restart at len(prompt) for every c_i. Targets,
    in row, completion, token order: c_i[0] predicted at the prompt's last position, c_i[t] at c_i[t-1]'s (with
    an empty prompt c_i[0] has no predictor and is left out, as rollout.samples_to_tensors does). positions:
    their flat indices into [R * T]."""
    T = max(2, max(len(p) + sum(map(len, cs)) for p, cs in rows))
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    seg = torch.full((len(rows), T), -1, dtype=torch.long)
    pos = torch.zeros((len(rows), T), dtype=torch.long)
    positions, targets = [], []
    for r, (prompt, completions) in enumerate(rows):
        P, at = len(prompt), len(prompt)
        ids[r, :P], seg[r, :P], pos[r, :P] = torch.tensor(prompt, dtype=torch.long), 0, torch.arange(P)
        for i, c in enumerate(completions, start=1):
            L = len(c)
            ids[r, at:at + L], seg[r, at:at + L], pos[r, at:at + L] = torch.tensor(c, dtype=torch.long), i, \
                torch.arange(P, P + L)
            pred = [at - 1 + t for t in range(L)]   # c[t] is predicted at the position before it...
            if L:
                pred[0] = P - 1                     # ...and c[0] at the prompt's last position
            skip = 1 if P == 0 else 0
            positions += [r * T + p for p in pred[skip:]]
            targets += c[skip:]
            at += L
    return {"input_ids": ids, "segment": seg, "position_ids": pos,
            "positions": torch.tensor(positions, dtype=torch.long), "targets": torch.tensor(targets, dtype=torch.long)}


def shared_prompt_mask(segment):
    """[B, 1, T, T] bool, True = attend: causal, and a token sees the prompt (segment 0) and its own segment.
    (Padding, -1, sees the prompt and padding: no query row is empty, so no softmax of nothing gives NaN.)"""
    T = segment.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=segment.device).tril()
    return (causal & ((segment[:, None, :] == 0) | (segment[:, None, :] == segment[:, :, None])))[:, None]


def shared_prompt_logprobs(model, input_ids, segment, position_ids, positions, targets, temperature=1.0,
                           chunk_size=1024, compile=False, keep_logits=False):
    """[N] log-probs of targets [N], each predicted at flat position positions[n] of [B * T], from one forward
    with the block mask of `segment` [B, T] and position ids [B, T] (shared_prompt_rows makes them)."""
    impl = model.config._attn_implementation
    if impl not in ("sdpa", "eager"):
        raise ValueError(f"shared prompts need attn_implementation sdpa or eager (a custom 4D mask), got {impl!r}")
    if set(getattr(model.config, "layer_types", None) or ["full_attention"]) != {"full_attention"}:
        raise ValueError("shared prompts need full attention in every layer (a 4D mask replaces sliding windows)")
    select = lambda h: h.flatten(0, 1)[positions]
    if int(segment.max()) <= 1:   # no row holds a second completion: the block mask is the causal one
        return _head_logprobs(model, select, targets, temperature, chunk_size, compile, keep_logits,
                              input_ids=input_ids)
    attention_mask = shared_prompt_mask(segment)
    if impl == "eager":   # eager attention adds its mask to the scores: True -> 0, False -> -inf (as transformers)
        attention_mask = torch.zeros(attention_mask.shape, dtype=model.dtype, device=attention_mask.device) \
            .masked_fill_(~attention_mask, torch.finfo(model.dtype).min)
    return _head_logprobs(model, select, targets, temperature, chunk_size, compile, keep_logits, input_ids=input_ids,
                          attention_mask=attention_mask, position_ids=position_ids)


def grpo_loss(logprobs, old_logprobs, advantages, mask, clip_eps=0.2, clip_eps_high=None, kl_coef=0.0,
              ref_logprobs=None, num_tokens=None, engine_logprobs=None, is_cap=2.0):
    """Clipped GRPO surrogate (+ optional k3 KL, optional truncated IS), token-mean. Returns (loss, stats).

    logprobs, old_logprobs, mask (and ref/engine logprobs): [B, T]; advantages: [B] (per sequence) or [B, T].
    old_logprobs=None means on-policy (the detached current log-probs: rho = 1, gradient = A * grad logp).
    Masked positions must hold finite values (token_logprobs gives 0 there): 0 * inf is NaN.
    """
    mask = mask.to(logprobs.dtype)
    old = logprobs.detach() if old_logprobs is None else old_logprobs
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp((logprobs - old).clamp(-20.0, 20.0))  # overflow guard, as verl; inactive in sane runs
    surr = ratio * adv
    surr_clipped = torch.clamp(ratio, 1 - clip_eps, 1 + eps_high) * adv
    per_token = -torch.minimum(surr, surr_clipped)
    if engine_logprobs is not None:
        is_weight = torch.exp(old - engine_logprobs).clamp(max=is_cap).detach()
        per_token = per_token * is_weight
    if ref_logprobs is not None:
        log_r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)  # same guard
        kl = torch.exp(log_r) - log_r - 1
        per_token = per_token + kl_coef * kl
    local = mask.sum()
    denom = local.clamp(min=1) if num_tokens is None else num_tokens
    loss = (per_token * mask).sum() / denom

    with torch.no_grad():
        n = local.clamp(min=1)
        mean = lambda x: ((x * mask).sum() / n).item()
        stats = {"tokens": int(local.item()), "ratio_mean": mean(ratio),
                 "clip_frac": mean((surr_clipped < surr).float()),
                 "kl": mean(kl) if ref_logprobs is not None else 0.0}
        if engine_logprobs is not None:
            stats["is_weight_mean"] = mean(is_weight)
    return loss, stats
