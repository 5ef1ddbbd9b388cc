"""rollout.py: the bi-level tree rollout of MetaAgent-X.

For each query q of a batch of B tasks the Designer writes M workflow scripts d_1..d_M, and every
script that parses is executed N times e_i1..e_iN by the Executor. Every run gets a reward

    R[q, i, j] = correct(e_ij) + lam * format(e_ij)      (reward.reward; a script that does not
                                                          parse is never run and scores 0)

so R is a [B, M, N] tensor: advantage.py turns it into the Designer's advantage (per script, over
the M scripts of a query) and the Executor's (per run, over the runs of a query). Unparseable
scripts stay in the Designer's group: they are its failures and must pull its advantage down. Their
runs never happened, so batch.executed [B, M, N] marks the runs that did: the Executor's advantage
leaves the others out of its group.

rollout() is four phases, a function each, called in order:

    design    M scripts a query: ONE engine.generate call for all B*M designer prompts
    execute   N runs a parsed script: ONE sandbox.run_workflows call for all B*M*N runs, their
              agent calls reaching the engine on the schedule's terms:
                ticks       when every live script waits on a call, all their calls at once,
                            answered when the longest reply ends (the reference)
                continuous  each call submitted as its script makes it, each script answered as
                            its call's samples end, programs running while others decode
    grade     R = correct + lam * format a run (reward.reward), each distinct answer graded once
    assemble  the samples, one RunInfo a run, R and executed [B, M, N]: the Batch

Batching is what makes this fast. Every completion is seeded from (seed, step, q, i) or (seed,
step, q, i, j, call index), so a seeded rollout does not depend on the order in which scripts reach
their calls, nor, on an engine whose completions do not depend on their batch (transformers), on
the schedule. q counts from q_offset: a rank that rolls out queries b..b+B-1 of the global batch
passes q_offset=b and draws exactly what one process rolling out the whole batch would.

What comes out is trajectories as token ids, exactly as the engine generated them (never
re-tokenized): a designer sample is (designer prompt, script completion) for (q, i); an executor
sample is one agent call (call prompt, reply) for (q, i, j). samples_to_tensors packs them for
grpo.token_logprobs.

    batch = rollout(tasks, engine, engine, M=4, N=4, step=t, lam=cfg.lam)  # shared policy
    batch = rollout(tasks, d, e, M=4, N=4, step=t, lam=cfg.lam)  # separate: two engines, or views
    batch = rollout(tasks, None, engine, 1, 8, template="single", lam=0)  # fixed structure; R is
                                                                          # the correctness
    batch.R, batch.executed   # [B, M, N] rewards; True where the run happened (its script parsed)
    t = samples_to_tensors(batch.executor, pad_id)   # input_ids, attention_mask, completion_mask,
                                                     # logprobs

Needs: machinery/data.py, machinery/engine.py, mas.py, reward.py, sandbox.py, machinery/decode.py,
machinery/isolation.py, machinery/confine.py, machinery/programs.py, machinery/grader.py"""

import contextlib
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial

import torch

import mas
import reward as reward_lib
import sandbox
from machinery import data, programs
from machinery import engine as engine_lib


