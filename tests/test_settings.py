"""settings.py's memory plan of a GPU rank: every Adam state that exists counted (a shared policy
trained stagewise holds two after the first switch, unless the idle one is offloaded; separate
policies two models), at the update and at the engine's wake; the presets fit the ranks they are
set for; a plan that does not fit is refused before any model loads with its arithmetic and the fix;
an engine share too small for its own weights is refused; the parameters are init_from's
(*.safetensors headers) or, before it exists, Qwen3's by the size its name says. `train.py PRESET
--plan` prints the plan per rank count and agrees with validate. The batch that does not divide by
the ranks says what to set. No GPU here: the plan is for an H200 (plans.H200_GIB)."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import settings
from machinery import plans
from world import tiny

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
QWEN3_8B, QWEN3_4B = 8_190_735_360, 4_022_468_096  # plans.qwen3_params, built on meta below


def header_only(folder, params):
    """A model folder whose model.safetensors declares `params` bf16 parameters: the header alone
    (all stored_params reads; no tensor data follows it)."""
    folder.mkdir()
    head = json.dumps({"w": {"dtype": "BF16", "shape": [int(params)], "data_offsets": [0, 0]}})
    raw = head.encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    return str(folder)


def test_the_presets_plans_fit_and_8b_on_one_gpu_is_refused():
    big = settings.parse_config(["config/qwen3_8b.py"])
    assert big.offload_idle_state and big.mode == "stagewise" and big.policy == "shared"
    assert plans.plan_problems(big, 8, QWEN3_8B) == []
    assert plans.plan_problems(big, 2, QWEN3_8B) == []  # 61.0 + 62.6 + 4 = 127.6 GiB of 139
    (problem,) = plans.plan_problems(big, 1, QWEN3_8B)
    # 16 B x 8.19e9 = 122.1 GiB of trainer states alone
    assert "update: (4 weights + 4 gradients + 8 Adam, 1 state(s)) B x 8.19e+09 params" in problem
    assert "/ 1 rank(s) = 122.1 GiB" in problem and "at least 2 ranks" in problem
    small = settings.parse_config(["config/qwen3_4b.py"])
    assert plans.plan_problems(small, 1, QWEN3_4B) == []
    plan = plans.memory_plan(small, 1, QWEN3_4B)
    assert plan["trainer"] == pytest.approx(16 * QWEN3_4B / GIB)  # one Adam state on the GPU
    assert plan["host"] == pytest.approx(8 * QWEN3_4B / GIB)  # the idle one, in host memory
    assert plan["engine"] == pytest.approx(0.5 * 139.0)
    assert plan["update"] == pytest.approx(plan["trainer"] + plan["engine"] + plans.RESERVE_GIB)
    assert plan["wake"] == pytest.approx(plan["update"] - 4 * QWEN3_4B / GIB)  # gradients freed
    assert plan["total"] == plan["update"] <= plan["gpu"]
    # the CPU presets have no plan
    assert plans.memory_plan(settings.parse_config([]), 1, 1e6) is None


def test_the_plan_counts_every_adam_state_that_exists():
    """Bytes a parameter at the update: shared stagewise 4 + 4 + 8 x 2 = 24 (both roles' states
    after the first switch), 16 with the idle one offloaded; coupled and one-role modes one state
    (16), the offload moving nothing; separate policies (P: both models) 4 P weights, the trained
    model's gradients and one state a model: stagewise 4 + 2 + 8 = 14 B x P (10 offloaded),
    coupled 4 + 4 + 8 = 16 B x P."""
    P = 1e9

    def per_param(*flags):
        cfg = settings.parse_config(["config/qwen3_8b.py", *flags])
        p = plans.memory_plan(cfg, 1, P)
        return p["trainer"] * GIB / P, p["host"] * GIB / P, p["wake"] - p["update"]

    assert per_param("--offload_idle_state=False") == pytest.approx((24, 0, -4 * P / GIB))
    assert per_param() == pytest.approx((16, 8, -4 * P / GIB))
    for mode in ("coupled", "executor", "designer"):
        for off in ("True", "False"):
            assert per_param(f"--mode={mode}", f"--offload_idle_state={off}")[:2] == (16, 0)
    sep = ("--policy=separate",)
    assert per_param(*sep, "--offload_idle_state=False") == pytest.approx((14, 0, -2 * P / GIB))
    assert per_param(*sep) == pytest.approx((10, 4, -2 * P / GIB))
    assert per_param(*sep, "--mode=coupled") == pytest.approx((16, 0, -4 * P / GIB))
    # the engine holds one role's weights at a time: one model's, in bf16
    cfg = settings.parse_config(["config/qwen3_8b.py", *sep])
    assert plans.memory_plan(cfg, 1, 2 * P)["engine_weights"] == pytest.approx(2 * P / GIB)
    # the arithmetic without the offload: 4B on one GPU 20 B at wake, 148.4 GiB; 8B on two
    # ranks 142.8 GiB; both refused, with the offload among the fixes
    for preset, n, world, wake in (
        ("qwen3_4b", QWEN3_4B, 1, 148.4),
        ("qwen3_8b", QWEN3_8B, 2, 142.8),
    ):
        cfg = settings.parse_config([f"config/{preset}.py", "--offload_idle_state=False"])
        assert plans.memory_plan(cfg, world, n)["wake"] == pytest.approx(wake, abs=0.05)
        (problem,) = plans.plan_problems(cfg, world, n)
        assert "--offload_idle_state" in problem and "16 Adam, 2 state(s)" in problem


def test_validate_refuses_a_plan_that_does_not_fit_with_its_arithmetic(tmp_path):
    folder = header_only(tmp_path / "sft-4b", QWEN3_4B)
    cfg = settings.parse_config(
        [
            "config/qwen3_4b.py",
            f"--init_from={folder}",
            "--engine_kwargs={'gpu_memory_utilization': 0.6}",
        ]
    )
    # 59.9 + 0.6 x 139 = 83.4 + 4 = 147.3 GiB of 139: the largest share that fits is 0.54
    with pytest.raises(settings.ConfigError) as e:
        settings.validate(cfg, world=1)
    assert "= 59.9 GiB" in str(e.value) and "= 147.3 GiB of 139 GiB" in str(e.value)
    assert "at least 2 ranks, or gpu_memory_utilization <= 0.54" in str(e.value)
    low = settings.parse_config(
        ["config/qwen3_8b.py", "--engine_kwargs={'gpu_memory_utilization': 0.1}"]
    )
    (problem,) = plans.plan_problems(low, 8, QWEN3_8B)
    # 0.1 x 139 = 13.9 GiB, below the bf16 weights' 15.3 GiB
    assert "leaves the engine no KV cache" in problem and "(15.3 GiB)" in problem
    # an engine share that leaves no room at any number of ranks: the fix is the share
    full = settings.parse_config(
        ["config/qwen3_8b.py", "--engine_kwargs={'gpu_memory_utilization': 0.97}"]
    )
    (problem,) = plans.plan_problems(full, 8, QWEN3_8B)
    assert problem.endswith("(gpu_memory_utilization <= 0.86)")
    whole = settings.parse_config(
        ["config/qwen3_8b.py", "--engine_kwargs={'gpu_memory_utilization': 1}"]
    )
    assert "must be in (0, 1), got 1" in plans.plan_problems(whole, 8, QWEN3_8B)[0]


def test_the_plans_parameters_are_init_froms(tmp_path):
    folder = tiny.save_tiny(str(tmp_path / "m"), seed=0)
    n = plans.stored_params(folder)  # from the safetensors headers alone
    model, _ = tiny.build_model(seed=0)
    assert n == sum(p.numel() for p in model.parameters())  # tied: the head stored once
    cfg = settings.parse_config(["config/qwen3_8b.py", f"--init_from={folder}"])
    assert plans.init_params(cfg) == n
    assert plans.plan_problems(cfg, world=8) == []
    # 8B's files on one GPU: refused from the headers, before any model loads
    big = header_only(tmp_path / "sft-8b", QWEN3_8B)
    cfg = settings.parse_config(["config/qwen3_8b.py", f"--init_from={big}"])
    (problem,) = plans.plan_problems(cfg, world=1)
    assert "B x 8.19e+09 params / 1 rank(s) = 122.1 GiB" in problem
    # a missing init_from: no plan to check (validate names the folder on its own)
    gone = settings.parse_config(["config/qwen3_8b.py", f"--init_from={tmp_path / 'gone'}"])
    assert plans.plan_problems(gone, world=1) == []


def test_the_qwen3_table_counts_the_models_parameters():
    """plans.QWEN3's shapes, built as transformers builds Qwen3 (on the meta device: no memory),
    hold qwen3_params parameters; init_from's name picks the size."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    counts = {}
    for size, shape in plans.QWEN3.items():
        with torch.device("meta"):
            model = Qwen3ForCausalLM(Qwen3Config(**shape))
        # parameters() lists a tied head once, as the safetensors file stores it
        counts[size] = sum(p.numel() for p in model.parameters())
        assert counts[size] == plans.qwen3_params(size), size
    assert counts == {"0.6b": 596_049_920, "4b": QWEN3_4B, "8b": QWEN3_8B}
    names = {
        "out/sft-qwen3-8b": "8b",
        "Qwen/Qwen3-4B": "4b",
        "out/sft-qwen3-0.6b-separate": "0.6b",
        "Qwen/Qwen3-14B": None,
        "out/tiny-sft": None,
    }
    assert {path: plans.qwen3_size(path) for path in names} == names


