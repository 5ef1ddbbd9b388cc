"""heldout.py: a policy measured on held-out tiny tasks: sampled accuracy and the exact rows, and
the learning curve that train.py records with them during RL.

Two measurements of one policy on tasks it never trained on (tiny.SPLITS: "val" for the curve and
for tuning, "eval" for the final table), each a vector with one value a task, so that two policies
(RL and its cold start, or two checkpoints) pair task by task:

    sampled: acc_t = (1/S) sum_s correct(design_s, execution_s)
             S independent (design, execution) draws of task t at T=1 (rollout with M=S, N=1: every
             draw a fresh script), lam=0
    exact:   suited_t   = P(the Designer writes the template that suits t's kind | t)
             executor_t = tiny.executor_score: P(oracle reply | context), weighted by the cold
                          start's structure shares
             (teacher forcing: no sampling noise)

Paired over T tasks, RL - SFT = mean_t (x_RL,t - x_SFT,t) with SE = std_t(x_RL,t - x_SFT,t) /
sqrt(T). S draws a task shrink the sampling part of that variance by S; the draw of tasks remains.

    acc, structures = sampled(tasks, eng, eng, cfg, samples=4)   # separate: each role's view
    rows = exact(designer_model, executor_model, tokenizer, tasks, contexts)   # the cold start's
                                                                               # shares
    curve = Curve(cfg, world, rank)
    line = curve(step, weights, policy_of, tokenizer)   # train.py's: heldout/ keys (weights:
                                                        # machinery/weights.EngineWeights)

Curve (train.py, tiny data, probe_tasks > 0): at step 0 (the cold start) and at every checkpoint,
probe_tasks "val" tasks, SAMPLES draws each, and the exact rows, into that step's metrics.jsonl line
under `heldout/` (accuracy and its SE over the tasks, suited, executor, tester_code = P(tester |
code task), copy = P(the repair copies wrong_reply's failed program)). The cold start's structure
shares, which weight the executor row, are written into the step-0 line
(heldout/share/KIND/TEMPLATE), so a resumed run reads them back. The sampled draws use the same
seeds at every probe, so the curve's steps differ by the policy, not the noise.

Benchmark (train.py, Config.val_every > 0): the benchmark curve of a run at scale, as the authors
validate (every val_freq steps, greedy). A fixed sample of a prepared benchmark (val_tasks:
data/NAME.jsonl, or a task file; val_size of its tasks, drawn once from the run's seed), at step 0
and every val_every steps (and the last), each task rolled out by the learned Designer and the
Executor (one greedy draw, VAL_SAMPLING: the authors' validation), lam = 0:

    heldout/NAME/accuracy = mean_t acc_t,  heldout/NAME/accuracy_se = std_t(acc_t) / sqrt(T),
    heldout/NAME/unparsed = the share of designs that did not parse

in that step's metrics.jsonl line, each rank rolling out its share of the tasks (seeds follow a
task's index). A resume truncates metrics.jsonl to its checkpoint's step and keeps the rows up to
it; tools/plot.py draws the curve beside the tiny one.

    bench = Benchmark(cfg, world, rank, kept)     # kept: a resumed run's metrics lines
    line = bench(step, weights)                    # the heldout/NAME/ keys of this step

Needs: machinery/engine.py, mas.py, rollout.py, settings.py, world/tiny.py, machinery/decode.py,
machinery/data.py, reward.py, sandbox.py, stagewise.py, machinery/logprob_rows.py,
machinery/isolation.py, machinery/confine.py, machinery/cpu_bits.py, machinery/plans.py,
machinery/provenance.py, machinery/rundir.py, machinery/programs.py, machinery/grader.py"""

from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

import mas
import rollout as rollout_lib
import settings
from machinery import data
from machinery import engine as engine_lib
from world import tiny

