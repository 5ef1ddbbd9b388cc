"""Both roles learning in one tiny run: the Executor first, 30 steps of 32 queries (256 executions a step, four
times a default step's), then the Designer, 15 steps of 8.

    python train.py config/tiny.py config/both_roles.py

Why: at the cold start the Executor's GRPO gradient points at its exact row (P(oracle reply)) about six times less
directly than the Designer's points at its own (P(suited template)), so the Executor needs more executions per
update at the same lr; four times the lr instead lost it (docs/NOTES.md, "What the Executor's learning takes").
The Designer's updates leave the Executor where it was (designer-only: P(oracle) +0.1 +- 0.0 over 3 seeds), so
the Designer goes second. Measured from the default's cold start, seed 0, RL - SFT on the 200 held-out tasks:
P(suited template) +7.8 +- 0.6, P(oracle reply) +2.0 +- 0.6 points (paired SE; on one core, whose rounding draws
other samples: +8.0 +- 0.6, +2.2 +- 0.7), both beyond two standard errors, where the default's 40 steps give
+12.3 +- 0.9 and -0.7 +- 0.5. Seeds 1 and 2: P(suited) +7.7 +- 0.4 and +2.5 +- 0.2, P(oracle) +2.7 +- 0.9 and
+3.4 +- 0.8, both rows beyond two standard errors on every seed. It costs about 8 min of RL on 2 CPU cores (30
Executor steps at ~14 s, 15 Designer steps at ~4.7 s; the default's 40 steps: about 3 min), 9 min 45 s with the
table from a saved cold start.
"""

first_role = "executor"
K = 30
steps = 45
executor_batch_size = 32
out_dir = "out/both-roles"