def plan_rows(text):
    """{(offload, ranks): the row's verdict} of plan_report's tables."""
    rows, offload = {}, None
    for line in text.splitlines():
        if line.startswith("offload_idle_state="):
            offload = line.split("=")[1].split()[0].rstrip(",") == "True"
        cells = line.split()
        if offload is not None and cells and cells[0].isdigit():
            rows[(offload, int(cells[0]))] = " ".join(cells[7:])
    return rows


def test_plan_prints_each_rank_count_and_agrees_with_validate(tmp_path, capsys):
    """`train.py PRESET --plan`: loads nothing, checks no data or model folder, exits 0 whether the
    plan fits or not; a row says "does not fit" exactly where validate refuses."""
    import train

    for preset, n in (("config/qwen3_4b.py", QWEN3_4B), ("config/qwen3_8b.py", QWEN3_8B)):
        out = tmp_path / "out"
        args = [preset, "--plan", "--ranks=1,2,3,4,8", f"--out_dir={out}"]
        assert train.main(args) is None  # no SystemExit: exit 0
        text = capsys.readouterr().out
        assert not out.exists() and not torch.distributed.is_initialized()
        assert f"{n:.3g} parameters" in text and "not there yet" in text  # QWEN3's, by name
        rows = plan_rows(text)
        assert sorted(rows) == sorted(itertools.product((True, False), (1, 2, 3, 4, 8)))
        for (on, w), verdict in rows.items():
            cfg = settings.parse_config([preset, f"--offload_idle_state={on}"])
            refused = plans.plan_problems(cfg, w, n)
            assert (not verdict.startswith("fits")) == bool(refused), (preset, on, w)
            assert ("batch_size: set --batch_size=9 (3 a rank)" in verdict) == (w == 3)
    rows = plan_rows(text)  # the 8B preset's
    assert rows[(True, 2)] == "fits" and rows[(False, 2)].startswith("does not fit: at least 4")
    # the parameters from init_from's headers, or given
    folder = header_only(tmp_path / "any-model", 1e9)
    train.main(["config/qwen3_8b.py", "--plan", f"--init_from={folder}", "--ranks=1"])
    assert "1e+09 parameters (init_from" in capsys.readouterr().out
    train.main(["config/qwen3_8b.py", "--plan", "--init_from=elsewhere", "--params=4b"])
    assert f"{QWEN3_4B:.3g} parameters (Qwen3-4B's, --params)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        train.main(["config/qwen3_8b.py", "--plan", "--init_from=elsewhere"])
    assert "give --params=8b or --params=8.19e9" in str(e.value.code)
    train.main(["--plan"])  # the tiny default: no GPU plan
    assert "no memory plan" in capsys.readouterr().out


