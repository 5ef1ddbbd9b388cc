"""Both roles learning in one tiny run: the Executor first, 30 steps of 32 queries (256 executions a
step, four times a default step's), then the Designer, 15 steps of 8.

    python train.py config/tiny.py config/both_roles.py

Why: at the cold start the Executor's GRPO gradient points at its exact row (P(oracle reply)) less
directly than the Designer's points at its own (P(suited template)), so the Executor needs more
executions per update at the same lr; the Designer's updates leave the Executor where it was, so the
Designer goes second. The measurements behind this: docs/NOTES.md, "What the Executor's learning
takes".
"""

first_role = "executor"
K = 30
steps = 45
executor_batch_size = 32
out_dir = "out/both-roles"
