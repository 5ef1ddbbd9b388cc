"""train.py end to end on a small model that learns (transformers backend, B=4, M=2, N=2, a few
steps).

The model is a 2-layer, 64-wide tiny model after a 400-step SFT on tiny traces (built once per
module): sampled at T=1 it writes a parseable script about 40% of the time and well-formed replies
some of the time, so the rollouts carry real advantages for both roles (the tests check that they
are non-zero). With them:

- bad config values and a used out_dir stop the run with a clear message before any model loads;
- two seeded uninterrupted runs end with the same weights;
- a run SIGKILLed at five points of its steps (tests/kill_at.py: mid-rollout, mid-update, between a
  checkpoint's files, between a step's metrics line and its checkpoint, right after a checkpoint)
  and resumed each time ends with the same weights and the same metrics lines (timings aside) as the
  uninterrupted run;
- so does a run at 2 gloo ranks (torchrun), each rank saving and reading back its own shards of the
  master weights and Adam states (the checkpoint's state/ folder);
- torchrun --nproc_per_node=2 (gloo, FSDP2) ends with the same weights, losses and grad norms as one
  process on the same global batch (within float tolerance), and both ranks' engines hold identical
  weights;
- with a shared policy and one role per step, each role's steps use their own optimizer state.
"""

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import rollout as rollout_lib
import settings
import stagewise
import train
from machinery import data, loggers, logprob_rows, recorder, rundir
from world import final_table

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny model that has learned the four templates a little (see the module docstring)."""
    import sft
    from world import tiny

    out = str(tmp_path_factory.mktemp("model") / "learner")
    tasks = tiny.make_tasks(400, seed=0, split="sft")
    designer, executor = tiny.sft_traces(tasks, seed=0)
    model, tok = tiny.build_model(seed=0, hidden_size=64, num_layers=2)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    # every core, as when this module runs alone (three other modules set one thread at import)
    threads = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    try:
        sft.train_sft(
            model,
            tok,
            designer[:400] + executor,
            steps=400,
            lr=2e-3,
            batch_size=16,
            out_dir=out,
            seed=0,
            optimizer="muon",
            log=lambda *a, **k: None,
        )
    finally:
        torch.set_num_threads(threads)
    return out


def args_for(model_dir, out_dir, steps=3, **kw):
    base = dict(
        init_from=str(model_dir),
        out_dir=str(out_dir),
        backend="hf",
        data_mix="{'tiny': 1.0}",
        batch_size=4,
        M=2,
        N=2,
        K=1,
        steps=steps,
        save_every=1,
        max_tokens=48,
        designer_max_tokens=400,
        executor_lr=5e-5,
        designer_lr=1e-4,
        micro_batch=8,
        minibatches=1,
        logprobs="plain",
        eval_tasks=0,
        probe_tasks=0,
        seed=0,
    )
    base.update(kw)
    return ["config/tiny.py"] + [f"--{k}={v}" for k, v in base.items()]


def run(args, timeout=600):
    p = subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def weights(ckpt):
    from safetensors.torch import load_file

    return load_file(str(Path(ckpt) / "model" / "model.safetensors"))


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def same_state(a, b):
    """Two rundir.read_state results bit for bit: tensors equal, the rest == (a tuple and a list
    alike: a resumed optimizer's betas come back a list, torch's state-dict round trip)."""
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
        )
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(same_state, a, b))
    if torch.is_tensor(a):
        return torch.is_tensor(b) and torch.equal(a, b)
    return a == b


def distance(a, b, keys):
    """The L2 distance between two sets of weights, over the names in keys (a float: pytest.approx
    takes no tensors)."""
    return float(sum((a[k] - b[k]).double().norm() ** 2 for k in keys) ** 0.5)


def metrics(out_dir, name="metrics.jsonl"):
    return [json.loads(ln) for ln in (Path(out_dir) / name).read_text().splitlines()]


def step_lines(out_dir):
    """metrics.jsonl's lines of the steps (a step-0 line holds the held-out curve's start alone)."""
    return [m for m in metrics(out_dir) if m["step"] > 0]


def trees(out_dir):
    return metrics(out_dir, "rollouts.jsonl")


def tensorboard_events(folder):
    """{(tag, step): [values]} over every event file in folder, read with TensorBoard's own
    reader."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    out = {}
    for path in sorted(Path(folder).glob("events.out.tfevents.*")):
        for e in EventFileLoader(str(path)).Load():  # (it reads a scalar summary as a 0-d tensor)
            for v in e.summary.value:
                out.setdefault((v.tag, e.step), []).append(
                    np.float32(make_ndarray(v.tensor).item())
                )
    return out


def wandb_history(path):
    """{step: {key: value}} of one offline wandb run (its .wandb file, through
    loggers.offline_steps' reader)."""
    out = {}
    for rec in loggers.wandb_records(str(path)):
        if rec.WhichOneof("record_type") == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item
            }
            # wandb's own: _step, _timestamp
            row = {k: v for k, v in items.items() if not k.startswith("_")}
            assert rec.history.step.num not in out
            out[rec.history.step.num] = row
    return out


# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--bogus=1", "unknown config key 'bogus'"),
        ("--M=two", "'M' must be int"),
        ("--designer_lr=[1]", "'designer_lr' must be float"),
        ("--data_mix={}", "data_mix is empty"),
        ("--data_mix={'missing.jsonl': 1.0}", "'missing.jsonl' (in data_mix) not found"),
        ("--data_mix={'tiny': 0}", "weight of 'tiny' must be a number > 0"),
        ("--mode=sometimes", "unknown mode 'sometimes'"),
        ("--policy=both", "policy must be one of"),
    ],
)
def test_bad_config_is_reported_before_any_model_loads(tmp_path, flag, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        train.main(["config/tiny.py", f"--out_dir={out}", "--init_from=does/not/matter", flag])
    assert message in str(e.value.code)
    assert not out.exists()  # nothing was set up: the check ran before the models
    assert not torch.distributed.is_initialized()


def test_executor_batch_size_applies_to_executor_only_steps():
    cfg = settings.parse_config(["config/tiny.py", "--batch_size=8", "--executor_batch_size=32"])
    assert [
        stagewise.step_batch(
            stagewise.active_roles(t, "stagewise", 2, "designer"),
            cfg.batch_size,
            cfg.executor_batch_size,
        )
        for t in range(5)
    ] == [8, 8, 32, 32, 8]
    # coupled: one batch for both roles
    assert stagewise.step_batch({"designer", "executor"}, 8, 32) == 8
    # 0 = batch_size
    assert stagewise.step_batch({"executor"}, 8, 0) == 8
    with pytest.raises(
        settings.ConfigError, match="executor_batch_size=6 must be divisible by the number of ranks"
    ):
        settings.validate(settings.parse_config(["--executor_batch_size=6"]), world=4)
    # config/both_roles.py: the Executor's 30 steps of 32 queries first, then the Designer's 15 of 8
    both = settings.parse_config(["config/tiny.py", "config/both_roles.py"])
    settings.validate(both)
    plan = [
        (sorted(r), stagewise.step_batch(r, both.batch_size, both.executor_batch_size))
        for r in (
            stagewise.active_roles(t, both.mode, both.K, both.first_role) for t in range(both.steps)
        )
    ]
    assert plan == [(["executor"], 32)] * 30 + [(["designer"], 8)] * 15


def test_bad_config_from_the_command_line(tmp_path):
    p = subprocess.run(
        [sys.executable, "train.py", "--M=2", "--mode=sometimes", "--bogus_key=3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode != 0
    assert "unknown config key 'bogus_key'" in p.stderr and "Traceback" not in p.stderr


def test_parse_config_types_and_files(tmp_path):
    cfg = settings.parse_config(
        ["config/qwen3_4b.py", "--M=8", "--N=1", "--backend=hf", "--resume"]
    )
    assert (cfg.M, cfg.N, cfg.backend, cfg.resume, cfg.designer_lr) == (8, 1, "hf", True, 5e-6)
    assert cfg.init_from == "out/sft-qwen3-4b"  # the 4B preset on top of the 8B one
    assert settings.parse_config([]).out_dir == "out/tiny-rl"  # no file: the tiny default
    # an int where a float is expected is fine
    assert settings.parse_config(["--clip_eps=1"]).clip_eps == 1.0
    bad = tmp_path / "bad.py"
    bad.write_text("M = 4\nlearning_rate = 1e-3\n")
    with pytest.raises(settings.ConfigError, match="learning_rate"):
        settings.parse_config([str(bad)])
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    # validate() refuses a used out_dir, and the checkout's out/tiny-rl holds a run once the main
    # job has run
    own = f"--out_dir={tmp_path / 'run'}"
    cfg = settings.parse_config([f"--data_mix={{'{data}': 1.0}}", "--init_from=.", own])
    settings.validate(cfg)
    with pytest.raises(settings.ConfigError, match="no tasks"):
        train.load_mix(cfg)
    with pytest.raises(settings.ConfigError, match="divisible"):
        settings.validate(settings.parse_config(["--batch_size=3", "--init_from=.", own]), world=2)
    # a fixed structure has no Designer: a stagewise run would silently train nothing half the time
    with pytest.raises(settings.ConfigError, match="mode='executor'"):
        settings.validate(settings.parse_config(["--template=single", "--init_from=.", own]))
    settings.validate(
        settings.parse_config(["--template=single", "--mode=executor", "--init_from=.", own])
    )
    # per-role lr: one shared optimizer step cannot serve two learning rates
    with pytest.raises(settings.ConfigError, match="designer_lr != executor_lr"):
        settings.validate(
            settings.parse_config(["--mode=coupled", "--designer_lr=1e-4", "--init_from=.", own])
        )
    settings.validate(
        settings.parse_config(
            ["--mode=coupled", "--designer_lr=1e-4", "--policy=separate", "--init_from=.", own]
        )
    )
    with pytest.raises(settings.ConfigError, match="ac_policy must be one of"):
        settings.validate(settings.parse_config(["--ac_policy=some", "--init_from=.", own]))
    with pytest.raises(settings.ConfigError, match="logprobs must be one of"):
        settings.validate(settings.parse_config(["--logprobs=fast", "--init_from=.", own]))
    cfg = settings.parse_config(["--executor_lr=1e-5", "--designer_lr=1e-4"])
    # (each role's lr in training: test_seeded_runs_agree_with_real_advantages)
    assert (cfg.designer_lr, cfg.executor_lr) == (1e-4, 1e-5)
    # separate policies start from init_from's designer/ and executor/ (sft.py --roles separate
    # writes them)
    sep = settings.parse_config(["config/tiny.py", "config/ablation_separate.py"])
    assert settings.model_dirs(sep) == {
        "designer": "out/tiny-sft-separate/designer",
        "executor": "out/tiny-sft-separate/executor",
    }


def test_a_cold_start_is_whole_with_every_model_folder(tmp_path):
    # sft.py --roles separate renames designer/ into place before executor/: a build stopped
    # between them is not whole, and train.py's tiny world makes it again
    assert not rundir.cold_start_whole(str(tmp_path / "none"))
    (tmp_path / "designer").mkdir()
    assert rundir.cold_start_whole(str(tmp_path))  # shared: the folder itself
    assert not rundir.cold_start_whole(str(tmp_path), separate=True)
    (tmp_path / "executor").mkdir()
    assert rundir.cold_start_whole(str(tmp_path), separate=True)


def test_lr_schedule_and_its_step(tmp_path, group):
    """Config.lr_schedule: constant 1; warmup_cosine [authors] up over 10 steps, then cosine to 0.3
    at the last step. The update steps at the role's lr times that factor, its gradient clipped to
    grad_clip (the norm it records is the one before the clip)."""
    flat, cos = settings.Config(steps=50), settings.Config(steps=50, lr_schedule="warmup_cosine")
    assert [train.lr_factor(flat, t) for t in (0, 10, 49)] == [1.0, 1.0, 1.0]
    f = [train.lr_factor(cos, t) for t in range(50)]
    # (t + 1) / 10, then 0.3 + 0.7 (1 + cos(pi p)) / 2: a few ulps off the decimals
    assert f[0] == pytest.approx(0.1) and f[9] == f[10] == pytest.approx(1.0)
    assert f[49] == pytest.approx(0.3) and f[29] == pytest.approx(
        0.3 + 0.7 * (1 + math.cos(math.pi * 19 / 39)) / 2
    )
    assert all(a >= b for a, b in zip(f[10:], f[11:]))  # non-increasing after the warmup
    if group is None:
        return
    from world import tiny

    tiny.save_tiny(str(tmp_path / "m"), seed=0, hidden_size=32, num_layers=2)
    cfg = settings.Config(
        init_from=str(tmp_path / "m"),
        mode="executor",
        steps=50,
        lr_schedule="warmup_cosine",
        executor_lr=1e-3,
        grad_clip=1e-3,
    )
    policies, policy_of = train.make_policies(cfg, None, None, torch.device("cpu"))
    samples = repeated_prompt_samples(seed=1)
    adv = torch.randn(len(samples), generator=torch.Generator().manual_seed(3))
    rows = train.rows_for(cfg, 0)
    stats = train.update(
        cfg,
        4,
        train.lr_factor(cfg, 4),
        {"executor": (samples, adv)},
        policy_of,
        rows,
        torch.device("cpu"),
        1,
    )
    assert stats["lr"] == pytest.approx(1e-3 * 0.5)  # step 4 of the warmup
    # one CPU process keeps the step's gradient, clipped, until the next update
    grads = [p.grad for p in policies["model"]["model"].parameters()]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert stats["model/grad_norm"] > 10 * cfg.grad_clip
    assert norm.item() == pytest.approx(cfg.grad_clip, rel=1e-4)


def test_sample_queries_resumes_at_the_saved_position():
    sources = [list(range(5)), list(range(100, 103))]
    pos = [0, 0]
    full = [data.sample_queries(sources, [1.0, 1.0], s, 4, 0, pos) for s in range(6)]
    pos2 = [0, 0]
    for s in range(3):
        data.sample_queries(sources, [1.0, 1.0], s, 4, 0, pos2)
    again = [data.sample_queries(sources, [1.0, 1.0], s, 4, 0, list(pos2)) for s in range(3, 4)]
    assert again[0] == full[3]
    # within a source's epoch every task is drawn once
    pos = [0]
    drawn = [
        t for s in range(5) for t in data.sample_queries([list(range(10))], [1.0], s, 2, 0, pos)
    ]
    assert sorted(drawn) == list(range(10))


STEPS = 4


@pytest.fixture(scope="module")
def uninterrupted(model_dir, tmp_path_factory):
    """One seeded uninterrupted run (stagewise with K=1: the roles alternate, each with its own Adam
    state)."""
    out = tmp_path_factory.mktemp("runs") / "a"
    # the held-out curve at every checkpoint
    run(args_for(model_dir, out, steps=STEPS, probe_tasks=2))
    return out


def without_timings(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_seeded_runs_agree_with_real_advantages(model_dir, uninterrupted, tmp_path):
    a, b = uninterrupted, tmp_path / "b"
    # b prints the final table too
    pb = run(args_for(model_dir, b, steps=STEPS, eval_tasks=4, probe_tasks=2))
    wa, wb = weights(a / f"step_{STEPS:06d}"), weights(b / f"step_{STEPS:06d}")
    assert same_weights(wa, wb), "two seeded runs differ"
    assert without_timings(metrics(a)) == without_timings(metrics(b))
    ma = step_lines(a)
    # run.json records every setting the update and the reward use
    config = json.loads((a / "run.json").read_text())["config"]
    knobs = ("lam", "clip_eps", "grad_clip", "weight_decay", "lr_schedule", "chat_template_kwargs")
    assert {k: config[k] for k in knobs} == {k: getattr(settings.Config(), k) for k in knobs}
    # the held-out curve (probe_tasks 2, a checkpoint every step): the cold start at step 0, with
    # the structure shares that weight the executor row, then every checkpoint's
    start = metrics(a)[0]
    assert start["step"] == 0 and not any(k.startswith("time/") for k in start)
    for kind in ("math", "code"):
        shares = [
            start[f"heldout/share/{kind}/{n}"] for n in ("single", "ensemble", "critic", "tester")
        ]
        assert sum(shares) == pytest.approx(1.0)
    for m in [start] + ma:
        assert all(
            0 <= m[f"heldout/{k}"] <= 1 for k in ("accuracy", "suited", "executor", "unparsed")
        )
        assert m["heldout/accuracy_se"] >= 0
    # where the learning signal goes (recorder.signal_metrics), each a share or a non-negative mean
    for m in ma:
        for k in (
            "signal/all_correct",
            "signal/all_wrong",
            "designer/dead_groups",
            "executor/dead_groups",
            "signal/same_structure",
        ):
            assert 0 <= m[k] <= 1, k
        assert m["signal/all_correct"] + m["signal/all_wrong"] <= 1
        assert (
            m["signal/reward_std"] >= 0
            and m["entropy/designs"] >= 0
            and m["entropy/executor_tokens"] >= 0
        )
        assert m[f"{m['active']}/grad_norm"] == m["model/grad_norm"]
        # the repairs' dose (recorder.repair_metrics): trained on an Executor step alone
        trained = m["repair/calls"] if "executor" in m["active"] else 0
        assert m["repair/calls"] >= 0 and m["repair/trained"] == trained
        assert 0 <= m.get("repair/copy_rate", 0) <= 1
    # real learning signal: some advantages of each role are non-zero, and both roles' steps moved
    # the weights
    assert (
        min(m["designer/adv_zero_frac"] for m in ma) < 1
        and min(m["executor/adv_zero_frac"] for m in ma) < 1
    )
    assert any(m["designer/loss"] != 0 for m in ma if "designer/loss" in m)
    assert any(m["executor/loss"] != 0 for m in ma if "executor/loss" in m)
    table = json.loads((b / "final_table.json").read_text())
    assert table["tasks"] == 4 and set(table["rows"]) == {
        "RL: learned designs",
        "RL: single agent",
        "SFT: designs",
        "SFT: single agent",
    }
    parts = ("executor_answer", "executor_steps", "repair", "repair_own", "copy", "copy_own")
    per_kind = [f"accuracy/{k}" for k in sorted(set(table["kinds"]))] + ["accuracy/rl_mix"]
    per_template = [f"code/{n}" for n in ("single", "ensemble", "critic", "tester")]
    assert set(table["rl_minus_sft"]) == {
        "learned designs",
        "single agent",
        "suited",
        "executor",
        "oracle",
        *parts,
        *per_kind,
        *per_template,
    }
    # the run's data mix, {"tiny": 1.0}: both kinds interleaved
    assert table["rl_mix"] == {"code": 0.5, "math": 0.5}
    # per kind: the learned designs' accuracy over that kind's tasks, RL minus SFT
    correct = table["per_task"]["correct"]
    for kind in sorted(set(table["kinds"])):
        idx = [i for i, k in enumerate(table["kinds"]) if k == kind]
        d = [correct["RL: learned designs"][i] - correct["SFT: designs"][i] for i in idx]
        got = table["rl_minus_sft"][f"accuracy/{kind}"]["points"]
        assert got == pytest.approx(100 * sum(d) / len(d))
    mix = sum(
        w * table["rl_minus_sft"][f"accuracy/{k}"]["points"] for k, w in table["rl_mix"].items()
    )
    assert table["rl_minus_sft"]["accuracy/rl_mix"]["points"] == pytest.approx(mix)
    # each template forced on the code tasks: one value a code task, in code_ids' order
    assert table["code_ids"] == [i for i, k in zip(table["ids"], table["kinds"]) if k == "code"]
    for n in ("single", "ensemble", "critic", "tester"):
        rl, sft = correct[f"RL: code, {n}"], correct[f"SFT: code, {n}"]
        assert len(rl) == len(table["code_ids"]) and all(0 <= v <= 1 for v in rl + sft)
        got = table["rl_minus_sft"][f"code/{n}"]["points"]
        assert got == pytest.approx(100 * (sum(rl) - sum(sft)) / len(rl))
    # the training accuracy's change, from metrics.jsonl (4 steps: 10% is one step, so the last
    # minus the first)
    acc = [m["accuracy"] for m in ma]
    assert table["train_change"] == pytest.approx(acc[-1] - acc[0])
    # the new exact rows, per task: probabilities, None where a repair context does not occur
    # (math tasks; code tasks whose own frozen reply passed the visible tests)
    own = json.loads(Path(model_dir, final_table.OWN_REPLIES).read_text())
    code = [i for i, k in zip(table["ids"], table["kinds"]) if k == "code"]
    assert code and set(code) <= set(own)  # every code task's own reply, frozen in the cold start
    for who in ("RL", "SFT"):
        ex = table["per_task"]["exact"][who]
        for k in parts:
            assert all(v is None or 0 <= v <= 1 for v in ex[k]) and len(ex[k]) == 4
        assert sum(v is not None for v in ex["repair_own"]) == table["own_wrong_programs"]
        kinds = table["kinds"]
        assert [v is None for v in ex["repair"]] == [k == "math" for k in kinds]
    for what in [*parts, *per_kind, *per_template]:
        del table["rl_minus_sft"][what]
    for what, gain in table["rl_minus_sft"].items():  # paired: RL row minus SFT row, task by task
        # exact (teacher-forced) probabilities, not sampled accuracies
        if what in (
            "suited",
            "executor",
            "oracle",
        ):
            rl, sft = (table["exact"][who][what] for who in ("RL", "SFT"))
            assert 0 <= rl <= 1 and 0 <= sft <= 1
        else:
            rl, sft = (
                table["rows"][n]["accuracy"]
                for n in (
                    ("RL: learned designs", "SFT: designs")
                    if what == "learned designs"
                    else ("RL: single agent", "SFT: single agent")
                )
            )
            assert f"RL - SFT, {what}:" in pb.stdout
        assert gain["points"] == pytest.approx(100 * (rl - sft)) and gain["stderr"] >= 0
    assert "RL - SFT, P(suited template):" in pb.stdout
    # rollouts.jsonl: every query of every step (record_queries 8 >= B), the same in both seeded
    # runs; A_D is advantage.py's of the recorded R, A_E is null exactly where no run happened; show
    # draws it
    import advantage

    ta = trees(a)
    assert ta == trees(b) and [(t["step"], t["query"]) for t in ta] == [
        (s, q) for s in range(1, 5) for q in range(4)
    ]
    for t in ta:
        assert [sc["A_D"] for sc in t["scripts"]] == pytest.approx(
            advantage.designer_advantages(t["R"]).tolist()
        )
        assert t["role"] == ma[t["step"] - 1]["active"] and t["task"]["kind"] in ("math", "code")
        for sc in t["scripts"]:
            assert len(sc["runs"]) == 2 and all(
                (r["A_E"] is None) == (not sc["parsed"]) for r in sc["runs"]
            )
            assert all(
                c["prompt"][-1]["role"] == "user" and isinstance(c["reply"], str)
                for r in sc["runs"]
                for c in r["calls"]
            )
            # an unparsed script ran nothing
            assert sc["parsed"] or not any(r["calls"] for r in sc["runs"])
    assert any(r["calls"] for t in ta for sc in t["scripts"] for r in sc["runs"])
    # the page, as the README makes it
    p = subprocess.run(
        [sys.executable, "tools/show.py", str(b), "--steps", "2:3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and "s3-q0-i1-j1" in (b / "rollouts.html").read_text()
    assert [m["step"] for m in ma] == list(range(1, STEPS + 1))
    # the Executor first
    assert [m["active"] for m in ma] == ["executor", "designer"] * (STEPS // 2)
    # designer_lr on the Designer's steps, executor_lr on the Executor's
    assert [m["lr"] for m in ma] == [5e-5, 1e-4] * (STEPS // 2)
    assert all(m["samples/designer"] == 8 for m in ma)  # B x M
    # on-policy (1 epoch, 1 minibatch): the old log-probs are the training forward's own, rho = 1
    # (a step whose advantages are all zero trains no sample, and reports ratio and clip share 0)
    trained = [m for m in ma if m[f"{m['active']}/adv_zero_frac"] < 1]
    assert trained and all(
        m[f"{m['active']}/ratio_mean"] == 1.0 and m[f"{m['active']}/clip_frac"] == 0.0
        for m in trained
    )
    from safetensors.torch import load_file

    w0 = load_file(str(Path(model_dir) / "model.safetensors"))
    assert any(not torch.equal(w0[k], wa[k]) for k in w0), "no update changed the weights"
    for key in (
        "reward/mean",
        "accuracy",
        "format_rate",
        "script_error_rate",
        "designer/adv_std",
        "time/design",
        "time/execute",
        "time/grade",
        "time/update",
        "time/weight_sync",
        "tokens/executor",
        "lr",
    ):
        assert key in ma[0], key
    assert "executor/logprob_gap" in ma[0] and "designer/logprob_gap" in ma[1]
    # the engine's log-probs are what the trainer computes
    assert ma[1]["designer/logprob_gap"] < 1e-3
    # one Adam state per role over the shared weights; both saved, the optimizer state on its own
    # file
    last = a / f"step_{STEPS:06d}"
    assert rundir.read_state(last, ["trainer"])["trainer"]["optimizers"] == [
        "model/designer",
        "model/executor",
    ]
    optim = rundir.read_state(last, ["model/designer", "model/executor"])
    steps_of = {k: {int(v["step"]) for v in st["state"].values()} for k, st in optim.items()}
    assert steps_of == {"model/designer": {STEPS // 2}, "model/executor": {STEPS // 2}}


# mid-rollout, mid-update, between a checkpoint's files, between a step's metrics line and its
# checkpoint, right after a checkpoint (tests/kill_at.py: where each is)
FAULTS = ["executor-phase:1", "update:2", "checkpoint:2", "logged:3", "saved:3"]


def kill_at(point):
    """The arguments before a script's that run it SIGKILLed at `point` (tests/kill_at.py)."""
    return [str(ROOT / "tests" / "kill_at.py"), point]


def test_sigkill_anywhere_then_resume_is_exact(model_dir, uninterrupted, tmp_path, monkeypatch):
    import tempfile

    c = tmp_path / "c"
    killed = []
    # both loggers on: each start is an offline wandb run
    monkeypatch.setenv("WANDB_MODE", "offline")
    for point in FAULTS:
        args = args_for(
            model_dir, c, steps=STEPS, resume=True, loggers="tensorboard,wandb", probe_tasks=2
        )
        p = subprocess.Popen(
            [sys.executable, *kill_at(point), "train.py", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = p.communicate(timeout=600)
        assert p.returncode == -signal.SIGKILL, (point, out[-2000:] + err[-2000:])
        killed.append(p.pid)  # the trainer's pid names its sandbox folders
        done = [m["step"] for m in metrics(c)] if (c / "metrics.jsonl").exists() else []
        # every checkpoint's step is in metrics.jsonl: its line was written first
        assert {int(d[5:]) for d in rundir.checkpoints(c)} <= set(done), (point, done)
    run(
        args_for(model_dir, c, steps=STEPS, resume=True, loggers="tensorboard,wandb", probe_tasks=2)
    )
    assert same_weights(
        weights(uninterrupted / f"step_{STEPS:06d}"), weights(c / f"step_{STEPS:06d}")
    ), "resumed run differs from the uninterrupted one"
    assert without_timings(metrics(c)) == without_timings(metrics(uninterrupted))
    # TensorBoard's event files hold each step once, with metrics.jsonl's values (float32); wandb's
    # offline runs (one a start) hold each step once, their step ranges disjoint, with the same
    # values
    mc = {m["step"]: m for m in metrics(c)}
    tb = tensorboard_events(c / "tensorboard")
    # bools as 0/1
    assert sorted(tb) == sorted(
        (k, s)
        for s, m in mc.items()
        for k, v in m.items()
        if isinstance(v, int | float) and k != "step"
    )
    assert all(vals == [np.float32(mc[s][k])] for (k, s), vals in tb.items())
    runs = sorted((c / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == len(FAULTS) + 1
    held = [wandb_history(r) for r in runs]
    steps = [s for h in held for s in h]
    assert sorted(steps) == sorted(mc) and loggers.offline_steps(str(c / "wandb")) == set(mc)
    numbers = {
        s: {k for k, v in m.items() if isinstance(v, int | float) and k != "step"}
        for s, m in mc.items()
    }
    # a killed run's step keeps its own
    assert all(
        set(row) == numbers[s]
        and all(
            v == pytest.approx(mc[s][k], rel=1e-12)
            for k, v in row.items()
            if not k.startswith("time/")
        )
        for h in held
        for s, row in h.items()
    )
    # each step's tree once, as the uninterrupted run wrote it
    assert trees(c) == trees(uninterrupted)
    assert not list(c.glob(".tmp_step_*")) and not list(c.glob(".*.tmp"))
    # the killed runs' sandbox folders were removed by the next start (their pids are dead)
    for pid in killed:
        assert not list(Path(tempfile.gettempdir()).glob(f"metaagent-sandbox-{pid}-*"))


def test_a_full_disk_stops_with_a_line_and_the_run_resumes_once_there_is_room(tmp_path):
    """out_dir on a small disk (a tmpfs made here) filled so that step 1's checkpoint fits and step
    2's cannot: the run stops non-zero with one line saying what it needs and where, no traceback,
    step_000001 whole and nothing partial; with room made, --resume runs to the weights and lines of
    a run on a roomy disk. (An untrained tiny model, short replies: the disk is the point.)"""
    from test_full_disk import disk_bytes, filled, mount_small_disk

    from world import tiny

    model = tmp_path / "model"
    tiny.save_tiny(model, seed=0)
    small = dict(batch_size=2, M=2, N=1, max_tokens=12, designer_max_tokens=24)
    roomy = tmp_path / "roomy"
    run(args_for(model, roomy, steps=3, **small))
    # the biggest checkpoint (both Adam states; step 1's has the Designer's alone)
    size = disk_bytes(roomy / "step_000003")
    c = tmp_path / "disk"
    mount_small_disk(c, 4 * size)
    try:
        filler = filled(c, int(1.2 * size))
        args = args_for(model, c, steps=3, **small)
        p = subprocess.run(
            [sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True
        )
        assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
        last = p.stderr.strip().splitlines()[-3:]
        assert any(ln.startswith("train.py: disk full: step_000002 needs") for ln in last), last
        assert any(str(c) in ln and "free" in ln for ln in last), last
        assert "Traceback" not in p.stderr, p.stderr[-3000:]
        assert rundir.checkpoints(c) == ["step_000001"]
        assert {d.name for d in (c / "step_000001").iterdir()} == {"model", "state"}
        assert not list(c.glob(".tmp_step_*"))
        filler.unlink()  # room made
        run(args_for(model, c, steps=3, resume=True, **small))
        assert same_weights(weights(roomy / "step_000003"), weights(c / "step_000003"))
        assert without_timings(metrics(c)) == without_timings(metrics(roomy))
    finally:
        subprocess.run(["umount", str(c)], check=False)


def test_sigkill_with_the_idle_state_offloaded_then_resume_is_exact(
    model_dir, uninterrupted, tmp_path
):
    """offload_idle_state on (machinery/offload.py): a run SIGKILLed mid-update while the
    Designer's state waits in host memory, resumed from a checkpoint that saved the Executor's from
    there, then killed right after a checkpoint that saved the Designer's, and resumed again, ends
    with the weights, metrics lines and optimizer states of the uninterrupted run without the
    offload: the offload changes no bit, and a resume puts each state back where it was."""
    c = tmp_path / "c"
    args = args_for(model_dir, c, steps=STEPS, resume=True, probe_tasks=2, offload_idle_state=True)
    for point in ("update:3", "saved:3"):
        p = subprocess.run(
            [sys.executable, *kill_at(point), "train.py", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert p.returncode == -signal.SIGKILL, (point, p.stdout[-2000:] + p.stderr[-2000:])
    run(args)
    last = f"step_{STEPS:06d}"
    assert same_weights(weights(uninterrupted / last), weights(c / last))
    assert without_timings(metrics(c)) == without_timings(metrics(uninterrupted))
    keys = ["model/designer", "model/executor"]
    want, got = (rundir.read_state(d / last, keys) for d in (uninterrupted, c))
    assert set(got) == {"model/designer", "model/executor"}
    for key, st in want.items():
        # (a resumed optimizer's betas come back a list: torch's state-dict round trip)
        for g, h in zip(st["param_groups"], got[key]["param_groups"], strict=True):
            assert {**g, "betas": tuple(g["betas"])} == {**h, "betas": tuple(h["betas"])}
        for name, moments in st["state"].items():
            for k, t in moments.items():
                assert torch.equal(t, got[key]["state"][name][k]), (key, name, k)


def torchrun(args, point=None):
    """train.py under torchrun at 2 gloo ranks; with a point, both killed there (kill_at)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += kill_at(point) if point else []
    return subprocess.run(
        [*cmd, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env
    )


def test_two_ranks_sigkill_anywhere_then_resume_is_exact(model_dir, tmp_path):
    """At 2 gloo ranks, each rank writing and reading back its own shards of the master weights and
    Adam states (state/, torch.distributed.checkpoint), a run SIGKILLed at the five points and
    resumed each time ends with the weights, Adam states, metrics lines (timings aside) and trees of
    the uninterrupted 2-rank run."""
    a, c = tmp_path / "a", tmp_path / "c"
    p = torchrun(args_for(model_dir, a, steps=STEPS, probe_tasks=2))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for point in FAULTS:
        p = torchrun(args_for(model_dir, c, steps=STEPS, resume=True, probe_tasks=2), point)
        assert p.returncode != 0 and "SIGKILL" in p.stderr, (point, p.stderr[-3000:])
        done = [m["step"] for m in metrics(c)] if (c / "metrics.jsonl").exists() else []
        assert {int(d[5:]) for d in rundir.checkpoints(c)} <= set(done), (point, done)
    p = torchrun(args_for(model_dir, c, steps=STEPS, resume=True, probe_tasks=2))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    last = f"step_{STEPS:06d}"
    assert same_weights(weights(a / last), weights(c / last))
    assert without_timings(metrics(c)) == without_timings(metrics(a))
    assert trees(c) == trees(a)
    # the fp32 master weights and both Adam states, whole
    keys = ["model/model", "model/designer", "model/executor"]
    want, got = (rundir.read_state(d / last, keys) for d in (a, c))
    assert same_state(want, got)
    assert not list(c.glob(".tmp_step_*"))


def test_torchrun_two_ranks_equal_one_rank(model_dir, tmp_path):
    out, one = tmp_path / "dist", tmp_path / "one"
    # both roles' token-means in one step
    kw = dict(steps=2, save_every=2, mode="coupled", designer_lr=5e-5)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "train.py",
            *args_for(model_dir, out, eval_tasks=4, **kw),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ms = metrics(out)
    assert [m["step"] for m in ms] == [1, 2]
    # every rank's engine computed with its trainer's weights: the reload probe (the largest rank's
    # gap)
    assert all(0 <= m["reload/probe_gap"] <= m["reload/probe_limit"] for m in ms)
    w = weights(out / "step_000002")
    # the final table, made by rank 0 from the last checkpoint
    table = json.loads((out / "final_table.json").read_text())
    assert table["tasks"] == 4 and set(table["exact"]) == {"SFT", "RL"}
    # one process on the same global batch: the same rollouts (seeds follow the global query index),
    # so the same rewards; the same losses and grad norms (every per-role token count and
    # reduction), the same weights
    run(args_for(model_dir, one, **kw))
    m1 = metrics(one)
    assert (
        min(m["executor/adv_zero_frac"] for m in m1) < 1
        and min(m["designer/adv_zero_frac"] for m in m1) < 1
    )
    for a, b in zip(ms, m1, strict=True):
        assert (
            a["reward/mean"] == b["reward/mean"] and a["samples/executor"] == b["samples/executor"]
        )
        for k in ("designer/loss", "executor/loss", "model/grad_norm"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-7), k
    from safetensors.torch import load_file

    w1, w0 = weights(one / "step_000002"), load_file(str(Path(model_dir) / "model.safetensors"))
    moved = distance(w1, w0, w1)
    diff = distance(w1, w, w1)
    assert moved > 0 and diff <= 1e-3 * moved, (float(diff), float(moved))


def test_a_used_out_dir_is_refused_and_overwrite_starts_over(model_dir, uninterrupted, tmp_path):
    """A used out_dir is refused; --overwrite starts over there. The one-step run it makes grades
    with --format_reward=authors: every run by their term, R = correct + 0.4 delivered + 0.4
    solution (reward.py), recorded in rollouts.jsonl (one run serves both checks)."""
    import shutil

    d = tmp_path / "used"
    shutil.copytree(uninterrupted, d)
    before = (d / "metrics.jsonl").read_text()
    with pytest.raises(SystemExit) as e:
        train.main(args_for(model_dir, d, steps=1))
    msg = str(e.value.code)
    assert "holds a run" in msg and "--resume" in msg and "--overwrite" in msg
    assert (d / "metrics.jsonl").read_text() == before and rundir.checkpoints(
        d
    ) == rundir.checkpoints(uninterrupted)
    assert not torch.distributed.is_initialized()
    (d / "notes.txt").write_text("mine")
    run(args_for(model_dir, d, steps=1, overwrite=True, format_reward="authors", record_queries=4))
    assert [m["step"] for m in metrics(d)] == [1] and rundir.checkpoints(d) == ["step_000001"]
    assert {t["step"] for t in trees(d)} == {1}
    assert (d / "notes.txt").read_text() == "mine"  # only the run's own files are deleted
    # the authors' format reward
    assert json.loads((d / "run.json").read_text())["config"]["format_reward"] == "authors"
    seen = 0
    for tree in trees(d):
        for script in tree["scripts"]:
            for r in script["runs"]:
                assert r["format"] in (0.0, 0.5, 1.0)
                assert r["R"] == pytest.approx(r["correct"] + 0.8 * r["format"])
                seen += 1
    assert seen == 4 * 2 * 2  # every run of the step's 4 queries (M 2, N 2)


def test_checkpoints_rotate_by_step_number_and_metrics_truncate_atomically(tmp_path):
    for n in (999_999, 1_000_000, 20, 3):
        (tmp_path / f"step_{n:06d}").mkdir()
    assert rundir.checkpoints(tmp_path) == [
        "step_000003",
        "step_000020",
        "step_999999",
        "step_1000000",
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "rew')
    rundir.truncate_jsonl(str(path), 2)  # a partial last line (a kill mid-write) is dropped
    assert [m["step"] for m in metrics(tmp_path)] == [1, 2]
    # no .tmp left
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["metrics.jsonl"]
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2"):
        rundir.truncate_jsonl(str(path), 1)


def test_stale_sandbox_folders_of_dead_processes_are_removed(tmp_path):
    import sandbox

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"metaagent-sandbox-{dead.pid}-abc_1").mkdir()
    (tmp_path / f"metaagent-sandbox-{os.getpid()}-xyz").mkdir()
    (tmp_path / "metaagent-sandbox-other").mkdir()
    assert sandbox.remove_stale_bases(str(tmp_path)) == [f"metaagent-sandbox-{dead.pid}-abc_1"]
    assert {p.name for p in tmp_path.iterdir()} == {
        "metaagent-sandbox-other",
        f"metaagent-sandbox-{os.getpid()}-xyz",
    }


def test_heldout_tasks_share_no_text_with_training_and_cover_both_kinds():
    from machinery import data
    from world import tiny

    cfg = settings.Config(eval_tasks=40, seed=0)
    training = train.load_mix(cfg)[0]  # the tiny RL pool: the "rl" split
    assert {tiny.split_of(t) for t in training} == {"rl"}
    held = final_table.heldout_tasks(cfg)
    assert len(held) == 40 and {t["kind"] for t in held} == {"math", "code"}
    assert {tiny.split_of(t) for t in held} == {"eval"}
    assert not {data.task_text(t) for t in held} & {data.task_text(t) for t in training}
    val = final_table.heldout_tasks(cfg, "val")  # where RL's settings are tuned
    assert {tiny.split_of(t) for t in val} == {"val"} and {t["kind"] for t in val} == {
        "math",
        "code",
    }
    assert not {data.task_text(t) for t in val} & {data.task_text(t) for t in training}


def rerun_alone(request):
    """Run this test (its own parameters only) in a fresh interpreter, where it can own the gloo
    group."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"{__file__}::{request.node.name}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.fixture
def group(tmp_path, request):
    """A gloo process group of one for this test (train.update all-reduces), or None when another
    test's group is alive in this process: the test then reruns alone."""
    import torch.distributed as dist

    if dist.is_initialized():
        rerun_alone(request)
        yield None
        return
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield True
    finally:
        dist.destroy_process_group()


def test_load_model_applies_the_speed_options(model_dir, group):
    """The Config's speed options reach the model (speed.prepare) and the update's log-probs
    (train.rows_for's), and change no number: full checkpointing and chunked log-probs give
    the reference's log-probs and gradients."""
    if group is None:
        return
    from machinery import speed

    cfg = settings.parse_config(["--ac_policy=full", "--logprobs=chunked"])
    assert settings.parse_config(
        ["config/qwen3_4b.py"]
    ).compile_layers  # the GPU presets compile their layers
    fast = train.load_model(str(model_dir), cfg, torch.device("cpu"))
    assert all(layer.forward.func is speed._full for layer in fast.model.layers)
    plain_cfg = settings.Config()
    plain = train.load_model(str(model_dir), plain_cfg, torch.device("cpu"))
    # defaults: the layers as transformers made them
    assert "forward" not in vars(plain.model.layers[0])
    ids = torch.randint(
        0, plain.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)
    ).tolist()
    samples = [
        rollout_lib.Sample(row[:4], row[4:], [0.0] * 8, (0, 0, k)) for k, row in enumerate(ids)
    ]
    cpu = torch.device("cpu")
    rows, plain_rows = train.rows_for(cfg, 0), train.rows_for(plain_cfg, 0)
    (b,) = train.micro_batches(rows, samples, [0, 1], {}, cpu)
    (b_plain,) = train.micro_batches(plain_rows, samples, [0, 1], {}, cpu)
    assert (
        rows.token_logprobs is logprob_rows.chunked_token_logprobs
    )  # the chunked path, dispatched
    got, want = rows.logprobs(fast, b), plain_rows.logprobs(plain, b_plain)
    got.sum().backward()
    want.sum().backward()
    # two fp32 computations of a log-prob (another kernel and order): within 16 eps of the logits'
    # scale S, |z| + log V <= ~10 here; a gradient entry sums <= 24 tokens' terms: 24 eps of the
    # tensor's largest entry
    eps = 2.0**-23
    torch.testing.assert_close(got, want, rtol=0.0, atol=16 * eps * 10)
    for (name, p), q in zip(fast.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(
            p.grad, q.grad, rtol=24 * eps, atol=24 * eps * q.grad.abs().max().item(), msg=name
        )
    with pytest.raises(ValueError, match="checkpointing must be one of"):
        train.load_model(str(model_dir), settings.Config(ac_policy="some"), torch.device("cpu"))


def repeated_prompt_samples(n_prompts=3, per_prompt=(5, 2, 4), seed=0, vocab=100):
    """Samples with repeated prompts (as a step's designer or executor samples), random engine
    log-probs."""
    import random

    from rollout import Sample

    rng = random.Random(seed)
    samples = []
    for p in range(n_prompts):
        prompt = [rng.randrange(6, vocab) for _ in range(rng.randint(5, 12))]
        for _ in range(per_prompt[p]):
            c = [rng.randrange(6, vocab) for _ in range(rng.randint(2, 9))]
            samples.append(Sample(prompt, c, [-rng.random() * 4 for _ in c], (p, len(samples))))
    rng.shuffle(samples)
    return samples


def test_batches_hold_every_sample_once_and_the_same_count_on_every_rank(group):
    """train.micro_batches, plain and shared: each sample of idx once, with its own values on its
    own tokens, at most micro_batch rows; padded with fillers (no trained token) to the count every
    rank must forward, at least one."""
    if group is None:
        return
    from machinery import logprob_rows

    samples = repeated_prompt_samples()
    values = {
        "adv": {k: torch.full((len(s.completion_ids),), float(k)) for k, s in enumerate(samples)},
        "old": None,
    }
    for logprobs in ("plain", "shared"):
        cfg = settings.Config(micro_batch=3, logprobs=logprobs)
        rows = train.rows_for(cfg, 0)
        bs = train.micro_batches(rows, samples, range(len(samples)), values, torch.device("cpu"))
        assert sorted(k for b in bs for k in b["order"]) == list(range(len(samples)))
        for b in bs:  # each trained token carries its sample's value, in the batch's token order
            want = torch.cat([values["adv"][k] for k in b["order"]])
            assert torch.equal(b["adv"][b["mask"].bool()], want) and b["old"] is None
            assert int(b["mask"].sum()) == sum(len(samples[k].completion_ids) for k in b["order"])
            assert b["input_ids"].shape[0] <= 3
        empty = train.micro_batches(rows, samples, [], values, torch.device("cpu"))
        assert len(empty) == 1 and empty[0]["order"] == [] and empty[0]["mask"].sum() == 0
    # shared rows: one prompt a row, fewer rows than samples, none longer than ROW_CAP x the longest
    # sequence
    longest = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    rows = logprob_rows.share_rows(
        samples, range(len(samples)), int(logprob_rows.ROW_CAP * longest)
    )
    assert len(rows) < len(samples) and all(
        len({tuple(samples[k].prompt_ids) for k in r}) == 1 for r in rows
    )

    def row_len(r):
        return len(samples[r[0]].prompt_ids) + sum(len(samples[k].completion_ids) for k in r)

    assert all(row_len(r) <= logprob_rows.ROW_CAP * longest or len(r) == 1 for r in rows)


def naive_update(model, samples, adv, lr):
    """The update's reference, one sample at a time: the on-policy GRPO loss sum_t -A rho_t / N over
    every sample (A = 0 included), its gradient, clipped to norm 1, one AdamW step. Returns (loss,
    grad norm, grads)."""
    import grpo

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    n = sum(len(s.completion_ids) for s in samples)
    total = 0.0
    for s, a in zip(samples, adv, strict=True):
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        lp = grpo.token_logprobs(model, ids)[0, len(s.prompt_ids) - 1 :]
        loss = -(a * torch.exp(lp - lp.detach())).sum() / n
        loss.backward()
        total += loss.item()
    gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    opt.step()
    return total, gn, grads


@pytest.mark.parametrize("logprobs", ["plain", "shared", "chunked"])
def test_update_is_the_token_mean_loss_over_every_sample(tmp_path, group, logprobs):
    """train.update (micro-batches, samples of A = 0 not forwarded, each logprobs variant) gives the
    loss, grad norm and gradients of the reference: every sample forwarded alone, the token-mean
    over all of them. A step in which every advantage is 0 forwards one filler and still steps Adam,
    on a zero gradient."""
    if group is None:
        return
    from world import tiny

    tiny.save_tiny(str(tmp_path / "m"), seed=0, hidden_size=32, num_layers=2)
    samples = repeated_prompt_samples(seed=1)
    adv = torch.randn(len(samples), generator=torch.Generator().manual_seed(3))
    adv[::3] = 0.0  # every third sample: a group whose rewards were all equal
    cfg = settings.Config(
        init_from=str(tmp_path / "m"),
        mode="executor",
        micro_batch=4,
        executor_lr=1e-3,
        logprobs=logprobs,
    )
    policies, policy_of = train.make_policies(cfg, None, None, torch.device("cpu"))
    model = policies["model"]["model"]
    rows = []
    model.register_forward_pre_hook(
        lambda m, a, k: rows.append(k["input_ids"].shape[0]), with_kwargs=True
    )
    rows_of = train.rows_for(cfg, 0)
    stats = train.update(
        cfg,
        0,
        train.lr_factor(cfg, 0),
        {"executor": (samples, adv)},
        policy_of,
        rows_of,
        torch.device("cpu"),
        1,
    )
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    forwarded = sum(rows)
    ref_model = tiny.build_model(seed=0, hidden_size=32, num_layers=2)[0]
    loss, gn, want = naive_update(ref_model, samples, adv.tolist(), 1e-3)
    # sums of <= ~60 fp32 token terms in other orders (and two ways to the log-probs, each within 16
    # eps of the logits' scale ~10): ~1e-5 of the largest terms, so 1e-5 of the loss, the norm and
    # each tensor's largest entry
    assert stats["executor/loss"] == pytest.approx(loss, rel=1e-5, abs=1e-7)
    assert stats["model/grad_norm"] == pytest.approx(gn, rel=1e-5) and stats["lr"] == 1e-3
    for k in want:
        torch.testing.assert_close(
            got[k], want[k], rtol=1e-5, atol=1e-5 * want[k].abs().max().item(), msg=k
        )
    # the A = 0 samples were not forwarded (shared: fewer rows still)
    assert 0 < forwarded < len(samples)
    rows.clear()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    zero = train.update(
        cfg,
        1,
        train.lr_factor(cfg, 1),
        {"executor": (samples, torch.zeros(len(samples)))},
        policy_of,
        rows_of,
        torch.device("cpu"),
        1,
    )
    # one filler row, Adam stepped
    assert rows == [1] and zero["model/grad_norm"] == 0.0 and zero["lr"] == 1e-3
    # the moments moved it
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_off_policy_minibatches_clip_and_correct(tmp_path, group):
    """Two minibatches: the old log-probs are the trainer's before the first step (not the
    engine's), so the second minibatch, after a step, clips; TIS weights the loss by the old/engine
    ratio. Plain and shared rows give the same numbers."""
    if group is None:
        return
    from world import tiny

    tiny.save_tiny(str(tmp_path / "m"), seed=0, hidden_size=32, num_layers=2)
    samples = {
        "designer": repeated_prompt_samples(seed=1),
        "executor": repeated_prompt_samples(seed=2),
    }
    adv = {
        r: torch.randn(len(s), generator=torch.Generator().manual_seed(3))
        for r, s in samples.items()
    }

    def update(lr, logprobs):
        cfg = settings.Config(
            init_from=str(tmp_path / "m"),
            mode="coupled",
            micro_batch=4,
            designer_lr=lr,
            executor_lr=lr,
            minibatches=2,
            logprobs=logprobs,
        )
        policies, policy_of = train.make_policies(cfg, None, None, torch.device("cpu"))
        return train.update(
            cfg,
            0,
            train.lr_factor(cfg, 0),
            {r: (s, adv[r]) for r, s in samples.items()},
            policy_of,
            train.rows_for(cfg, 0),
            torch.device("cpu"),
            1,
        )

    # a step large enough for the second minibatch's ratios to leave [0.8, 1.2]
    big = update(1e-2, "plain")
    assert (
        big["designer/clip_frac"] > 0
        and big["executor/clip_frac"] > 0
        and big["executor/ratio_mean"] != 1.0
    )
    # the engine's random log-probs are far from the trainer's
    assert big["executor/logprob_gap"] > 0.5
    # the same update two ways: the first minibatch's numbers agree to fp32 rounding of sums of ~60
    # terms (1e-5 of them); the second's start from weights Adam moved by ~lr = 1e-3 a weight, which
    # that rounding changes by a share of ~1e-5 too (a gradient entry near 0 can flip Adam's sign:
    # 1e-4 covers a few)
    plain, shared = update(1e-3, "plain"), update(1e-3, "shared")
    for k, v in plain.items():
        assert shared[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k


def test_shared_rows_run_equals_plain(model_dir, uninterrupted, tmp_path):
    """A seeded train.py run with shared-prompt rows (config/tiny.py's logprobs) gives the metrics
    of the uninterrupted run (plain): the same rollouts, the update's numbers within float
    tolerance."""
    # the tiny preset shares its prompts
    assert settings.parse_config(["config/tiny.py"]).logprobs == "shared"
    d = tmp_path / "shared"
    run(args_for(model_dir, d, steps=STEPS, logprobs="shared", probe_tasks=2))  # as uninterrupted
    plain, shared = without_timings(metrics(uninterrupted)), without_timings(metrics(d))
    # the held-out curve's step-0 line, then the steps
    assert len(shared) == len(plain) == STEPS + 1
    for a, b in zip(plain, shared, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            # |engine - trainer| log-prob: float rounding itself, ~16 eps x 10
            if "logprob_gap" in k:
                assert a[k] == pytest.approx(b[k], abs=16 * 2.0**-23 * 10), (a["step"], k)
            elif isinstance(a[k], float):
                # the losses and norms: 1e-5 of sums of token terms (as above), carried through
                # Adam's steps into the next rollouts only if a sampled token flips, which would
                # change rewards (checked)
                assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), (a["step"], k)
            else:
                assert a[k] == b[k], (a["step"], k)


def test_continuous_schedule_gives_the_ticks_rollouts(model_dir, uninterrupted, tmp_path):
    """The same seeded run with each agent call submitted when its script makes it
    (--rollout_schedule=continuous) instead of a batch a tick: the transformers engine samples each
    row with its own generator, so the rollouts are the same row for row, and so are the updates
    and the weights."""
    d = tmp_path / "continuous"
    run(args_for(model_dir, d, steps=STEPS, probe_tasks=2, rollout_schedule="continuous"))
    assert trees(d) == trees(uninterrupted)  # the same tokens, replies, rewards, advantages
    last = f"step_{STEPS:06d}"
    assert same_weights(weights(d / last), weights(uninterrupted / last))
    # the engine's own log-probs of those tokens come from batches of other rows and padding: they
    # agree to float rounding (logprob_gap ~1e-7, its ±16 eps bound as in shared rows' test), and
    # so do the token entropies estimated from them
    for a, b in zip(metrics(uninterrupted), metrics(d), strict=True):
        for k in a:
            if "logprob_gap" in k:
                assert a[k] == pytest.approx(b[k], abs=16 * 2.0**-23 * 10), (a["step"], k)
            elif k.startswith("entropy/"):
                assert a[k] == pytest.approx(b[k], rel=1e-6), (a["step"], k)
            elif not k.startswith("time/"):
                assert a[k] == b[k], (a["step"], k)
    assert json.loads((d / "run.json").read_text())["config"]["rollout_schedule"] == "continuous"


def test_ask_one_query_against_the_cold_start(model_dir, uninterrupted, tmp_path):
    """tools/ask.py: the RL model and its cold start on one query of our own, the same seeds, one
    page."""
    from tools import ask

    rl = uninterrupted / f"step_{STEPS:06d}" / "model"
    tiny_args = [
        "--backend",
        "hf",
        "--short_prompt",
        "--max_tokens",
        "48",
        "--designer_max_tokens",
        "400",
        "--temperature",
        "1",
        "--top_p",
        "1",
        "--M",
        "2",
        "--N",
        "2",
    ]
    recs = ask.main(
        [
            "Compute 9-7+8.",
            "--model",
            str(rl),
            "--against",
            str(model_dir),
            "--gold",
            "10",
            "--out",
            str(tmp_path / "graded"),
            *tiny_args,
        ]
    )
    assert [r["step"] for r in recs] == [1, 2] and all(r["task"]["gold"] == "10" for r in recs)
    assert any(sc["parsed"] and sc["runs"][0]["calls"] for r in recs for sc in r["scripts"])
    for sc in (sc for r in recs for sc in r["scripts"] if sc["parsed"]):
        for run_ in sc["runs"]:  # graded: R = correct + 0.4 format, correct strictly 0 or 1
            assert run_["correct"] in (0.0, 1.0) and run_["R"] == pytest.approx(
                run_["correct"] + 0.4 * run_["format"]
            )
    page = (tmp_path / "graded" / "ask.html").read_text()
    assert str(rl) in page and str(model_dir) in page and "Compute 9-7+8." in page
    recs = ask.main(
        ["Compute 2+3.", "--model", str(rl), "--out", str(tmp_path / "open"), *tiny_args]
    )
    assert len(recs) == 1 and all(
        run_["correct"] is None for sc in recs[0]["scripts"] for run_ in sc["runs"]
    )
    with pytest.raises(SystemExit, match="tests as JSON"):
        ask.main(
            [
                "Write f(x).",
                "--kind",
                "code",
                "--gold",
                "{oops",
                "--model",
                str(rl),
                *tiny_args,
            ]
        )


def test_signal_metrics_on_a_known_reward_matrix():
    """Two queries, M=2 designs x N=2 runs: one query all correct (no signal for either role), one
    mixed with an unparsed design; the shares, stds and entropies as computed by hand."""
    import advantage

    R = torch.tensor([[[1.4, 1.4], [1.4, 1.4]], [[1.4, 0.4], [0.0, 0.0]]])
    E = torch.tensor([[[True, True], [True, True]], [[True, True], [False, False]]])
    structures = [
        "tester",
        "tester",
        "single",
        "single",
        "ensemble",
        "ensemble",
        "unparsed",
        "unparsed",
    ]
    recs = [{"correct": r >= 1.0, "structure": s} for r, s in zip(R.flatten().tolist(), structures)]
    A_D, A_E = advantage.designer_advantages(R), advantage.executor_advantages(R, executed=E)
    m = recorder.signal_metrics(recs, R, E, A_D, A_E)
    assert m["signal/all_correct"] == 0.5 and m["signal/all_wrong"] == 0.0
    assert m["designer/dead_groups"] == 0.5 and m["executor/dead_groups"] == 0.5
    # query 1's executed runs are 1.4 and 0.4 (std 0.7071); its designs' means 0.9 and 0.0 (std
    # 0.6364)
    assert m["signal/reward_std"] == pytest.approx((0 + 0.5**0.5) / 2)
    assert m["signal/design_reward_std"] == pytest.approx((0 + 0.9 / 2**0.5) / 2)
    # two structures in each query, one design each: H = log 2; never one structure for all designs
    assert m["entropy/designs"] == pytest.approx(np.log(2)) and m["signal/same_structure"] == 0.0


def test_repair_metrics_count_the_repairs_their_copies_and_their_advantage():
    """mas.repairs on real-shaped call records (a repair: a call after a failed run_tests report;
    a copy: a repair whose answer is the failed program), and recorder.repair_metrics over the
    runs."""
    import mas
    from sandbox import CallRecord

    def call(message, answer, k):
        messages = [{"role": "system", "content": "coder: x"}, {"role": "user", "content": message}]
        return CallRecord("coder", messages, f"1+2=3\n<answer>{answer}</answer>", None, k)

    first = call("Write f(x).\nf(1)==3", "def f(x): return x+2", 0)
    failed = "Write f(x).\nf(1)==3\nCode:\ndef f(x): return x+2\nTests: FAIL 1/3\ninput: [2]"
    copy = call(failed, "def f(x): return x+2", 1)
    switch = call(failed, "def f(x): return 4-x", 1)
    passed = call("Write f(x).\nTests: PASS 3/3", "def f(x): return x+2", 1)
    assert mas.repairs([first, copy]) == (1, 1) and mas.repairs([first, switch]) == (1, 0)
    assert mas.repairs([first]) == (0, 0) and mas.repairs([first, passed]) == (0, 0)
    # the first call is never a repair, whatever its message shows
    assert mas.repairs([call(failed, "x", 0)]) == (0, 0)
    recs = [{"repairs": 1, "copies": 1}, {"repairs": 1, "copies": 0}, {"repairs": 0, "copies": 0}]
    A_E = torch.tensor([[[-1.0, 0.5, 2.0]]])
    m = recorder.repair_metrics(recs, A_E)
    assert m == {"repair/calls": 2, "repair/copy_rate": 0.5, "repair/adv_mean": -0.25}
    assert recorder.repair_metrics([{"repairs": 0, "copies": 0}], A_E[..., :1]) == {
        "repair/calls": 0
    }


def test_format_reward_is_a_setting():
    """`--format_reward=authors --help` parses and lists the setting; a value of neither kind is
    refused, naming both."""
    p = subprocess.run(
        [sys.executable, "train.py", "--format_reward=authors", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert 'format_reward: str = "paper"' in p.stderr and "unknown config key" not in p.stderr
    assert settings.parse_config(["config/tiny.py"]).format_reward == "paper"
    cfg = settings.parse_config(["config/tiny.py", "--format_reward=theirs"])
    with pytest.raises(settings.ConfigError, match="format_reward must be one of"):
        settings.validate(cfg)


READING_PATH = {  # the files a reader opens from rl_step's queries to the optimizer step
    "train.py",
    "stagewise.py",
    "machinery/data.py",
    "rollout.py",
    "mas.py",
    "reward.py",
    "machinery/engine.py",
    "machinery/weights.py",
    "advantage.py",
    "machinery/logprob_rows.py",
    "grpo.py",
}
INTERNALS = {  # the engine's, the sandbox's and the graders' insides, which a reader may skip
    "machinery/decode.py",
    "sandbox.py",
    "machinery/isolation.py",
    "machinery/confine.py",
    "machinery/programs.py",
    "machinery/grader.py",
}


def test_one_rl_step_runs_in_the_reading_path(tmp_path):
    """The project files whose Python code runs (in the trainer's thread) from rl_step's queries
    to the role's optimizer step, in one step of the tiny preset's paths (lean engine, shared-prompt
    rows) with the tester template (its scripts run, call the Executor, run programs, are graded):
    READING_PATH's eleven at most, the engine's, sandbox's and graders' insides aside."""
    from world import tiny

    tiny.save_tiny(str(tmp_path / "m"), seed=0, hidden_size=32, num_layers=2)
    names, state = set(), {"on": False, "done": False}  # the code objects' file names

    def profile(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and frame.f_code.co_name == "sample_queries":
            state["on"] = True
        if state["on"] and not state["done"] and event == "call":
            names.add(name)
        if state["on"] and event == "return" and "/torch/optim/" in name:
            callers, up = [], frame.f_back
            while up is not None and len(callers) < 6:
                callers, up = callers + [up.f_code.co_name], up.f_back
            state["done"] |= frame.f_code.co_name == "step" and "update" in callers

    def traced(cfg, step, run):
        sys.setprofile(profile)
        try:
            step_of_rl(cfg, step, run)
        finally:
            sys.setprofile(None)

    step_of_rl = train.rl_step
    argv = args_for(tmp_path / "m", tmp_path / "run", steps=1, template="tester", mode="executor")
    argv += ["--backend=lean", "--logprobs=shared"]
    try:
        train.rl_step = traced
        train.main(argv)
    finally:
        train.rl_step = step_of_rl
    assert state["done"], "no optimizer step was traced"
    seen = set()
    for name in names:  # the project's files (not torch's, not <string> or <frozen ...>)
        path = Path(name).resolve()
        if name.endswith(".py") and path.is_relative_to(ROOT) and path.is_file():
            seen.add(path.relative_to(ROOT).as_posix())
    assert seen - INTERNALS <= READING_PATH, sorted(seen - INTERNALS - READING_PATH)
    assert len(READING_PATH) <= 11 and {"train.py", "grpo.py", "rollout.py"} <= seen
