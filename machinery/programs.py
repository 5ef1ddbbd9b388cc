"""programs.py: programs under test, as the benchmarks grade them: a program run on each test
input in a sandbox job (machinery/isolation.py), its outputs compared as LiveCodeBench compares
them. reward.py grades with it (passes_all, code_score); sandbox.py's scripts call it through
run_python and run_tests.

    run_code(code, stdin="", timeout=10.0) -> RunResult(stdout, stderr, status, duration, rc)
    run_tests(code, tests, timeout_per_test=4.0) -> [TestOutcome(status, output, error)]   (one job)
    run_tests(..., budget=s, stop=fn)  a wall budget for the job; stop(k, outcome) asked in the
                                       trainer as each outcome arrives ends the job early
    program(code, tests)               the program as every test run takes it (CALL_HEADER first
                                       for call-based tests)
    passed(outcome, expected, call)    one test's verdict, as reward.py grades it
    tests_report(outcomes, tests)      "PASS k/k", or "FAIL j/k" and the first failing case
    fenced(reply)                      a reply's fenced code blocks, in time linear in the reply

A stdin test runs in a fresh interpreter; call-based tests ({"fn_name": f}) share one, in turn, as
LeetCode's and LiveCodeBench's harnesses run them (module state persists from call to call), and a
fresh one after any test that does not return, so that no test can sink another. outputs_match
(stdout: the same lines, each equal as text or token by token as numbers) and call_output_match
(return values as JSON values) compare outputs: an expected integer is matched by its value only
(500000000.0 and 5e8 match 500000000; 500000250.0 does not), other numbers within FLOAT_TOL. Nothing
a program prints or returns raises here: what does not parse or compare is a mismatch, counted in
`failures` ({reason: count} since start, with the kills sandbox.py counts; rollout puts each step's
in its metrics).

Where ours differs from LiveCodeBench's own checker (lcb_runner/evaluation/testing_util.py,
grade_stdio and grade_call_based, run by compute_code_generation_metrics.check_correctness):
- stdout: the same stripped lines, each equal as text or as a list of Decimals; LiveCodeBench
  compares those Decimals exactly (no tolerance: 0.1000001 is not 0.1), we give a non-integer
  expected number FLOAT_TOL (CodeContests' checker gives every number 1e-5 absolute, integers
  included; APPS' np.allclose 1e-5 relative). Integers: by value in both.
- return values: LiveCodeBench tests `prediction == expected` (a top-level tuple made a list): a
  float must be exact and True equals 1; ours are JSON values, floats within FLOAT_TOL, bools only
  as bools, tuples as lists at any depth, sets as sorted lists.
- processes: LiveCodeBench runs every test of a program in one process (a stdin program made a
  function called once a test, its imports shared); ours gives each stdin test a fresh
  interpreter, and call tests one shared until one does not return.
- early exit: LiveCodeBench stops at the first test that fails in any way; we run every test
  whatever the outputs before it and stop only at one that did not finish (a timeout, a crash, a
  limit), so that what ran tells a program nothing of what passed. The verdict (all pass) is the
  same.
- limits: LiveCodeBench's 6 s a test (SIGALRM) and (6 + 1) * tests + 5 s in all; ours the caller's
  seconds a test (CPU and wall) and a wall budget for all (reward.GRADE_BUDGET).

Needs: machinery/isolation.py, machinery/confine.py, mas.py (the fork-server's)
"""

import json
import math
import re
import threading
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from machinery import isolation as iso

# why programs and scripts failed in ways the trainer had to catch: {reason: count}, since start
# (rollout puts each step's in its metrics): results that do not parse or compare, protocol
# violations, limits, timeouts
failures, _failures_lock = Counter(), threading.Lock()


def count_failure(reason):
    with _failures_lock:  # (graders run in threads)
        failures[reason] += 1


@dataclass
class RunResult:
    stdout: str
    stderr: str
    status: str  # "ok" | "error" | "timeout" | "memory" | "killed"
    duration: float
    returncode: int | None  # exit code, or -signal; None when it never ran


@dataclass
class TestOutcome:
    status: str  # as RunResult.status
    output: str  # stdout (stdin tests) or JSON of the return value (call tests)
    error: str | None


def outcome(job):
    """isolation.outcome of an ended job, a job stopped at its cap of tasks counted ("task cap")."""
    out = iso.outcome(job)
    if iso.AT_CAP in out[1]:
        count_failure("task cap")
    return out


