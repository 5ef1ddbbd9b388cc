"""offload.py: the idle role's Adam state off the GPU for the other role's stage, back at the
switch.

Stagewise co-evolution over a shared policy keeps one AdamW state per role (train.opt_state): after
the first switch a rank holds two, exp_avg and exp_avg_sq in fp32, 8 B a parameter each, and a
stage reads one of them. Per GPU rank, P parameters over R ranks (FSDP2 shards every state):

    the update, both states on the GPU:   (4 weights + 4 gradients + 8 + 8) B x P / R = 24 P / R
    the idle one in host memory:          (4 + 4 + 8) B x P / R                       = 16 P / R
    host memory a rank (pinned on a GPU): 8 B x P / R, one copy of one state

switch(opts, active), called for each step before it runs, with its active roles
(train.idle_to_host: at the end of the step before, after its checkpoint, and at start-up):
the state of each role not in `active` is copied into host memory and leaves the optimizer, and
each active role's held state is copied back onto its parameters' device, a parameter at a time,
out then in, so that neither the GPU nor the host ever holds more than one state (and a
parameter's); a step that switches nothing moves nothing. A copy is exact: the moments come back
bit for bit, the step count is the same tensor, and the optimizer steps on as if they had never
left (tests/test_offload.py: against a run without the offload, at 1 and 2 gloo ranks, and
through a checkpoint and a resume). During the idle stage `opt.state` holds nothing of that role:
its tensors are in `opt.host_state` ({param: {"step", "exp_avg", "exp_avg_sq"}}).

Under FSDP2 a state tensor is a DTensor: the rank's local shard is copied and the DTensor rebuilt
around the copy with the same spec (mesh, placements), as FSDP2 itself keeps CPU-offloaded
parameters. That is the form torch's distributed checkpoint gathers, one tensor at a time, each
moved to its mesh's device first: rundir.save_checkpoint puts `opt.host_state` back into opt.state
for the length of the save and takes it out again. A resume restores every state onto the GPU, and
train.make_policies' switch for the resumed step puts the idle one back in host memory, before the
engine takes its share. Separate policies: the idle role's model keeps its weights (the engine
reads them), its optimizer's state goes the same way. Coupled: no role is idle, nothing moves.

    from machinery import offload
    offload.switch({"designer": adam_d, "executor": adam_e}, active={"executor"})
    adam_d.state                   # {}: adam_d.host_state holds its moments, in host memory
    offload.switch({"designer": adam_d, "executor": adam_e}, active={"designer"})  # and back

Needs: no other file of this project (torch).
"""

import torch
from torch.distributed.tensor import DTensor


def switch(opts, active):
    """opts: {role: its optimizer}. The state of each role not in `active` is copied into host
    memory and leaves its optimizer; the held state of each role in `active` comes back. One
    parameter's state at a time, out then in: the returning state takes the GPU memory the leaving
    one freed and, the shapes being the same, the pinned blocks torch's host allocator keeps, so
    neither side ever holds more than one state and a parameter's. An optimizer shared with an
    active role (coupled: one state for both) stays."""
    back = {id(opts[r]): opts[r] for r in active if r in opts}
    idle = {id(o): o for r, o in opts.items() if r not in active and id(o) not in back}
    outs, ins = [], []
    for opt in idle.values():
        outs += [(opt, p) for p in opt.state]
    for opt in back.values():
        ins += [(opt, p) for p in getattr(opt, "host_state", {})]
    left_gpu = False
    for k in range(max(len(outs), len(ins))):
        if k < len(outs):
            left_gpu |= _out(*outs[k])
        if k < len(ins):
            _in(*ins[k])
    if left_gpu:  # what it held back to the driver: the engine allocates outside torch's cache
        torch.cuda.empty_cache()


def _out(opt, p):
    """Parameter p's state of opt into opt.host_state, in host memory; True if it was on a GPU."""
    state = opt.state.pop(p)
    if not hasattr(opt, "host_state"):
        opt.host_state = {}
    opt.host_state[p] = {k: _moved(t, torch.device("cpu")) for k, t in state.items()}
    return any(_local(t).is_cuda for t in state.values() if torch.is_tensor(t))


def _in(opt, p):
    """Parameter p's held state back into opt.state, each moment on the parameter's device."""
    state = opt.host_state.pop(p)
    opt.state[p] = {k: _moved(t, _local(p).device) for k, t in state.items()}


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def _moved(t, device):
    """A moment copied onto `device` (into pinned memory when it leaves a GPU: one copy, at the
    copy engine's speed); a DTensor's local shard, rebuilt with its spec. The step count (a 0-dim
    tensor, where AdamW keeps it) and non-tensors stay as they are."""
    if not torch.is_tensor(t) or t.dim() == 0:
        return t
    local = _local(t)
    pin = local.is_cuda and device.type == "cpu"
    out = torch.empty_like(local, device=device, pin_memory=pin)
    out.copy_(local)
    return DTensor(out, t._spec, requires_grad=False) if isinstance(t, DTensor) else out
