"""data.py on the real benchmark files and on fixtures in each published shape."""

import base64
import json
import os
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import sandbox
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
    n, skipped = data.convert(source, str(path), str(out), **kw)
    tasks = data.load_tasks(str(out))
    assert len(tasks) == n
    return tasks, skipped


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
    assert skipped == 1 and [t["id"] for t in tasks] == ["apps-4001", "apps-4002", "apps-4003"]
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
    assert len(all_tasks) == 4 and skipped == 0


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
    # ours refuses it with a clear error naming file, line and the global it asked for; nothing ran
    os.environ.pop("METAAGENT_PWNED", None)
    with pytest.raises(ValueError) as e:
        data.convert("livecodebench", str(path), str(tmp_path / "out.jsonl"))
    msg = str(e.value)
    assert f"{path}:1:" in msg and "refused" in msg and "builtins.exec" in msg
    assert "METAAGENT_PWNED" not in os.environ
    assert not (tmp_path / "out.jsonl").exists()


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
    with pytest.raises(ValueError, match="private_test_cases: refused"):
        data.decode_lcb_tests(blob)
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
    rows = tmp_path / "apps.jsonl"
    rows.write_text(
        (FIX / "apps.jsonl").read_text()
        + json.dumps(
            {
                "problem_id": 9,
                "question": "q",
                "input_output": "{not json",
                "difficulty": "introductory",
            }
        )
        + "\n"
    )
    with pytest.raises(
        ValueError, match=rf"{rows}:5: cannot convert this apps row: input_output is not JSON"
    ):
        data.convert("apps", str(rows), str(tmp_path / "o.jsonl"))
    with pytest.raises(
        ValueError, match=rf"{rows}:1: cannot convert this polaris row: missing field 'problem'"
    ):
        data.convert("polaris", str(rows), str(tmp_path / "o.jsonl"))


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


def test_cli_convert(tmp_path):
    out = tmp_path / "p.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "machinery/data.py",
            "convert",
            "polaris",
            str(FIX / "polaris.jsonl"),
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "wrote 2 tasks" in proc.stdout and len(data.load_tasks(str(out))) == 2
    proc = subprocess.run(
        [
            sys.executable,
            "machinery/data.py",
            "convert",
            "apps",
            str(FIX / "polaris.jsonl"),
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "polaris.jsonl:1:" in proc.stderr
