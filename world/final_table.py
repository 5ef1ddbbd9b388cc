"""final_table.py: the table the tiny default ends with: the RL model against its SFT cold start on
held-out tasks.

Both models on the same tasks of a held-out split (the "eval" split by default, which neither the
cold start nor RL nor the tuning of RL's settings sees), measured by heldout.py, and the paired
difference task by task:

    RL - SFT = mean_t (x_RL,t - x_SFT,t),   SE = std_t(x_RL,t - x_SFT,t) / sqrt(T)
                                                                      (report.paired_margin)

Rows: the sampled accuracy of the learned designs and of the single agent (heldout.SAMPLES draws a
task, each a fresh design executed once), and the exact rows by teacher forcing
(tiny.exact_figures), which carry no sampling noise: P(the Designer writes each template | kind of
task), its share on the template that suits the kind (tiny.SUITED: `suited`, the Designer's primary
row), P(the Executor writes the oracle reply) in each of its contexts, and those contexts weighted
by the SFT Designer's structure shares (tiny.executor_score: `executor`, the Executor's primary row;
`oracle` is the single agent's context); the repair of the cold start's own wrong programs
(`repair_own`: in this world, the switch to the other function) and the habit, P(the repair writes
the failed program again) (`copy_own`; `copy` after tiny.wrong_reply's); each template forced on the
code tasks (`code/NAME`, sampled); the learned designs' accuracy per kind and weighted as RL's data
mix draws the kinds (`accuracy/rl_mix` = sum_k mix_k d_k, SE = sqrt(sum_k mix_k^2 SE_k^2)); and
the training accuracy's change, metrics.jsonl's last 10% of steps minus the first 10%. Printed,
and written to out_dir/final_table.json (or final_table_val.json) with the per-task vectors, so
that runs of one seed (the same tasks) pair task by task (ablations.py).

    final_table(cfg, engine, "out/tiny-rl/step_000040")     # train.py's last act, rank 0
    python world/final_table.py out/tiny-rl --split val           # a finished run's table again, on
                                                                  # another split

Needs: evaluate.py, machinery/engine.py, machinery/rundir.py, machinery/weights.py, mas.py,
settings.py, world/heldout.py, world/tiny.py, machinery/logprob_rows.py, machinery/data.py,
machinery/decode.py, machinery/isolation.py, machinery/confine.py, machinery/provenance.py,
machinery/ranks.py, machinery/cpu_bits.py, machinery/reload_check.py, reward.py, rollout.py,
sandbox.py, stagewise.py,
machinery/plans.py, machinery/programs.py, machinery/grader.py, machinery/results.py"""

import argparse
import fcntl
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

# run by path (python world/final_table.py): the project's root first on the path, for its imports
# below
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import evaluate
import mas
import settings
from machinery import cpu_bits, rundir, weights
from machinery import engine as engine_lib
from machinery import results as report
from world import heldout, tiny


def heldout_tasks(cfg, split="eval"):
    """cfg.eval_tasks tiny tasks of a held-out split (tiny.SPLITS: a hash of the text the model is
    shown, so no training task shows the same text; the final table runs for the tiny data alone,
    data_mix {"tiny"}, whose tasks are the "rl" split's)."""
    return heldout.tasks(cfg.eval_tasks, cfg.seed, split)


def policy_dirs(cfg, ckpt):
    """{"RL": {role: folder}, "SFT": {role: folder}}: the checkpoint's models and the cold
    start's."""
    sft = settings.model_dirs(cfg)
    name = {r: "model" if cfg.policy == "shared" else r for r in ("designer", "executor")}
    return {
        "RL": {r: os.path.join(ckpt, name[r]) for r in name},
        "SFT": {r: sft[name[r]] for r in name},
    }


