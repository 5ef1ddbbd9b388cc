"""logprob_rows.py: log pi of the update's samples, the one interface train.update calls: the
samples laid out in rows (micro-batches) and each trained token's log-prob computed, in one of three
ways that give the same numbers (train.rows_for picks one at setup, from Config.logprobs):

    "plain"    Rows(grpo.token_logprobs, ...): one sample a row, the full logits (the reference)
    "chunked"  Rows(chunked_token_logprobs, ...): one sample a row, the lm head a chunk of tokens
               at a time (the Qwen3 presets)
    "shared"   SharedRows: each prompt forwarded once for all the samples that share it (the tiny
               preset), its head through head_logprobs

Each has batches(samples, idx, values), filler(values) and logprobs(model, batch).

The chunked head. Per-token log-probs through the lm head a chunk of tokens at a time, the same
numbers as grpo.token_logprobs without the full-vocabulary logits in memory:

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

Shared-prompt rows. A GRPO group is k completions of one prompt (the M designs of a query; the agent
calls of a script's N runs that see the same context), and one sample a row forwards that prompt k
times. One row [p, c_1, ..., c_k] instead, with block (tree) attention and position ids that restart
for every completion:

    attend(q, j) = j <= q  and  (seg_j = prompt  or  seg_j = seg_q)
                                              seg: prompt, c_1, ..., c_k, padding
    pos(p[t]) = t,   pos(c_i[t]) = len(p) + t

gives c_i[t] exactly the keys, at exactly the positions, it has in its own row [p, c_i], so its
log-prob and gradient are the same up to float rounding (a masked key weighs exp(-inf) = 0). c_i[0]
is predicted at p's last position, c_i[t] at c_i[t-1]'s; the hidden rows at those positions go
through head_logprobs: [N] log-probs in row, completion, token order. The mask is 4D bool
[B, 1, T, T], which transformers passes through unchanged (sdpa: True = attend; eager gets 0/-inf),
with position_ids. The mask is dense, so a row's attention costs its length squared whatever it
hides: a row is at most ROW_CAP x the longest sequence of the batch long. A micro-batch in which no
row holds a second completion needs no mask (its block mask is the causal one).

Usage:
    rows = SharedRows(pad_id, micro_batch=8)        # or Rows(token_logprobs, pack, pad_id, 8)
    bs = rows.batches(samples, idx, {"adv": {k: A_k, ...}, "engine": ...})
    logp = rows.logprobs(model, bs[0])              # [1, N], laid out like bs[0]["mask"]
    logp = chunked_token_logprobs(model, ids, attn)  # [B, T-1], as grpo.token_logprobs

Needs: no other file of this project (torch only).
"""

from types import SimpleNamespace

import torch

CHUNK = 1024  # tokens a chunk
ROW_CAP = 1.5  # a shared row at most this x the longest sequence of the batch


# --------------------------------------------------------------------------------------------------
# the interface: Rows (one sample a row) and SharedRows (each prompt once)


