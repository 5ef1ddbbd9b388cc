"""recorder.py: what a train.py run records of each step, and in which order: the step's tree, its
metrics line, and its clock.

A step's records, all written by rank 0 (every rank calls: the metrics are reduced over the ranks),
each on disk (fsync) before the step's checkpoint exists, so that no kill loses a logged step:

    out_dir/rollouts.jsonl   the step's tree, a line per recorded query (rollout.Batch.tree;
                             tools/show.py draws it): the first record_queries queries of rank 0
    out_dir/metrics.jsonl    one line: what the rollout did over every rank (step_metrics), the
                             update's numbers, the reload probe's, the held-out curve's on
                             checkpoint steps, and the step's times (time/*)

then TensorBoard and wandb (loggers.py) and a printed line. Use:

    rec = Recorder(cfg, rank, device, start, tiny)    # a resume drops the lines of steps after
                                                      # `start`
    rec.write({"step": 0, ...})                       # a line as it is (the held-out curve's step
                                                      # 0)
    rec.begin(step, active)                           # the step's clock starts; its active roles
    with rec.timed("update"): ...                     # time/update in the step's line
    rec.tree(batch, queries, A_D, A_E)                # rollouts.jsonl (time/record)
    rec.add(keys)                                     # more keys for the step's line (the held-out
                                                      # curve)
    rec.line(batch, queries, A_D, A_E, stats, info)   # metrics.jsonl
    rec.close()

The metrics line's rollout part, step_metrics (A_D [b, M] and A_E [b, M, N] as the update used them,
never recomputed here), over every rank's queries:

    reward/mean, accuracy, format_rate     means over the runs (an unparsed script's runs count, as
                                           0)
    reward/designer, reward/best_design    mean_q mean_i Rbar[q, i]; mean_q max_i Rbar[q, i]
    parse_rate, script_error_rate          parsed scripts; runs of parsed scripts that raised
    accuracy/KIND, structure/NAME          per task kind; the share of each structure (or
                                           "unparsed")
    tokens/ROLE, samples/ROLE              generated tokens and samples of each role
    ROLE/adv_mean, adv_std, adv_zero_frac  the role's advantages (A_E over the runs that happened)
    entropy/ROLE_tokens                    mean -log pi(token) over the sampled tokens, an
                                           estimate of the sampling policy's per-token entropy
                                           E_x~pi[-log pi(x)]
    time/design, time/execute, time/grade  the rollout's phases (rank 0's)
    sandbox/REASON                         failures the sandbox caught this step (programs.failures:
                                           kills, results that do not parse), every rank's
    repair/calls, trained, copy_rate,      the repairs after a failed run_tests (repair_metrics):
    adv_mean                               the dose the Executor's habit gets

and where the learning signal goes (signal_metrics).

Needs: machinery/loggers.py, machinery/rundir.py, machinery/provenance.py, machinery/ranks.py,
machinery/cpu_bits.py"""

import contextlib
import os
import time
from collections import Counter

import numpy as np
import torch
import torch.distributed as dist

from machinery import loggers, ranks, rundir


