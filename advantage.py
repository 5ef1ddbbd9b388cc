"""advantage.py: decomposed credit assignment from the bi-level reward matrix.

For each query q the Designer writes M workflow scripts d_1..d_M, and each script is executed N
times (e_i1..e_iN). Every execution gets a scalar reward R_ij = correct(e_ij) + lambda *
format(e_ij), so a query yields an M x N reward matrix R. Two advantages come out of it, GRPO-style
(group-relative, no critic):

Designer (one advantage per script, judged by how well it does on average across its executions):

    R̄_i  = (1/N) Σ_j R_ij
    Â_D,i = (R̄_i - mean_k R̄_k) / (std_k R̄_k + eps)

Executor (one advantage per execution, shared by every agent call made during that execution),
grouped by query as the paper groups it:

    Â_E,ij = (R_ij - mean_{k,l} R_kl) / (std_{k,l} R_kl + eps)

All M*N executions of a query compete with each other, so an execution that ran under a good script
gets credit for the Designer's choice as well as for its own work (the executor learns "behave like
executions under good designs").

std is unbiased (N-1), torch.std's default, as verl and TRL compute it. One normaliser,
_group_normalize, computes both advantages: over the executed runs of a query (below), and over
every design of a query.

Failed executions (script crashed, timed out, no answer) are not dropped: they keep their reward (0
correct, and λ times the share of their replies that were well formed) and stay in the group, so a
script that often crashes gets a low R̄_i and its designer sample a negative advantage. Degenerate
groups (all rewards equal, a single design M=1, a single sample M*N=1) give zeros, never NaN or inf.

Runs that never happened are another matter. A script that does not parse is never executed: its N
slots of R hold 0, which is right for the Designer (the unparsed script is its failure,
and designer_advantages keeps it), but those slots have no executor samples, so in the executor's
group they would only shift the mean. Three parsed designs whose runs all score 0.4 and one unparsed
design would give every real executor sample (0.4 - 0.3) / std ≈ +0.54 (N=2), although no execution
was better than another. So executor_advantages takes `executed` [..., M, N] (bool): the slots where
it is False are left out of their group's mean and std and get advantage 0 (mean, std and the
constant-group test run over the executed slots):

    Â_E,ij = (R_ij - mean_{executed kl} R_kl) / (std_{executed kl} R_kl + eps)   if e_ij ran
    Â_E,ij = 0                                                                   otherwise

Usage:
    R = torch.tensor(...)                         # [B, M, N] rewards
    a_design = designer_advantages(R)             # [B, M]    -> every token of script d_i
    a_exec = executor_advantages(R)               # [B, M, N] -> each reply token of e_ij's calls
    a_exec = executor_advantages(R, executed=E)   # E [B, M, N] bool: runs that never ran left out
    per_sample(samples, a_design)                 # [S]: each sample's, at its index (q, i) or
                                                  # (q, i, j)

Needs: no other file of this project (torch only).
"""

import torch


def _group_normalize(x, valid, eps):
    """(x - mean) / (std + eps) over the last dim, mean and std over the entries where `valid` is
    True; the others are left out and get 0, and so does a group of one (unbiased std is
    undefined) or a constant group. All valid is the plain case (the designer's groups)."""
    n = valid.sum(dim=-1, keepdim=True)
    # mean over the valid entries
    mean = torch.where(valid, x, 0.0).sum(dim=-1, keepdim=True) / n.clamp(min=1)
    # Exact zeros for constant groups: the rounded mean of e.g. five 0.4s leaves ~1e-8 residues, and
    # dividing those by std (~1e-8) + eps would turn "no signal" into advantages of ~0.05.
    big = torch.finfo(x.dtype).max
    lo = torch.where(valid, x, big).amin(-1, keepdim=True)
    constant = lo == torch.where(valid, x, -big).amax(-1, keepdim=True)
    constant |= n == 0
    centered = torch.where(valid & ~constant, x - mean, 0.0)
    # std = sqrt(Σ (x - mean)² / (n - 1)), unbiased, as x.std()
    std = (centered.square().sum(dim=-1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()
    return torch.where(valid & ~constant & (n > 1), centered / (std + eps), 0.0)


def designer_advantages(rewards, eps=1e-6):
    """rewards [..., M, N] -> designer advantages [..., M]: design i's mean reward, normalised over
    the M."""
    rewards = torch.as_tensor(rewards).float()
    if rewards.dim() < 2:
        raise ValueError(f"rewards must have shape [..., M, N], got {tuple(rewards.shape)}")
    means = rewards.mean(dim=-1)  # R̄_i = (1/N) Σ_j R_ij
    every = torch.ones_like(means, dtype=torch.bool)  # every design is in its query's group
    return _group_normalize(means, every, eps)  # Â_D,i = (R̄_i - mean_k R̄_k) / (std_k R̄_k + eps)


def executor_advantages(rewards, eps=1e-6, executed=None):
    """rewards [..., M, N] -> executor advantages [..., M, N], normalised over the M*N runs of each
    query.

    executed: None (every slot counts) or a bool tensor of R's shape; False slots (runs that never
    happened, e.g. of a script that did not parse) are left out of their group and get advantage
    0."""
    rewards = torch.as_tensor(rewards).float()
    if rewards.dim() < 2:
        raise ValueError(f"rewards must have shape [..., M, N], got {tuple(rewards.shape)}")
    if executed is None:  # every run happened
        executed = torch.ones_like(rewards, dtype=torch.bool)
    executed = torch.as_tensor(executed, dtype=torch.bool, device=rewards.device)
    if executed.shape != rewards.shape:
        raise ValueError(
            f"executed must have the rewards' shape {tuple(rewards.shape)}, "
            f"got {tuple(executed.shape)}"
        )
    x = rewards.reshape(*rewards.shape[:-2], -1)  # a query's M*N runs: one group
    valid = executed.reshape(x.shape)
    # Â_E,ij = (R_ij - mean_executed R) / (std_executed R + eps); 0 where e_ij never ran
    return _group_normalize(x, valid, eps).reshape(rewards.shape)


def per_sample(samples, A):
    """Each sample's advantage [S]: A at its index, (q, i) for a script, (q, i, j) for a call."""
    return torch.tensor([float(A[s.index]) for s in samples])