SAMPLES = 4  # (design, execution) draws a task in the curve and the final table
# the task draw of each split, offset from the run's seed
SEEDS = {
    "val": 2_000_003,
    "eval": 1_000_003,
    "benchmark": 3_000_017,  # the benchmark curve's sample of val_tasks
}
PROBE_STEP = 10**6  # the rollout step the draws are seeded with: the same at every probe
# the benchmark curve: greedy, one draw a task, as [authors] validate
VAL_SAMPLING = dict(temperature=0.0, top_p=1.0)


def tasks(n, seed, split):
    """n tiny tasks of a held-out split ("val" or "eval"): the same for every run of one seed."""
    return tiny.make_tasks(n, seed=seed + SEEDS[split], split=split)


def sampled(
    tasks, designer_engine, executor_engine, cfg, samples=SAMPLES, template=None, q_offset=0
):
    """(per-task accuracy over `samples` draws, Counter of the draws' structures): rollout with
    M=samples, N=1 (template: a fixed structure, e.g. "single"); lam=0, so R is the correctness (0
    or 1)."""
    b = rollout_lib.rollout(
        tasks,
        designer_engine,
        executor_engine,
        samples,
        1,
        PROBE_STEP,
        seed=cfg.seed + 31,
        template=template,
        designer_sampling=engine_lib.Sampling(max_tokens=cfg.designer_max_tokens),
        executor_sampling=engine_lib.Sampling(max_tokens=cfg.max_tokens),
        short=True,
        lam=0.0,
        q_offset=q_offset,
        schedule=cfg.rollout_schedule,
        **rollout_lib.config_kwargs(cfg),
    )
    structures = Counter(r.structure or "unparsed" for r in b.runs)
    return b.R.mean(dim=(1, 2)).tolist(), structures


def cold_start_shares(choice, kinds):
    """{kind: {template: share}}: the mean P(template | task) of a Designer over the tasks of each
    kind, normalised (the executor row's fixed weights: the cold start's, so that policies pair)."""
    shares = {}
    for kind in sorted(set(kinds)):
        mass = {n: sum(c[n] for c, k in zip(choice, kinds) if k == kind) for n in mas.TEMPLATES}
        shares[kind] = {n: v / sum(mass.values()) for n, v in mass.items()}
    return shares


def exact(designer_model, executor_model, tokenizer, tasks, contexts, shares=None):
    """The exact rows of one policy, per task: {"suited", "executor", "oracle", "choice",
    "contexts", "shares"}. contexts: tiny.executor_contexts(tasks). shares: the cold start's (None:
    this Designer's own, which is right when it is the cold start). Under FSDP2 every rank calls it
    with the same tasks."""
    f = tiny.exact_figures(
        designer_model,
        tokenizer,
        tasks,
        executor=executor_model is designer_model,
        contexts=contexts,
    )
    # separate policies: the contexts are the executor model's
    if executor_model is not designer_model:
        f.update(
            tiny.exact_figures(executor_model, tokenizer, tasks, designer=False, contexts=contexts)
        )
    kinds = [t["kind"] for t in tasks]
    shares = shares or cold_start_shares(f["choice"], kinds)
    suited = [c.get(tiny.SUITED.get(k), 0.0) for c, k in zip(f["choice"], kinds)]
    return {
        "suited": suited,
        "executor": tiny.executor_score(f["contexts"], kinds, shares),
        # the executor row from each context's two factors alone (P = P_answer * P_steps per
        # context; the weighted rows do not multiply): the answer tokens, the format and steps
        "executor_answer": tiny.executor_score(f["contexts_answer"], kinds, shares),
        "executor_steps": tiny.executor_score(f["contexts_steps"], kinds, shares),
        # the repair after wrong_reply's program, and after the cold start's own wrong program
        # (None where it does not occur)
        "repair": list(f["contexts"]["repair"]),
        "repair_own": list(f["contexts"].get("repair_own", [None] * len(tasks))),
        # the habit: P(the repair copies the failed reply), after wrong_reply's and after its own
        "copy": list(f["contexts"]["copy"]),
        "copy_own": list(f["contexts"].get("copy_own", [None] * len(tasks))),
        "oracle": list(f["oracle"]),
        "choice": f["choice"],
        "contexts": f["contexts"],
        "shares": shares,
    }