class Recorder:
    """A run's records of its steps (the module docstring): every rank makes one and calls it."""

    def __init__(self, cfg, rank, device, start, tiny=False):
        self.cfg, self.rank, self.device, self.tiny = cfg, rank, device, tiny
        self.metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
        self.tree_path = os.path.join(cfg.out_dir, "rollouts.jsonl")
        self.kept, self.log = [], None  # kept: metrics.jsonl's lines up to `start` (a resume's)
        if rank == 0:
            self.kept = rundir.truncate_jsonl(self.metrics_path, start)
            self.log = loggers.Loggers(cfg, self.kept)
            rundir.truncate_jsonl(self.tree_path, start)
            print(  # the run's first line
                f"train.py: steps {start}..{cfg.steps}, {dist.get_world_size()} rank(s), {device}, "
                f"{cfg.backend}, {cfg.policy}, {cfg.mode} K={cfg.K}, B={cfg.batch_size} "
                f"M={cfg.M} N={cfg.N}",
                flush=True,
            )

    def begin(self, step, active):
        """Step `step` (0-based), which trains the roles `active`, starts: its clock, its times."""
        self.step = step
        self.t0 = time.perf_counter()
        self.times, self.extra = {}, {}  # time/NAME: seconds; the keys add() gives
        self.roles = "+".join(sorted(active))  # "designer", "executor" or "designer+executor"

    @contextlib.contextmanager
    def timed(self, name):
        """The block's time as time/NAME of the step's line (added up when the name comes again)."""
        t0 = time.perf_counter()
        yield
        self.since(name, t0)

    def since(self, name, t0):
        """The time from t0 (time.perf_counter()) to now, added to time/NAME of the step's line."""
        key = f"time/{name}"
        self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - t0

    def tree(self, batch, queries, A_D, A_E):
        """The step's tree into rollouts.jsonl: rank 0's first record_queries queries."""
        with self.timed("record"):
            if self.rank == 0:
                n = self.cfg.record_queries
                rows = batch.tree(queries[:n], A_D, A_E, self.step + 1, self.roles, self.tiny)
                rundir.append_jsonl(self.tree_path, rows)

    def add(self, keys):
        """More keys for the step's line, after the update's and the probe's."""
        self.extra.update(keys)

    def write(self, m):
        """A metrics line as it is: on disk, then to the loggers (rank 0)."""
        if self.rank == 0:
            rundir.append_jsonl(self.metrics_path, [m])
            self.log(m)

    def line(self, batch, queries, A_D, A_E, stats, info):
        """The step's metrics line (collective: step_metrics gathers every rank's runs) and the
        printed line. stats: the update's; info: the reload probe's (weights.info)."""
        m = {"step": self.step + 1, "active": self.roles}
        m.update(step_metrics(batch, queries, self.device, A_D, A_E))
        m["repair/trained"] = m["repair/calls"] if "executor" in self.roles else 0
        m.update(stats)
        m.update(info)
        m.update(self.extra)
        m.update(self.times)
        m["time/step"] = time.perf_counter() - self.t0
        self.write(m)
        if self.rank == 0:
            gap = max(stats.get(f"{r}/logprob_gap", 0.0) for r in self.roles.split("+"))
            print(
                f"step {m['step']:4d} [{m['active']:>8}] reward {m['reward/mean']:.3f} "
                f"acc {m['accuracy']:.2f} parse {m['parse_rate']:.2f} "
                f"err {m['script_error_rate']:.2f} gap {gap:.1e} {m['time/step']:.1f}s",
                flush=True,
            )
        return m

    def close(self):
        if self.log is not None:
            self.log.close()


