"""data.py on the real benchmark files and on fixtures in each published shape: the converters,
skip-and-count, the recipe (`prepare --from` on local files, offline) and its train/test split."""

import base64
import json
import os
import pickle
import socket
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import sandbox
import settings
from machinery import data

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).resolve().parent / "fixtures"
DATA = ROOT.parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"benchmark data folder {DATA} is absent")
try:  # grading a program runs it in the sandbox, which needs unprivileged user namespaces
    ISOLATION, WHY = sandbox.isolation(), ""
except sandbox.SandboxUnavailable as e:
    ISOLATION, WHY = None, str(e).splitlines()[0]
needs_sandbox = pytest.mark.skipif(ISOLATION is None, reason=f"no sandbox here: {WHY}")


def _convert(source, path, tmp_path, **kw):
    out = tmp_path / f"{source}.jsonl"
    manifest = data.convert(source, str(path), str(out), **kw)
    tasks = data.load_tasks(str(out))
    assert len(tasks) == manifest["written"]
    assert json.loads((tmp_path / f"{source}.manifest.json").read_text()) == manifest
    return tasks, manifest["skipped"]


@needs_data
@pytest.mark.parametrize("name,n", [("aime24", 30), ("aime25", 30), ("olympiadbench", 675)])
def test_real_math_benchmarks(name, n, tmp_path):
    tasks, _ = _convert(name, DATA / "benchmarks" / f"{name}.jsonl", tmp_path)
    assert len(tasks) == n
    assert len({t["id"] for t in tasks}) == n
    assert all(t["kind"] == "math" and t["answer"] and t["question"] for t in tasks)
    if name == "aime24":
        golds = [json.loads(line)["answer"] for line in open(DATA / "benchmarks" / "aime24.jsonl")]
        assert "025" in golds and "25" in [t["answer"] for t in tasks]  # zero padding normalised
        assert all(t["answer"].isdigit() and not t["answer"].startswith("0") for t in tasks)


@needs_data
def test_olympiadbench_multiple_answers_compare_as_sets(tmp_path):
    import reward

    tasks, _ = _convert("olympiadbench", DATA / "benchmarks" / "olympiadbench.jsonl", tmp_path)
    multi = [t for t in tasks if t["metadata"]["multiple_answer"]]
    assert len(multi) == 94
    assert all("$" not in t["answer"] for t in tasks)
    t = next(t for t in multi if t["answer"] == "69,84")
    assert reward.math_equal("84, 69", t["answer"]) and not reward.math_equal("84", t["answer"])
    t = next(t for t in multi if t["answer"].startswith("(6,3),(9,3)"))
    shuffled = ", ".join(reversed(reward._split_top(t["answer"])))
    assert reward.math_equal(shuffled, t["answer"])


def test_olympiadbench_final_answer_literal_is_never_evaluated(tmp_path):
    row = {
        "id": 1,
        "question": "q",
        "final_answer": "['$\\\\frac{1}{2}$']",
        "is_multiple_answer": False,
    }
    assert data.from_olympiadbench(row)["answer"] == "\\frac{1}{2}"
    row["final_answer"] = "['5,15']"
    assert data.from_olympiadbench(row)["answer"] == "5,15"
    marker = tmp_path / "ran"
    row["final_answer"] = f"__import__('pathlib').Path({str(marker)!r}).write_text('x')"
    with pytest.raises(ValueError, match="final_answer"):
        data.from_olympiadbench(row)
    assert not marker.exists()
    row["final_answer"] = "[1, 2]"
    with pytest.raises(ValueError, match="list of strings"):
        data.from_olympiadbench(row)


def test_polaris_fixture(tmp_path):
    tasks, _ = _convert("polaris", FIX / "polaris.jsonl", tmp_path)
    assert [t["answer"] for t in tasks] == ["\\frac{5}{8}", "2"]
    assert tasks[0]["id"] == "polaris-0" and tasks[0]["metadata"]["difficulty"] == "2/8"


