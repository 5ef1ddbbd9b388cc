"""speed.py: how the trainer runs its decoder layers: activation checkpointing (full / off),
per-layer torch.compile, FSDP2 sharding. The same numbers come out every way; only time and memory
change.

One decoder layer maps x -> y = layer(x). What its backward needs from the forward is the choice:

    off        autograd keeps every intermediate of the layer          memory ~ all activations, no
               recompute
    full       keep x only; replay the whole layer in the backward     memory ~ x, +1 forward of
               compute

compile=True puts the checkpointed layer function under torch.compile (the checkpoint inside the
compiled region, as torchtitan orders it: checkpoint, then compile, then shard), so inductor fuses
the element-wise ops. All decoder layers share the same code, hence one compiled graph (and one
recompile when the sequence length first changes: dynamic shapes from then on). The FSDP2 hooks stay
outside the compiled region: the layer's `forward` attribute is replaced, not its `__call__`, so no
parameter or state-dict name changes.

shard=True is train.py's FSDP2 layout: fully_shard each decoder layer, then the root (embeddings,
final norm and the tied lm_head in the root group, which grpo.token_logprobs relies on); bf16=True
computes in bf16 with fp32 gradient reduction (the parameters keep their own dtype as master
weights).

Usage (train.load_model and bench.py gpu call exactly this):

    from machinery import speed
    speed.prepare(model, checkpointing="full", compile=True, shard=True, bf16=True)

tests/test_speed.py checks every mode (eager and compiled, with and without FSDP2) against the plain
model: values and gradients. Which mode is fastest within the memory budget is measured by `python
tools/bench.py gpu`.

Needs: no other file of this project (torch, and a Hugging Face-style model with
model.model.layers).
"""

import functools

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

MODES = ("off", "full")


def _full(forward, *args, **kwargs):
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def layer_forward(forward, checkpointing="off", compile=False, backend="inductor"):
    """The replacement for one layer's bound `forward`: checkpointed as `checkpointing` says, then
    compiled."""
    if checkpointing != "off":
        forward = functools.partial(_full, forward)
    return torch.compile(forward, backend=backend) if compile else forward


def prepare(model, checkpointing="off", compile=False, shard=False, bf16=False, backend="inductor"):
    """In place, and returned: every decoder layer of model.model.layers checkpointed and compiled,
    then (shard=True) FSDP2 per layer and at the root. Call it once, after model.to(device)."""
    if checkpointing not in MODES:
        raise ValueError(f"activation checkpointing must be one of {MODES}, got {checkpointing!r}")
    if checkpointing != "off" or compile:
        for layer in model.model.layers:
            layer.forward = layer_forward(layer.forward, checkpointing, compile, backend)
    if shard:
        mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if bf16
            else MixedPrecisionPolicy()
        )
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)  # embeddings, norm and (tied) lm_head in the root group
    return model