class Rows:
    """One sample a row, the reference layout: micro_batch rows a batch, similar lengths together,
    each packed by pack(samples, pad_id) (rollout.samples_to_tensors: right padding, the completion
    mask [S, T-1]); log pi by token_logprobs(model, input_ids, attention_mask): grpo's, or
    chunked_token_logprobs."""

    def __init__(self, token_logprobs, pack, pad_id, micro_batch):
        self.token_logprobs, self.pack, self.pad_id = token_logprobs, pack, pad_id
        self.micro_batch = micro_batch

    def batches(self, samples, idx, values):
        """The samples idx in micro-batches: each the model's inputs, `mask` [S, T-1] (the trained
        tokens), values[name][k] (sample k's per-token vectors, or None) laid out like it, and
        `order` (its samples, in the mask's token order)."""
        lengths = {k: len(samples[k].prompt_ids) + len(samples[k].completion_ids) for k in idx}
        idx = sorted(idx, key=lambda k: (lengths[k], k))
        out = []
        for i in range(0, len(idx), self.micro_batch):
            order = idx[i : i + self.micro_batch]
            out.append(self.batch([samples[k] for k in order], order, values))
        return out

    def filler(self, values):
        """A row of padding that trains nothing."""
        pad = SimpleNamespace(
            prompt_ids=[self.pad_id], completion_ids=[self.pad_id], logprobs=[0.0]
        )
        return self.batch([pad], [], values)

    def batch(self, samples, order, values):
        """One micro-batch of `samples`, the samples `order` ([]: a filler)."""
        b = self.pack(samples, self.pad_id)
        mask = b["completion_mask"] * bool(order)  # a filler (no order) trains nothing
        out = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"], mask=mask)
        for name, v in values.items():  # v[k] on sample k's trained positions
            out[name] = None if v is None else torch.zeros(mask.shape)
            if v is not None and order:
                out[name] = out[name].masked_scatter(mask.bool(), torch.cat([v[k] for k in order]))
        return {**out, "order": order}

    def logprobs(self, model, b):
        """log pi of batch b's tokens, laid out like b["mask"] ([S, T-1])."""
        return self.token_logprobs(model, b["input_ids"], b["attention_mask"])


class SharedRows:
    """Each prompt forwarded once for its samples, in rows of shared_prompt_rows: batches(),
    filler() and logprobs() as Rows has them."""

    def __init__(self, pad_id, micro_batch):
        self.pad_id, self.micro_batch = pad_id, micro_batch

    def batches(self, samples, idx, values):
        """The samples idx in micro-batches of at most micro_batch rows and micro_batch x the
        longest sequence tokens (padded), never more than an unshared micro-batch holds. Each
        batch: the rows' tensors, mask [1, N] and values[name][k] (a sample's per-token vectors, or
        None) laid out [1, N] in the rows' token order, and "order", the samples in that order."""
        longest = max(
            (len(samples[k].prompt_ids) + len(samples[k].completion_ids) for k in idx), default=1
        )
        rows = share_rows(samples, idx, int(min(ROW_CAP, self.micro_batch) * longest))

        def length(r):
            return len(samples[r[0]].prompt_ids) + sum(len(samples[k].completion_ids) for k in r)

        mbs = []
        for r in sorted(rows, key=lambda r: (length(r), r)):  # similar lengths together
            if (
                mbs
                and len(mbs[-1]) < self.micro_batch
                and (len(mbs[-1]) + 1) * length(r) <= self.micro_batch * longest
            ):
                mbs[-1].append(r)
            else:
                mbs.append([r])
        out = []
        for mb in mbs:
            prompts = [
                (samples[r[0]].prompt_ids, [samples[k].completion_ids for k in r]) for r in mb
            ]
            b = shared_prompt_rows(prompts, self.pad_id)
            order = []  # the samples, in the row's token order
            for r in mb:
                order += r
            b["mask"] = torch.ones(1, len(b["targets"]))
            for n, v in values.items():
                b[n] = None if v is None else torch.cat([v[k] for k in order])[None]
            out.append({**b, "order": order})
        return out

    def filler(self, values):
        """A batch of one padding row that trains nothing (mask and values 0)."""
        b = shared_prompt_rows([([self.pad_id], [[self.pad_id]])], self.pad_id)
        b["mask"] = torch.zeros(1, 1)
        for n, v in values.items():
            b[n] = None if v is None else torch.zeros(1, 1)
        return {**b, "order": []}

    def logprobs(self, model, b):
        """log pi of batch b's trained tokens, laid out like b["mask"] ([1, N])."""
        return shared_prompt_logprobs(
            model, b["input_ids"], b["segment"], b["position_ids"], b["positions"], b["targets"]
        )[None]


# --------------------------------------------------------------------------------------------------
# shared-prompt rows: the layout, the block mask, the forward


