"""train.py end to end on a small model that learns (transformers backend, B=4, M=2, N=2, a few steps).

The model is a 2-layer, 64-wide tiny model after a 300-step SFT on tiny traces (built once per module, ~45 s):
sampled at T=0.4 it writes a parseable script about 85% of the time and right answers some of the time, so
the rollouts carry real advantages for both roles (the tests check that they are non-zero). With them:

- bad config values and a used out_dir stop the run with a clear message before any model loads;
- two seeded uninterrupted runs end with the same weights;
- a run SIGKILLed at five points of its steps (fault injection: mid-rollout, mid-update, between a checkpoint's
  files, between a step's metrics line and its checkpoint, right after a checkpoint) and resumed each time
  ends with the same weights and the same metrics lines (timings aside) as the uninterrupted run;
- torchrun --nproc_per_node=2 (gloo, FSDP2) ends with the same weights, losses and grad norms as one process
  on the same global batch (within float tolerance), and both ranks' engines hold identical weights;
- with a shared policy and one role per step, each role's steps use their own optimizer state.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import evaluate  # noqa: E402
import rundir  # noqa: E402
import settings  # noqa: E402
import stagewise  # noqa: E402
import train  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny model that has learned the four templates a little (see the module docstring)."""
    import sft
    import tiny
    out = str(tmp_path_factory.mktemp("model") / "learner")
    tasks = tiny.make_tasks(400, seed=0, split="sft")
    designer, executor = tiny.sft_traces(tasks, seed=0)
    model, tok = tiny.build_model(seed=0, hidden_size=64, num_layers=2)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    sft.train_sft(model, tok, designer[:200] + executor, steps=300, lr=2e-3, batch_size=16, out_dir=out, seed=0,
                  optimizer="muon", log=lambda *a, **k: None)
    return out


def args_for(model_dir, out_dir, steps=3, **kw):
    base = dict(init_from=str(model_dir), out_dir=str(out_dir), backend="hf", data_mix="{'tiny': 1.0}",
                tiny_tasks=40, batch_size=4, M=2, N=2, K=1, steps=steps, save_every=1, max_tokens=48,
                designer_max_tokens=400, max_calls=3, script_timeout=20.0, lr=5e-5, designer_lr=1e-4, micro_batch=8,
                temperature=0.4, weight_decay=0.1, kl_coef=0.1, sft_if_missing=False, eval_tasks=0, progress=False,
                seed=0)
    base.update(kw)
    return ["config/tiny.py"] + [f"--{k}={v}" for k, v in base.items()]


def run(args, timeout=600):
    p = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def weights(ckpt):
    from safetensors.torch import load_file
    return load_file(str(Path(ckpt) / "model" / "model.safetensors"))


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def distance(a, b, keys):
    """The L2 distance between two sets of weights, over the names in keys (a float: pytest.approx takes no
    tensors)."""
    return float(sum((a[k] - b[k]).double().norm() ** 2 for k in keys) ** 0.5)


