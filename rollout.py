"""rollout.py: the bi-level tree rollout of MetaAgent-X.

For each query q of a batch of B tasks the Designer writes M workflow scripts d_1..d_M, and every script that
parses is executed N times e_i1..e_iN by the Executor. Every run gets a reward

    R[q, i, j] = correct(e_ij) + lam * format(e_ij)          (reward.reward; a script that does not
                                                              parse is never run and scores 0 - penalty)

so R is a [B, M, N] tensor: advantage.py turns its rows into the Designer's advantage (per script, over the
M scripts of a query) and the Executor's (per run, over the runs of a query). Unparseable scripts stay in the
Designer's group: they are its failures and must pull its advantage down. Their runs never happened, so
batch.executed [B, M, N] marks the runs that did: the Executor's advantage leaves the others out of its group.

Batching is what makes this fast. The Designer phase is one engine.generate call for all B*M prompts. The
execution phase is ONE sandbox.run_workflows call for all B*M*N runs; each tick, every agent call pending
across all live scripts goes to the executor engine as one generate call. Every completion is seeded from
(seed, step, q, i) or (seed, step, q, i, j, call index), so a seeded rollout does not depend on the order in
which scripts reach their calls. q counts from q_offset: a rank that rolls out queries b..b+B-1 of the global
batch passes q_offset=b and draws exactly what one process rolling out the whole batch would.

What comes out is trajectories as token ids, exactly as the engine generated them (never re-tokenized):
a designer sample is (designer prompt, script completion) for (q, i); an executor sample is one agent call
(call prompt, reply) for (q, i, j). samples_to_tensors packs them for grpo.token_logprobs.

    batch = rollout(tasks, engine, engine, M=4, N=4, step=t)           # shared policy
    batch = rollout(tasks, eng_d, eng_e, M=4, N=4, step=t)             # separate policies, two engines
    batch = rollout(tasks, None, engine, M=1, N=8, template="single")  # fixed structure, no Designer
    batch.R                      # [B, M, N]
    batch.executed               # [B, M, N] bool: the run happened (its script parsed)
    t = samples_to_tensors(batch.executor, pad_id)   # input_ids, attention_mask, completion_mask, logprobs

Needs: engine.py, decode.py, mas.py, sandbox.py, reward.py, data.py
"""

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch

import data
import engine as engine_lib
import mas
import reward as reward_lib
import sandbox


@dataclass
class Sample:
    """One generated sequence to train on: prompt and completion token ids, the engine's log-probs."""
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    index: tuple[int, ...]   # (q, i) for a designer sample, (q, i, j) for an executor sample
    call: int = -1           # executor: the call's index within its run
    finish_reason: str = "stop"


@dataclass
class RunInfo:
    """What happened in one execution e_ij of script d_i for query q."""
    q: int
    i: int
    j: int
    structure: str | None    # mas.structure_of(script); None when the script did not parse
    error: str | None
    n_calls: int
    tokens: int              # executor completion tokens generated for this run
    prompt_tokens: int
    answer: str | None
    reward: float
    run: object = None       # the sandbox.WorkflowRun (None when the script was not executed)


@dataclass
class Batch:
    R: torch.Tensor                    # [B, M, N] rewards
    executed: torch.Tensor             # [B, M, N] bool: the run happened (False: its script did not parse)
    designer: list[Sample]             # one per designer completion (none in fixed-structure mode)
    executor: list[Sample]             # one per agent call, in (q, i, j, call) order
    runs: list[RunInfo]                # B*M*N, in (q, i, j) order
    scripts: list[list[str | None]]    # [B][M] parsed scripts (None: unparseable)
    designer_texts: list[list[str]]    # [B][M] raw designer completions ("" in fixed-structure mode)
    stats: dict = field(default_factory=dict)   # timings, generate calls, token counts

    def run(self, q, i, j) -> RunInfo:
        M, N = self.R.shape[1], self.R.shape[2]
        return self.runs[(q * M + i) * N + j]


def _sample(comp, index, call=-1):
    return Sample(list(comp.prompt_ids), list(comp.token_ids), list(comp.logprobs), index, call,
                  comp.finish_reason)


def executor_generate(eng, sampling, seed_of, records, stats, batched=True):
    """The `generate` callback for sandbox.run_workflows: one engine.generate call per tick.

    seed_of(call) gives each call's seed; every completion is stored in records[(run, index)].
    batched=False sends each call to the engine on its own (the naive baseline of bench.py).
    """
    def generate(calls):
        if not calls:
            return []
        prompts = [c.messages for c in calls]
        samplings = [replace(sampling, n=1, seed=seed_of(c)) for c in calls]
        t0 = time.perf_counter()
        try:
            if batched:
                outs = eng.generate(prompts, samplings)
                stats["generate_calls"] += 1
            else:
                outs = []
                for p, s in zip(prompts, samplings):
                    outs += eng.generate([p], [s])
                    stats["generate_calls"] += 1
        except Exception as e:
            # the sandbox would turn this into failed runs (reward 0); an engine failure is ours, not the
            # model's, so rollout re-raises it after the sandbox has cleaned up
            stats.setdefault("engine_error", e)
            raise
        finally:
            stats["generate_s"] += time.perf_counter() - t0
        comps = [o[0] for o in outs]
        for c, comp in zip(calls, comps):
            records[(c.run, c.index)] = comp
        return comps
    return generate


