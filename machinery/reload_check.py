"""reload_check.py: proof that the engine computes with the trainer's weights, after every weight
sync.

A weight sync can fail without a sound: vLLM logs, and goes on, when a reload leaves weights out; a
fused layer given only part of its weights (q_proj without k_proj) keeps the old rest without a
word; an engine woken from a level-2 sleep without its reload holds garbage. RL then trains on
another policy's samples. Three checks, each stopping the run with a ReloadError that says what went
wrong:

1. vLLM's own reload warnings ("Following weights were not loaded", "<Layer>: Failed to load
   weights") are errors whatever VLLM_LOGGING_LEVEL says (engine.VLLMEngine.load_weights).
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

    gap, S = probe(eng, model, device)               # collective under FSDP: every rank calls it
    check(gap, limit(torch.bfloat16, S), "after the reload of step 10")

Needs: machinery/engine.py (Sampling), machinery/decode.py (what machinery/engine.py needs)
"""

import math

import torch

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