def known_mean(xs):
    """The mean of the values that are not None (nan if none is)."""
    known = [x for x in xs if x is not None]
    return float(np.mean(known)) if known else float("nan")


def gather_list(xs, world):
    """Every rank's list, concatenated in rank order (the tasks were split in that order)."""
    if world == 1:
        return xs
    out = [None] * world
    dist.all_gather_object(out, xs)
    every = []
    for part in out:
        every += part
    return every


def curves(cfg, world, rank, kept, tiny_data):
    """The run's held-out curves, each called as curve(step, weights, policy_of, tokenizer) where
    curve.due(step): the tiny world's (probe_tasks > 0 on tiny data) and the benchmark's
    (val_every > 0)."""
    out = []
    if cfg.probe_tasks > 0 and tiny_data:
        out.append(Curve(cfg, world, rank, kept))
    if cfg.val_every > 0:
        out.append(Benchmark(cfg, world, rank, kept))
    return out


class Curve:
    """The held-out curve during RL: call it at step 0 and at each checkpoint; it returns the
    heldout/ keys of that step's metrics line. Every rank calls it (the exact forwards are
    collective under FSDP2); each rank samples its share of the tasks."""

    def __init__(self, cfg, world, rank, kept=()):
        self.cfg, self.world, self.rank = cfg, world, rank
        self.tasks = tasks(cfg.probe_tasks, cfg.seed, "val")
        self.contexts = tiny.executor_contexts(self.tasks)
        self.shares = None
        for m in kept:  # a resumed run: the cold start's shares, from its step-0 line
            if m["step"] == 0 and "heldout/accuracy" in m:
                self.shares = {}
                for key, v in m.items():
                    if key.startswith("heldout/share/"):
                        kind, name = key.split("/")[2:]
                        self.shares.setdefault(kind, {})[name] = v
        self.started = self.shares is not None  # the step-0 probe is in metrics.jsonl already
        self.timer = "heldout"  # its time in the metrics line: time/heldout

    def due(self, step):
        """Whether step (1-based: the steps done) is a probe of the curve: each checkpoint's."""
        return step % self.cfg.save_every == 0 or step == self.cfg.steps

    def cold_start(self, tokenizer):
        """The cold start's structure shares on the probe's tasks (its Designer: init_from, or its
        designer/)."""
        path = settings.model_dirs(self.cfg)["model" if self.cfg.policy == "shared" else "designer"]
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        f = tiny.exact_figures(model, tokenizer, self.tasks, executor=False)
        return cold_start_shares(f["choice"], [t["kind"] for t in self.tasks])

    def __call__(self, step, weights, policy_of, tokenizer):
        """weights: the trainer's weights in the engine (machinery/weights.py); each role samples
        through its view, which holds that role's weights."""
        part = np.array_split(np.arange(len(self.tasks)), self.world)[self.rank]
        mine = [self.tasks[k] for k in part]
        d, e = weights.view("designer"), weights.view("executor")
        acc, structures = sampled(mine, d, e, self.cfg, q_offset=int(part[0]) if len(part) else 0)
        acc = gather_list(acc, self.world)
        models = {r: policy_of[r]["model"] for r in ("designer", "executor")}
        # no step-0 line to read them from: the cold start's own
        if self.shares is None and step > 0:
            self.shares = self.cold_start(tokenizer)
        rows = exact(
            models["designer"],
            models["executor"],
            tokenizer,
            self.tasks,
            self.contexts,
            self.shares,
        )
        kinds = [t["kind"] for t in self.tasks]
        tester_code = [c["tester"] if k == "code" else None for c, k in zip(rows["choice"], kinds)]
        for model in {id(m): m for m in models.values()}.values():
            if hasattr(model, "reshard"):  # FSDP2: a forward without grad leaves the root gathered
                model.reshard()
        line = {
            "heldout/accuracy": float(np.mean(acc)),
            "heldout/accuracy_se": float(np.std(acc, ddof=1) / np.sqrt(len(acc)))
            if len(acc) > 1
            else 0.0,
            "heldout/suited": float(np.mean(rows["suited"])),
            "heldout/executor": float(np.mean(rows["executor"])),
            "heldout/tester_code": known_mean(tester_code),
            "heldout/copy": known_mean(rows["copy"]),
            "heldout/unparsed": structures.get("unparsed", 0) / max(1, sum(structures.values())),
        }
        if self.shares is None:  # step 0: the cold start's shares weight every later executor row
            self.shares = rows["shares"]
            for kind, d in self.shares.items():
                line.update({f"heldout/share/{kind}/{n}": v for n, v in d.items()})
        return line