@dataclass
class Sample:
    """One generated sequence to train on: prompt and completion token ids, the engine's
    log-probs."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    index: tuple[int, ...]  # (q, i) for a designer sample, (q, i, j) for an executor sample
    call: int = -1  # executor: the call's index within its run


@dataclass
class RunInfo:
    """What happened in one execution e_ij of script d_i for query q."""

    q: int
    i: int
    j: int
    structure: str | None  # mas.structure_of(script); None when the script did not parse
    error: str | None
    n_calls: int
    tokens: int  # executor completion tokens generated for this run
    answer: str | None
    correct: float
    format: float
    reward: float  # correct + lam * format
    run: object = None  # the sandbox.WorkflowRun (None when the script was not executed)


@dataclass
class Batch:
    R: torch.Tensor  # [B, M, N] rewards
    executed: torch.Tensor  # [B, M, N] bool: the run happened (its script parsed)
    designer: list[Sample]  # one per designer completion (none in fixed-structure mode)
    executor: list[Sample]  # one per agent call, in (q, i, j, call) order
    runs: list[RunInfo]  # B*M*N, in (q, i, j) order
    scripts: list[list[str | None]]  # [B][M] parsed scripts (None: unparseable)
    designer_texts: list[list[str]]  # [B][M] raw designer completions ("" with a template)
    stats: dict = field(default_factory=dict)  # timings, generate calls, token counts

    def run(self, q, i, j) -> RunInfo:
        M, N = self.R.shape[1], self.R.shape[2]
        return self.runs[(q * M + i) * N + j]

    def records(self, queries):
        """Per-run facts as plain values (small enough to gather over ranks): what train.py logs of
        a run (repairs, copies: mas.repairs of its calls)."""
        return [
            {
                **dict(zip(("repairs", "copies"), mas.repairs(r.run.calls if r.run else []))),
                "reward": r.reward,
                "correct": r.correct == 1.0,
                "format": r.format,
                "calls": r.n_calls,
                "structure": r.structure or "unparsed",
                "error": r.error is not None,
                "parsed": r.structure is not None,
                "tokens": r.tokens,
                "kind": queries[r.q]["kind"],
            }
            for r in self.runs
        ]

    def tree(self, queries, A_D, A_E, step, role, short=False):
        """The step's tree, one plain dict per query (a line of out_dir/rollouts.jsonl;
        tools/show.py draws it):

            {step, role, query, task: {id, kind, text, gold}, R: [M][N],
             scripts: [{text, parsed, error, structure, A_D,
                        runs: [{calls: [{role, prompt, reply}],
                                answer, correct, format, R, A_E, error}]}]}

        queries: the batch's, or its first few (those are recorded); task.text is what the Designer
        was shown; A_E is None for a run that did not happen."""
        _, M, N = self.R.shape
        out = []
        for q, t in enumerate(queries):
            scripts = []
            for i in range(M):
                runs = [self.run(q, i, j) for j in range(N)]
                parsed = self.scripts[q][i] is not None
                records = []
                for j, r in enumerate(runs):  # A_E None: the run did not happen
                    a_e = float(A_E[q, i, j]) if self.executed[q, i, j] else None
                    records.append(_run_record(r, a_e))
                script = {
                    "text": self.designer_texts[q][i] or self.scripts[q][i] or "",
                    "parsed": parsed,
                    "error": None if parsed else runs[0].error,
                    "A_D": float(A_D[q, i]),
                    "structure": runs[0].structure,  # None when the script did not parse
                    "runs": records,
                }
                scripts.append(script)
            text = data.task_text(t, short=short)
            out.append(
                {
                    "step": step,
                    "role": role,
                    "query": q,
                    "R": self.R[q].tolist(),
                    "scripts": scripts,
                    "task": {
                        "id": t.get("id"),
                        "kind": t.get("kind"),
                        "text": text,
                        "gold": t.get("answer") or t.get("tests"),
                    },
                }
            )
        return out


def _run_record(r, a_e):
    """One run of a step's tree: its calls (role, prompt, reply), answer, grades, R and A_E."""
    calls = r.run.calls if r.run is not None else []
    return {
        "calls": [{"role": c.role, "prompt": c.messages, "reply": c.reply} for c in calls],
        "answer": r.answer,
        "correct": r.correct,
        "format": r.format,
        "R": r.reward,
        "error": r.error,
        "A_E": a_e,
    }


def _sample(comp, index, call=-1):
    return Sample(list(comp.prompt_ids), list(comp.token_ids), list(comp.logprobs), index, call)


