"""evaluate.py on real inputs: the published benchmark files (prepared as machinery/data.py
prepares them), a tiny model, a 2-step tiny run evaluated with its own settings, one rank and two,
the same rollout code as training."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import evaluate
from machinery import results as report

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "benchmarks"
needs_shared = pytest.mark.skipif(
    not SHARED.exists(), reason=f"{SHARED} not present (the real benchmark files)"
)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """../shared/data's published math benchmarks through `machinery/data.py prepare NAME --from
    FILE --out DIR`: DIR/NAME.jsonl, the file evaluate.py reads by name."""
    from machinery import data

    out = tmp_path_factory.mktemp("data")
    for name in ("aime24", "aime25", "olympiadbench"):
        data.main(["prepare", name, "--from", str(SHARED / f"{name}.jsonl"), "--out", str(out)])
    return out


def test_benchmark_names_are_the_prepared_test_splits(tmp_path):
    assert evaluate.BENCHMARKS == (
        "aime24",
        "aime25",
        "olympiadbench",
        "apps",
        "apps500",
        "livecodebench",
        "codecontests",
    )
    for name in evaluate.BENCHMARKS:  # a missing one: one line naming the command that makes it
        with pytest.raises(SystemExit) as e:
            evaluate.load_benchmark(name, data_dir=tmp_path)
        want = f"`python machinery/data.py prepare {name} --out {tmp_path}` writes it"
        assert want in str(e.value) and "\n" not in str(e.value)
    if not (evaluate.DATA / "codecontests.jsonl").exists():  # the default folder: data/
        with pytest.raises(SystemExit, match=r"`python machinery/data.py prepare codecontests` "):
            evaluate.load_benchmark("codecontests")


@needs_shared
@pytest.mark.parametrize("name,n", [("aime24", 30), ("aime25", 30), ("olympiadbench", 675)])
def test_named_benchmarks_load_through_the_converters(name, n, prepared):
    bench, tasks, src = evaluate.load_benchmark(name, data_dir=prepared)
    assert (bench, src) == (name, prepared / f"{name}.jsonl") and len(tasks) == n
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
    both = "give --run RUN, --model .one model, both roles., or --designer and --executor"
    for args in ([], ["--designer", "x"], ["--model", "x", "--executor", "y"]):
        with pytest.raises(SystemExit, match=both):
            evaluate.main([*args, "--tasks", "tiny", *data])


def test_tables_shape():
    res = {"single": {"a": {"pass@1": 0.25}, "b": {"pass@1": 0.75}}}
    table = report.results_table(res, ["a", "b"])
    assert table.splitlines()[0] == "| method | a | b | Avg |"
    assert table.splitlines()[2] == "| single | 25.00 | 75.00 | 50.00 |"
    s = report.structure_table({"a": {"structures": {"single": 0.5, "tester": 0.5}}})
    assert "| a | 50.00 | 0.00 | 0.00 | 50.00 | 0.00 | 0.00 |" in s


def test_paper_table_across_folders(tmp_path):
    """evaluate.py --table: the paper's sets in its order, then any other; a row lacking a set
    shows "-" there and has no average."""
    base = {"models": {"shared": "Qwen/Qwen3-8B"}, "run": None}
    runs = {"base": {"single": {"aime24": 0.25, "mine": 0.5, "livecodebench": 0.125}}}
    runs["rl"] = {"auto": {"aime24": 0.5, "livecodebench": 0.25}}
    for d, res in runs.items():
        per = {m: {b: {"pass@1": x} for b, x in r.items()} for m, r in res.items()}
        (tmp_path / d).mkdir()
        record = {**base, "results": per}
        if d == "rl":
            record["run"] = {"dir": "out/qwen3-8b-rl", "step": 400}
        (tmp_path / d / "results.json").write_text(json.dumps(record))
    table = report.paper_table([tmp_path / "base", tmp_path / "rl"]).splitlines()
    assert table == [
        "| model | method | livecodebench | aime24 | mine | average |",
        "|---|---|---|---|---|---|",
        "| Qwen/Qwen3-8B | single | 12.50 | 25.00 | 50.00 | 29.17 |",
        "| out/qwen3-8b-rl step 400 | auto | 25.00 | 50.00 | - | - |",
    ]
    with pytest.raises(SystemExit, match="no results.json"):
        report.paper_table([tmp_path])
    with pytest.raises(SystemExit, match="--table: give"):
        report.paper_table([])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from world import tiny

    path = tmp_path_factory.mktemp("tiny")
    tiny.save_tiny(path, seed=0)
    return path


def test_end_to_end_on_tiny_tasks_and_real_format(tiny_model, tmp_path, request):
    """Untrained tiny model: scores ~0, but every method runs through rollout + reward, crashing
    scripts count as wrong, and results.json records what was evaluated."""
    tasks = ["tiny"]
    if SHARED.exists():  # two real AIME25 problems, converted and saved in the task format
        from machinery import data

        prepared = request.getfixturevalue("prepared")
        _, aime, _ = evaluate.load_benchmark("aime25", data_dir=prepared)
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
        "--n_tiny",
        "2",
        "--short_prompt",
        "--max_tokens",
        "8",
        "--designer_max_tokens",
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
            "--n_tiny",
            "2",
            "--short_prompt",
            "--max_tokens",
            "8",
            "--designer_max_tokens",
            "16",
            "--out",
            str(tmp_path / "eval"),
        ]
    )
    rec = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert rec["models"] == {"designer": str(tiny_model), "executor": str(other)}


# -------------------------------------------------------------------------------- a run, as trained
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model):
    """A 2-step tiny train.py run (an untrained tiny model as its cold start), with settings of its
    own that evaluate.py must read back: the hf backend, 12 / 24 tokens, a chat template switch."""
    out = tmp_path_factory.mktemp("run") / "rl"
    args = [
        "config/tiny.py",
        f"--init_from={tiny_model}",
        f"--out_dir={out}",
        "--backend=hf",
        "--steps=2",
        "--save_every=1",
        "--batch_size=2",
        "--M=2",
        "--N=1",
        "--K=1",
        "--max_tokens=12",
        "--designer_max_tokens=24",
        "--logprobs=plain",
        "--eval_tasks=0",
        "--probe_tasks=0",
        "--chat_template_kwargs={'enable_thinking': False}",
    ]
    p = subprocess.run(
        [sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out


def run_args(run, data, out, *more):
    return ["--run", str(run), "--tasks", "tiny", *data, "--n_tiny", "4", "--out", str(out), *more]


def test_a_run_is_evaluated_with_its_own_settings(tiny_run, tmp_path, capsys):
    """--run RUN: the last checkpoint's model, the run's backend, chat template switches, max tokens
    and prompts, greedy by default; each read back from the results' header and record."""
    data = tiny_tasks(tmp_path)
    evaluate.main(run_args(tiny_run, data, tmp_path / "a", "--mode", "auto"))
    head = (tmp_path / "a" / "results.md").read_text().split("### ")[0]
    assert f"- models: --model {tiny_run}/step_000002/model (run {tiny_run}, step 2)" in head
    assert f"- settings from {tiny_run}/run.json (step 2)\n" in head  # no flag overrode any
    assert "- protocol: greedy: temperature 0.0, top_p 1.0 ([authors] greedy" in head
    assert "- backend: hf; engine_kwargs: {}" in head
    assert '- chat_template_kwargs: {"enable_thinking": false}' in head
    assert "- max_tokens: 12; designer_max_tokens: 24; short prompts: True" in head
    assert "- benchmarks (source; split; subset; problems x samples a problem):\n" in head
    tiny_file = f"{data[1]}/tiny.jsonl"
    assert f"  - tiny: the tiny world's held-out eval split ({tiny_file}), its first 4; " in head
    assert "; 4 problems x 1 sample a problem\n" in head
    rec = json.loads((tmp_path / "a" / "results.json").read_text())
    assert rec["run"] == {"dir": str(tiny_run), "step": 2} and rec["ranks"] == 1
    assert rec["sampling"]["executor"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 12}
    assert rec["sampling"]["designer"]["max_tokens"] == 24
    # --step, a protocol and a flag: each stated
    more = ["--mode", "single", "--step", "1", "--protocol", "train", "--max_tokens", "8"]
    evaluate.main(run_args(tiny_run, data, tmp_path / "b", *more))
    head = (tmp_path / "b" / "results.md").read_text()
    assert f"(run {tiny_run}, step 1)" in head and "; flags: --max_tokens\n" in head
    assert "- protocol: train: temperature 1.0, top_p 1.0 (ours" in head
    assert "- max_tokens: 8; designer_max_tokens: 24" in head
    evaluate.main(run_args(tiny_run, data, tmp_path / "c", "--mode", "single", "--top_p", "0.5"))
    assert (
        "- protocol: greedy (custom: --top_p): temperature 0.0, top_p 0.5"
        in (tmp_path / "c" / "results.md").read_text()
    )
    # the paper's Table 1 across the two evaluations: a row per model and method, nothing run
    capsys.readouterr()  # (what the evaluations printed)
    evaluate.main(["--table", str(tmp_path / "a"), str(tmp_path / "b")])
    table = capsys.readouterr().out.strip().splitlines()
    assert table[0] == "| model | method | tiny | average |"
    pct = {d: json.loads((tmp_path / d / "results.json").read_text())["results"] for d in "ab"}
    a_auto = f"{100 * pct['a']['auto']['tiny']['pass@1']:.2f}"
    b_single = f"{100 * pct['b']['single']['tiny']['pass@1']:.2f}"
    assert table[2:] == [
        f"| {tiny_run} step 2 | auto | {a_auto} | {a_auto} |",
        f"| {tiny_run} step 1 | single | {b_single} | {b_single} |",
    ]
    with pytest.raises(SystemExit, match=r"--step 7: no .*step_000007 \(the run has 1, 2\)"):
        evaluate.main(run_args(tiny_run, data, tmp_path / "d", "--step", "7"))
    with pytest.raises(SystemExit, match="--run: no .*run.json"):
        evaluate.main(run_args(tmp_path, data, tmp_path / "d"))
    with pytest.raises(SystemExit, match="--run takes its models and settings from the run"):
        evaluate.main(run_args(tiny_run, data, tmp_path / "d", "--model", "x"))


def test_two_gloo_ranks_give_the_table_of_one(tiny_run, tmp_path):
    """torchrun --nproc_per_node=2 evaluate.py: each rank its half of the tasks with its own engine,
    rank 0 the gathered table; sampled (protocol train, K = 2), a problem's draws follow its index
    alone, so the numbers are those of one process."""
    data = tiny_tasks(tmp_path, n=5)  # 5: the ranks hold 3 and 2
    more = ["--n_tiny", "5", "--mode", "single", "auto", "--protocol", "train", "--samples", "2"]
    one = run_args(tiny_run, data, tmp_path / "one", *more)
    # --rundir: torchrun's parser would take --run for its --run-path
    two = ["--rundir", *run_args(tiny_run, data, tmp_path / "two", *more)[1:]]
    evaluate.main(one)
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        + ["evaluate.py", *two],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "two"))
    assert (a["ranks"], b["ranks"]) == (1, 2)
    assert len(b["results"]["auto"]["tiny"]["per_problem"]) == 5
    assert a["results"] == b["results"]  # every per-problem number and structure count
    table = (tmp_path / "one" / "results.md").read_text().split("### ", 1)[1]
    assert (tmp_path / "two" / "results.md").read_text().split("### ", 1)[1] == table


def test_a_separate_policy_run_gives_each_role_its_checkpoint_folder(tiny_model, tmp_path):
    """--run of a policy=separate run: the Designer from step_N/designer, the Executor from
    step_N/executor, each role's view of one engine (as train.py runs them)."""
    from world import tiny

    cold = tmp_path / "cold"
    tiny.save_tiny(cold / "designer", seed=0)
    tiny.save_tiny(cold / "executor", seed=1)
    out = tmp_path / "sep"
    args = ["config/tiny.py", f"--init_from={cold}", f"--out_dir={out}", "--policy=separate"]
    args += ["--backend=hf", "--steps=1", "--batch_size=2", "--M=2", "--N=1", "--K=1"]
    args += ["--max_tokens=12", "--designer_max_tokens=24", "--logprobs=plain", "--eval_tasks=0"]
    p = subprocess.run(
        [sys.executable, "train.py", *args, "--probe_tasks=0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    evaluate.main(run_args(out, tiny_tasks(tmp_path), tmp_path / "e", "--mode", "auto"))
    rec = json.loads((tmp_path / "e" / "results.json").read_text())
    step = out / "step_000001"
    assert rec["models"] == {"designer": str(step / "designer"), "executor": str(step / "executor")}
    head = (tmp_path / "e" / "results.md").read_text()
    assert f"- models: --designer {step / 'designer'} --executor {step / 'executor'}" in head


def test_an_evaluation_killed_after_its_first_benchmark_resumes_without_redoing_it(
    tiny_model, tmp_path
):
    """Each benchmark's results are written as it finishes (OUT/parts/); an evaluation SIGKILLed
    right after its first (tests/kill_at.py, point part:1) resumes with --resume: the first is read
    back, not evaluated again (its file untouched), and results.json holds the numbers of an
    evaluation left alone."""
    data = tiny_tasks(tmp_path, n=3)
    args = [*data, "--model", str(tiny_model), "--tasks", "tiny", "--mode", "single", "auto"]
    args += ["--backend", "hf", "--n_tiny", "3", "--short_prompt", "--max_tokens", "8"]
    args += ["--designer_max_tokens", "16", "--protocol", "train", "--samples", "2"]
    evaluate.main([*args, "--out", str(tmp_path / "alone")])
    out = tmp_path / "killed"
    cmd = [sys.executable, "evaluate.py", *args, "--out", str(out)]
    kill = [sys.executable, str(ROOT / "tests" / "kill_at.py"), "part:1", *cmd[1:]]
    p = subprocess.run(kill, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == -signal.SIGKILL, p.stdout[-2000:] + p.stderr[-2000:]
    assert sorted(f.name for f in (out / "parts").iterdir()) == ["single@tiny.json"]
    first = (out / "parts" / "single@tiny.json").stat()
    p = subprocess.run([*cmd, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    again = (out / "parts" / "single@tiny.json").stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    a, b = (json.loads((d / "results.json").read_text()) for d in (tmp_path / "alone", out))
    assert a["results"] == b["results"]
    table = (tmp_path / "alone" / "results.md").read_text().split("### ", 1)[1]
    assert (out / "results.md").read_text().split("### ", 1)[1] == table