def metrics(out_dir):
    return [json.loads(ln) for ln in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag, message", [
    ("--bogus=1", "unknown config key 'bogus'"),
    ("--M=two", "'M' must be int"),
    ("--lr=[1]", "'lr' must be float"),
    ("--data_mix={}", "data_mix is empty"),
    ("--data_mix={'missing.jsonl': 1.0}", "'missing.jsonl' (in data_mix) not found"),
    ("--data_mix={'tiny': 0}", "weight of 'tiny' must be a number > 0"),
    ("--mode=sometimes", "unknown mode 'sometimes'"),
    ("--policy=both", "policy must be one of"),
])
def test_bad_config_is_reported_before_any_model_loads(tmp_path, flag, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        train.main(["config/tiny.py", f"--out_dir={out}", "--init_from=does/not/matter", "--sft_if_missing=True", flag])
    assert message in str(e.value.code)
    assert not out.exists()   # nothing was set up: the check ran before the models
    assert not torch.distributed.is_initialized()


def test_executor_batch_size_applies_to_executor_only_steps():
    cfg = settings.parse_config(["config/tiny.py", "--batch_size=8", "--executor_batch_size=32"])
    assert [settings.step_batch(cfg, stagewise.active_roles(t, "stagewise", 2, "designer")) for t in range(5)] == \
        [8, 8, 32, 32, 8]
    assert settings.step_batch(cfg, {"designer", "executor"}) == 8           # coupled: one batch for both roles
    assert settings.step_batch(settings.parse_config(["--batch_size=8"]), {"executor"}) == 8   # 0 = batch_size
    with pytest.raises(settings.ConfigError, match="executor_batch_size=6 must be divisible by the number of ranks"):
        settings.validate(settings.parse_config(["--executor_batch_size=6"]), world=4)
    # config/both_roles.py: the Executor's 30 steps of 32 queries first, then the Designer's 15 of 8
    both = settings.parse_config(["config/tiny.py", "config/both_roles.py"])
    settings.validate(both)
    plan = [(sorted(r), settings.step_batch(both, r)) for r in
            (stagewise.active_roles(t, both.mode, both.K, both.first_role) for t in range(both.steps))]
    assert plan == [(["executor"], 32)] * 30 + [(["designer"], 8)] * 15


def test_bad_config_from_the_command_line(tmp_path):
    p = subprocess.run([sys.executable, "train.py", "--M=2", "--mode=sometimes", "--bogus_key=3"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "unknown config key 'bogus_key'" in p.stderr and "Traceback" not in p.stderr


def test_parse_config_types_and_files(tmp_path):
    cfg = settings.parse_config(["config/qwen3_4b.py", "--M=8", "--N=1", "--backend=hf", "--resume"])
    assert (cfg.M, cfg.N, cfg.backend, cfg.resume, cfg.lr) == (8, 1, "hf", True, 5e-6)
    assert cfg.init_from == "out/sft-qwen3-4b"          # the 4B preset on top of the 8B one
    assert settings.parse_config([]).out_dir == "out/tiny-rl"   # no file: the tiny default
    assert settings.parse_config(["--lr=1"]).lr == 1.0           # an int where a float is expected is fine
    bad = tmp_path / "bad.py"
    bad.write_text("M = 4\nlearning_rate = 1e-3\n")
    with pytest.raises(settings.ConfigError, match="learning_rate"):
        settings.parse_config([str(bad)])
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    cfg = settings.parse_config([f"--data_mix={{'{data}': 1.0}}", "--init_from=."])
    settings.validate(cfg)
    with pytest.raises(settings.ConfigError, match="no tasks"):
        train.load_mix(cfg)
    with pytest.raises(settings.ConfigError, match="divisible"):
        settings.validate(settings.parse_config(["--batch_size=3", "--init_from=."]), world=2)
    # a fixed structure has no Designer: a stagewise run would silently train nothing half the time
    with pytest.raises(settings.ConfigError, match="mode='executor'"):
        settings.validate(settings.parse_config(["--template=single", "--init_from=."]))
    settings.validate(settings.parse_config(["--template=single", "--mode=executor", "--init_from=."]))
    # per-role lr: one shared optimizer step cannot serve two learning rates
    with pytest.raises(settings.ConfigError, match="designer_lr != executor_lr"):
        settings.validate(settings.parse_config(["--mode=coupled", "--designer_lr=1e-4", "--init_from=."]))
    settings.validate(settings.parse_config(["--mode=coupled", "--designer_lr=1e-4", "--policy=separate", "--init_from=."]))
    with pytest.raises(settings.ConfigError, match="ac_policy must be one of"):
        settings.validate(settings.parse_config(["--ac_policy=some", "--init_from=."]))
    cfg = settings.parse_config(["--lr=1e-5", "--designer_lr=1e-4"])
    assert (settings.role_lr(cfg, "designer"), settings.role_lr(cfg, "executor")) == (1e-4, 1e-5)


def test_sample_queries_resumes_at_the_saved_position():
    sources = [list(range(5)), list(range(100, 103))]
    pos = [0, 0]
    full = [train.sample_queries(sources, [1.0, 1.0], s, 4, 0, pos) for s in range(6)]
    pos2 = [0, 0]
    for s in range(3):
        train.sample_queries(sources, [1.0, 1.0], s, 4, 0, pos2)
    again = [train.sample_queries(sources, [1.0, 1.0], s, 4, 0, list(pos2)) for s in range(3, 4)]
    assert again[0] == full[3]
    # within a source's epoch every task is drawn once
    pos = [0]
    drawn = [t for s in range(5) for t in train.sample_queries([list(range(10))], [1.0], s, 2, 0, pos)]
    assert sorted(drawn) == list(range(10))


STEPS = 4


@pytest.fixture(scope="module")
def uninterrupted(model_dir, tmp_path_factory):
    """One seeded uninterrupted run (stagewise with K=1: the roles alternate, each with its own Adam state)."""
    out = tmp_path_factory.mktemp("runs") / "a"
    run(args_for(model_dir, out, steps=STEPS))
    return out


def without_timings(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_seeded_runs_agree_with_real_advantages(model_dir, uninterrupted, tmp_path):
    a, b = uninterrupted, tmp_path / "b"
    pb = run(args_for(model_dir, b, steps=STEPS, eval_tasks=4))    # b also prints the final table
    wa, wb = weights(a / f"step_{STEPS:06d}"), weights(b / f"step_{STEPS:06d}")
    assert same_weights(wa, wb), "two seeded runs differ"
    ma = metrics(a)
    assert without_timings(ma) == without_timings(metrics(b))
    # real learning signal: some advantages of each role are non-zero, and both roles' steps moved the weights
    assert min(m["designer/adv_zero_frac"] for m in ma) < 1 and min(m["executor/adv_zero_frac"] for m in ma) < 1
    assert any(m["designer/loss"] != 0 for m in ma if "designer/loss" in m)
    assert any(m["executor/loss"] != 0 for m in ma if "executor/loss" in m)
    table = json.loads((b / "final_table.json").read_text())
    assert table["tasks"] == 4 and set(table["rows"]) == {"RL: learned designs", "RL: single agent",
                                                          "SFT: designs", "SFT: single agent"}
    assert set(table["rl_minus_sft"]) == {"learned designs", "single agent", "suited", "oracle"}
    for what, gain in table["rl_minus_sft"].items():   # paired: RL row minus SFT row, task by task
        if what in ("suited", "oracle"):   # exact (teacher-forced) probabilities, not sampled accuracies
            rl, sft = (table["exact"][who][what] for who in ("RL", "SFT"))
            assert 0 <= rl <= 1 and 0 <= sft <= 1
        else:
            rl, sft = (table["rows"][n]["accuracy"] for n in (("RL: learned designs", "SFT: designs")
                       if what == "learned designs" else ("RL: single agent", "SFT: single agent")))
            assert f"RL - SFT, {what}:" in pb.stdout
        assert gain["points"] == pytest.approx(100 * (rl - sft)) and gain["stderr"] >= 0
    assert "RL - SFT, P(suited template):" in pb.stdout
    assert [m["step"] for m in ma] == list(range(1, STEPS + 1))
    assert [m["active"] for m in ma] == ["designer", "executor"] * (STEPS // 2)
    # designer_lr on the Designer's steps, lr on the Executor's
    assert [m["lr"] for m in ma] == [1e-4, 5e-5] * (STEPS // 2)
    assert all(m["samples/designer"] == 8 for m in ma)   # B x M
    # on-policy (1 epoch, 1 minibatch): the old log-probs are the training forward's own, rho = 1
    assert all(m[f"{m['active']}/ratio_mean"] == 1.0 and m[f"{m['active']}/clip_frac"] == 0.0 for m in ma)
    from safetensors.torch import load_file
    w0 = load_file(str(Path(model_dir) / "model.safetensors"))
    assert any(not torch.equal(w0[k], wa[k]) for k in w0), "no update changed the weights"
    for key in ("reward/mean", "accuracy", "format_rate", "script_error_rate", "designer/adv_std",
                "time/rollout", "time/update", "time/weight_sync", "tokens/executor", "lr"):
        assert key in ma[0], key
    assert "designer/logprob_gap" in ma[0] and "executor/logprob_gap" in ma[1]
    assert ma[0]["designer/logprob_gap"] < 1e-3   # the engine's log-probs are what the trainer computes
    # one Adam state per role over the shared weights; both saved, the optimizer state on its own file
    optim = torch.load(a / f"step_{STEPS:06d}" / "optimizer.pt", weights_only=False)
    assert set(optim) == {"model/designer", "model/executor"}
    steps_of = {k: {int(v["step"]) for v in st["state"].values()} for k, st in optim.items()}
    assert steps_of == {"model/designer": {STEPS // 2}, "model/executor": {STEPS // 2}}


FAULTS = ["executor-phase:1", "update:2", "checkpoint:2", "logged:3", "saved:3"]


def test_sigkill_anywhere_then_resume_is_exact(model_dir, uninterrupted, tmp_path):
    import tempfile
    c = tmp_path / "c"
    killed = []
    for point in FAULTS:
        p = subprocess.Popen([sys.executable, "train.py", *args_for(model_dir, c, steps=STEPS, resume=True)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "METAAGENT_FAULT": point})
        out, err = p.communicate(timeout=600)
        assert p.returncode == -signal.SIGKILL, (point, out[-2000:] + err[-2000:])
        killed.append(p.pid)   # the trainer's pid names its sandbox folders
        done = [m["step"] for m in metrics(c)] if (c / "metrics.jsonl").exists() else []
        # every checkpoint's step is in metrics.jsonl: its line was written first
        assert {int(d[5:]) for d in rundir.checkpoints(c)} <= set(done), (point, done)
    run(args_for(model_dir, c, steps=STEPS, resume=True))
    assert same_weights(weights(uninterrupted / f"step_{STEPS:06d}"), weights(c / f"step_{STEPS:06d}")), \
        "resumed run differs from the uninterrupted one"
    assert without_timings(metrics(c)) == without_timings(metrics(uninterrupted))
    assert not list(c.glob(".tmp_step_*")) and not list(c.glob("*.tmp"))
    # the killed runs' sandbox folders were removed by the next start (their pids are dead)
    for pid in killed:
        assert not list(Path(tempfile.gettempdir()).glob(f"metaagent-sandbox-{pid}-*"))


def test_torchrun_two_ranks_equal_one_rank(model_dir, tmp_path):
    out, one = tmp_path / "dist", tmp_path / "one"
    kw = dict(steps=2, save_every=2, mode="coupled", designer_lr=5e-5)   # both roles' token-means in one step
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "train.py", *args_for(model_dir, out, verify_sync=True, eval_tasks=4, **kw)],
                       cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ms = metrics(out)
    assert [m["step"] for m in ms] == [1, 2]
    # verify_sync: every rank hashed the full weights it loaded into its engine; all hashes agreed
    assert all(m["weights_ranks_agree"] for m in ms)
    w = weights(out / "step_000002")
    assert train.weights_digest(w.items()) == ms[-1]["weights_digest"]   # = what rank 0 saved
    # the final table: sampled rows over both ranks' shares, exact rows through the sharded trainer model
    table = json.loads((out / "final_table.json").read_text())
    assert table["tasks"] == 4 and set(table["exact"]) == {"SFT", "RL"}
    # one process on the same global batch: the same rollouts (seeds follow the global query index), so the
    # same rewards; the same losses and grad norms (every per-role token count and reduction), the same weights
    run(args_for(model_dir, one, **kw))
    m1 = metrics(one)
    assert min(m["executor/adv_zero_frac"] for m in m1) < 1 and min(m["designer/adv_zero_frac"] for m in m1) < 1
    for a, b in zip(ms, m1, strict=True):
        assert a["reward/mean"] == b["reward/mean"] and a["samples/executor"] == b["samples/executor"]
        for k in ("designer/loss", "executor/loss", "model/grad_norm"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-7), k
    from safetensors.torch import load_file
    w1, w0 = weights(one / "step_000002"), load_file(str(Path(model_dir) / "model.safetensors"))
    moved = distance(w1, w0, w1)
    diff = distance(w1, w, w1)
    assert moved > 0 and diff <= 1e-3 * moved, (float(diff), float(moved))


def test_a_used_out_dir_is_refused_and_overwrite_starts_over(model_dir, uninterrupted, tmp_path):
    import shutil
    d = tmp_path / "used"
    shutil.copytree(uninterrupted, d)
    before = (d / "metrics.jsonl").read_text()
    with pytest.raises(SystemExit) as e:
        train.main(args_for(model_dir, d, steps=1))
    msg = str(e.value.code)
    assert "holds a run" in msg and "--resume" in msg and "--overwrite" in msg
    assert (d / "metrics.jsonl").read_text() == before and rundir.checkpoints(d) == rundir.checkpoints(uninterrupted)
    assert not torch.distributed.is_initialized()
    (d / "notes.txt").write_text("mine")
    run(args_for(model_dir, d, steps=1, overwrite=True))
    assert [m["step"] for m in metrics(d)] == [1] and rundir.checkpoints(d) == ["step_000001"]
    assert (d / "notes.txt").read_text() == "mine"   # only the run's own files are deleted


def test_checkpoints_rotate_by_step_number_and_metrics_truncate_atomically(tmp_path):
    for n in (999_999, 1_000_000, 20, 3):
        (tmp_path / f"step_{n:06d}").mkdir()
    assert rundir.checkpoints(tmp_path) == ["step_000003", "step_000020", "step_999999", "step_1000000"]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "rew')
    rundir.truncate_metrics(str(path), 2)   # a partial last line (a kill mid-write) is dropped
    assert [m["step"] for m in metrics(tmp_path)] == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["metrics.jsonl"]
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2"):
        rundir.truncate_metrics(str(path), 1)


def test_stale_sandbox_folders_of_dead_processes_are_removed(tmp_path):
    import sandbox
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"metaagent-sandbox-{dead.pid}-abc_1").mkdir()
    (tmp_path / f"metaagent-sandbox-{os.getpid()}-xyz").mkdir()
    (tmp_path / "metaagent-sandbox-other").mkdir()
    assert sandbox.remove_stale_bases(str(tmp_path)) == [f"metaagent-sandbox-{dead.pid}-abc_1"]
    assert {p.name for p in tmp_path.iterdir()} == {"metaagent-sandbox-other",
                                                    f"metaagent-sandbox-{os.getpid()}-xyz"}


def test_heldout_tasks_share_no_text_with_training_and_cover_both_kinds():
    import data
    import tiny
    cfg = settings.Config(eval_tasks=40, seed=0)
    training = train.load_mix(cfg)[0]                      # the tiny RL pool: the "rl" split
    assert {tiny.split_of(t) for t in training} == {"rl"}
    held = evaluate.heldout_tasks(cfg, [training, tiny.make_tasks(300, seed=0)])   # + a file that holds tiny tasks
    assert len(held) == 40 and {t["kind"] for t in held} == {"math", "code"}
    assert {tiny.split_of(t) for t in held} == {"eval"}
    assert not {data.task_text(t) for t in held} & {data.task_text(t) for t in training}


def test_load_model_applies_the_speed_options(model_dir, tmp_path):
    """The Config's speed options reach the model (speed.prepare) and token_logprobs (logprobs_of), and change
    no number: selective checkpointing, 7-token chunks, kept logits give the defaults' log-probs and gradients."""
    import torch.distributed as dist

    import speed

    if dist.is_initialized():   # an earlier test owns this process's group: run in a fresh interpreter
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               f"{__file__}::test_load_model_applies_the_speed_options"], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        return
    cfg = settings.parse_config(["--activation_checkpointing", "--ac_policy=selective", "--logprob_chunk=7",
                              "--logprob_keep_logits", "--temperature=0.7"])
    assert settings.parse_config(["config/qwen3_4b.py"]).compile_layers    # the GPU presets compile their layers
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        fast = train.load_model(str(model_dir), cfg, torch.device("cpu"))
        assert all(layer.forward.func is speed._selective for layer in fast.model.layers)
        plain = train.load_model(str(model_dir), settings.Config(temperature=0.7), torch.device("cpu"))
        assert "forward" not in vars(plain.model.layers[0])   # defaults: the layers as transformers made them
        ids = torch.randint(0, plain.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
        b = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        got, want = (train.logprobs_of(m, b, c, grad=True) for m, c in ((fast, cfg), (plain, settings.Config(temperature=0.7))))
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(got, want)
        for (name, p), q in zip(fast.named_parameters(), plain.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        with pytest.raises(ValueError, match="checkpointing must be one of"):
            train.load_model(str(model_dir), settings.Config(activation_checkpointing=True, ac_policy="some"),
                             torch.device("cpu"))
    finally:
        dist.destroy_process_group()


def test_micro_batches_cap_padding():
    from rollout import Sample
    lengths = [10, 100, 11, 12, 101, 99, 10, 50]
    samples = [Sample([0] * n, [], [], (k,)) for k, n in enumerate(lengths)]
    # pad_cap=1: sorted by length, cut every `size` sequences
    assert train.micro_batches(samples, range(8), 4, pad_cap=1.0) == [[0, 6, 2, 3], [7, 5, 1, 4]]
    mbs = train.micro_batches(samples, range(8), 4, pad_cap=0.05)
    assert mbs == [[0, 6], [2, 3], [7], [5, 1, 4]]   # 10, 10, 11 would be 6% padding
    assert sorted(k for mb in mbs for k in mb) == list(range(8))     # every sample once
    for mb in mbs:
        assert len(mb) <= 4 and 1 - sum(lengths[k] for k in mb) / (len(mb) * max(lengths[k] for k in mb)) <= 0.05
    assert train.micro_batches(samples, [1, 4], 4, pad_cap=0.0) == [[1], [4]]


def repeated_prompt_samples(n_prompts=3, per_prompt=(5, 2, 4), seed=0, vocab=100):
    """Samples with repeated prompts (as a step's designer or executor samples), random engine log-probs."""
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


def rerun_alone(request):
    """Run this test (its own parameters only) in a fresh interpreter, where it can own the gloo group."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"{__file__}::{request.node.name}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_share_rows_and_micro_batches():
    samples = repeated_prompt_samples()
    cfg = settings.Config(micro_batch=3, pad_cap=1.0, share_prompts=True, share_row_cap=1.5)
    longest = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    mbs = train.micro_batch_rows(samples, range(len(samples)), cfg)
    rows = [r for mb in mbs for r in mb]
    assert sorted(k for r in rows for k in r) == list(range(len(samples)))   # every sample once
    assert len(rows) < len(samples)
    row_len = lambda r: len(samples[r[0]].prompt_ids) + sum(len(samples[k].completion_ids) for k in r)
    for r in rows:
        assert len({tuple(samples[k].prompt_ids) for k in r}) == 1        # one prompt a row
        assert row_len(r) <= 1.5 * longest or len(r) == 1
    for mb in mbs:   # at most micro_batch rows, and no more padded tokens than an unshared micro-batch can hold
        assert len(mb) <= 3 and len(mb) * max(map(row_len, mb)) <= 3 * longest
    # a cap of one sample's length: each row is at most the longest sequence; off: one sample a row
    assert all(row_len(r) <= longest for r in train.share_rows(samples, range(len(samples)), longest))
    one = settings.Config(micro_batch=1, share_prompts=True, share_row_cap=1.5)   # a row fits an unshared batch
    assert all(len(mb) == 1 and row_len(mb[0]) <= longest
               for mb in train.micro_batch_rows(samples, range(len(samples)), one))
    off = train.micro_batch_rows(samples, range(len(samples)), settings.Config(micro_batch=3, pad_cap=1.0))
    assert off == [[[k] for k in mb] for mb in train.micro_batches(samples, range(len(samples)), 3, 1.0)]


@pytest.mark.parametrize("kw", [dict(kl_coef=0.1), dict(ppo_epochs=2, minibatches=2, kl_coef=0.1, tis_cap=1.5)],
                         ids=["on-policy+ref", "off-policy+ref+tis"])
def test_share_prompts_update_equals_unshared(tmp_path, kw, request):
    """train.update with share_prompts on and off, from the same weights, on samples with repeated prompts: the
    same losses, clip fractions, ratios, KL, engine/trainer gaps and grad norms, and the same weights after."""
    import torch.distributed as dist

    import tiny

    if dist.is_initialized():   # an earlier test owns this process's group
        return rerun_alone(request)
    tiny.save_tiny(str(tmp_path / "m"), seed=0, hidden_size=32, num_layers=2)
    samples = {"designer": repeated_prompt_samples(seed=1), "executor": repeated_prompt_samples(seed=2)}
    adv = {r: torch.randn(len(s), generator=torch.Generator().manual_seed(3)) for r, s in samples.items()}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        out = {}
        for share in (False, True):
            cfg = settings.Config(init_from=str(tmp_path / "m"), mode="coupled", micro_batch=4, temperature=0.7,
                                  clip_eps=0.05, lr=1e-3, share_prompts=share, **kw)
            policies = train.make_policies(cfg, None, None, torch.device("cpu"), True)
            policy_of = {r: policies["model"] for r in samples}
            role_data = {r: {"samples": s, "adv": adv[r]} for r, s in samples.items()}
            stats, _ = train.update(cfg, 0, role_data, policy_of, 0, torch.device("cpu"), 1)
            out[share] = stats, {k: v.clone() for k, v in policies["model"]["model"].state_dict().items()}
    finally:
        dist.destroy_process_group()
    (off, w_off), (on, w_on) = out[False], out[True]
    assert off.keys() == on.keys() and off["designer/loss"] != 0 and off["executor/loss"] != 0
    for k in off:
        assert on[k] == pytest.approx(off[k], rel=1e-4, abs=1e-6), k
    if "tis_cap" in kw:   # the second minibatch's KL, clipped ratios and IS weights are exercised
        assert off["executor/kl"] > 0 and off["executor/clip_frac"] > 0 and off["executor/logprob_gap"] > 0
    # Adam divides by sqrt(v): float rounding in a near-zero gradient can move a weight by a visible share of lr,
    # so the weights are compared as the two-rank test does, against how far the update moved them
    from safetensors.torch import load_file
    w0 = load_file(str(tmp_path / "m" / "model.safetensors"))
    moved = distance(w_off, w0, w0)
    diff = distance(w_on, w_off, w0)
    assert moved > 0 and diff <= 1e-3 * moved, (float(diff), float(moved))


@pytest.mark.parametrize("kw", [dict(), dict(ppo_epochs=2, minibatches=2, share_prompts=True, tis_cap=1.5)],
                         ids=["on-policy", "off-policy+shared+tis"])
def test_zero_advantage_samples_are_not_forwarded(tmp_path, kw, request):
    """skip_zero_adv (kl_coef = 0): the update forwards only the samples whose advantage is not 0 and gives the
    loss, grad norm and weights of forwarding all of them; a step in which every advantage is 0 forwards nothing
    and still steps Adam (its moments decay), as the zero gradient of forwarding them would have."""
    import torch.distributed as dist

    import tiny

    if dist.is_initialized():   # an earlier test owns this process's group
        return rerun_alone(request)
    tiny.save_tiny(str(tmp_path / "m"), seed=0, hidden_size=32, num_layers=2)
    samples = repeated_prompt_samples(seed=1)
    adv = torch.randn(len(samples), generator=torch.Generator().manual_seed(3))
    adv[::3] = 0.0   # every third sample: a group whose rewards were all equal
    zero = torch.zeros(len(samples))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        out = {}
        for skip in (False, True):
            cfg = settings.Config(init_from=str(tmp_path / "m"), mode="executor", micro_batch=4, temperature=0.7,
                                  lr=1e-3, skip_zero_adv=skip, **kw)
            policies = train.make_policies(cfg, None, None, torch.device("cpu"), True)
            model = policies["model"]["model"]
            policy_of = {"executor": policies["model"]}
            rows = []
            hook = model.register_forward_pre_hook(lambda m, a, k, rows=rows: rows.append(k["input_ids"].shape[0]),
                                                   with_kwargs=True)
            stats, _ = train.update(cfg, 0, {"executor": {"samples": samples, "adv": adv}}, policy_of, 0,
                                    torch.device("cpu"), 1)
            n_rows = sum(rows)
            rows.clear()
            after_one = {k: v.clone() for k, v in model.state_dict().items()}
            stats0, stepped = train.update(cfg, 1, {"executor": {"samples": samples, "adv": zero}}, policy_of, 0,
                                           torch.device("cpu"), 1)
            hook.remove()
            out[skip] = stats, n_rows, sum(rows), after_one, stats0, stepped, model.state_dict()
    finally:
        dist.destroy_process_group()
    (st_all, rows_all, rows0_all, w1_all, st0_all, stepped_all, w_all), \
        (st_skip, rows_skip, rows0_skip, w1_skip, st0_skip, stepped_skip, w_skip) = out[False], out[True]
    assert st_all["executor/loss"] != 0
    # (clip fraction, ratio and engine/trainer gap are means over the forwarded tokens: equal only on-policy,
    # where rho = 1 and nothing is clipped)
    same = ("executor/loss", "model/grad_norm", "lr") + (("executor/clip_frac", "executor/ratio_mean") if not kw else ())
    for k in same:
        assert st_skip[k] == pytest.approx(st_all[k], rel=1e-5, abs=1e-7), k
    assert 0 < rows_skip < rows_all and rows0_skip == 0 < rows0_all   # fewer forwards; none when every A is 0
    # the weights against how far the update moved them (Adam: see test_share_prompts_update_equals_unshared)
    from safetensors.torch import load_file
    w0 = load_file(str(tmp_path / "m" / "model.safetensors"))
    moved = distance(w1_all, w0, w0)
    diff = distance(w1_skip, w1_all, w0)
    assert moved > 0 and diff <= 1e-3 * moved, (float(diff), float(moved))
    # the all-zero step: Adam stepped on both sides (with kw's two minibatches, twice), by the same amount
    assert stepped_skip == stepped_all == {("model", "executor")} and st0_skip["lr"] == st0_all["lr"] > 0
    assert st0_skip["model/grad_norm"] == st0_all["model/grad_norm"] == 0.0
    step_all = distance(w_all, w1_all, w0)
    step_skip = distance(w_skip, w1_skip, w0)
    assert step_all > 0 and step_skip == pytest.approx(step_all, rel=1e-3)


def test_share_prompts_run_equals_unshared(model_dir, uninterrupted, tmp_path):
    """A seeded train.py run with share_prompts off gives the metrics of the uninterrupted run (config/tiny.py:
    share_prompts on): the same rollouts, the update's numbers and the weights within float tolerance."""
    assert settings.parse_config(["config/tiny.py"]).share_prompts   # the uninterrupted run shared its prompts
    d = tmp_path / "unshared"
    run(args_for(model_dir, d, steps=STEPS, share_prompts=False))
    shared, unshared = without_timings(metrics(uninterrupted)), without_timings(metrics(d))
    assert len(shared) == len(unshared) == STEPS
    for a, b in zip(shared, unshared, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if "logprob_gap" in k:   # |engine - trainer| log-prob: float rounding itself, ~1e-6
                assert a[k] == pytest.approx(b[k], abs=1e-5), (a["step"], k)
            elif isinstance(a[k], float):
                assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), (a["step"], k)
            else:
                assert a[k] == b[k], (a["step"], k)
    # the weights against how far the run moved them (Adam: see test_share_prompts_update_equals_unshared)
    from safetensors.torch import load_file
    wa, wb = weights(uninterrupted / f"step_{STEPS:06d}"), weights(d / f"step_{STEPS:06d}")
    w0 = load_file(str(Path(model_dir) / "model.safetensors"))
    moved = distance(wb, w0, w0)
    diff = distance(wa, wb, w0)
    assert moved > 0 and diff <= 1e-3 * moved, (float(diff), float(moved))
