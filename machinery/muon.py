"""muon.py: the SFT cold start's optimizer: Muon on the decoder's weight matrices, AdamW on the
rest.

Muon (Jordan et al. 2024) replaces a matrix's momentum by its nearest orthogonal matrix before the
step, so every direction of the update moves at the same rate:

    B_t = mu B_{t-1} + (1 - mu) G_t                         (momentum, Nesterov-style below)
    W_t = (1 - lr wd) W_{t-1} - lr * 0.2 sqrt(max(rows, cols)) * NS((1 - mu) G_t + mu B_t)

NS is a few Newton-Schulz iterations (newton_schulz), roughly U V^T of the momentum U S V^T; 0.2
sqrt(max(rows, cols)) gives the update AdamW's RMS, so one lr and one schedule serve both optimizers
(make_optimizer puts the embeddings and norm gains on AdamW, as Muon's authors advise).

    opt = make_optimizer(model, "muon", lr=2e-3, weight_decay=0.01)    # or "adamw"
    loss.backward(); opt.step(); opt.zero_grad()

Needs: no other file of this project (torch only).
"""

import math

import torch
from torch.distributed.tensor import DTensor, distribute_tensor


def make_optimizer(model, name, lr, weight_decay):
    """The SFT optimizer: name "adamw" (AdamW on everything) or "muon" (Muon on the decoder's 2-D
    weight matrices, AdamW on the rest).

    Muon (Jordan et al. 2024; the class below) replaces each matrix's momentum by its nearest
    orthogonal matrix, so every direction of the update moves at the same rate, scaled to AdamW's
    update size so that one lr and one schedule serve both. The embedding (tied to the LM head here)
    and the norm gains stay on AdamW, as Muon's authors advise."""

    def adamw(params):
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)

    if name == "adamw":
        return adamw(model.parameters())
    if name != "muon":
        raise ValueError(f"optimizer must be 'adamw' or 'muon', not {name!r}")
    emb = {id(p) for p in model.get_input_embeddings().parameters()}
    emb |= {id(p) for p in model.get_output_embeddings().parameters()}
    matrices = [p for p in model.parameters() if p.ndim == 2 and id(p) not in emb]
    rest = [p for p in model.parameters() if p.ndim != 2 or id(p) in emb]
    return Together([Muon(matrices, lr=lr, weight_decay=weight_decay), adamw(rest)])


# Jordan et al.'s quintic: steepest slope at 0 that still converges
NS_COEFFICIENTS = (
    3.4445,
    -4.7750,
    2.0315,
)


def newton_schulz(G, steps=5, eps=1e-7, dtype=None):
    """Approximately orthogonalise a stack of wide matrices G [k, m, n] (m <= n):

        X_0 = G / ||G||_F,   X_{i+1} = a X_i + (b A + c A A) X_i,   A = X_i X_i^T

    which drives every singular value of X towards ~1 (to within about 0.7..1.2) and keeps the
    singular vectors: roughly U V^T of G = U S V^T. In bf16 on a GPU (as Muon's authors and
    torch.optim.Muon run it), in fp32 on a CPU: a CPU without native bf16 matmuls runs them many
    times slower than fp32, and fp32 gives the same cold start for the same seed whatever the CPU.
    dtype overrides that choice."""
    a, b, c = NS_COEFFICIENTS
    X = G.to(dtype or (torch.bfloat16 if G.is_cuda else torch.float32))
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        A = X @ X.mT
        X = torch.baddbmm(X, torch.baddbmm(A, A, A, beta=b, alpha=c), X, beta=a)
    return X


class Muon(torch.optim.Optimizer):
    """Muon for 2-D weight matrices, written out; the update is torch.optim.Muon's with
    adjust_lr_fn="match_rms_adamw" (Nesterov momentum mu, decoupled weight decay wd), up to the
    rounding of torch's bf16 Newton-Schulz iteration (ours runs in fp32 on a CPU: newton_schulz):

        B_t = mu B_{t-1} + (1 - mu) G_t
        W_t = (1 - lr wd) W_{t-1} - lr * 0.2 sqrt(max(rows, cols)) * NS((1 - mu) G_t + mu B_t)

    (0.2 sqrt(max(rows, cols)) gives the update the RMS of AdamW's, so AdamW's lr carries over.) Two
    things differ from torch.optim.Muon: the Newton-Schulz iterations run batched over all matrices
    of one shape, and under FSDP2 each matrix is gathered whole (full_tensor), every rank
    orthogonalising the same matrix and keeping its own shard, so that N ranks compute what one
    process does (the iteration is not linear, so it cannot run on shards)."""

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, ns_steps=5, eps=1e-7):
        super().__init__(
            params,
            dict(lr=lr, weight_decay=weight_decay, momentum=momentum, ns_steps=ns_steps, eps=eps),
        )

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            mu, stacks = group["momentum"], {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.ndim != 2:
                    shape = tuple(p.grad.shape)
                    raise ValueError(
                        f"Muon takes 2-D matrices only, got a gradient of shape {shape}"
                    )
                state = self.state[p]
                # (setdefault would allocate a zero matrix every step)
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)
                u = p.grad.lerp(buf, mu)
                full = u.full_tensor() if isinstance(u, DTensor) else u
                tall = full.shape[0] > full.shape[1]
                wide = full.T if tall else full
                stacks.setdefault(tuple(wide.shape), []).append((p, u, tall, wide))
            for items in stacks.values():
                X = newton_schulz(
                    torch.stack([w for *_, w in items]), group["ns_steps"], group["eps"]
                )
                for (p, u, tall, _), x in zip(items, X, strict=True):
                    x = (x.T if tall else x).to(p.dtype)
                    # every rank holds the same x: keep its own shard, no traffic
                    if isinstance(u, DTensor):
                        x = distribute_tensor(x, u.device_mesh, u.placements, src_data_rank=None)
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(x, alpha=-group["lr"] * 0.2 * math.sqrt(max(p.shape)))


class Together(torch.optim.Optimizer):
    """Several optimizers stepped as one. Its param_groups are the very group dicts of its members
    (the base class keeps the dicts it is given), so an LR scheduler on this object sets the lr of
    all of them."""

    def __init__(self, optimizers):
        self.optimizers = optimizers
        groups = []
        for o in optimizers:
            groups += o.param_groups
        super().__init__(groups, {})

    def step(self, closure=None):
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state_dict):
        for o, s in zip(self.optimizers, state_dict["optimizers"], strict=True):
            o.load_state_dict(s)
        self.relink()

    def relink(self):
        """Its param_groups the members' own dicts again: a member's load_state_dict (torch's, or
        torch.distributed.checkpoint's set_optimizer_state_dict) gives it new ones, which an LR
        scheduler on this object would no longer reach."""
        self.param_groups = [g for o in self.optimizers for g in o.param_groups]