def shared_prompt_rows(rows, pad_id):
    """Tensors of packed rows, one per prompt: rows = [(prompt ids, [completion ids, ...]), ...]
    (lists of ints, prompts not empty). Row = [prompt, c_1, ..., c_k], right-padded. segment: 0 on
    the prompt, i on c_i, -1 on padding; position ids restart at len(prompt) for every c_i. targets,
    in row, completion, token order, each predicted at flat position `positions` of [R * T]."""
    T = max(2, max(len(p) + sum(map(len, cs)) for p, cs in rows))
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    seg = torch.full((len(rows), T), -1, dtype=torch.long)
    pos = torch.zeros((len(rows), T), dtype=torch.long)
    positions, targets = [], []
    for r, (prompt, completions) in enumerate(rows):
        P = at = len(prompt)
        ids[r, :P], seg[r, :P], pos[r, :P] = torch.tensor(prompt), 0, torch.arange(P)
        for i, c in enumerate(completions, start=1):
            L = len(c)
            ids[r, at : at + L], seg[r, at : at + L], pos[r, at : at + L] = (
                torch.tensor(c),
                i,
                torch.arange(P, P + L),
            )
            # c[0]: after p
            positions += [r * T + P - 1] * (L > 0) + [r * T + at + t for t in range(L - 1)]
            targets += c
            at += L
    return {
        "input_ids": ids,
        "segment": seg,
        "position_ids": pos,
        "positions": torch.tensor(positions, dtype=torch.long),
        "targets": torch.tensor(targets, dtype=torch.long),
    }


def shared_prompt_mask(segment):
    """[B, 1, T, T] bool, True = attend: causal, and a token sees the prompt (segment 0) and its own
    segment. (Padding, -1, sees the prompt and padding: no query row is empty, so no softmax of
    nothing gives NaN.)"""
    T = segment.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=segment.device).tril()
    return (causal & ((segment[:, None, :] == 0) | (segment[:, None, :] == segment[:, :, None])))[
        :, None
    ]


def shared_prompt_logprobs(model, input_ids, segment, position_ids, positions, targets, **chunk):
    """[N] log-probs of targets [N], each predicted at flat position positions[n] of [B * T], from
    one forward with the block mask of `segment` [B, T] and position ids [B, T] (shared_prompt_rows
    makes them)."""
    impl = model.config._attn_implementation
    if impl not in ("sdpa", "eager"):
        need = "attn_implementation sdpa or eager (a custom 4D mask)"
        raise ValueError(f"shared prompts need {need}, got {impl!r}")
    if set(getattr(model.config, "layer_types", None) or ["full_attention"]) != {"full_attention"}:
        raise ValueError(
            "shared prompts need full attention in every layer (a 4D mask replaces sliding windows)"
        )

    def select(h):
        return h.flatten(0, 1)[positions]

    # no row holds a second completion: the block mask is the causal one
    if int(segment.max()) <= 1:
        return head_logprobs(model, select, targets, input_ids=input_ids, **chunk)
    mask = shared_prompt_mask(segment)
    # eager attention adds its mask to the scores: True -> 0, False -> -inf (as transformers)
    if impl == "eager":
        mask = torch.zeros(mask.shape, dtype=model.dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(model.dtype).min
        )
    return head_logprobs(
        model,
        select,
        targets,
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=position_ids,
        **chunk,
    )


def share_rows(samples, idx, cap):
    """The samples idx grouped by identical prompt, each group cut into rows [k, ...] of at most
    `cap` tokens (the prompt once + the row's completions; a sample longer than cap alone)."""
    groups = {}
    for k in idx:
        groups.setdefault(tuple(samples[k].prompt_ids), []).append(k)
    rows = []
    for ks in groups.values():
        n = cap + 1
        for k in ks:
            L = len(samples[k].completion_ids)
            if n + L > cap:  # a new row: the prompt again
                rows.append([])
                n = len(samples[k].prompt_ids)
            rows[-1].append(k)
            n += L
    return rows


# --------------------------------------------------------------------------------------------------
# the chunked head


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


def chunked_token_logprobs(model, input_ids, attention_mask=None, chunk_size=CHUNK):
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
