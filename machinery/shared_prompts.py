"""shared_prompts.py: the update's micro-batches with each prompt forwarded once for all the samples
that share it (the same log-probs as one sample a row, at less cost: the tiny preset,
Config.logprobs = "shared").

A GRPO group is k completions of one prompt (the M designs of a query; the agent calls of a script's
N runs that see the same context), and one sample a row forwards that prompt k times. One row [p,
c_1, ..., c_k] instead, with block (tree) attention and position ids that restart for every
completion:

    attend(q, j) = j <= q  and  (seg_j = prompt  or  seg_j = seg_q)
                                              seg: prompt, c_1, ..., c_k, padding
    pos(p[t]) = t,   pos(c_i[t]) = len(p) + t

gives c_i[t] exactly the keys, at exactly the positions, it has in its own row [p, c_i], so its
log-prob and gradient are the same up to float rounding (a masked key weighs exp(-inf) = 0). c_i[0]
is predicted at p's last position, c_i[t] at c_i[t-1]'s; the hidden rows at those positions go
through chunked.head_logprobs: [N] log-probs in row, completion, token order. The mask is 4D bool
[B, 1, T, T], which transformers passes through unchanged (sdpa: True = attend; eager gets 0/-inf),
with position_ids. The mask is dense, so a row's attention costs its length squared whatever it
hides: a row is at most ROW_CAP x the longest sequence of the batch long. A micro-batch in which no
row holds a second completion needs no mask (its block mask is the causal one).

    values = {"adv": [...], "engine": [...]}
    bs = batches(samples, idx, values, pad_id, micro_batch=8)   # as train.batches
    logp = logprobs(model, bs[0])     # [1, N], laid out like bs[0]["mask"]

Needs: machinery/chunked.py
"""

import torch

from machinery import chunked

ROW_CAP = 1.5  # a row at most this x the longest sequence of the batch


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
        return chunked.head_logprobs(model, select, targets, input_ids=input_ids, **chunk)
    mask = shared_prompt_mask(segment)
    # eager attention adds its mask to the scores: True -> 0, False -> -inf (as transformers)
    if impl == "eager":
        mask = torch.zeros(mask.shape, dtype=model.dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(model.dtype).min
        )
    return chunked.head_logprobs(
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


def batches(samples, idx, values, pad_id, micro_batch):
    """train.batches with shared rows: the samples idx in micro-batches of at most micro_batch rows
    and micro_batch x the longest sequence tokens (padded), never more than an unshared micro-batch
    holds. Each batch: the rows' tensors, mask [1, N] and values[name][k] (a sample's per-token
    vectors, or None) laid out [1, N] in the rows' token order, and "order", the samples in that
    order."""
    longest = max(
        (len(samples[k].prompt_ids) + len(samples[k].completion_ids) for k in idx), default=1
    )
    rows = share_rows(samples, idx, int(min(ROW_CAP, micro_batch) * longest))

    def length(r):
        return len(samples[r[0]].prompt_ids) + sum(len(samples[k].completion_ids) for k in r)

    mbs = []
    for r in sorted(rows, key=lambda r: (length(r), r)):  # similar lengths together: little padding
        if (
            mbs
            and len(mbs[-1]) < micro_batch
            and (len(mbs[-1]) + 1) * length(r) <= micro_batch * longest
        ):
            mbs[-1].append(r)
        else:
            mbs.append([r])
    out = []
    for mb in mbs:
        b = shared_prompt_rows(
            [(samples[r[0]].prompt_ids, [samples[k].completion_ids for k in r]) for r in mb], pad_id
        )
        order = []  # the samples, in the row's token order
        for r in mb:
            order += r
        b["mask"] = torch.ones(1, len(b["targets"]))
        b.update(
            {
                n: None if v is None else torch.cat([v[k] for k in order])[None]
                for n, v in values.items()
            }
        )
        out.append({**b, "order": order})
    return out


def logprobs(model, b):
    """The log-probs of batch b's trained tokens, laid out like b["mask"] ([1, N])."""
    return shared_prompt_logprobs(
        model, b["input_ids"], b["segment"], b["position_ids"], b["positions"], b["targets"]
    )[None]
