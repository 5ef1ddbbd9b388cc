"""evaluate.py on real inputs: the published benchmark files, a tiny model, the same rollout code as
training."""

import json
from pathlib import Path

import pytest

import evaluate

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "benchmarks"
needs_shared = pytest.mark.skipif(
    not SHARED.exists(), reason=f"{SHARED} not present (the real benchmark files)"
)


@needs_shared
@pytest.mark.parametrize("name,n", [("aime24", 30), ("aime25", 30), ("olympiadbench", 675)])
def test_named_benchmarks_load_through_the_converters(name, n):
    bench, tasks, src = evaluate.load_benchmark(name)
    assert (bench, src) == (name, SHARED / f"{name}.jsonl") and len(tasks) == n
    assert len({t["id"] for t in tasks}) == n and all(t["kind"] == "math" for t in tasks)
    if name.startswith("aime"):  # graded as training grades: the gold right, its neighbour wrong
        import reward

        assert all(reward.correctness(t, f"so \\boxed{{{t['answer']}}}") == 1.0 for t in tasks)
        assert all(
            reward.correctness(t, f"<answer>{int(t['answer']) + 1}</answer>") == 0.0 for t in tasks
        )


def tiny_tasks(folder, n=4):
    """`python world/tiny.py tasks`: the tiny world's held-out tasks, written where --data says."""
    from world import tiny

    tiny.main(["tasks", "--n", str(n), "--out", str(folder / "tiny.jsonl")])
    return ["--data", str(folder)]


def test_clear_errors(tmp_path):
    with pytest.raises(SystemExit, match="task file not found"):
        evaluate.load_benchmark(str(tmp_path / "missing.jsonl"))
    # the tiny tasks are a file: a missing one says which command writes it
    with pytest.raises(SystemExit, match="world/tiny.py tasks --out"):
        evaluate.main(
            ["--model", "Qwen/Qwen3-8B", "--tasks", "tiny", "--data", str(tmp_path / "none")]
        )
    data = tiny_tasks(tmp_path)
    with pytest.raises(SystemExit, match="--model: no model folder"):
        evaluate.main(["--model", str(tmp_path / "nope"), "--tasks", "tiny", *data])
    with pytest.raises(SystemExit, match="unknown mode"):
        evaluate.main(["--model", "Qwen/Qwen3-8B", "--tasks", "tiny", "--mode", "bogus", *data])
    both = "give --model .one model, both roles., or --designer and --executor"
    for args in ([], ["--designer", "x"], ["--model", "x", "--executor", "y"]):
        with pytest.raises(SystemExit, match=both):
            evaluate.main([*args, "--tasks", "tiny", *data])


def test_tables_shape():
    res = {"single": {"a": {"pass@1": 0.25}, "b": {"pass@1": 0.75}}}
    table = evaluate.results_table(res, ["a", "b"])
    assert table.splitlines()[0] == "| method | a | b | Avg |"
    assert table.splitlines()[2] == "| single | 25.00 | 75.00 | 50.00 |"
    s = evaluate.structure_table({"a": {"structures": {"single": 0.5, "tester": 0.5}}})
    assert "| a | 50.00 | 0.00 | 0.00 | 50.00 | 0.00 | 0.00 |" in s


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from world import tiny

    path = tmp_path_factory.mktemp("tiny")
    tiny.save_tiny(path, seed=0)
    return path


def test_end_to_end_on_tiny_tasks_and_real_format(tiny_model, tmp_path):
    """Untrained tiny model: scores ~0, but every method runs through rollout + reward, crashing
    scripts count as wrong, and results.json records what was evaluated."""
    tasks = ["tiny"]
    if SHARED.exists():  # two real AIME25 problems, converted and saved in the task format
        from machinery import data

        _, aime, _ = evaluate.load_benchmark("aime25")
        data.save_tasks(aime[:2], tmp_path / "aime25_head.jsonl")
        tasks.append(str(tmp_path / "aime25_head.jsonl"))
    args = [
        *tiny_tasks(tmp_path),
        "--model",
        str(tiny_model),
        "--tasks",
        *tasks,
        "--mode",
        "single",
        "template:ensemble",
        "auto",
        "--backend",
        "hf",
        "--n-tiny",
        "2",
        "--short-prompt",
        "--max-tokens",
        "8",
        "--designer-max-tokens",
        "16",
        "--samples",
        "2",
        "--out",
        str(tmp_path),
    ]
    res = evaluate.main(args)
    rec = json.loads((tmp_path / "results.json").read_text())
    assert set(res) == {"single", "template:ensemble", "auto"}
    for method in res:
        for bench in res[method].values():
            assert 0.0 <= bench["pass@1"] <= 1.0
            # fp64 shares k/n of 6 categories (Python floats): their sum is within ~6·2^-53 ~ 1e-15
            # of 1
            assert abs(sum(bench["structures"].values()) - 1.0) < 1e-12
    assert len(rec["tasks"]["tiny"]["ids"]) == 2 and rec["samples"] == 2
    assert rec["models"] == {"shared": str(tiny_model)}
    assert len(rec["tasks"]["tiny"]["sha256"]) == 64  # the tiny tasks' file, by its hash
    if SHARED.exists():  # a task file is recorded with its hash
        assert len(rec["tasks"]["aime25_head"]["sha256"]) == 64
    # an untrained designer writes garbage: every one of its designs is unparseable, and it is
    # scored, not raised
    assert res["auto"]["tiny"]["structures"]["unparseable"] == 1.0
    assert res["single"]["tiny"]["structures"]["single"] == 1.0
    assert "| method |" in (tmp_path / "results.md").read_text()


def test_separate_policies_each_role_generates_with_its_own_model(tiny_model, tmp_path):
    """--designer D --executor E: one engine (D's), each role's view of it holding that role's
    weights: the Designer's view samples what an engine of D samples, the Executor's what an engine
    of E samples, in turn; results.json records both models."""
    from machinery import engine
    from world import tiny

    other = tiny.save_tiny(tmp_path / "other", seed=1)  # another model of the same shapes
    a = evaluate.parse_args(
        [
            "--designer",
            str(tiny_model),
            "--executor",
            str(other),
            "--tasks",
            "tiny",
            "--backend",
            "hf",
        ]
    )
    d, e = evaluate.load_policies(a)
    prompt = [{"role": "user", "content": "Compute 2+3."}]
    sampling = engine.Sampling(max_tokens=12, seed=7)
    want = {
        r: engine.make_engine(str(p), backend="hf").generate([prompt], sampling)[0][0].token_ids
        for r, p in (("designer", tiny_model), ("executor", other))
    }
    assert want["designer"] != want["executor"]  # the two models differ, so the check can fail
    for view in (d, e, d, e):  # each role's weights come back after the other's
        assert view.generate([prompt], sampling)[0][0].token_ids == want[view.role]
    evaluate.main(
        [
            *tiny_tasks(tmp_path),
            "--designer",
            str(tiny_model),
            "--executor",
            str(other),
            "--tasks",
            "tiny",
            "--mode",
            "auto",
            "--backend",
            "hf",
            "--n-tiny",
            "2",
            "--short-prompt",
            "--max-tokens",
            "8",
            "--designer-max-tokens",
            "16",
            "--out",
            str(tmp_path / "eval"),
        ]
    )
    rec = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert rec["models"] == {"designer": str(tiny_model), "executor": str(other)}