class Benchmark:
    """The benchmark curve during RL (the module docstring): call it at step 0 and every val_every
    steps; it returns the heldout/NAME/ keys of that step's metrics line. Every rank calls it (the
    gather is collective); each rank rolls out its share of the tasks."""

    def __init__(self, cfg, world, rank, kept=()):
        self.cfg, self.world, self.rank = cfg, world, rank
        path = settings.val_path(cfg)
        self.tasks = data.load_tasks(path)
        if 0 < cfg.val_size < len(self.tasks):  # a fixed sample: the same at every probe
            rng = np.random.default_rng(cfg.seed + SEEDS["benchmark"])
            pick = sorted(rng.choice(len(self.tasks), cfg.val_size, replace=False).tolist())
            self.tasks = [self.tasks[k] for k in pick]
        self.name = Path(path).stem
        self.key = f"heldout/{self.name}/accuracy"
        # a resumed run: the step-0 probe is in metrics.jsonl already (rank 0 reads it)
        self.started = any(m["step"] == 0 and self.key in m for m in kept)
        self.timer = "benchmark"

    def due(self, step):
        """Whether step (1-based: the steps done) is a probe of the curve."""
        return step % self.cfg.val_every == 0 or step == self.cfg.steps

    def __call__(self, step, weights, policy_of=None, tokenizer=None):
        """weights: the trainer's weights in the engine (machinery/weights.py); step, policy_of and
        tokenizer unused (Curve's call)."""
        cfg = self.cfg
        part = np.array_split(np.arange(len(self.tasks)), self.world)[self.rank]
        mine = [self.tasks[k] for k in part]
        sampling = VAL_SAMPLING
        b = rollout_lib.rollout(
            mine,
            weights.view("designer"),
            weights.view("executor"),
            1,
            1,
            PROBE_STEP,
            seed=cfg.seed + 37,
            designer_sampling=engine_lib.Sampling(max_tokens=cfg.designer_max_tokens, **sampling),
            executor_sampling=engine_lib.Sampling(max_tokens=cfg.max_tokens, **sampling),
            short=settings.is_tiny(cfg),
            lam=0.0,
            q_offset=int(part[0]) if len(part) else 0,
            schedule=cfg.rollout_schedule,
            **rollout_lib.config_kwargs(cfg),
        )
        acc = gather_list(b.R.mean(dim=(1, 2)).tolist(), self.world)
        parsed = gather_list([r.structure is not None for r in b.runs], self.world)
        return {
            self.key: float(np.mean(acc)),
            f"heldout/{self.name}/accuracy_se": float(np.std(acc, ddof=1) / np.sqrt(len(acc)))
            if len(acc) > 1
            else 0.0,
            f"heldout/{self.name}/unparsed": 1.0 - float(np.mean(parsed)),
        }
