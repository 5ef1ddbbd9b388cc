"""final_table.py: the table the tiny default ends with: the RL model against its SFT cold start on held-out tasks.

Both models on the same 200 tasks of the tiny world's "eval" split (which neither the cold start nor RL sees),
1 design x 1 execution each, and the paired difference task by task:

    RL - SFT = mean_t (x_RL,t - x_SFT,t),   SE = std_t(x_RL,t - x_SFT,t) / sqrt(T)      (evaluate.paired_margin)

Rows: the sampled accuracy of the learned designs and of the single agent, and the exact rows by teacher forcing
(tiny.exact_figures), which carry no sampling noise: P(the Designer writes each template | kind of task), its
share on the template that suits the kind (tiny.SUITED: `suited`, the Designer's primary row), P(the Executor
writes the oracle reply) in each of its contexts, and those contexts weighted by the SFT Designer's structure
shares (tiny.executor_score: `executor`, the Executor's primary row; `oracle` is the single agent's context).
Sampled accuracy on 200 tasks carries ~3.5 points of noise; the exact rows show what was learned even when the
accuracy cannot resolve it. Printed, and written to out_dir/final_table.json with the per-task vectors, so
that runs of one seed (the same tasks) pair task by task (ablations.py).

    final_table(cfg, engine, sources, "out/tiny-rl/step_000040")   # train.py's last act, rank 0

Needs: evaluate.py, settings.py, stagewise.py, engine.py, decode.py, chunked.py, tiny.py, rollout.py, mas.py,
sandbox.py, isolation.py, reward.py, data.py, advantage.py, show.py
"""

import json
import os
from collections import Counter

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import engine as engine_lib
import evaluate
import mas
import rollout as rollout_lib
import settings
import tiny


def heldout_tasks(cfg):
    """cfg.eval_tasks tiny tasks from the "eval" split, which neither the cold start nor RL draws from
    (tiny.SPLITS: the split is a hash of the text the model is shown, so no training task shows the same text;
    the final table runs for the tiny data alone, data_mix {"tiny"}, whose tasks are the "rl" split's)."""
    return tiny.make_tasks(cfg.eval_tasks, seed=cfg.seed + 1_000_003, split="eval")


def heldout_row(cfg, eng, tasks, template, on_phase):
    """One sampled row of the final table: 1 design x 1 execution a task -> (reward, accuracy, structure shares
    as text, per-task correct)."""
    b = rollout_lib.rollout(tasks, eng, eng, 1, 1, 10**6, seed=cfg.seed + 31, template=template,
                            designer_sampling=engine_lib.Sampling(max_tokens=cfg.designer_max_tokens),
                            executor_sampling=engine_lib.Sampling(max_tokens=cfg.max_tokens),
                            short=settings.is_tiny(cfg), lam=cfg.lam, on_phase=on_phase)
    recs = b.records(tasks)
    n, shares = max(len(recs), 1), Counter(r["structure"] for r in recs)
    return (sum(r["reward"] for r in recs) / n, sum(r["correct"] for r in recs) / n,
            ", ".join(f"{k} {v / n:.0%}" for k, v in shares.most_common()), [float(r["correct"]) for r in recs])