def test_apps_fixture_with_introductory_filter(tmp_path):
    tasks, skipped = _convert("apps", FIX / "apps.jsonl", tmp_path)
    assert skipped == {"other difficulty": 1}
    assert [t["id"] for t in tasks] == ["apps-4001", "apps-4002", "apps-4003"]
    stdin, call, lines = tasks
    assert stdin["tests"] == {
        "inputs": ["1 2\n", "3 4\n", "-5 5\n"],
        "outputs": ["3\n", "7\n", "0\n"],
        "fn_name": None,
    }
    assert stdin["public_tests"]["inputs"] == ["1 2\n", "3 4\n"]
    assert call["tests"] == {
        "inputs": [[1, 2], [5, 3]],
        "outputs": [[3, -1], [8, 2]],
        "fn_name": "pair_sum",
    }
    assert call["metadata"]["starter_code"].startswith("def pair_sum")
    assert lines["tests"]["inputs"] == ["a\nb\nc\n"]
    all_tasks, skipped = _convert("apps", FIX / "apps.jsonl", tmp_path, difficulty=None)
    assert len(all_tasks) == 4 and skipped == {}


@needs_sandbox
def test_apps_solutions_pass_their_tests(tmp_path):
    import reward

    rows = [json.loads(line) for line in open(FIX / "apps.jsonl")]
    tasks, _ = _convert("apps", FIX / "apps.jsonl", tmp_path, difficulty=None)
    for row, task in zip(rows, tasks):
        assert reward.code_score(json.loads(row["solutions"])[0], task["tests"]) == 1.0, task["id"]


def test_codecontests_fixture(tmp_path):
    (t,), _ = _convert("codecontests", FIX / "codecontests.jsonl", tmp_path)
    # public + private + generated
    assert t["tests"]["inputs"] == [
        "3\n",
        "1000000000\n",
        "1\n",
        "7\n",
    ]
    assert t["public_tests"] == {"inputs": ["3\n"], "outputs": ["6\n"], "fn_name": None}
    assert t["metadata"]["time_limit"] == 2.0
    assert "Example 1:\nInput:\n3\nOutput:\n6" in data.task_text(t)


@needs_data
def test_livecodebench_real_row(tmp_path):
    (t,), _ = _convert("livecodebench", DATA / "samples" / "livecodebench_row.jsonl", tmp_path)
    assert t["id"] == "livecodebench-1873_A" and t["tests"]["fn_name"] is None
    assert len(t["public_tests"]["inputs"]) == 1 and len(t["tests"]["inputs"]) > 1
    assert t["tests"]["inputs"][0] == t["public_tests"]["inputs"][0]


@needs_data
@needs_sandbox
def test_livecodebench_real_row_grades_a_solution(tmp_path):
    import reward

    (t,), _ = _convert("livecodebench", DATA / "samples" / "livecodebench_row.jsonl", tmp_path)
    sol = (
        "for _ in range(int(input())):\n    s = input().strip()\n"
        "    print('YES' if sum(a != b for a, b in zip(s, 'abc')) in (0, 2) else 'NO')\n"
    )
    assert reward.code_score(sol, t["tests"]) == 1.0
    assert reward.code_score("print('YES')", t["tests"]) < 1.0


def test_livecodebench_functional_fixture(tmp_path):
    (t,), _ = _convert("livecodebench", FIX / "livecodebench_functional.jsonl", tmp_path)
    assert t["tests"] == {
        "inputs": [[[3, 2, 4], 6], [[2, 7, 11, 15], 9], [[3, 3], 6]],
        "outputs": [[1, 2], [0, 1], [0, 1]],
        "fn_name": "twoSum",
    }
    text = data.task_text(t)
    assert "class Solution" in text and "twoSum([3, 2, 4], 6) == [1, 2]" in text