def measure(cfg, eng, dirs, tasks, contexts, shares):
    """One policy's sampled rows and exact rows on the tasks. The engine gets each role's weights;
    separate policies: the designer's in the design phase, the executor's after."""
    loaded = {
        d: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32) for d in set(dirs.values())
    }
    models = {r: loaded[d] for r, d in dirs.items()}  # shared: one model plays both roles
    state = {d: m.state_dict() for d, m in loaded.items()}
    # each role's view holds its weights
    held = weights.EngineWeights(eng, {r: state[d] for r, d in dirs.items()})
    d, e = held.view("designer"), held.view("executor")
    designs = heldout.sampled(tasks, d, e, cfg)
    single = heldout.sampled(tasks, d, e, cfg, template="single")
    # each template forced on the code tasks (single's from its row above)
    code = [k for k, t in enumerate(tasks) if t["kind"] == "code"]
    per_template = {"single": [single[0][k] for k in code]}
    for name in [n for n in mas.TEMPLATES if n != "single"]:
        per_template[name] = heldout.sampled([tasks[k] for k in code], d, e, cfg, template=name)[0]
    tok = AutoTokenizer.from_pretrained(dirs["designer"])
    rows = heldout.exact(models["designer"], models["executor"], tok, tasks, contexts, shares)
    return designs, single, rows, per_template


OWN_REPLIES = "own_first_replies.json"  # in the cold start's Executor folder: frozen once made


def own_first_replies(cfg, eng, sft_dirs, tasks, contexts):
    """{task id: the cold start Executor's own reply to the tester's first call}, on the code tasks:
    sampled once at T=1 (each task's seed a hash of its id) and frozen in the cold start's folder
    (OWN_REPLIES), so that every run from that cold start, its RL model and the cold start alike,
    every arm of a seed, is scored on the same programs (tiny.repair_contexts: the repair_own row).
    Written atomically, under a lock on the folder's OWN_REPLIES.lock: two runs from one cold start
    (two arms of a seed) never both sample; tasks already there are never sampled again."""
    path = os.path.join(sft_dirs["executor"], OWN_REPLIES)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return _own_first_replies(cfg, eng, sft_dirs, tasks, contexts, path)