def final_table(cfg, eng, sources, ckpt):
    """train.py's last act (eval_tasks > 0, tiny data, rank 0): the RL models of checkpoint `ckpt` and the SFT
    cold start on the same held-out tasks, sampled and exact, printed and written to out_dir/final_table.json.
    `eng` is the run's engine: each row loads the weights it needs into it. `sources`, the run's training
    tasks, are all of the "rl" split (heldout_tasks says why none can be held out).

    Rows: sampled accuracy of the learned designs and of the single agent, RL against SFT with paired standard
    errors, and exact rows by teacher forcing (tiny.exact_figures): P(the Designer writes each template | kind of
    task), P(the Executor writes the oracle reply | context), and the primary rows `suited` and `executor`."""
    tasks = heldout_tasks(cfg)
    sft = settings.model_dirs(cfg)
    dirs = {"RL": {r: os.path.join(ckpt, "model" if cfg.policy == "shared" else r) for r in ("designer", "executor")},
            "SFT": {r: sft["model" if cfg.policy == "shared" else r] for r in ("designer", "executor")}}
    rows, exact, contexts = [], {}, tiny.executor_contexts(tasks)
    for who in ("RL", "SFT"):
        loaded = {d: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32) for d in set(dirs[who].values())}
        models = {r: loaded[d] for r, d in dirs[who].items()}   # shared: one model plays both roles
        eng.load_weights(models["designer"].state_dict())
        # separate policies: the engine holds the designer's weights in the design phase, the executor's after
        on_phase = (lambda role, m=models: eng.load_weights(m[role].state_dict())) \
            if cfg.policy == "separate" else None
        rows += [("RL: learned designs" if who == "RL" else "SFT: designs", heldout_row(cfg, eng, tasks, None, on_phase)),
                 (f"{who}: single agent", heldout_row(cfg, eng, tasks, "single", on_phase))]
        tok = AutoTokenizer.from_pretrained(dirs[who]["designer"])
        shared = models["executor"] is models["designer"]
        exact[who] = tiny.exact_figures(models["designer"], tok, tasks, executor=shared, contexts=contexts)
        if not shared:   # separate policies: the Executor's contexts are the executor model's
            exact[who].update(tiny.exact_figures(models["executor"], tok, tasks, designer=False, contexts=contexts))
    # (the training reward is in metrics.jsonl: other queries at every step; the paired rows below measure)
    print(f"\nheld-out tiny tasks: {len(tasks)} (1 design x 1 execution each, T=1)")
    print(f"{'':24s} {'reward':>7s} {'accuracy':>9s}  structures")
    for name, (rw, acc, sh, _) in rows:
        print(f"{name:24s} {rw:7.3f} {acc:9.1%}  {sh}")
    # RL and SFT rows ran on the same tasks in the same order: the paired difference is the honest error bar
    gains = {}
    for what, a, b in (("learned designs", 0, 2), ("single agent", 1, 3)):
        gains[what] = evaluate.paired_margin(rows[a][1][3], rows[b][1][3])
        print(f"RL - SFT, {what + ':':16s} {100 * gains[what][0]:+5.1f} points (paired standard error "
              f"{100 * gains[what][1]:.1f})")
    # the same comparison without sampling noise: what each model would write, by teacher forcing
    kinds, names = sorted({t["kind"] for t in tasks}), list(mas.TEMPLATES)
    print("exact, teacher-forced on the same tasks (no sampling): P(the Designer writes each template's "
          "script | kind), P(the single agent writes the oracle reply)")
    print(f"{'':24s} " + "   ".join(f"{k}: " + " ".join(f"{n:>8s}" for n in names) for k in kinds)
          + "   oracle reply")
    # the Executor's primary row: its contexts weighted by the SFT Designer's structure shares (tiny.executor_score)
    kind_of = [t["kind"] for t in tasks]
    shares = {}
    for kind in kinds:
        mass = {n: sum(c[n] for c, k in zip(exact["SFT"]["choice"], kind_of) if k == kind) for n in names}
        shares[kind] = {n: v / sum(mass.values()) for n, v in mass.items()}
    summary = {}
    for who, f in exact.items():
        cells = []
        for kind in kinds:
            idx = [i for i, t in enumerate(tasks) if t["kind"] == kind]
            cells.append(" " * (len(kind) + 2) + " ".join(
                f"{100 * sum(f['choice'][i][n] for i in idx) / len(idx):8.1f}" for n in names))
        print(f"{who:24s} " + "   ".join(cells) + f"   {100 * np.mean(f['oracle']):12.1f}")
        # the structure each kind profits from most (tiny.SUITED; sft.py's quality bar measures it)
        summary[who] = {"suited": [c.get(tiny.SUITED.get(k), 0.0) for c, k in zip(f["choice"], kind_of)],
                        "executor": tiny.executor_score(f["contexts"], kind_of, shares), "oracle": list(f["oracle"])}
    print("exact, the Executor in its own contexts: P(oracle reply | context), mean over the tasks where it occurs; "
          "executor = the contexts weighted by the SFT Designer's structure shares (tiny.executor_score)")
    for who, f in exact.items():
        known = {c: [v for v in vs if v is not None] for c, vs in f["contexts"].items()}
        print(f"{who:24s} " + "  ".join(f"{c} {100 * np.mean(vs):5.1f}" for c, vs in known.items())
              + f"  executor {100 * np.mean(summary[who]['executor']):5.1f}")
    for what, label in (("suited", "P(suited template)"), ("executor", "Executor (exact)"),
                        ("oracle", "P(oracle reply)")):
        gains[what] = evaluate.paired_margin(summary["RL"][what], summary["SFT"][what])
        print(f"RL - SFT, {label + ':':19s} {100 * gains[what][0]:+5.1f} points (paired standard error "
              f"{100 * gains[what][1]:.1f})")
    print(f"(suited: {', '.join(f'{v} on {k}' for k, v in tiny.SUITED.items())})")
    table = {"tasks": len(tasks),
             "rows": {name: {"reward": rw, "accuracy": acc, "structures": sh} for name, (rw, acc, sh, _) in rows},
             "exact": {who: {w: float(np.mean(v[w])) for w in ("suited", "executor", "oracle")}
                       for who, v in summary.items()},
             "executor_shares": shares,
             "rl_minus_sft": {w: {"points": 100 * m, "stderr": 100 * se} for w, (m, se) in gains.items()},
             # per task, in the order of "ids", so that runs of one seed (the same tasks) can be paired task by
             # task (ablations.py): the sampled rows' correctness and the exact probabilities
             "ids": [str(t["id"]) for t in tasks], "kinds": [t["kind"] for t in tasks],
             "per_task": {"correct": {name: r[3] for name, r in rows},
                          "exact": {who: {**summary[who], "choice": {n: [c[n] for c in f["choice"]] for n in names},
                                          "contexts": f["contexts"]} for who, f in exact.items()}}}
    with open(os.path.join(cfg.out_dir, "final_table.json"), "w") as f:   # for scripts (ablations.py)
        json.dump(table, f, indent=1)