def test_crafted_pickle_is_refused_and_runs_nothing(tmp_path):
    path = FIX / "livecodebench_crafted_pickle.jsonl"
    row = json.loads(path.read_text())
    # the fixture really is malicious: a plain pickle.loads (in a throwaway process) runs its code
    blob = zlib.decompress(base64.b64decode(row["private_test_cases"]))
    probe = (
        "import os, pickle, sys; pickle.loads(sys.stdin.buffer.read()); "
        "print(os.environ.get('METAAGENT_PWNED'))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], input=blob, capture_output=True)
    assert proc.stdout.decode().strip() == "1"
    # ours refuses it, naming file, line and the global it asked for; nothing ran. The row is
    # skipped as "refused pickle"; a file of nothing else writes no task file at all
    os.environ.pop("METAAGENT_PWNED", None)
    with pytest.raises(ValueError) as e:
        data.convert("livecodebench", str(path), str(tmp_path / "out.jsonl"))
    msg = str(e.value)
    assert "skipped 1 row: refused pickle 1" in msg
    assert f"{path}:1:" in msg and "refused" in msg and "builtins.exec" in msg
    assert "METAAGENT_PWNED" not in os.environ
    assert not (tmp_path / "out.jsonl").exists()
    rows = tmp_path / "rows.jsonl"
    rows.write_text((FIX / "livecodebench_functional.jsonl").read_text() + path.read_text())
    tasks, skipped = _convert("livecodebench", rows, tmp_path)
    assert [t["id"] for t in tasks] == ["livecodebench-1"] and skipped == {"refused pickle": 1}
    assert "METAAGENT_PWNED" not in os.environ


def test_restricted_unpickler_accepts_plain_data_only(tmp_path):
    plain = {"a": [1, 2.5, "x", None, True], "b": {"c": []}}
    assert data.safe_unpickle(pickle.dumps(plain)) == plain
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        assert data.safe_unpickle(pickle.dumps("[1]", protocol=proto)) == "[1]"
    for bad in ((1, 2), {1, 2}, b"bytes", Path("x")):
        with pytest.raises(pickle.UnpicklingError, match="refused"):
            data.safe_unpickle(pickle.dumps(bad))
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with pytest.raises(pickle.UnpicklingError, match=r"refused.*(posix|os)\.system"):
        data.safe_unpickle(pickle.dumps(Evil()))
    assert not marker.exists()
    blob = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(data.BadRow, match="private_test_cases: refused") as e:
        data.decode_lcb_tests(blob)
    assert e.value.reason == "refused pickle"
    assert not marker.exists()


def test_malformed_rows_name_file_and_line(tmp_path):
    good = {"id": "a", "kind": "math", "question": "1+1?", "answer": "2"}
    p = tmp_path / "tasks.jsonl"
    p.write_text(json.dumps(good) + "\n\n" + '{"id": "b", "kind": "math", oops\n')
    with pytest.raises(ValueError, match=rf"{p}:3: not valid JSON"):
        data.load_tasks(str(p))
    p.write_text(json.dumps(good) + "\n" + json.dumps({**good, "answer": None}) + "\n")
    with pytest.raises(ValueError, match=rf"{p}:2: math task without a string 'answer'"):
        data.load_tasks(str(p))
    p.write_text(
        json.dumps(
            {"id": "c", "kind": "code", "question": "q", "tests": {"inputs": ["1"], "outputs": []}}
        )
        + "\n"
    )
    with pytest.raises(ValueError, match=rf"{p}:1: tests: inputs and outputs"):
        data.load_tasks(str(p))
    p.write_text(json.dumps({**good, "answer": " "}) + "\n")  # a hand-made file is refused too
    with pytest.raises(ValueError, match=rf"{p}:1: math task with an empty 'answer'"):
        data.load_tasks(str(p))
    # a file that is not JSONL is an error naming file and line, for convert as for load_tasks
    rows = tmp_path / "apps.jsonl"
    rows.write_text((FIX / "apps.jsonl").read_text() + '{"problem_id": 9, oops\n')
    with pytest.raises(ValueError, match=rf"{rows}:5: not valid JSON"):
        data.convert("apps", str(rows), str(tmp_path / "o.jsonl"))
    # rows of another shape: each skipped as "missing field"; with none left, an error naming the
    # first one's file and line, and nothing written
    with pytest.raises(ValueError, match=rf"missing field at {FIX}/apps.jsonl:1: missing field"):
        data.convert("polaris", str(FIX / "apps.jsonl"), str(tmp_path / "o.jsonl"))
    assert not (tmp_path / "o.jsonl").exists()


def test_save_load_roundtrip_and_task_text(tmp_path):
    tasks = [
        {
            "id": "m1",
            "kind": "math",
            "question": "What is 1+1?",
            "answer": "2",
            "source": "x",
            "metadata": {},
        },
        {
            "id": "c1",
            "kind": "code",
            "question": "Double it.",
            "source": "x",
            "metadata": {},
            "tests": {"inputs": ["2\n", "5\n"], "outputs": ["4\n", "10\n"], "fn_name": None},
            "public_tests": {"inputs": ["2\n"], "outputs": ["4\n"], "fn_name": None},
        },
    ]
    p = tmp_path / "sub" / "t.jsonl"
    data.save_tasks(tasks, str(p))
    assert data.load_tasks(str(p)) == tasks
    assert data.task_text(tasks[0]) == "What is 1+1?"
    text = data.task_text(tasks[1])
    assert "Input:\n2\nOutput:\n4" in text and "10" not in text  # hidden tests stay hidden
    assert data.task_text(tasks[1], short=True) == "Double it.\nin: 2\nout: 4"
    assert data.task_text(tasks[0], short=True) == "What is 1+1?"
    fn = {**tasks[1], "public_tests": {"inputs": [[2], [5]], "outputs": [4, 10], "fn_name": "f"}}
    # the tiny world's compact form
    assert data.task_text(fn, short=True) == "Double it.\nf(2)==4\nf(5)==10"
    # run_tests still checks both; the text shows one
    one = {
        **fn,
        "metadata": {"shown_examples": 1},
    }
    assert data.task_text(
        one, short=True
    ) == "Double it.\nf(2)==4" and "f(5)" not in data.task_text(one)
    for bad in ("1", -1, True):
        with pytest.raises(ValueError, match="shown_examples"):
            data.validate_task({**one, "metadata": {"shown_examples": bad}})
    with pytest.raises(ValueError, match="task 0"):
        data.save_tasks([{"id": "x", "kind": "math", "question": "q"}], str(p))
    assert data.load_tasks(str(p)) == tasks  # the old file is intact


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "machinery/data.py", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )


def _concat(tmp_path, name, *paths):
    """One file of several fixtures' rows, as a published file holds good rows and bad."""
    out = tmp_path / name
    out.write_text("".join(Path(p).read_text() for p in paths))
    return out


def test_cli_convert(tmp_path):
    out = tmp_path / "p.jsonl"
    proc = _cli("convert", "polaris", FIX / "polaris.jsonl", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"wrote 2 tasks to {out}"
    assert len(data.load_tasks(str(out))) == 2
    proc = _cli("convert", "apps", FIX / "polaris.jsonl", out)  # no row is an APPS problem
    assert proc.returncode != 0 and "polaris.jsonl:1" in proc.stderr
    assert len(data.load_tasks(str(out))) == 2  # the old file is intact


def test_cli_convert_skips_and_counts_bad_rows(tmp_path):
    rows = _concat(tmp_path, "apps_rows.jsonl", FIX / "apps.jsonl", FIX / "apps_bad_rows.jsonl")
    out = tmp_path / "apps.jsonl"
    proc = _cli("convert", "apps", rows, out)
    assert proc.returncode == 0, proc.stderr
    first, *examples = proc.stdout.splitlines()
    assert first == (
        f"wrote 3 tasks to {out} (skipped 6 rows: no tests 2, other difficulty 2, "
        "malformed tests 1, unparsable tests 1)"
    )
    assert f"  first no tests: {rows}:5: input_output is empty" in examples
    manifest = json.loads((tmp_path / "apps.manifest.json").read_text())
    assert manifest["rows_read"] == 9 and manifest["written"] == 3
    assert manifest["filter"] == "difficulty == introductory"
    assert manifest["revision"] == {str(rows): data._sha256(rows)}
    assert manifest["first_skipped"]["unparsable tests"].startswith(f"{rows}:6: input_output")


@pytest.mark.parametrize(
    "source,fixtures,ids,skipped",
    [
        (
            "polaris",
            ["polaris.jsonl", "polaris_bad_rows.jsonl"],
            ["polaris-0", "polaris-1"],
            {"empty answer": 2, "empty question": 1},
        ),
        (
            "codecontests",
            ["codecontests.jsonl", "codecontests_no_tests.jsonl"],
            ["codecontests-1000_A. Double it"],
            {"no tests": 1},
        ),
        (
            "livecodebench",  # convert has no date window: only the garbled blob goes
            ["livecodebench_functional.jsonl", "livecodebench_bad_rows.jsonl"],
            ["livecodebench-1", "livecodebench-fixture_after"],
            {"unparsable tests": 1},
        ),
    ],
)
def test_bad_rows_are_skipped_and_counted(source, fixtures, ids, skipped, tmp_path):
    rows = _concat(tmp_path, "rows.jsonl", *(FIX / f for f in fixtures))
    tasks, got = _convert(source, rows, tmp_path)
    assert [t["id"] for t in tasks] == ids and got == skipped


def test_an_empty_gold_answer_is_never_a_task():
    for answer in ("", "  ", None):
        with pytest.raises(data.BadRow) as e:
            data.validate_task(data.from_polaris({"problem": "1+1?", "answer": answer}))
        assert e.value.reason == "empty answer"
    row = {"question": "q", "final_answer": "[]"}  # OlympiadBench with no final answer
    with pytest.raises(data.BadRow) as e:
        data.validate_task(data.from_olympiadbench(row))
    assert e.value.reason == "empty answer"


def test_skip_reasons_are_short_stable_keys():
    rows = [
        ("a", {"problem": "q", "answer": "1"}),
        ("b", {"answer": "1"}),  # a missing field
        ("c", ["not", "an", "object"]),  # a row of another type
        ("d", {"problem": "q", "answer": ""}),
    ]
    tasks, skipped, n = data.convert_rows("polaris", rows)
    assert len(tasks) == 1 and n == 4
    assert skipped.by_reason() == {"empty answer": 1, "malformed row": 1, "missing field": 1}
    assert skipped.first["missing field"] == "b: missing field 'problem'"
    assert skipped.summary() == "skipped 3 rows: empty answer 1, malformed row 1, missing field 1"
    assert data.skip_summary({}) == ""
    assert data.skip_summary({"no tests": 1}) == "skipped 1 row: no tests 1"
    lcb = json.loads((FIX / "livecodebench_v5_window.jsonl").read_text())
    rows = [
        ("x", lcb),
        ("y", {**lcb, "contest_date": ""}),
        ("z", {**lcb, "contest_date": "2023-05-06T00:00:00"}),
    ]
    tasks, skipped, _ = data.convert_rows("livecodebench", rows, dates=data.LCB_WINDOW)
    assert [t["metadata"]["contest_date"] for t in tasks] == ["2024-09-14"]
    assert skipped.by_reason() == {"no contest date": 1, "outside date window": 1}


# --------------------------------------------------------------------------------------------------
# The recipe: prepare --from, offline, on files in each published shape


CC_ROWS = [FIX / "codecontests.jsonl", FIX / "codecontests_no_tests.jsonl"]


def _cc_parquet(tmp_path):
    """CodeContests as published: parquet (the fixtures' rows, a good problem and one without
    tests)."""
    import datasets

    files = [str(f) for f in CC_ROWS]
    rows = datasets.load_dataset("json", data_files=files, split="train", cache_dir=tmp_path)
    out = tmp_path / "test-00000-of-00001.parquet"
    rows.to_parquet(str(out))
    return out


APPS_SKIPPED = {"no tests": 2, "other difficulty": 2, "malformed tests": 1, "unparsable tests": 1}
PREPARED = {  # name: (the files' stand-ins, rows read, tasks written, skipped by reason)
    "polaris": (
        ["polaris.jsonl", "polaris_bad_rows.jsonl"],
        5,
        2,
        {"empty answer": 2, "empty question": 1},
    ),
    "apps_train": (["apps.jsonl", "apps_bad_rows.jsonl"], 9, 3, APPS_SKIPPED),
    "apps": (["apps.jsonl", "apps_bad_rows.jsonl"], 9, 3, APPS_SKIPPED),
    # every difficulty (the other-difficulty rows kept, one of them without tests)
    "apps500": (
        ["apps.jsonl", "apps_bad_rows.jsonl"],
        9,
        4,
        {"no tests": 3, "malformed tests": 1, "unparsable tests": 1},
    ),
    "codecontests_train": ("parquet", 2, 1, {"no tests": 1}),
    "codecontests": ("parquet", 2, 1, {"no tests": 1}),
    "aime24": ([DATA / "benchmarks" / "aime24.jsonl"], 30, 30, {}),
    "aime25": ([DATA / "benchmarks" / "aime25.jsonl"], 30, 30, {}),
    "olympiadbench": ([DATA / "benchmarks" / "olympiadbench.jsonl"], 675, 675, {}),
    "livecodebench": (
        [
            DATA / "samples" / "livecodebench_row.jsonl",  # 2023-08-21: before the window
            "livecodebench_functional.jsonl",
            "livecodebench_v5_window.jsonl",
            "livecodebench_bad_rows.jsonl",
        ],
        5,
        1,
        {"outside date window": 3, "unparsable tests": 1},
    ),
}


def test_every_recipe_is_tested_offline():
    assert sorted(PREPARED) == sorted(data.RECIPES)


@pytest.mark.parametrize("name", sorted(PREPARED))
def test_prepare_from_files(name, tmp_path):
    fixtures, n_read, n_written, skipped = PREPARED[name]
    if any(str(f).startswith(str(DATA)) for f in fixtures) and not DATA.is_dir():
        pytest.skip(f"benchmark data folder {DATA} is absent")
    if fixtures == "parquet":
        files = [_cc_parquet(tmp_path)]
    else:
        files = [FIX / f for f in fixtures]  # an absolute path (DATA's) stays itself
    out = tmp_path / "data"
    manifest = data.prepare(name, str(out), [str(f) for f in files], cache_dir=str(tmp_path))
    tasks = data.load_tasks(str(out / f"{name}.jsonl"))
    recipe = data.RECIPES[name]
    assert len(tasks) == n_written and len({t["id"] for t in tasks}) == n_written
    assert json.loads((out / f"{name}.manifest.json").read_text()) == manifest
    assert manifest["rows_read"] == n_read and manifest["written"] == n_written
    assert manifest["skipped"] == skipped
    assert manifest["split"] == recipe.split and manifest["converter"] == recipe.converter
    assert manifest["source"] == f"{recipe.host}:{recipe.repo}"
    assert manifest["revision"] == {str(f): data._sha256(f) for f in files}
    assert all(t["source"] == recipe.converter for t in tasks)
    if recipe.dates is None:  # convert has no date window
        # the same rows through convert, without `datasets`: the same tasks
        rows = _concat(tmp_path, "rows.jsonl", *(CC_ROWS if fixtures == "parquet" else files))
        convert_out = tmp_path / "converted.jsonl"
        data.convert(recipe.converter, str(rows), str(convert_out), recipe.difficulty)
        assert data.load_tasks(str(convert_out)) == tasks


def test_cli_prepare_from_and_its_errors(tmp_path):
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "data"
    args = ("prepare", "polaris", "--out", out, "--from", FIX / "polaris.jsonl")
    proc = _cli(*args, FIX / "polaris_bad_rows.jsonl", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (
        f"wrote 2 tasks to {out}/polaris.jsonl (skipped 3 rows: empty answer 2, empty question 1)"
    )
    assert (out / "polaris.manifest.json").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "a", "answer": "1"}\n{"problem": "b", oops\n')
    proc = _cli(*args[:-1], bad, env=env)
    assert proc.returncode != 0 and f"{bad}:2: not valid JSON" in proc.stderr
    proc = _cli("prepare", "polaris", "apps", "--from", bad, env=env)
    assert proc.returncode != 0 and "with several names, give each file as NAME=FILE" in proc.stderr
    # several names, each its files as NAME=FILE: one process
    apps = [f"apps={FIX / f}" for f in ("apps.jsonl", "apps_bad_rows.jsonl")]
    proc = _cli("prepare", "polaris", "apps", "--out", out, "--from", *apps, env=env)
    assert proc.returncode != 0 and "--from names no file of polaris" in proc.stderr
    polaris = f"polaris={FIX / 'polaris.jsonl'}"
    proc = _cli("prepare", "polaris", "apps", "--out", out, "--from", polaris, *apps, env=env)
    assert proc.returncode == 0, proc.stderr
    assert [ln.split(" (")[0] for ln in proc.stdout.splitlines() if ln.startswith("wrote")] == [
        f"wrote 2 tasks to {out}/polaris.jsonl",
        f"wrote 3 tasks to {out}/apps.jsonl",
    ]
    proc = _cli("prepare", "polaris", "--from", tmp_path / "absent.jsonl", env=env)
    assert proc.returncode != 0 and "no file" in proc.stderr


def test_prepare_apps500_reads_the_first_500_rows(tmp_path):
    """The authors' APPS benchmark: the first 500 rows of test.jsonl, whatever their difficulty."""
    row = json.loads((FIX / "apps.jsonl").read_text().splitlines()[0])
    rows = tmp_path / "test.jsonl"
    with open(rows, "w") as f:
        for k in range(502):
            f.write(json.dumps({**row, "problem_id": k, "difficulty": "interview"}) + "\n")
    out = tmp_path / "data"
    manifest = data.prepare("apps500", str(out), [str(rows)], cache_dir=str(tmp_path))
    assert manifest["rows_read"] == manifest["written"] == 500
    assert manifest["subset"] == "the first 500 rows" and manifest["filter"] is None
    ids = [t["id"] for t in data.load_tasks(str(out / "apps500.jsonl"))]
    assert ids == [f"apps-{k}" for k in range(500)]


def test_prepare_without_the_network_says_so_in_one_line(tmp_path):
    """A hub that does not answer (HF_ENDPOINT on a closed port): at most three lines on stderr,
    one naming `--from FILE`, and a non-zero exit; no traceback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_OFFLINE": "0"}
    env["HF_DATASETS_CACHE"] = str(tmp_path / "cache")
    for name in ("polaris", "apps500"):
        proc = _cli("prepare", name, "--out", tmp_path / "data", env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and 1 <= len(lines) <= 3, proc.stderr
        assert any(f"prepare {name} --from FILE" in line for line in lines), proc.stderr
        assert "Traceback" not in proc.stderr


def test_convert_needs_no_datasets_package(tmp_path):
    """`datasets` is imported where data is prepared, nowhere else: convert runs without it, and
    prepare says what to install."""
    out = tmp_path / "p.jsonl"
    code = (
        "import sys; sys.modules['datasets'] = None; from machinery import data; "
        "data.main(sys.argv[1:])"
    )
    run = [sys.executable, "-c", code]
    proc = subprocess.run(
        [*run, "convert", "polaris", str(FIX / "polaris.jsonl"), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "wrote 2 tasks" in proc.stdout, proc.stderr
    proc = subprocess.run(
        [*run, "prepare", "polaris", "--from", str(FIX / "polaris.jsonl")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "pip install datasets" in proc.stderr


def test_rl_presets_read_train_splits_only():
    """The Qwen3 presets' data_mix names prepared files of train splits only: RL never sees a
    benchmark the paper reports."""
    for preset in ("config/qwen3_8b.py", "config/qwen3_4b.py"):
        cfg = settings.parse_config([str(ROOT / preset)])
        assert cfg.data_mix, preset
        for path in cfg.data_mix:
            name = path.removeprefix("data/").removesuffix(".jsonl")
            assert path == f"data/{name}.jsonl" and name in data.RECIPES, (preset, path)
            assert data.RECIPES[name].split == "train", (preset, path)


def test_the_recipe_table():
    train = sorted(n for n, r in data.RECIPES.items() if r.split == "train")
    assert train == ["apps_train", "codecontests_train", "polaris"]
    for name, r in data.RECIPES.items():
        assert r.split in ("train", "test") and r.converter in data.CONVERTERS
        assert all(f.endswith((".jsonl", ".parquet")) for f in r.files), name  # never a script
        assert f"\n    {name} " in data.__doc__, f"the docstring's table lacks {name}"
    assert data.RECIPES["apps"].difficulty == data.RECIPES["apps_train"].difficulty
    assert data.RECIPES["apps_train"].files == ("train.jsonl",)
    assert data.RECIPES["codecontests_train"].files == ("data/train-*.parquet",)
    lcb = data.RECIPES["livecodebench"]  # release_v5: the published files up to test5.jsonl
    assert lcb.files == tuple(f"test{k}.jsonl" for k in ("", 2, 3, 4, 5))
    assert lcb.dates == data.LCB_WINDOW == ("2024-08-01", "2025-02-01")
    for name, n in (("aime24", 30), ("aime25", 30), ("olympiadbench", 674)):  # the authors' sets
        assert data.RECIPES[name].host == "hf" and data.RECIPES[name].problems == n


# --------------------------------------------------------------------------------------------------
# The math benchmarks from the hub, in its published shapes (parquet, their fields and types)


def _hub_parquet(path, rows):
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def hub_benchmarks(folder):
    """{name: its file}: aime24, aime25 and olympiadbench as the hub publishes them, each with its
    published problem count. Maxwell-Jia/AIME_2024 aime_2024_problems.parquet: ID ("2024-I-1"),
    Problem, Solution, Answer (int64). yentinglin/aime_2025 data/train-00000-of-00001.parquet:
    id, problem, answer (a string). Hothan/OlympiadBench's OE_TO_maths_en_COMP (OlympiadBench/
    OE_TO_maths_en_COMP/OE_TO_maths_en_COMP.parquet): id, question, solution and final_answer
    (lists of strings), context, image_1 (null: text only), is_multiple_answer, unit,
    answer_type, subfield, ..."""
    aime24 = []
    for k in range(30):
        exam = "I" if k < 15 else "II"
        aime24.append(
            {
                "ID": f"2024-{exam}-{k % 15 + 1}",
                "Problem": f"Find the remainder when {k} is added to {k + 1}.",
                "Solution": f"It is \\boxed{{{2 * k + 1:03d}}}.",
                "Answer": 2 * k + 1,
            }
        )
    aime25 = [{"id": k, "problem": f"Find {k} + 3.", "answer": str(k + 3)} for k in range(30)]
    olympiad = []
    for k in range(674):
        multiple = k % 100 == 0
        olympiad.append(
            {
                "id": 1606 + k,
                "question": f"Find every real x with x^2 = {k * k}." if multiple else f"Find {k}.",
                "solution": [f"So the final answer is \\boxed{{{k}}}."],
                "final_answer": [f"${k}$", f"$-{k}$"] if multiple else [f"${k}$"],
                "context": None,
                "image_1": None,
                "modality": "Text-only",
                "difficulty": "Competition",
                "is_multiple_answer": multiple,
                "unit": None,
                "answer_type": "Numerical",
                "error": None,
                "question_type": "Open-ended",
                "subfield": "Algebra",
                "subject": "Math",
                "language": "English",
            }
        )
    return {
        "aime24": _hub_parquet(folder / "aime_2024_problems.parquet", aime24),
        "aime25": _hub_parquet(folder / "data" / "train-00000-of-00001.parquet", aime25),
        "olympiadbench": _hub_parquet(folder / "OE_TO_maths_en_COMP.parquet", olympiad),
    }


def test_prepare_reads_the_math_benchmarks_in_the_hubs_shapes(tmp_path):
    """`prepare aime24 aime25 olympiadbench` on files in the hub's shapes (--from NAME=FILE: the
    same path as the hub's files, read from here): every row a task, and the count checked against
    the published set's, said in a line."""
    files = hub_benchmarks(tmp_path / "hub")
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "data"
    pairs = [f"{name}={path}" for name, path in files.items()]
    proc = _cli(
        "prepare", "aime24", "aime25", "olympiadbench", "--out", out, "--from", *pairs, env=env
    )
    assert proc.returncode == 0, proc.stderr
    for name, n in (("aime24", 30), ("aime25", 30), ("olympiadbench", 674)):
        assert f"wrote {n} tasks to {out}/{name}.jsonl" in proc.stdout
        assert f"{name}: {n} problems, as many as the published set holds" in proc.stdout
        manifest = json.loads((out / f"{name}.manifest.json").read_text())
        assert manifest["source"] == f"hf:{data.RECIPES[name].repo}"
        assert manifest["problems"] == f"{name}: {n} problems, as many as the published set holds"
    aime24 = data.load_tasks(str(out / "aime24.jsonl"))
    assert aime24[0]["id"] == "aime24-2024-I-1" and aime24[0]["answer"] == "1"
    assert aime24[-1]["id"] == "aime24-2024-II-15" and aime24[-1]["answer"] == "59"
    assert aime24[1]["question"] == "Find the remainder when 1 is added to 2."
    aime25 = data.load_tasks(str(out / "aime25.jsonl"))
    assert (aime25[4]["id"], aime25[4]["question"], aime25[4]["answer"]) == (
        "aime25-4",
        "Find 4 + 3.",
        "7",
    )
    olympiad = data.load_tasks(str(out / "olympiadbench.jsonl"))
    assert olympiad[100]["id"] == "olympiadbench-1706" and olympiad[100]["answer"] == "100, -100"
    assert olympiad[100]["metadata"]["multiple_answer"] and olympiad[5]["answer"] == "5"


def test_a_benchmark_that_is_not_the_published_set_is_said_and_refused_from_the_hub():
    """Fewer (or more) problems than the published set holds: from the hub's files (another
    version of them) nothing is written; from --from files, written and said."""
    recipe = data.RECIPES["olympiadbench"]
    assert recipe.problems == 674  # the hub's OE_TO_maths_en_COMP (the GitHub file's: 675)
    assert data.count_check("olympiadbench", recipe, 674, local=False).endswith(
        "674 problems, as many as the published set holds"
    )
    with pytest.raises(ValueError, match="publishes 674: .*nothing written.*--revision"):
        data.count_check("olympiadbench", recipe, 673, local=False)
    line = data.count_check("olympiadbench", recipe, 675, local=True)
    assert "675 problems, where hf:Hothan/OlympiadBench publishes 674" in line
    assert data.count_check("polaris", data.RECIPES["polaris"], 5, local=False) is None


def test_only_a_network_error_is_offline(monkeypatch):
    """Listing the published files: a network's or a hub client's error is "offline" (the line
    naming --from FILE); any other is ours, and raised as itself."""
    from huggingface_hub import HfApi

    recipe = data.RECIPES["aime24"]

    def refused(*args, **kwargs):
        raise ConnectionError("connection refused")

    monkeypatch.setattr(HfApi, "dataset_info", refused)
    with pytest.raises(data.Unreachable, match="prepare aime24 --from FILE"):
        data.prepare("aime24", "unused")

    def broken(*args, **kwargs):
        raise KeyError("sha")

    monkeypatch.setattr(HfApi, "dataset_info", broken)
    with pytest.raises(KeyError):
        data.prepare("aime24", "unused")
    assert recipe.host == "hf"
