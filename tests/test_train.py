"""train.py end to end on a tiny model (transformers backend, B=2, M=2, N=2, a few steps).

- bad config values stop the run with a clear message before any model loads;
- two seeded uninterrupted runs end with the same weights;
- a run killed with SIGKILL right after its step-1 checkpoint, then resumed, ends after step 3 with the same
  weights (and the same metrics) as the uninterrupted run;
- torchrun --nproc_per_node=2 (gloo, FSDP2): both ranks' engines hold identical weights after each update.

The model is freshly initialised (an SFT cold start takes minutes): it writes no parseable script and no
answer tag, so every reward is equal and every GRPO advantage zero. The weights still move, through real code
paths: weight decay changes them at step 1, and from step 2 on the k3 KL to the reference model gives a
gradient on the samples the engine generated with the synced weights. So equal final weights need the same
rollouts, the same optimizer/scheduler state and the same data position; the rest of the loss is covered by
tests/test_grpo.py, and learning itself by `python train.py`.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import tiny
    return tiny.save_tiny(str(tmp_path_factory.mktemp("model") / "tiny"), seed=0, hidden_size=64, num_layers=2)


def args_for(model_dir, out_dir, steps=3, **kw):
    base = dict(init_from=str(model_dir), out_dir=str(out_dir), backend="hf", data_mix="{'tiny': 1.0}",
                tiny_tasks=40, batch_size=2, M=2, N=2, K=1, steps=steps, save_every=1, max_tokens=24,
                designer_max_tokens=48, max_calls=3, script_timeout=20.0, lr=1e-3, designer_lr=2e-3, micro_batch=8,
                weight_decay=0.1, kl_coef=0.1,
                sft_if_missing=False, eval_tasks=0, progress=False, seed=0)
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


def test_bad_config_from_the_command_line(tmp_path):
    p = subprocess.run([sys.executable, "train.py", "--M=2", "--mode=sometimes", "--bogus_key=3"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "unknown config key 'bogus_key'" in p.stderr and "Traceback" not in p.stderr


def test_parse_config_types_and_files(tmp_path):
    cfg = train.parse_config(["config/qwen3_4b.py", "--M=8", "--N=1", "--backend=hf", "--resume"])
    assert (cfg.M, cfg.N, cfg.backend, cfg.resume, cfg.lr) == (8, 1, "hf", True, 5e-6)
    assert cfg.init_from == "out/sft-qwen3-4b"          # the 4B preset on top of the 8B one
    assert train.parse_config([]).out_dir == "out/tiny-rl"   # no file: the tiny default
    assert train.parse_config(["--lr=1"]).lr == 1.0           # an int where a float is expected is fine
    bad = tmp_path / "bad.py"
    bad.write_text("M = 4\nlearning_rate = 1e-3\n")
    with pytest.raises(train.ConfigError, match="learning_rate"):
        train.parse_config([str(bad)])
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    cfg = train.parse_config([f"--data_mix={{'{data}': 1.0}}", "--init_from=."])
    train.validate(cfg)
    with pytest.raises(train.ConfigError, match="no tasks"):
        train.load_mix(cfg)
    with pytest.raises(train.ConfigError, match="divisible"):
        train.validate(train.parse_config(["--batch_size=3", "--init_from=."]), world=2)
    # a fixed structure has no Designer: a stagewise run would silently train nothing half the time
    with pytest.raises(train.ConfigError, match="mode='executor'"):
        train.validate(train.parse_config(["--template=single", "--init_from=."]))
    train.validate(train.parse_config(["--template=single", "--mode=executor", "--init_from=."]))
    # per-role lr: one shared optimizer step cannot serve two learning rates
    with pytest.raises(train.ConfigError, match="designer_lr != executor_lr"):
        train.validate(train.parse_config(["--mode=coupled", "--designer_lr=1e-4", "--init_from=."]))
    train.validate(train.parse_config(["--mode=coupled", "--designer_lr=1e-4", "--policy=separate", "--init_from=."]))
    cfg = train.parse_config(["--lr=1e-5", "--designer_lr=1e-4"])
    assert (train.role_lr(cfg, "designer"), train.role_lr(cfg, "executor")) == (1e-4, 1e-5)


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


def test_seeded_runs_agree_and_resume_after_sigkill_is_exact(model_dir, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    run(args_for(model_dir, a))
    pb = run(args_for(model_dir, b, eval_tasks=4))    # b also prints the final table (after its last save)
    wa, wb = weights(a / "step_000003"), weights(b / "step_000003")
    assert same_weights(wa, wb), "two seeded runs differ"
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
    ma = metrics(a)
    assert [m["step"] for m in ma] == [1, 2, 3]
    assert [m["active"] for m in ma] == ["designer", "executor", "designer"]
    # designer_lr on the Designer's steps, lr on the Executor's (0: that step had no executor sample to train)
    assert ma[0]["lr"] == ma[2]["lr"] == 2e-3 and ma[1]["lr"] in (0.0, 1e-3)
    assert all(m["samples/designer"] == 4 for m in ma)
    # the weights moved: at least one update had a non-zero advantage
    from safetensors.torch import load_file
    w0 = load_file(str(Path(model_dir) / "model.safetensors"))
    assert any(not torch.equal(w0[k], wa[k]) for k in w0), "no update changed the weights"
    for key in ("reward/mean", "accuracy", "format_rate", "script_error_rate", "designer/adv_std",
                "time/rollout", "time/update", "time/weight_sync", "tokens/executor", "lr"):
        assert key in ma[0], key
    assert "designer/logprob_gap" in ma[0] and "executor/logprob_gap" in ma[1]
    assert ma[0]["designer/logprob_gap"] < 1e-3   # the engine's log-probs are what the trainer computes

    # killed right after its step-1 checkpoint, then resumed: the same weights after step 3
    p = subprocess.Popen([sys.executable, "train.py", *args_for(model_dir, c)], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (c / "step_000001").exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL
    assert (c / "step_000001" / "trainer_state.pt").exists()
    assert not (c / "step_000003").exists()
    run(args_for(model_dir, c, resume=True))
    assert same_weights(wa, weights(c / "step_000003")), "resumed run differs from the uninterrupted one"
    mc = metrics(c)
    assert [m["step"] for m in mc] == [1, 2, 3]
    assert [m["reward/mean"] for m in mc] == [m["reward/mean"] for m in ma]


def test_torchrun_two_ranks_hold_identical_weights(model_dir, tmp_path):
    out = tmp_path / "dist"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        "train.py", *args_for(model_dir, out, steps=2, save_every=2, verify_sync=True, eval_tasks=4)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
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


def test_heldout_tasks_share_no_text_with_training_and_cover_both_kinds():
    import data
    import tiny
    cfg = train.Config(eval_tasks=40, seed=0)
    training = train.load_mix(cfg)[0]                      # the tiny RL pool: the "rl" split
    assert {tiny.split_of(t) for t in training} == {"rl"}
    held = train.heldout_tasks(cfg, [training, tiny.make_tasks(300, seed=0)])   # + a file that holds tiny tasks
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
    cfg = train.parse_config(["--activation_checkpointing", "--ac_policy=selective", "--logprob_chunk=7",
                              "--logprob_keep_logits", "--temperature=0.7"])
    assert train.parse_config(["config/qwen3_4b.py"]).compile_layers    # the GPU presets compile their layers
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        fast = train.load_model(str(model_dir), cfg, torch.device("cpu"))
        assert all(layer.forward.func is speed._selective for layer in fast.model.layers)
        plain = train.load_model(str(model_dir), train.Config(temperature=0.7), torch.device("cpu"))
        assert "forward" not in vars(plain.model.layers[0])   # defaults: the layers as transformers made them
        ids = torch.randint(0, plain.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
        b = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        got, want = (train.logprobs_of(m, b, c, grad=True) for m, c in ((fast, cfg), (plain, train.Config(temperature=0.7))))
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(got, want)
        for (name, p), q in zip(fast.named_parameters(), plain.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        with pytest.raises(ValueError, match="checkpointing must be one of"):
            train.load_model(str(model_dir), train.Config(activation_checkpointing=True, ac_policy="some"),
                             torch.device("cpu"))
    finally:
        dist.destroy_process_group()
