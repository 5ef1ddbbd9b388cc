"""settings.py's memory plan of a GPU rank: the presets fit the ranks they are set for, a plan that
does not fit is refused before any model loads with its arithmetic in the message (and the fix), an
engine share too small for its own weights is refused, and the parameters are init_from's (its
*.safetensors headers). No GPU here: the plan is for an H200 (settings.H200_GIB)."""

import json

import pytest

import settings
from world import tiny

GIB = 2**30
QWEN3_8B, QWEN3_4B = 8.19e9, 4.02e9


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
    assert settings.plan_problems(big, 8, QWEN3_8B) == []
    assert settings.plan_problems(big, 2, QWEN3_8B) == []  # 61.0 + 62.6 + 4 = 127.6 GiB of 139
    (problem,) = settings.plan_problems(big, 1, QWEN3_8B)
    # 16 B x 8.19e9 = 122.0 GiB of trainer states alone
    assert "does not fit: 16 B x 8.19e+09 params / 1 rank(s) = 122.0 GiB" in problem
    assert "at least 2 ranks" in problem
    small = settings.parse_config(["config/qwen3_4b.py"])
    assert settings.plan_problems(small, 1, QWEN3_4B) == []
    plan = settings.memory_plan(small, 1, QWEN3_4B)
    assert plan["trainer"] == pytest.approx(16 * 4.02e9 / GIB)
    assert plan["engine"] == pytest.approx(0.5 * 139.0)
    assert plan["total"] == pytest.approx(plan["trainer"] + plan["engine"] + settings.RESERVE_GIB)
    assert plan["total"] <= plan["gpu"]
    # the CPU presets have no plan
    assert settings.memory_plan(settings.parse_config([]), 1, 1e6) is None


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
    assert "gpu_memory_utilization <= 0.54" in str(e.value)
    low = settings.parse_config(
        ["config/qwen3_8b.py", "--engine_kwargs={'gpu_memory_utilization': 0.1}"]
    )
    (problem,) = settings.plan_problems(low, 8, QWEN3_8B)
    # 0.1 x 139 = 13.9 GiB, below the bf16 weights' 15.3 GiB
    assert "leaves the engine no KV cache" in problem and "(15.3 GiB)" in problem
    # an engine share that leaves no room at any number of ranks: the fix is the share
    full = settings.parse_config(
        ["config/qwen3_8b.py", "--engine_kwargs={'gpu_memory_utilization': 0.97}"]
    )
    (problem,) = settings.plan_problems(full, 8, QWEN3_8B)
    assert "(a smaller engine share, or gpu_memory_utilization <= 0.86)" in problem
    whole = settings.parse_config(
        ["config/qwen3_8b.py", "--engine_kwargs={'gpu_memory_utilization': 1}"]
    )
    assert "must be in (0, 1), got 1" in settings.plan_problems(whole, 8, QWEN3_8B)[0]


def test_the_plans_parameters_are_init_froms(tmp_path):
    folder = tiny.save_tiny(str(tmp_path / "m"), seed=0)
    n = settings.stored_params(folder)  # from the safetensors headers alone
    model, _ = tiny.build_model(seed=0)
    assert n == sum(p.numel() for p in model.parameters())  # tied: the head stored once
    cfg = settings.parse_config(["config/qwen3_8b.py", f"--init_from={folder}"])
    assert settings.init_params(cfg) == n
    assert settings.plan_problems(cfg, world=8) == []
    # 8B's files on one GPU: refused from the headers, before any model loads
    big = header_only(tmp_path / "sft-8b", QWEN3_8B)
    cfg = settings.parse_config(["config/qwen3_8b.py", f"--init_from={big}"])
    (problem,) = settings.plan_problems(cfg, world=1)
    assert "16 B x 8.19e+09 params / 1 rank(s) = 122.0 GiB" in problem
    # a missing init_from: no plan to check (validate names the folder on its own)
    gone = settings.parse_config(["config/qwen3_8b.py", f"--init_from={tmp_path / 'gone'}"])
    assert settings.plan_problems(gone, world=1) == []