def _grade(pairs, lam, fail_penalty, workers, dedupe=True):
    """reward.reward for every (task, WorkflowRun). correct() depends only on the task and the graded part of
    the answer (reward.graded_part), and many runs of a step return the same program or answer (the N
    executions of a script, designs with the same template): so each distinct (task, graded part) is graded
    once, keyed by the task object itself (every run of a query holds the same dict), and each run adds its
    own format score and penalty. In threads, since grading waits on sandbox children (hidden tests) and
    grader processes (math_equal), both safe to drive from several threads. dedupe=False grades every run
    on its own (the same rewards; for tests and bench.py)."""
    if not pairs:
        return []
    keys = [(id(task), reward_lib.graded_part(task.get("kind"), getattr(run, "answer", None))) if dedupe else k
            for k, (task, run) in enumerate(pairs)]
    first = {}                          # key -> the first run that has it: that run's answer is graded
    for k, key in enumerate(keys):
        first.setdefault(key, k)
    f = lambda k: reward_lib.correctness(pairs[k][0], getattr(pairs[k][1], "answer", None))
    todo = list(first.values())
    if workers <= 1 or len(todo) == 1:
        correct = [f(k) for k in todo]
    else:
        with ThreadPoolExecutor(min(workers, len(todo))) as ex:
            correct = list(ex.map(f, todo))
    correct = dict(zip(first, correct))
    return [reward_lib.reward(task, run, lam=lam, fail_penalty=fail_penalty, correct=correct[key])
            for (task, run), key in zip(pairs, keys)]