def run_code(code, stdin="", timeout=10.0, *, memory=iso.MEMORY):
    """Run one Python program in a sandbox job, as `python -c` would; nothing it does raises
    here."""
    job = iso.Job("code", {"code": str(code), "stdin": str(stdin)}, timeout, 1 << 20, memory)
    iso.drive([job])
    return RunResult(*outcome(job))


def tests_job(code, tests, per_test, max_output, budget=None, **callbacks):  # inputs: not empty
    """The job that runs a program on every test input; its wall limit: every test's seconds (and
    a margin), or `budget` seconds if that is less."""
    payload = {
        "code": str(code),
        "inputs": tests["inputs"],
        "fn_name": tests.get("fn_name"),
        "max_output": max_output,
        "timeout_per_test": per_test,
    }
    limit = len(tests["inputs"]) * (per_test + 0.5) + 5.0
    limit = limit if budget is None else min(limit, budget)
    return iso.Job("tests", payload, limit, max_output, **callbacks)


def _outcome(msg):
    """A harness's message as a TestOutcome (one that is not well formed: an error)."""
    status, output, error = (msg.get(k) for k in ("status", "output", "error"))
    if isinstance(status, str) and isinstance(output, str) and isinstance(error, str | None):
        return TestOutcome(status, output, error)
    count_failure("malformed test outcome")
    return TestOutcome("error", "", "malformed test outcome")


def outcomes(job, n):
    outs = [_outcome(m) for m in job.messages[:n]]
    if len(outs) < n:  # the harness was killed (its overall deadline) or died: the rest did not run
        _, err, status, _, _ = outcome(job)
        why = status if status != "ok" else "error"
        outs += [TestOutcome(why, "", iso.last_line(err) or why)] * (n - len(outs))
    return outs


def run_tests(code, tests, timeout_per_test=4.0, *, max_output=1 << 20, budget=None, stop=None):
    """Run one program on every test, all in ONE sandbox job; raw outputs back, compared elsewhere.

    tests: {"inputs": [...], "outputs": [...], "fn_name": str|None}. A stdin test's input is the
    stdin text and its output stdout; a call test's input is the list of positional arguments (or
    their JSON lines) and its output the JSON of the return value.

    budget: wall seconds for the whole job (default: every test's timeout and a margin); the tests
    it leaves unrun come back as timeouts. stop(k, outcome) -> bool: asked here, in the trainer, as
    each outcome arrives; when it holds the job is killed at once and the outcomes up to test k are
    returned (reward.passes_all stops at a test that did not finish, never at a wrong answer: what
    ran must not depend on the expected outputs, which never enter the job)."""
    n = len((tests or {}).get("inputs") or [])
    if not n:
        return []
    stopped = []  # the test that stop() held on

    def arrived(job, msg):
        k = len(job.messages) - 1
        if stop is not None and not stopped and stop(k, _outcome(msg)):
            stopped.append(k)

    job = tests_job(code, tests, timeout_per_test, max_output, budget, on_message=arrived)
    # every outcome is in (not its exit too), or stop() held: drive() kills the job as it returns
    iso.drive([job], until=lambda: len(job.messages) >= n or bool(stopped))
    if stopped:
        return [_outcome(m) for m in job.messages[: stopped[0] + 1]]
    return outcomes(job, n)


def passed(outcome, expected, call):
    """Did one test pass: the program returned, and its output matches `expected` (a call test's
    JSON value as call_output_match compares it, a stdin test's text as outputs_match does)."""
    if call:
        return outcome.status == "ok" and call_output_match(outcome.output, expected)
    return outcome.status == "ok" and outputs_match(outcome.output, _text(expected))


# --------------------------------------------------------------------------------------------------
# Comparing outputs with expected ones, as LiveCodeBench does

FLOAT_TOL = 1e-6  # relative/absolute tolerance for non-integer expected numbers in outputs
# What LeetCode-style solutions take for granted (their starter code says `List[int]`), as
# LiveCodeBench's harness provides it; prepended to programs under call-based tests.
CALL_HEADER = (
    "from typing import *\nfrom collections import *\nfrom heapq import *\nfrom bisect import *\n"
    "from itertools import *\nfrom functools import *\n"
    "import bisect, collections, functools, heapq, itertools, math, re, string\n"
)