def test_plan_from_the_command_line():
    p = subprocess.run(
        [sys.executable, "train.py", "config/qwen3_4b.py", "--plan", "--ranks=1,2,8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert p.returncode == 0, p.stderr[-2000:]
    rows = plan_rows(p.stdout)
    assert rows[(True, 1)] == "fits"  # 133.4 GiB of 139
    assert rows[(False, 1)].startswith("does not fit: at least 2 ranks, or --offload_idle_state")
    assert "133.4" in p.stdout and "163.4" in p.stdout


def test_a_batch_that_does_not_divide_says_what_to_set(tmp_path):
    cfg = settings.parse_config(["--init_from=.", f"--out_dir={tmp_path / 'run'}"])
    with pytest.raises(settings.ConfigError) as e:
        settings.validate(cfg, world=16)  # the paper's B = 8 on 16 GPUs
    assert (
        "batch_size=8 must be divisible by the number of ranks (16): set --batch_size=16 (1 a "
        "rank), or run on 1, 2, 4, 8 ranks"
    ) in str(e.value)
    with pytest.raises(settings.ConfigError) as e:
        settings.validate(settings.parse_config(["--batch_size=6", "--init_from=."]), world=4)
    assert "set --batch_size=8 (2 a rank) or --batch_size=4 (1 a rank), or run on 1, 2, 3, 6" in (
        str(e.value)
    )


def test_the_sft_plan_counts_states_activations_and_the_head(tmp_path):
    """plans.sft_plan (sft.py's, before any model loads): 16 B a parameter over the ranks, the
    micro-batch's tokens x what a token keeps (checkpointing full: each layer's bf16 input and one
    layer's intermediates; off: every layer's), the lm head's chunk, the bf16 weights; refused
    with the arithmetic and the fix."""
    n, shape = plans.model_shape("Qwen/Qwen3-8B")  # not here: the size its name says
    assert n == QWEN3_8B and (shape["hidden_size"], shape["tie_word_embeddings"]) == (4096, False)
    layer = 2 * (10 * 4096 + 4 * 12288)  # one layer's intermediates a token, bf16
    p = plans.sft_plan(shape, n, 8, 16384, "full")
    assert p["states"] == pytest.approx(16 * n / 8 / GIB)
    assert p["per_token"] == 36 * 2 * 4096 + layer
    assert p["activations"] == pytest.approx(16384 * p["per_token"] / GIB)
    assert p["head"] == pytest.approx((3 * 1024 * 151936 * 4 + 151936 * 4096 * 4) / GIB)
    parts = p["states"] + p["activations"] + p["head"] + p["bf16"] + plans.RESERVE_GIB
    assert (
        p["total"] == pytest.approx(parts)
        and plans.sft_plan_problems(shape, n, 8, 16384, "full") == []
    )
    # the case: 8 samples of 8k tokens a rank in one pass, no checkpointing: ~6 MB a token
    off = plans.sft_plan(shape, n, 8, 8 * 8192, "off")
    assert off["per_token"] == 36 * layer and off["activations"] > 380
    (problem,) = plans.sft_plan_problems(shape, n, 8, 8 * 8192, "off")
    room = off["gpu"] - off["states"] - off["head"] - off["bf16"] - plans.RESERVE_GIB
    assert f"--micro_tokens <= {int(room * GIB // off['per_token'])}" in problem
    assert "--checkpointing full with --micro_tokens 65536" in problem
    # one GPU: 122 GiB of states alone and autocast's bf16 copy of the weights
    (problem,) = plans.sft_plan_problems(shape, n, 1, 16384, "full")
    assert "= 122.1 GiB" in problem and "bf16 weights 15.3 GiB" in problem
    assert problem.endswith("(at least 2 ranks)")
    # a folder: its config.json and safetensors headers
    folder = tiny.save_tiny(str(tmp_path / "m"), seed=0)
    n, shape = plans.model_shape(folder)
    model = tiny.build_model(seed=0)[0]
    assert n == sum(p.numel() for p in model.parameters())
    assert shape["hidden_size"] == model.config.hidden_size
    assert plans.model_shape(tmp_path / "no-such-model") == (0, None)


def test_the_benchmark_curve_settings_are_checked_and_recorded(tmp_path):
    """val_every > 0 needs val_tasks: a task file, or a benchmark name whose data/NAME.jsonl is
    there (the message names the command that writes it); off by default (the tiny default's run
    unchanged); every field is in run.json's config (dataclasses.asdict)."""
    import dataclasses

    cfg = settings.parse_config([])
    assert (cfg.val_every, cfg.val_tasks) == (0, "") and settings.val_problems(cfg) == []
    no_tasks = settings.parse_config(["--val_every=100"])
    assert settings.val_problems(no_tasks) == [
        "val_every > 0 needs val_tasks: a benchmark name (data/NAME.jsonl) or a task file"
    ]
    named = settings.parse_config(["--val_every=100", "--val_tasks=surely_absent"])
    assert settings.val_path(named) == os.path.join("data", "surely_absent.jsonl")
    (want,) = settings.val_problems(named)
    assert "`python machinery/data.py prepare surely_absent` writes" in want
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("")
    given = settings.parse_config(["--val_every=5", f"--val_tasks={tasks}"])
    assert settings.val_path(given) == str(tasks)
    with pytest.raises(settings.ConfigError, match="val_size must be >= 0"):
        settings.validate(settings.parse_config(["--val_size=-1", "--init_from=."]))
    fields = dataclasses.asdict(given)
    for k in ("val_tasks", "val_every", "val_size"):
        assert k in fields