def rollout(
    queries,
    designer_engine,
    executor_engine,
    M,
    N,
    step=0,
    *,
    lam,
    format_reward="paper",
    seed=0,
    template=None,
    designer_sampling=None,
    executor_sampling=None,
    short=False,
    q_offset=0,
    schedule="ticks",
    limits=None,
    grading=None,
) -> Batch:
    """The bi-level rollout of a batch of tasks (machinery/data.py's dicts): the four phases below,
    in order.

    lam: λ in R = correct + λ·format (settings.Config.lam in training; 0 makes R the correctness).
    format_reward: "paper" (λ·format) or "authors" (their term, reward.py; settings.Config's).
    template: None (the Designer writes the scripts) or a key of mas.TEMPLATES (a fixed structure:
      every one of the M designs is that template; designer_engine is not used and may be None).
    designer_engine, executor_engine: anything with engine.py's generate; separate policies that
      share one engine pass each role's view of it (machinery/weights.py: it holds that role's
      weights when it generates).
    q_offset: the global index of queries[0] in the step's batch (seeds follow global indices).
    schedule: how the Executor's agent calls reach the engine (sandbox.run_workflows): "ticks" or
      "continuous" (settings.Config.rollout_schedule). limits: a run's mas.Limits (None: the
      defaults); grading: reward.correctness's budget and math_timeout (None: the defaults), the
      latter also vote()'s."""
    seed_of = partial(_seed, seed, step, q_offset)
    stats = {"generate_calls": 0, "generate_s": 0.0}
    failed_before = Counter(programs.failures)
    with _timed(stats, "design_s"):
        designs = design(queries, designer_engine, M, template, designer_sampling, short, seed_of)
    with _timed(stats, "execute_s"):
        ran = execute(
            queries,
            designs.scripts,
            executor_engine,
            N,
            executor_sampling,
            short,
            seed_of,
            stats,
            schedule,
            limits,
            grading or {},
        )
    with _timed(stats, "grade_s"):
        graded = grade(queries, ran, lam, grading or {}, format_reward)
    stats["sandbox_failures"] = dict(programs.failures - failed_before)
    return assemble(len(queries), M, N, designs, ran, graded, stats)


def config_kwargs(cfg):
    """rollout()'s limits and grading as a Config sets them (train.rl_step and the held-out curves
    pass them on, with the rest of their settings by name)."""
    grading = dict(budget=cfg.grade_budget, math_timeout=cfg.math_timeout)
    return dict(limits=mas.Limits(**cfg.sandbox), grading=grading)


def _seed(seed, step, q_offset, q, *rest):
    """The seed of a completion for query q of this call, (q, i) or (q, i, j, call): derived from
    (seed, step, q's global index, *rest)."""
    return engine_lib.derive_seed(seed, step, q_offset + q, *rest)


@contextlib.contextmanager
def _timed(stats, key):
    """stats[key]: the seconds the block took."""
    t0 = time.perf_counter()
    yield
    stats[key] = time.perf_counter() - t0


# --------------------------------------------------------------------------------------------------
# Phase 1: design


@dataclass
class Designs:
    """What the Designer wrote, [B][M] each: its completion texts ("" with a template), the scripts
    (None: unparseable) and why not; and its samples, in (q, i) order."""

    samples: list[Sample]
    texts: list[list[str]]
    scripts: list[list[str | None]]
    errors: list[list[str | None]]


def design(queries, engine, M, template, sampling, short, seed_of) -> Designs:
    """M scripts a query. With a template, every one is the template and nothing is generated; else
    ONE generate call for all B*M designer prompts, completion (q, i) seeded from seed_of(q, i) and
    parsed by mas.parse_script."""
    B = len(queries)
    fixed = mas.TEMPLATES[template] if template else None
    d = Designs(
        samples=[],
        texts=[[""] * M for _ in range(B)],
        scripts=[[fixed] * M for _ in range(B)],
        errors=[[None] * M for _ in range(B)],
    )
    if template is not None or B == 0:
        return d
    sampling = sampling or engine_lib.Sampling(max_tokens=1024)
    prompts = [mas.designer_messages(data.task_text(t, short=short), short=short) for t in queries]
    slots = list(itertools.product(range(B), range(M)))  # completion (q, i) at q * M + i
    samplings = [replace(sampling, seed=seed_of(q, i)) for q, i in slots]
    outs = engine.generate([prompts[q] for q, _ in slots], samplings)
    for (q, i), out in zip(slots, outs):
        comp = out[0]
        if comp.finish_reason == "error":
            d.errors[q][i] = f"designer generation failed: {comp.error}"
            continue
        d.samples.append(_sample(comp, (q, i)))
        d.texts[q][i] = comp.text
        d.scripts[q][i], d.errors[q][i] = mas.parse_script(comp.text)
    return d


