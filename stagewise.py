"""stagewise.py: which role (Designer, Executor) is trained at RL step t.

Why stagewise co-evolution: the two roles are each other's environment. The Designer's reward
depends on how well the Executor carries out its scripts; the Executor's prompts and reward depend
on which scripts the Designer writes. Updating both at once makes each chase a moving target (a
non-stationary environment), so the default trains one role at a time for `stage_len` steps while
the other is frozen, then swaps:

    active(t) = {first}   if floor(t / stage_len) is even
                {other}   otherwise

first = "executor" by default, as in the authors' released configs (PettingLLMs, config/autoevol:
first_phase_trains: executor): the Executor's first stage trains on the cold start's designs, and
the Designer then learns which structures the trained Executor carries out best. (The paper does not
say which role goes first.)

The ablations: "coupled" trains both roles every step; "designer" / "executor" train one role only.
Samples of the inactive role are dropped before the forward pass (no compute is spent on them).

Usage:
    roles = active_roles(step, mode="stagewise", stage_len=30)   # 0-29 the Executor, 30-59 the
                                                                 # Designer
    if "designer" in roles: ...
    B = step_batch(roles, batch_size=8, executor_batch_size=32)  # 32 on an Executor-only step

Needs: no other file of this project.
"""

import numbers

ROLES = ("designer", "executor")
MODES = ("stagewise", "coupled", "designer", "executor")


def active_roles(step, mode="stagewise", stage_len=30, first="executor"):
    """The frozenset of roles trained at step `step` (steps count from 0)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    if first not in ROLES:
        raise ValueError(f"unknown role {first!r}; allowed: {', '.join(ROLES)}")
    if isinstance(stage_len, bool) or not isinstance(stage_len, numbers.Integral) or stage_len < 1:
        raise ValueError(f"stage_len must be an integer >= 1, got {stage_len!r}")
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    if mode == "coupled":
        return frozenset(ROLES)
    if mode in ROLES:
        return frozenset({mode})
    other = ROLES[1 - ROLES.index(first)]
    return frozenset({first if (step // stage_len) % 2 == 0 else other})


def step_batch(active, batch_size, executor_batch_size=0):
    """B, the queries of a step whose active roles are `active`: executor_batch_size (when > 0) for
    an Executor-only step, whose samples are the N runs of each script rather than M scripts."""
    only_executor = executor_batch_size > 0 and set(active) == {"executor"}
    return executor_batch_size if only_executor else batch_size