def rollout(queries, designer_engine, executor_engine, M, N, step=0, *, seed=0, template=None,
            designer_sampling=None, executor_sampling=None, short=False, lam=0.4, fail_penalty=0.0,
            limits=None, on_phase: Callable[[str], None] | None = None, batch_calls=True,
            grade_workers=4, q_offset=0) -> Batch:
    """Run the bi-level rollout for a batch of tasks (data.py dicts) and return a Batch.

    template: None (the Designer writes the scripts) or a key of mas.TEMPLATES (fixed structure: every one
      of the M designs is that template; designer_engine is not used and may be None).
    on_phase: called with "designer" before the design phase (not in fixed-structure mode) and "executor"
      before the execution phase (always), so that separate policies sharing one device can swap weights
      (engine.load_weights resets the prefix cache).
    fail_penalty: subtracted from the reward of a run that failed (script error, or script unparseable).
    batch_calls: False sends each agent call on its own (only for measuring what batching buys).
    grade_workers: threads grading runs at once.
    q_offset: the global index of queries[0] in the step's batch (seeds are drawn from global indices).
    """
    B = len(queries)
    designer_sampling = designer_sampling or engine_lib.Sampling(temperature=1.0, max_tokens=1024)
    executor_sampling = executor_sampling or engine_lib.Sampling(temperature=1.0, max_tokens=256)
    stats = {"generate_calls": 0, "designer_generate_calls": 0, "generate_s": 0.0}

    # ---- design phase: one generate call for all B*M designer prompts, one seeded completion each
    t0 = time.perf_counter()
    designer = []
    if template is not None:
        script = mas.TEMPLATES[template]
        texts = [["" for _ in range(M)] for _ in range(B)]
        scripts = [[script for _ in range(M)] for _ in range(B)]
        parse_errors = [[None for _ in range(M)] for _ in range(B)]
    else:
        if on_phase is not None:
            on_phase("designer")
        prompts, samplings = [], []
        for q, task in enumerate(queries):
            msgs = mas.designer_messages(data.task_text(task, short=short), short=short)
            for i in range(M):
                prompts.append(msgs)
                samplings.append(replace(designer_sampling, n=1,
                                         seed=engine_lib.derive_seed(seed, step, q_offset + q, i)))
        outs = designer_engine.generate(prompts, samplings) if prompts else []
        stats["designer_generate_calls"] = 1 if prompts else 0
        texts = [["" for _ in range(M)] for _ in range(B)]
        scripts = [[None for _ in range(M)] for _ in range(B)]
        parse_errors = [[None for _ in range(M)] for _ in range(B)]
        for k, out in enumerate(outs):
            q, i = divmod(k, M)
            comp = out[0]
            if comp.finish_reason == "error":
                parse_errors[q][i] = f"designer generation failed: {comp.error}"
                continue
            designer.append(_sample(comp, (q, i)))
            texts[q][i] = comp.text
            scripts[q][i], parse_errors[q][i] = mas.parse_script(comp.text)
    stats["design_s"] = time.perf_counter() - t0

    # ---- execution phase: every parseable script N times, all B*M*N runs in ONE run_workflows call
    t0 = time.perf_counter()
    run_keys, run_scripts, run_tasks = [], [], []
    for q in range(B):
        for i in range(M):
            if scripts[q][i] is not None:
                for j in range(N):
                    run_keys.append((q, i, j))
                    run_scripts.append(scripts[q][i])
                    run_tasks.append(queries[q])
    records = {}

    def seed_of(call):
        q, i, j = run_keys[call.run]
        return engine_lib.derive_seed(seed, step, q_offset + q, i, j, call.index)

    wf_runs = []
    if on_phase is not None:   # always, so that after a rollout the engine holds the executor's weights
        on_phase("executor")
    if run_keys:
        gen = executor_generate(executor_engine, executor_sampling, seed_of, records, stats, batch_calls)
        wf_runs = sandbox.run_workflows(run_scripts, run_tasks, gen, equal=reward_lib.math_equal, limits=limits,
                                        short=short)
        if "engine_error" in stats:
            e = stats.pop("engine_error")
            raise RuntimeError(f"the executor engine failed during the rollout: {type(e).__name__}: {e}") from e
    stats["execute_s"] = time.perf_counter() - t0

    # ---- rewards
    t0 = time.perf_counter()
    rewards = _grade(list(zip(run_tasks, wf_runs)), lam, fail_penalty, grade_workers)
    stats["grade_s"] = time.perf_counter() - t0

    # ---- assemble: executor samples in (q, i, j, call) order, per-run info, R
    executor, by_run = [], {}
    for (k, idx), comp in sorted(records.items()):
        by_run.setdefault(k, []).append(comp)
        if comp.finish_reason != "error":
            executor.append(_sample(comp, run_keys[k], idx))
    R = torch.zeros(B, M, N)
    executed = torch.zeros(B, M, N, dtype=torch.bool)
    runs = []
    done = {key: k for k, key in enumerate(run_keys)}
    for q in range(B):
        for i in range(M):
            for j in range(N):
                k = done.get((q, i, j))
                if k is None:   # unparseable script: not run, reward 0 - penalty, still in the group
                    r = -fail_penalty
                    runs.append(RunInfo(q, i, j, None, f"unparseable script: {parse_errors[q][i]}", 0, 0, 0,
                                        None, r))
                else:
                    wr, comps = wf_runs[k], by_run.get(k, [])
                    r = float(rewards[k])
                    executed[q, i, j] = True
                    runs.append(RunInfo(q, i, j, mas.structure_of(scripts[q][i]), wr.error, len(wr.calls),
                                        sum(len(c.token_ids) for c in comps),
                                        sum(len(c.prompt_ids) for c in comps), wr.answer, r, wr))
                R[q, i, j] = r
    stats["executor_tokens"] = sum(len(s.completion_ids) for s in executor)
    stats["designer_tokens"] = sum(len(s.completion_ids) for s in designer)
    return Batch(R, executed, designer, executor, runs, scripts, texts, stats)


def samples_to_tensors(samples, pad_id, device=None):
    """Pack samples into right-padded tensors aligned with grpo.token_logprobs ([S, T-1]: position t holds
    the log-prob of token t+1). completion_mask marks the completion tokens (the only ones trained on);
    logprobs holds the engine's log-probs at those positions and 0 elsewhere."""
    S = len(samples)
    T = max((len(s.prompt_ids) + len(s.completion_ids) for s in samples), default=1)
    T = max(T, 2)
    input_ids = torch.full((S, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(S, T, dtype=torch.long)
    completion_mask = torch.zeros(S, T - 1)
    logprobs = torch.zeros(S, T - 1)
    for k, s in enumerate(samples):
        P, L = len(s.prompt_ids), len(s.completion_ids)
        input_ids[k, :P + L] = torch.tensor(s.prompt_ids + s.completion_ids, dtype=torch.long)
        attention_mask[k, :P + L] = 1
        # completion token c sits at position P + c and is predicted at position P + c - 1; with no prompt
        # the first token has no prefix and is not trained on
        skip = 1 if P == 0 else 0
        if L > skip:
            completion_mask[k, P + skip - 1:P + L - 1] = 1
            logprobs[k, P + skip - 1:P + L - 1] = torch.tensor(s.logprobs[skip:L], dtype=torch.float)
    out = {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask,
           "logprobs": logprobs}
    return {k: v.to(device) for k, v in out.items()} if device is not None else out