def _tokens_equal(got, expected):
    try:
        x, y = Decimal(got), Decimal(expected)
    except InvalidOperation:
        return False
    if not (x.is_finite() and y.is_finite()):
        return False
    integer = "." not in expected and "e" not in expected.lower()  # matched by its value only
    return x == y or not integer and abs(x - y) <= Decimal(FLOAT_TOL) * max(Decimal(1), abs(y))


def _line_equal(a, b):
    return (
        a == b or len(a.split()) == len(b.split()) and all(map(_tokens_equal, a.split(), b.split()))
    )


def outputs_match(got, expected):
    """LiveCodeBench's stdout comparison: the same number of whitespace-stripped lines, each equal
    as text or, token by token, as numbers (integers exactly, others within FLOAT_TOL). Output that
    cannot be compared (a number past Decimal's range) is a mismatch, counted in `failures`."""
    g, e = ([line.strip() for line in str(t).strip().split("\n")] for t in (got, expected))
    try:
        return len(g) == len(e) and all(map(_line_equal, g, e))
    except Exception:  # noqa: BLE001 - decimal.Overflow and the like: the program's failure
        count_failure("unreadable result")
        return False


def _values_equal(got, expected):
    """Return values compared as JSON values: an expected integer by its value only, other numbers
    within FLOAT_TOL, tuples as lists, bools as bools."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return got is expected
    if isinstance(expected, int) and isinstance(got, int | float):
        return got == expected  # an integer: its value only (Python compares int and float exactly)
    if isinstance(expected, float) and isinstance(got, int | float):
        return math.isclose(got, expected, rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL)
    if isinstance(expected, list | tuple) and isinstance(got, list | tuple):
        return len(got) == len(expected) and all(map(_values_equal, got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(
            _values_equal(got[k], expected[k]) for k in expected
        )
    return got == expected


def call_output_match(output, expected):
    """A call test: `output` is the JSON text of the return value, `expected` the expected JSON
    value. A value that does not parse or compare (nested past the recursion limit, not JSON) is
    a mismatch, counted in `failures`: a program's output never raises here."""
    try:
        return _values_equal(json.loads(output), expected)
    except Exception:  # noqa: BLE001 - RecursionError, ValueError, TypeError, MemoryError: its own
        count_failure("unreadable result")
        return False


def fenced(text):
    """The fenced blocks of a reply and what follows its first fence's line: ([(info word, body)],
    the body of a block left open (None without a fence)). The blocks are those
    re.findall(r"```([\\w+-]*)[^\\n]*\\n(.*?)```", text, re.S) finds, in time linear in the text:
    each search goes on from where the one before ended, and stops where the regex would fail from
    every later ``` as well (it would scan to the end from each, and over each backtick run)."""
    blocks, pos, unclosed = [], 0, None
    while (start := text.find("```", pos)) >= 0:
        line_end = text.find("\n", start + 3)
        if line_end < 0:  # no newline after this fence: none after a later one
            break
        unclosed = text[line_end + 1 :] if unclosed is None else unclosed
        end = text.find("```", line_end + 1)
        if end < 0:  # nothing closes this block: nothing closes a later one
            break
        word = re.match(r"[\w+-]*", text[start + 3 : line_end]).group()
        blocks.append((word, text[line_end + 1 : end]))
        pos = end + 3
    return blocks, unclosed


def program(code, tests):
    """The program as every test run takes it: call-based tests get CALL_HEADER's imports first."""
    return CALL_HEADER + code if tests.get("fn_name") else code


def _text(value):
    return value if isinstance(value, str) else json.dumps(value)


def tests_report(outcomes, tests):
    """The text run_tests(code) gives a script: 'PASS 3/3', or 'FAIL 1/3' and the first failing
    case."""
    expected, call = tests.get("outputs") or [], bool(tests.get("fn_name"))
    fails = [k for k, (o, e) in enumerate(zip(outcomes, expected)) if not passed(o, e, call)]
    n = len(expected)
    if not fails:
        return f"PASS {n}/{n}"
    o, k = outcomes[fails[0]], fails[0]
    got = o.output if o.status == "ok" else f"{o.status}: {o.error}"
    return (
        f"FAIL {n - len(fails)}/{n}\ninput: {_text(tests['inputs'][k])[:300]}\n"
        f"expected: {_text(expected[k])[:300]}\ngot: {got[:300]}"
    )