def gather(obj):
    """[obj of every rank], on every rank."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def role_stats(roles, acc, gap_max, device):
    """Each role's update numbers over every rank: the loss and the forwarded tokens (sums); the
    clip fraction, the ratio and the engine/trainer log-prob gap (token means); the largest gap."""
    keys = []
    for r in roles:
        keys += [f"{r}/{k}" for k in ("loss", "tokens", "clip_frac", "ratio_mean", "logprob_gap")]
    tot = dict(zip(keys, ranks.all_sum([acc[k] for k in keys], device), strict=True))
    maxes = ranks.all_sum([gap_max[r] for r in roles], device, dist.ReduceOp.MAX)
    stats = {}
    for r, top in zip(roles, maxes, strict=True):
        for k in ("clip_frac", "ratio_mean", "logprob_gap"):
            stats[f"{r}/{k}"] = tot[f"{r}/{k}"] / max(tot[f"{r}/tokens"], 1)
        stats[f"{r}/loss"] = tot[f"{r}/loss"]
        stats[f"{r}/tokens"] = tot[f"{r}/tokens"]
        stats[f"{r}/logprob_gap_max"] = top
    return stats


def step_metrics(batch, queries, device, A_D, A_E):
    """The rollout part of a step's metrics line (the module docstring), over every rank's runs."""
    recs = []  # every rank's runs, in rank order
    for part in gather(batch.records(queries)):
        recs += part
    R, E = torch.cat(gather(batch.R)), torch.cat(gather(batch.executed))
    nll = [-sum(sum(s.logprobs) for s in samples) for samples in (batch.designer, batch.executor)]
    counts = [batch.stats["designer_tokens"], batch.stats["executor_tokens"], len(batch.designer)]
    counts.append(len(batch.executor))
    t = torch.tensor([*counts, *nll], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    n, parsed = max(len(recs), 1), [r for r in recs if r["parsed"]]
    Rbar = R.mean(-1)
    m = {
        "reward/mean": sum(r["reward"] for r in recs) / n,
        "reward/designer": Rbar.mean().item(),
        "reward/best_design": Rbar.amax(-1).mean().item(),
        "accuracy": sum(r["correct"] for r in recs) / n,
        "format_rate": sum(r["format"] for r in recs) / n,
        "parse_rate": len(parsed) / n,
        "script_error_rate": sum(r["error"] for r in parsed) / max(len(parsed), 1),
        "calls_per_run": sum(r["calls"] for r in recs) / n,
    }
    names = ("tokens/designer", "tokens/executor", "samples/designer", "samples/executor")
    m.update(zip(names, t[:4].tolist()))
    for k in ("design", "execute", "grade"):
        m[f"time/{k}"] = batch.stats[f"{k}_s"]
    for part in gather(batch.stats.get("sandbox_failures", {})):  # what the sandbox caught
        for why, n in part.items():
            m[f"sandbox/{why}"] = m.get(f"sandbox/{why}", 0) + n
    for kind in sorted({r["kind"] for r in recs}):
        sub = [r for r in recs if r["kind"] == kind]
        m[f"accuracy/{kind}"] = sum(r["correct"] for r in sub) / len(sub)
    for s, c in Counter(r["structure"] for r in recs).items():
        m[f"structure/{s}"] = c / n
    A_D, A_E = torch.cat(gather(A_D)), torch.cat(gather(A_E))
    for name, a in (("designer", A_D), ("executor", A_E[E])):
        if a.numel():
            m[f"{name}/adv_mean"] = a.mean().item()
            m[f"{name}/adv_std"] = a.std().item() if a.numel() > 1 else 0.0
            m[f"{name}/adv_zero_frac"] = (a == 0).float().mean().item()
    m.update(signal_metrics(recs, R, E, A_D, A_E))
    m.update(repair_metrics(recs, A_E))
    # E_x~pi[-log pi(x)], over the sampled tokens
    for k, role in enumerate(("designer", "executor")):
        if t[k] > 0:
            m[f"entropy/{role}_tokens"] = (t[4 + k] / t[k]).item()
    return m


def repair_metrics(recs, A_E):
    """The repairs of the step's runs (mas.repairs: calls after a failed run_tests), over every
    rank's runs (recs in (q, i, j) order, A_E [B, M, N] as the update used it):

        repair/calls      repair calls made (Recorder.line adds repair/trained: those the update
                          trained on, all of them on an Executor step, else 0)
        repair/copy_rate  the share of them that wrote the failed program again
        repair/adv_mean   the mean advantage A_E their tokens carried"""
    n = sum(r["repairs"] for r in recs)
    m = {"repair/calls": n}
    if n:
        a = A_E.flatten().tolist()
        m["repair/copy_rate"] = sum(r["copies"] for r in recs) / n
        m["repair/adv_mean"] = sum(r["repairs"] * x for r, x in zip(recs, a)) / n
    return m


def signal_metrics(recs, R, E, A_D, A_E):
    """Where the step's learning signal goes, per query group (R, E, A_D, A_E of every rank's
    queries; recs in (q, i, j) order):

        signal/all_correct, signal/all_wrong   queries whose M*N runs are all correct / all wrong
                                               (an unparsed script's runs count as wrong): no
                                               advantage for either role
        designer/dead_groups                   queries whose M designer advantages are all 0
        executor/dead_groups                   queries whose executor advantages are all 0
        signal/reward_std                      mean over queries of std_ij R[q] (its executed runs)
        signal/design_reward_std               mean over queries of std_i mean_j R[q, i, :]
        entropy/designs                        mean over queries of H(structure shares of its M
                                               designs), nats
        signal/same_structure                  queries whose M designs all have one structure"""
    B, M, N = R.shape
    if B == 0:
        return {}
    correct = torch.tensor([r["correct"] for r in recs], dtype=torch.bool).reshape(B, M, N)
    structures = [r["structure"] for r in recs]
    m = {
        "signal/all_correct": correct.flatten(1).all(-1).float().mean().item(),
        "signal/all_wrong": (~correct.flatten(1).any(-1)).float().mean().item(),
        "designer/dead_groups": (A_D == 0).all(-1).float().mean().item(),
        "executor/dead_groups": (A_E == 0).flatten(1).all(-1).float().mean().item(),
    }
    stds, design_stds, entropies, same = [], [], [], 0
    for q in range(B):
        ran = R[q][E[q]]
        stds.append(ran.std().item() if ran.numel() > 1 else 0.0)
        design_stds.append(R[q].mean(-1).std().item() if M > 1 else 0.0)
        shares = Counter(structures[(q * M + i) * N] for i in range(M))
        p = np.array(list(shares.values()), dtype=float) / M
        entropies.append(float(-(p * np.log(p)).sum()))
        same += len(shares) == 1
    m["signal/reward_std"] = float(np.mean(stds))
    m["signal/design_reward_std"] = float(np.mean(design_stds))
    m["entropy/designs"] = float(np.mean(entropies))
    m["signal/same_structure"] = same / B
    return m