def _own_first_replies(cfg, eng, sft_dirs, tasks, contexts, path):
    frozen = {}
    if os.path.exists(path):
        with open(path) as f:
            frozen = json.load(f)
    todo = []
    for k, t in enumerate(tasks):
        if t["kind"] == "code" and str(t["id"]) not in frozen and contexts["coder"][k]:
            todo.append(k)
    if todo:
        view = weights.EngineWeights(eng, {"executor": sft_dirs["executor"]}).view("executor")
        samplings = []
        for k in todo:
            seed = engine_lib.derive_seed("own-first-reply", str(tasks[k]["id"]))
            samplings.append(engine_lib.Sampling(max_tokens=cfg.max_tokens, seed=seed))
        outs = view.generate([contexts["coder"][k][0] for k in todo], samplings)
        for k, out in zip(todo, outs):
            frozen[str(tasks[k]["id"])] = out[0].text
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(frozen, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    return {str(t["id"]): frozen[str(t["id"])] for t in tasks if str(t["id"]) in frozen}


def known_margin(x, y):
    """report.paired_margin over the tasks where both values are known (a context that occurs):
    (mean, SE, tasks); (nan, nan, 0) where none is."""
    pairs = [(a, b) for a, b in zip(x, y) if a is not None and b is not None]
    if not pairs:
        return float("nan"), float("nan"), 0
    m, se = report.paired_margin([a for a, _ in pairs], [b for _, b in pairs])
    return m, se, len(pairs)


def mix_shares(cfg):
    """{kind: share}: how often RL's data mix draws each kind of tiny task
    (settings.TINY_SOURCES)."""
    shares = {}
    for src, w in cfg.data_mix.items():
        kinds = settings.TINY_SOURCES.get(src, ())
        for kind in kinds:
            shares[kind] = shares.get(kind, 0.0) + w / len(kinds)
    total = sum(shares.values())
    return {k: v / total for k, v in sorted(shares.items())}


def mixed_margin(gains, mix):
    """(mean, SE) of the RL - SFT accuracy at the RL mix: sum_k mix_k * d_k, the kinds' paired
    margins independent (disjoint tasks), SE = sqrt(sum_k mix_k^2 * SE_k^2)."""
    m = sum(w * gains[f"accuracy/{k}"][0] for k, w in mix.items())
    var = sum(w * w * gains[f"accuracy/{k}"][1] ** 2 for k, w in mix.items())
    return m, var**0.5


def training_change(out_dir):
    """The training accuracy (metrics.jsonl's `accuracy`, over the rollouts of the "rl" split) of
    the last 10% of steps minus the first 10% (at least one step each); None without steps."""
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        acc = [m["accuracy"] for m in map(json.loads, f) if "accuracy" in m]
    if not acc:
        return None
    n = max(1, len(acc) // 10)
    return float(np.mean(acc[-n:]) - np.mean(acc[:n]))


def structures_text(counter):
    n = max(1, sum(counter.values()))
    return ", ".join(f"{k} {v / n:.0%}" for k, v in counter.most_common())


def final_table(cfg, eng, ckpt, split="eval"):
    """train.py's last act (eval_tasks > 0, tiny data, rank 0): the RL models of checkpoint `ckpt`
    and the SFT cold start on the same held-out tasks, sampled and exact, printed and written to
    out_dir/final_table.json (split "val": final_table_val.json). `eng` is the run's engine: each
    row loads the weights it needs."""
    tasks = heldout_tasks(cfg, split)
    dirs = policy_dirs(cfg, ckpt)
    contexts = tiny.executor_contexts(tasks)
    # the repairs of the cold start's own wrong programs, frozen in its folder
    first = own_first_replies(cfg, eng, dirs["SFT"], tasks, contexts)
    contexts["repair_own"] = tiny.repair_contexts(tasks, first)
    contexts["copy_own"] = tiny.repair_contexts(tasks, first, copy=True)
    # its shares weight both executor rows
    sft = measure(cfg, eng, dirs["SFT"], tasks, contexts, None)
    rl = measure(cfg, eng, dirs["RL"], tasks, contexts, sft[2]["shares"])
    results = {"RL": rl, "SFT": sft}
    S = heldout.SAMPLES
    print(
        f"\nheld-out tiny tasks ({split} split): {len(tasks)}, {S} draws each "
        "(a design, executed once; T=1)"
    )
    print(f"{'':24s} {'accuracy':>9s}  structures")
    labels = {
        ("RL", 0): "RL: learned designs",
        ("RL", 1): "RL: single agent",
        ("SFT", 0): "SFT: designs",
        ("SFT", 1): "SFT: single agent",
    }
    rows = {}
    for who in ("RL", "SFT"):
        for k in (0, 1):
            acc, counter = results[who][k]
            rows[labels[who, k]] = {
                "accuracy": float(np.mean(acc)),
                "structures": structures_text(counter),
            }
            print(f"{labels[who, k]:24s} {np.mean(acc):9.1%}  {structures_text(counter)}")
    # RL and SFT rows ran on the same tasks in the same order: the paired difference is the honest
    # error bar
    gains = {}
    for what, k in (("learned designs", 0), ("single agent", 1)):
        gains[what] = report.paired_margin(rl[k][0], sft[k][0])
        m, se = gains[what]
        gain = f"RL - SFT, {what + ':':16s} {100 * m:+5.1f} points"
        print(f"{gain} (paired standard error {100 * se:.1f})")
    # the same comparison without sampling noise: what each model would write, by teacher forcing
    kinds, names = sorted({t["kind"] for t in tasks}), list(mas.TEMPLATES)
    print(
        "exact, teacher-forced on the same tasks (no sampling): "
        "P(the Designer writes each template's script | kind), "
        "P(the single agent writes the oracle reply)"
    )
    head = "   ".join(f"{k}: " + " ".join(f"{n:>8s}" for n in names) for k in kinds)
    print(f"{'':24s} {head}   oracle reply")
    for who in ("RL", "SFT"):
        f = results[who][2]
        cells = []
        for kind in kinds:
            idx = [i for i, t in enumerate(tasks) if t["kind"] == kind]
            shares = [100 * sum(f["choice"][i][n] for i in idx) / len(idx) for n in names]
            cells.append(" " * (len(kind) + 2) + " ".join(f"{v:8.1f}" for v in shares))
        print(f"{who:24s} " + "   ".join(cells) + f"   {100 * np.mean(f['oracle']):12.1f}")
    print(
        "exact, the Executor in its own contexts: P(oracle reply | context), mean over the tasks "
        "where it occurs; executor = the contexts weighted by the SFT Designer's structure shares "
        "(tiny.executor_score)"
    )
    for who in ("RL", "SFT"):
        f = results[who][2]
        known = {c: [v for v in vs if v is not None] for c, vs in f["contexts"].items()}
        cells = "  ".join(f"{c} {100 * np.mean(vs):5.1f}" for c, vs in known.items())
        print(f"{who:24s} {cells}  executor {100 * np.mean(f['executor']):5.1f}")
    for what, label in (
        ("suited", "P(suited template)"),
        ("executor", "Executor (exact)"),
        ("oracle", "P(oracle reply)"),
        ("executor_answer", "Executor, answer tokens"),
        ("executor_steps", "Executor, format+steps"),
    ):
        gains[what] = report.paired_margin(rl[2][what], sft[2][what])
        m, se = gains[what]
        gain = f"RL - SFT, {label + ':':24s} {100 * m:+5.1f} points"
        print(f"{gain} (paired standard error {100 * se:.1f})")
    # the repair rows: over the code tasks where the context occurs
    for what, label in (
        ("repair", "repair of wrong_reply's program"),
        ("repair_own", "repair of its own wrong program"),
    ):
        m, se, n = known_margin(rl[2][what], sft[2][what])
        gains[what] = (m, se)
        gain = f"RL - SFT, {label + ':':33s} {100 * m:+5.1f} points"
        print(f"{gain} (paired SE {100 * se:.1f}, {n} tasks)")
    # the habit: P(the repair copies the failed program), after wrong_reply's and its own
    for what, label in (
        ("copy", "copy of wrong_reply's program"),
        ("copy_own", "copy of its own wrong program"),
    ):
        m, se, n = known_margin(rl[2][what], sft[2][what])
        gains[what] = (m, se)
        gain = f"RL - SFT, {label + ':':33s} {100 * m:+5.1f} points"
        print(f"{gain} (paired SE {100 * se:.1f}, {n} tasks)")
    print(f"(suited: {', '.join(f'{v} on {k}' for k, v in tiny.SUITED.items())})")
    # sampled accuracy of the learned designs per kind, and weighted as the RL mix draws the kinds
    kinds_of = [t["kind"] for t in tasks]
    for kind in kinds:
        idx = [i for i, k in enumerate(kinds_of) if k == kind]
        gains[f"accuracy/{kind}"] = report.paired_margin(
            [rl[0][0][i] for i in idx], [sft[0][0][i] for i in idx]
        )
    mix = mix_shares(cfg)
    gains["accuracy/rl_mix"] = mixed_margin(gains, mix)
    # each template forced, on the code tasks
    for name in names:
        gains[f"code/{name}"] = report.paired_margin(rl[3][name], sft[3][name])
    print(
        "sampled accuracy of the learned designs per kind and at the RL mix "
        f"({', '.join(f'{k} {v:.0%}' for k, v in mix.items())}); each template forced on code:"
    )
    for who in ("RL", "SFT"):
        cells = "  ".join(f"{n} {100 * np.mean(results[who][3][n]):5.1f}" for n in names)
        print(f"{who:24s} {cells}")
    for what in (
        [f"accuracy/{k}" for k in kinds] + ["accuracy/rl_mix"] + [f"code/{n}" for n in names]
    ):
        m, se = gains[what]
        print(f"RL - SFT, {what + ':':24s} {100 * m:+5.1f} points (paired SE {100 * se:.1f})")
    train_change = training_change(cfg.out_dir)
    if train_change is not None:
        print(f"training accuracy, last 10% of steps - first 10%: {train_change:+.3f}")
    exact = {}
    keys = ("suited", "executor", "executor_answer", "executor_steps", "repair", "repair_own")
    keys += ("copy", "copy_own")
    for who in ("RL", "SFT"):
        f = results[who][2]
        exact[who] = {k: f[k] for k in keys}
        exact[who]["oracle"] = f["oracle"]
        exact[who]["choice"] = {n: [c[n] for c in f["choice"]] for n in names}
        exact[who]["contexts"] = f["contexts"]
    correct = {}  # the sampled rows' accuracy over the S draws, per task
    for who in ("RL", "SFT"):
        for k in (0, 1):
            correct[labels[who, k]] = results[who][k][0]
        # per template, on the code tasks (the "code_ids" order)
        for n in names:
            correct[f"{who}: code, {n}"] = results[who][3][n]
    table = {
        "tasks": len(tasks),
        "split": split,
        "samples": S,
        "rows": rows,
        "exact": {
            who: {w: float(np.mean(v[w])) for w in ("suited", "executor", "oracle")}
            for who, v in exact.items()
        },
        "own_wrong_programs": sum(v is not None for v in contexts["repair_own"]),
        "executor_shares": sft[2]["shares"],
        "rl_minus_sft": {
            w: {"points": 100 * m, "stderr": 100 * se} for w, (m, se) in gains.items()
        },
        # per task, in the order of "ids", so that runs of one seed (the same tasks) can be paired
        # task by task (ablations.py): the sampled rows' accuracy over the S draws and the exact
        # probabilities
        "rl_mix": mix,
        "train_change": train_change,
        "ids": [str(t["id"]) for t in tasks],
        "code_ids": [str(t["id"]) for t in tasks if t["kind"] == "code"],
        "kinds": [t["kind"] for t in tasks],
        "per_task": {"correct": correct, "exact": exact},
    }
    name = "final_table.json" if split == "eval" else f"final_table_{split}.json"
    with open(os.path.join(cfg.out_dir, name), "w") as f:  # for scripts (ablations.py)
        json.dump(table, f, indent=1)
    return table


# --------------------------------------------------------------------------------------------------
# a cold start's quality bar (sft.py prints it), with rollout.py's own machinery (the same code
# evaluate.py and RL use)


def evaluate_sft(model_path, tasks, *, designer_path=None, seed=0):
    """Quality-bar figures of a tiny cold start on held-out tasks.

    parse: share of Designer completions that parse into a script (one design per task); designer:
    accuracy of executing those designs once each; structures: their structure shares;
    templates[name]: accuracy of fixed template `name` (rollout's fixed-structure mode, one
    execution a task), "single" being the single-agent baseline. A run counts as correct when
    reward.py's correctness is 1. With designer_path the Designer's weights are swapped in for the
    design phase (separate policies)."""
    eng = engine_lib.make_engine(model_path, backend="lean")
    designer_eng = eng
    if designer_path is not None:  # one engine, each role's view of it holding that role's weights
        paths = {"designer": designer_path, "executor": model_path}
        # the engine: model_path's (the Executor's)
        held = weights.EngineWeights(eng, paths, held="executor")
        designer_eng, eng = held.view("designer"), held.view("executor")
    kw = {
        "short": True,
        "designer_sampling": engine_lib.Sampling(max_tokens=400),
        "chunk": max(1, len(tasks)),
        "executor_sampling": engine_lib.Sampling(max_tokens=128),
    }
    d = evaluate.evaluate_method(tasks, designer_eng, eng, "auto", 1, seed=seed, **kw)
    unparsed = d["structures"].pop("unparseable")
    out = {
        "tasks": len(tasks),
        "parse": 1 - unparsed,
        "designer": d["pass@1"],
        "structures": {k: v / (1 - unparsed) for k, v in d["structures"].items() if v > 0},
    }
    out["templates"], out["per_problem"] = {}, {"designs": d["per_problem"]}
    for name in mas.TEMPLATES:
        r = evaluate.evaluate_method(tasks, None, eng, f"template:{name}", 1, seed=seed + 1, **kw)
        out["templates"][name], out["per_problem"][name] = r["pass@1"], r["per_problem"]
    out["kinds"] = [t.get("kind", "?") for t in tasks]
    return out


def format_figures(fig):
    """The quality bar as text, from evaluate_sft's figures (every template, "single" among them,
    per task)."""
    t, pp, kinds = fig["templates"], fig["per_problem"], fig["kinds"]
    best = max((k for k in t if k != "single"), key=t.get)
    _, se = report.paired_margin(pp[best], pp["single"])
    lines = [
        f"held-out tasks: {fig['tasks']}",
        f"(a) designer completions that parse: {100 * fig['parse']:.1f}%   (target >= 95%)",
        f"    learned designs, executed once: {100 * fig['designer']:.1f}% correct; structures "
        + ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(fig["structures"].items())),
        f"(b) single agent accuracy: {100 * t['single']:.1f}%   (target 30-80%)",
        "(c) fixed templates: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in t.items()),
        f"    best template {best} beats single by {100 * (t[best] - t['single']):+.1f} points "
        f"(paired standard error {100 * se:.1f}; clear when above 2 standard errors)",
    ]
    if len(set(kinds)) > 1:
        # which structure pays depends on the kind of task: the learned Designer's whole premise
        for kind in sorted(set(kinds)):
            idx = [i for i, k in enumerate(kinds) if k == kind]
            acc = {name: sum(pp[name][i] for i in idx) / len(idx) for name in pp}
            top = max((k for k in acc if k not in ("single", "designs")), key=acc.get)
            m, se = report.paired_margin([pp[top][i] for i in idx], [pp["single"][i] for i in idx])
            lines.append(
                f"    {kind} ({len(idx)} tasks): "
                + ", ".join(f"{k} {100 * v:.1f}%" for k, v in acc.items())
                + f"; best template {top} {100 * m:+.1f} +- {100 * se:.1f} over single"
            )
    return "\n".join(lines)


def main(argv):
    p = argparse.ArgumentParser(
        description="a finished tiny run's final table, again (its last checkpoint)"
    )
    p.add_argument("run_dir")
    p.add_argument("--split", default="eval", choices=sorted(heldout.SEEDS))
    p.add_argument(
        "--tasks", type=int, default=None, help="held-out tasks (default: the run's eval_tasks)"
    )
    a = p.parse_args(argv)
    if not os.path.isdir(a.run_dir):
        sys.exit(f"final_table.py: no run folder {a.run_dir} (train.py makes it: its --out_dir)")
    steps = rundir.checkpoints(a.run_dir)
    if not steps:
        why = "train.py writes them: step_000040/ ..."
        sys.exit(f"final_table.py: {a.run_dir!r} holds no checkpoint ({why})")
    ckpt = os.path.join(a.run_dir, steps[-1])
    ts = rundir.trainer_state(ckpt)
    cfg = settings.Config(**{**ts["config"], "out_dir": a.run_dir})
    if a.tasks is not None:
        cfg.eval_tasks = a.tasks
    torch.set_num_threads(cpu_bits.threads(len(os.sched_getaffinity(0))))
    name = "model" if cfg.policy == "shared" else "designer"
    eng = engine_lib.make_engine(os.path.join(ckpt, name), backend="lean")
    final_table(cfg, eng, ckpt, a.split)


if __name__ == "__main__":
    cpu_bits.restart_pinned(__file__)  # the tiny world on a CPU: the same bits on any x86 CPU
    main(sys.argv[1:])