# --------------------------------------------------------------------------------------------------
# Phase 2: execute


@dataclass
class Execution:
    """The runs (q, i, j) that happened, in (q, i, j) order; their sandbox.WorkflowRuns; the
    engine's completion of every agent call handed to a run, by (run, call)."""

    keys: list[tuple[int, int, int]]
    runs: list
    completions: dict


def execute(
    queries, scripts, engine, N, sampling, short, seed_of, stats, schedule, limits, grading
) -> Execution:
    """Every parsed script N times: all B*M*N runs in ONE sandbox.run_workflows call, their agent
    calls submitted to the engine on the schedule's terms (ticks: one batch a tick; continuous:
    each as it is made); agent call c of run (q, i, j) seeded from seed_of(q, i, j, c). An engine
    failure is raised, not scored."""
    keys = []
    for q, row in enumerate(scripts):
        for i, script in enumerate(row):
            if script is not None:
                keys += [(q, i, j) for j in range(N)]
    ran = Execution(keys, [], {})
    if not keys:
        return ran
    sampling = sampling or engine_lib.Sampling()
    calls = ExecutorCalls(engine, sampling, keys, seed_of, stats)
    ran.runs = sandbox.run_workflows(
        [scripts[q][i] for q, i, _ in keys],
        [queries[q] for q, _, _ in keys],
        calls,
        equal=partial(reward_lib.math_equal, timeout=grading.get("math_timeout", 5.0)),
        limits=limits,
        short=short,
        schedule=schedule,
    )
    for k, run in enumerate(ran.runs):  # the calls handed to each run (a killed run's: not)
        ran.completions.update(((k, c.index), c.completion) for c in run.calls)
    if "engine_error" in stats:
        e = stats.pop("engine_error")
        raise RuntimeError(
            f"the executor engine failed in the rollout: {type(e).__name__}: {e}"
        ) from e
    return ran


class ExecutorCalls:
    """The Executor's side of the sandbox's agent calls (sandbox.run_workflows takes it as its
    engine): call c of run k = (q, i, j) is submitted to the engine seeded from seed_of(q, i, j, c)
    and its completion handed to the sandbox as it comes back."""

    def __init__(self, eng, sampling, keys, seed_of, stats):
        self.eng, self.sampling, self.keys, self.seed_of = eng, sampling, keys, seed_of
        self.stats, self.calls = stats, {}
        self.tag = object()  # this rollout's requests: an earlier one's left in the engine differ

    def submit(self, calls):
        try:
            for c in calls:
                seed = self.seed_of(*self.keys[c.run], c.index)
                self.calls[(c.run, c.index)] = c
                key = (self.tag, c.run, c.index)
                self.eng.submit(key, c.messages, replace(self.sampling, seed=seed))
        except Exception as e:  # as poll's: raised by rollout once the sandbox is clean
            self.stats.setdefault("engine_error", e)
            raise

    def poll(self):
        """[(call, completion)] of the calls the engine finished since the last poll."""
        t0 = time.perf_counter()
        try:
            done = self.eng.poll()
        except Exception as e:
            # the sandbox would turn this into failed runs (reward 0); an engine failure is ours,
            # not the model's, so rollout re-raises it after the sandbox has cleaned up
            self.stats.setdefault("engine_error", e)
            raise
        self.stats["generate_calls"] += 1
        self.stats["generate_s"] += time.perf_counter() - t0
        out = []
        for (tag, run, index), comps in done:
            if tag is self.tag:  # (else a request of a rollout that failed: dropped)
                out.append((self.calls.pop((run, index)), comps[0]))
        return out


# --------------------------------------------------------------------------------------------------
# Phase 3: grade


def grade(queries, ran, lam, grading, format_reward="paper"):
    """R = correct + λ·format of every run that happened, by reward.reward, from the correctness
    reward.grade_runs gives (each distinct answer to a query graded once) and each run's format
    share (format_reward "authors": their term's share). Returns (correct, format, R), lists in
    ran.keys' order."""
    pairs = [(queries[q], run) for (q, _, _), run in zip(ran.keys, ran.runs, strict=True)]
    correct = reward_lib.grade_runs(pairs, **grading)
    formats = [reward_lib.format_score(run, task, format_reward) for task, run in pairs]
    rewards = []
    for (task, run), c, f in zip(pairs, correct, formats, strict=True):
        kw = dict(lam=lam, correct=c, fmt=f, format_reward=format_reward)
        rewards.append(reward_lib.reward(task, run, **kw))
    return correct, formats, rewards


# --------------------------------------------------------------------------------------------------
# Phase 4: assemble


def assemble(B, M, N, designs, ran, graded, stats) -> Batch:
    """The Batch: executor samples in (q, i, j, call) order; a RunInfo for every slot (q, i, j),
    in that order (an unparsed script's: not run, reward 0, still in the Designer's group); R and
    executed [B, M, N]; graded: grade's (correct, format, R) of the runs that happened."""
    correct, formats, rewards = graded
    executor, by_run = [], {}
    for (k, c), comp in sorted(ran.completions.items()):
        by_run.setdefault(k, []).append(comp)
        if comp.finish_reason != "error":
            executor.append(_sample(comp, ran.keys[k], c))
    R, executed = torch.zeros(B, M, N), torch.zeros(B, M, N, dtype=torch.bool)
    slot = {key: k for k, key in enumerate(ran.keys)}
    runs = []
    for q, i, j in itertools.product(range(B), range(M), range(N)):
        k = slot.get((q, i, j))
        if k is None:
            why = f"unparseable script: {designs.errors[q][i]}"
            runs.append(RunInfo(q, i, j, None, why, 0, 0, None, 0.0, 0.0, 0.0))
            continue
        R[q, i, j], executed[q, i, j] = rewards[k], True
        wr = ran.runs[k]
        info = RunInfo(
            q,
            i,
            j,
            structure=mas.structure_of(designs.scripts[q][i]),
            error=wr.error,
            n_calls=len(wr.calls),
            tokens=sum(len(c.token_ids) for c in by_run.get(k, [])),
            answer=wr.answer,
            correct=correct[k],
            format=formats[k],
            reward=rewards[k],
            run=wr,
        )
        runs.append(info)
    stats["executor_tokens"] = sum(len(s.completion_ids) for s in executor)
    stats["designer_tokens"] = sum(len(s.completion_ids) for s in designs.samples)
    return Batch(
        R, executed, designs.samples, executor, runs, designs.scripts, designs.texts, stats
    )


def samples_to_tensors(samples, pad_id, device=None):
    """Pack samples into right-padded tensors aligned with grpo.token_logprobs ([S, T-1]: position t
    holds the log-prob of token t+1). completion_mask marks the completion tokens (the only ones
    trained on); logprobs holds the engine's log-probs at those positions and 0 elsewhere. Every
    sample needs a prompt (its first completion token is predicted from the prompt's last)."""
    T = max(2, max((len(s.prompt_ids) + len(s.completion_ids) for s in samples), default=2))
    input_ids = torch.full((len(samples), T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(len(samples), T, dtype=torch.long)
    completion_mask, logprobs = torch.zeros(len(samples), T - 1), torch.zeros(len(samples), T - 1)
    for k, s in enumerate(samples):
        P, L = len(s.prompt_ids), len(s.completion_ids)
        if P == 0:
            raise ValueError(
                "samples_to_tensors: without a prompt, a sample's first token has no predictor"
            )
        input_ids[k, : P + L] = torch.tensor(s.prompt_ids + s.completion_ids, dtype=torch.long)
        attention_mask[k, : P + L] = 1
        # completion token c sits at position P + c and is predicted at position P + c - 1
        completion_mask[k, P - 1 : P + L - 1] = 1
        logprobs[k, P - 1 : P + L - 1] = torch.tensor(s.logprobs, dtype=torch.float)
    out = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "completion_mask": completion_mask,
        "logprobs": logprobs,
    }
    return {k: v.to(device) for k, v in out.items()} if device is not None else out
