"""reward.py on real inputs: a math-equivalence corpus, every AIME gold, programs in the real
sandbox."""

import json
import random
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import mas
import reward
from machinery import programs
from reward import code_score, extract_answer, extract_code, format_score, math_equal

REPO = str(Path(__file__).resolve().parents[1])
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"benchmark data folder {DATA} is absent")

# (pred, gold, expected), by category
CORPUS = [
    # integers, zero padding, floats
    ("25", "025", True),
    ("025", "25", True),
    ("0025", "25", True),
    ("70.0", "70", True),
    ("70", "70.00", True),
    ("26", "025", False),
    ("-3", "3", False),
    ("1000", "1,000", True),
    ("1,000", "1000", True),
    ("100", "1,000", False),
    ("1000001", "1000000", False),
    ("+5", "5", True),
    ("1e3", "1000", True),
    # fractions vs decimals (tolerance 1e-6 relative)
    ("0.5", "\\frac12", True),
    ("\\frac{1}{2}", "0.5", True),
    ("1/2", "0.5", True),
    ("0.333", "\\frac13", False),
    ("0.3333333", "\\frac{1}{3}", True),
    ("\\dfrac{3}{4}", "0.75", True),
    ("\\tfrac34", "3/4", True),
    ("0.75", "3/4", True),
    ("0.76", "3/4", False),
    ("-\\frac{1}{2}", "-0.5", True),
    ("2.5", "\\frac52", True),
    # LaTeX expressions
    ("\\sqrt{12}", "2\\sqrt{3}", True),
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt2/2", True),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", True),
    ("\\sqrt{3}", "\\sqrt{2}", False),
    ("(x+1)^2", "x^2+2x+1", True),
    ("x^2+2x+2", "(x+1)^2", False),
    ("2^{10}", "1024", True),
    ("mn - \\lfloor m/2 \\rfloor", "m n-\\lfloor m / 2\\rfloor", True),
    ("\\binom{4}{2}", "6", True),
    ("\\pi", "\\pi", True),
    ("2\\pi", "\\pi", False),
    ("nm", "mn", True),
    ("e^{0}", "1", True),
    ("\\frac{9 \\sqrt{3}}{20}", "\\frac{9\\sqrt3}{20}", True),
    ("2^{1009}", "2^{1008}", False),
    # sets, tuples, intervals (open vs closed matters)
    ("[1,2)", "[1,2)", True),
    ("(1,2)", "[1,2)", False),
    ("[1,2]", "[1,2)", False),
    ("(1,2]", "(1,2]", True),
    ("(-\\infty, 3)", "(-\\infty,3)", True),
    ("(-\\infty, 3]", "(-\\infty,3)", False),
    ("[\\frac{1}{2}, 8]", "[0.5, 8]", True),
    ("\\{1,2,3\\}", "\\{3,2,1\\}", True),
    ("\\{1,2\\}", "\\{1,3\\}", False),
    ("(1,2)", "(2,1)", False),
    ("(3, 4)", "(3,4)", True),
    ("(-\\infty, 0) \\cup \\{1\\}", "(-\\infty,0)\\cup\\{1\\}", True),
    ("x \\in (0, 4]", "(0,4]", True),
    # percentages, units, \text{}
    ("28\\%", "0.28", True),
    ("0.28", "28\\%", True),
    ("28%", "28", True),
    ("28", "0.28", False),
    ("5 \\text{ cm}", "5", True),
    ("5\\text{cm}^2", "5", True),
    ("12 \\mathrm{~km}", "12", True),
    ("\\frac{1}{2}\\text{ hours}", "0.5", True),
    ("\\text{Yes}", "yes", True),
    ("Yes", "No", False),
    ("yes", "sey", False),
    ("\\$25", "25", True),
    ("25.", "25", True),
    ("\\text{no solution}", "No solution", True),
    # degrees vs radians
    ("90^\\circ", "90", True),
    ("90", "90^{\\circ}", True),
    ("\\frac{\\pi}{2}", "90^\\circ", True),
    ("90^\\circ", "\\frac{\\pi}{2}", True),
    ("\\frac{\\pi}{3}", "90^\\circ", False),
    ("45°", "45", True),
    ("60^\\circ", "45^\\circ", False),
    # multiple answers (OlympiadBench is_multiple_answer) compare as sets
    ("5, 15", "5,15", True),
    ("15, 5", "5,15", True),
    ("5, 16", "5,15", False),
    ("5", "5,15", False),
    ("60^\\circ, 90^\\circ", "90^{\\circ},60^{\\circ}", True),
    ("\\{60, 90\\}", "90,60", True),
    ("(3,2), (1,1)", "(1,1), (3,2)", True),
    ("(3,2), (1,2)", "(1,1), (3,2)", False),
    ("2 and 3", "3, 2", True),
    ("-2, 0, 2", "-2,0,2", True),
    # matrices
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", True),
    ("\\begin{pmatrix}1&2\\\\3&5\\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", False),
    ("\\begin{pmatrix}0.5\\\\1\\end{pmatrix}", "\\begin{pmatrix}\\frac12\\\\1\\end{pmatrix}", True),
    # x = 3 vs 3, equations
    ("x = 3", "3", True),
    ("3", "x=3", True),
    ("x=4", "3", False),
    ("y = 2x + 1", "2x+1", True),
    ("M=\\frac{9}{32} \\sqrt{2}", "\\frac{9\\sqrt2}{32}", True),
    ("n^2-n-1", "m_{\\max }=n^{2}-n-1", True),
    # ±
    ("\\pm 2", "2, -2", True),
    ("2", "\\pm 2", False),
    ("1 \\pm \\sqrt{2}", "1+\\sqrt2, 1-\\sqrt2", True),
    ("-2, 2", "\\pm 2", True),
    ("±3", "3, -3", True),
    # boxed / delimiters / garbage
    ("\\boxed{025}", "25", True),
    ("$\\frac{1}{2}$", "0.5", True),
    ("\\(7\\)", "7", True),
    ("", "7", False),
    ("the answer is seven", "7", False),
    ("\\boxed{\\frac{5}{8}}", "0.625", True),
    # more near misses
    ("\\frac{1}{3}", "0.33", False),
    ("x^2", "x^3", False),
    ("(1,2]", "(1,2)", False),
    ("\\{1,2\\}", "\\{1,2,3\\}", False),
    ("no", "yes", False),
    ("\\infty", "-\\infty", False),
]


def _grade(pairs):
    """math_equal over many pairs from two threads at once: two grader processes, as grade_runs uses
    them."""
    with ThreadPoolExecutor(2) as ex:
        return list(ex.map(lambda pg: math_equal(*pg), pairs))


def test_corpus_size_and_categories():
    assert len(CORPUS) >= 80
    assert sum(e for _, _, e in CORPUS) >= 30 and sum(not e for _, _, e in CORPUS) >= 30


def test_math_equal_corpus():
    got = _grade([(p, g) for p, g, _ in CORPUS])
    wrong = [(p, g, e) for (p, g, e), r in zip(CORPUS, got) if r != e]
    assert not wrong, f"{len(wrong)} graded wrong (pred, gold, expected): {wrong}"


def _aime_golds():
    golds = []
    for name in ("aime24", "aime25"):
        with open(DATA / "benchmarks" / f"{name}.jsonl") as f:
            golds += [(name, json.loads(line)["answer"]) for line in f if line.strip()]
    return golds


@needs_data
def test_every_aime_gold():
    golds = _aime_golds()
    assert len(golds) == 60
    cases = []
    for _, gold in golds:
        n = int(gold)
        for pred in (str(n), f"\\boxed{{{gold}}}", f"0{n}", f"{n}.0", gold):
            cases.append((pred, gold, True))
        cases += [(str(n + 1), gold, False), (f"\\boxed{{{n - 1}}}", gold, False)]
    got = _grade([(p, g) for p, g, _ in cases])
    wrong = [c for c, r in zip(cases, got) if r != c[2]]
    assert not wrong, wrong


def test_text_equal_is_the_same_text_whitespace_aside():
    """A code task's votes: programs that differ are different answers, whatever SymPy or the math
    cleaning would say; layout is not a difference."""
    assert reward.text_equal("def f(x):\n    return x+3", "def f(x): return x + 3")
    assert not reward.text_equal("print(x*2)", "print(2*x)")
    assert not reward.text_equal("print(a and b)", "print(a, b)")
    assert not reward.text_equal('print("$5")', 'print("5")')
    assert not reward.text_equal("1.0", "1")


def test_math_equal_from_threads():
    cases = [
        ("\\frac{1}{2}", "0.5", True),
        ("(x+1)^2", "x^2+2x+1", True),
        ("[1,2)", "(1,2)", False),
        ("\\sqrt{8}", "2\\sqrt2", True),
        ("x = 3", "3", True),
        ("\\sqrt{3}", "3", False),
    ] * 2
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda c: math_equal(c[0], c[1]), cases))
    assert got == [e for _, _, e in cases]


def test_pathological_expression_hits_deadline_then_grading_goes_on():
    t = time.monotonic()
    with ThreadPoolExecutor(1) as ex:  # from a worker thread, where SIGALRM could never work
        assert ex.submit(math_equal, "10^{10^{10^{10}}}", "1", 1.0).result() is False
    # deadline + generous margin (a fresh grader may start)
    assert time.monotonic() - t < 1.0 + 60.0
    assert math_equal("\\frac{2}{4}", "0.5") is True


def test_extract_answer():
    assert extract_answer("so <answer> 42 </answer>") == "42"
    assert extract_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert (
        extract_answer("thus \\boxed{\\frac{1}{2}} and finally \\boxed{\\frac{\\sqrt{3}}{2}}")
        == "\\frac{\\sqrt{3}}{2}"
    )
    assert extract_answer("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"
    assert extract_answer("<answer>7</answer> \\boxed{8}") == "7"
    assert extract_answer("no answer here") is None
    assert extract_answer("\\boxed{unclosed") is None
    assert extract_answer(None) is None


def test_extract_code():
    assert extract_code("blah\n```python\nprint(1)\n```\nmore") == "print(1)"
    assert extract_code("```\nx=1\n```\n```py\nprint(2)\n```") == "print(2)"
    assert extract_code("```python\nprint(3)\n") == "print(3)"  # cut off by the limit
    assert extract_code("<answer>\n```python\nprint(4)\n```\n</answer>") == "print(4)"
    assert extract_code("print(5)") == "print(5)"
    assert extract_code(None) == ""


ADD = {"inputs": ["1 2\n", "3 4\n", "10 -10\n", "5 5\n"], "outputs": ["3\n", "7\n", "0", "10\n"]}


@pytest.fixture(scope="module")
def sb():
    import sandbox

    return sandbox


def test_two_programs_are_the_same_answer_only_as_text():
    # A vote over code answers (ensemble-voting on a code task) compares programs: the same program
    # up to whitespace, or not the same, decided without math-verify (~25 ms a pair in the grader).
    # For programs of the tiny world's shape, math-verify (reward._equal without the rule) agrees:
    # it says no for each of these.
    bodies = ["x+3", "3+x", "(x+3)", "x*2", "2*x", "x**2", "x*x", "abs(x)", "x+3 if x>0 else x"]
    programs = [f"def f(x): return {b}" for b in bodies] + [
        "def f(x):\n    y = x+3\n    return y",
        "def g(x): return x+3",
    ]
    pairs = [(a, b) for i, a in enumerate(programs) for b in programs[i + 1 :]][::4]
    assert len(pairs) == 14
    assert not any(reward._verify(reward._clean(a), reward._clean(b)) for a, b in pairs)
    assert all(reward._fast_equal(a, b) is False for a, b in pairs)
    # where it would not: math-verify reads a returned constant as math; as programs these two
    # differ (a test calls f), and the rule says so
    assert reward._verify("def f(): return 3", "def g(): return 3")
    assert math_equal("def f(): return 3", "def g(): return 3") is False
    assert math_equal("def f(x): return x+3", "def f(x):\n    return x + 3")
    # a program against math: math-verify
    assert reward._fast_equal("def f(x): return x+3", "x+3") is None


def test_a_scripts_vote_compares_by_math_equal(sb):
    runs = sb.run_workflows(
        ["def workflow(task):\n    return vote(['3', '1/2', '0.5'])"],
        ["q"],
        lambda calls: [],
        equal=math_equal,
    )
    assert (runs[0].answer, runs[0].error) == ("1/2", None)  # equivalence, not strings


def test_code_score_stdin(sb):
    good = "a, b = map(int, input().split())\nprint(a + b)\n"
    assert code_score(good, ADD) == 1.0
    assert (
        code_score("a, b = map(int, input().split())\nprint(a * b if a == 5 else a + b)\n", ADD)
        == 0.75
    )
    assert code_score("print(0)\n", ADD) == 0.25
    assert code_score("raise SystemExit(1)\n", ADD) == 0.0
    assert code_score("", ADD) == 0.0
    assert code_score(good, {"inputs": [], "outputs": []}) == 0.0


def test_code_score_call_based(sb):
    tests = {
        "inputs": [[1, 2], [5, 3], [[1, 2], 0]],
        "outputs": [[3, -1], [8, 2], None],
        "fn_name": "f",
    }
    fn = """def f(a, b):
    if isinstance(a, list):
        return None
    return [a + b, a - b]
"""
    assert code_score(fn, tests) == 1.0
    assert code_score(
        "def f(a, b):\n    return [a + b, a - b] if a != 5 else [0, 0]\n", tests
    ) == pytest.approx(1 / 3)
    leetcode = {
        "inputs": [[[2, 7, 11, 15], 9], [[3, 2, 4], 6]],
        "outputs": [[0, 1], [1, 2]],
        "fn_name": "twoSum",
    }
    sol = (
        "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n                return [seen[target - x], i]\n"
        "            seen[x] = i\n"
    )
    assert code_score(sol, leetcode) == 1.0
    assert (
        code_score(sol.replace("[seen[target - x], i]", "[i, seen[target - x]]"), leetcode) == 0.0
    )
    floats = {"inputs": [[1]], "outputs": [0.3333333333], "fn_name": "g"}
    assert code_score("def g(x):\n    return x / 3\n", floats) == 1.0


def test_code_score_hanging_and_flooding_programs(sb):
    t = time.monotonic()
    assert (
        code_score(
            "while True:\n    pass\n", {"inputs": ["", ""], "outputs": ["", ""]}, timeout=1.0
        )
        == 0.0
    )
    assert time.monotonic() - t < 2 * 1.0 + 60.0
    flood = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    assert code_score(flood, {"inputs": [""], "outputs": ["x"]}, timeout=1.0) == 0.0
    big = "print('y' * (50 << 20))\n"
    assert code_score(big, {"inputs": [""], "outputs": ["y"]}, timeout=2.0) == 0.0


# A mixed set for the early exit: (program, tests) pairs whose verdicts the first failing test
# settles, whichever test that is
SQUARE = {"inputs": [f"{k}\n" for k in range(12)], "outputs": [f"{k * k}\n" for k in range(12)]}
CALLS = {"inputs": [[k] for k in range(8)], "outputs": [k * 3 for k in range(8)], "fn_name": "f"}
MIXED = [
    ("n = int(input())\nprint(n * n)", SQUARE),  # right
    ("n = int(input())\nprint(n * n + (n == 0))", SQUARE),  # wrong on the first test
    ("n = int(input())\nprint(n * n + (n == 11))", SQUARE),  # wrong on the last test only
    ("n = int(input())\nprint(n * n if n < 5 else 1 / 0)", SQUARE),  # crashes from test 6 on
    ("n = int(input())\nwhile n == 7:\n    pass\nprint(n * n)", SQUARE),  # never ends on test 8
    ("while True:\n    pass", SQUARE),  # never ends at all
    ("n = int(input())\nprint(n * n, 0)", SQUARE),  # the wrong format: two tokens a line
    ("n = int(input())\nprint(n * n)\nprint()\nprint(n)", SQUARE),  # the wrong format: 3 lines
    ("def f(x):\n    return x * 3", CALLS),  # right
    ("def f(x):\n    return x * 3 if x != 6 else str(18)", CALLS),  # wrong type on test 7
    ("def f(x):\n    return [x * 3]", CALLS),  # wrong format: a list
    ("import sys\ndef f(x):\n    if x == 2:\n        sys.exit(0)\n    return x * 3", CALLS),
    ("", SQUARE),  # no program
]


def test_the_early_exit_keeps_every_verdict(sb):
    """passes_all with and without the early exit, and code_score == 1 (every test run), agree on
    every program of the mixed set; correctness, which grades with the early exit, too."""
    verdicts = []
    for code, tests in MIXED:
        early = reward.passes_all(code, tests, timeout=1.0)
        full = reward.passes_all(code, tests, timeout=1.0, early_exit=False, budget=None)
        assert early == full == (code_score(code, tests, timeout=1.0) == 1.0), code
        task = {"kind": "code", "tests": tests}
        assert reward.correctness(task, f"```python\n{code}\n```") == float(early), code
        verdicts.append(early)
    assert verdicts == [True] + [False] * 7 + [True] + [False] * 4


def test_a_program_that_never_ends_is_graded_on_its_first_test(sb):
    """On a 100-test task, the early exit stops a never-ending program at its first test's
    timeout: the job gives back one outcome, so the verdict costs one test's seconds, not 100."""
    hundred = {"inputs": [f"{k}\n" for k in range(100)], "outputs": [f"{k}\n" for k in range(100)]}
    outcomes = []

    def first_fails(k, outcome):
        outcomes.append(outcome.status)
        return True

    assert not reward.passes_all("while True:\n    pass", hundred, timeout=1.0)
    # what passes_all asks the sandbox for: the job ends after the first outcome
    programs.run_tests("while True:\n    pass", hundred, timeout_per_test=1.0, stop=first_fails)
    assert outcomes == ["timeout"]
    assert reward.passes_all("print(input())", hundred)


def _run(replies, answer="", error=None):
    from sandbox import CallRecord, WorkflowRun

    return WorkflowRun(
        answer=answer,
        error=error,
        calls=[CallRecord(role="solver", messages=[], reply=r, completion=None) for r in replies],
    )


def test_format_score(sb):
    assert format_score(_run([])) == 0.0
    assert format_score(_run(["<answer>3</answer>"])) == 1.0
    replies = [
        "think <answer>3</answer>",
        "no tag",
        "<answer>1</answer><answer>2</answer>",
        "<answer></answer>",
        "</answer>4<answer>",
        "<answer>5",
    ]
    assert format_score(_run(replies)) == pytest.approx(1 / 6)


def test_reward_math_and_code(sb):
    math_task = {"id": "m", "kind": "math", "question": "?", "answer": "025"}
    ok = _run(["<answer>25</answer>", "<answer>25</answer>"], answer="25")
    assert reward.reward(math_task, ok, lam=0.4) == pytest.approx(1.4)
    assert reward.reward(
        math_task, _run(["x"], answer="The result is \\boxed{25}"), lam=0.4
    ) == pytest.approx(1.0)
    assert reward.reward(
        math_task, _run(["<answer>24</answer>"], answer="24"), lam=0.4
    ) == pytest.approx(0.4)
    assert reward.reward(math_task, _run(["<answer>25</answer>"], answer="25"), lam=0.0) == 1.0
    crashed = _run(["<answer>25</answer>"], answer=None, error="NameError: name 'x' is not defined")
    # paper: no correctness, that's all
    assert reward.reward(math_task, crashed, lam=0.4) == pytest.approx(0.4)
    code_task = {"id": "c", "kind": "code", "question": "?", "tests": ADD}
    prog = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert reward.reward(
        code_task, _run(["<answer>ok</answer>"], answer=prog), lam=0.4
    ) == pytest.approx(1.4)
    # correct is binary, as the paper's: 3 of the 4 hidden tests (code_score 0.75) earns no
    # correctness at all
    three = "```python\na, b = map(int, input().split())\nprint(a * b if a == 5 else a + b)\n```"
    assert code_score(reward.extract_code(three), ADD) == 0.75
    assert reward.correctness(code_task, three) == 0.0
    assert reward.reward(
        code_task, _run(["<answer>ok</answer>"], answer=three), lam=0.4
    ) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="kind"):
        reward.reward({"id": "z", "kind": "poetry"}, _run([], answer="x"), lam=0.4)


def test_reward_from_a_grade_given_is_the_reward_graded_here(sb):
    # rollout grades a step's runs first (grade_runs) and hands each grade to reward(): the same R
    task = {"id": "m", "kind": "math", "question": "?", "answer": "025"}
    runs = [
        _run(["<answer>25</answer>", "no tag"], answer="25"),
        _run(["<answer>24</answer>"], answer="24"),
        _run(["<answer>25</answer>"], answer=None, error="NameError"),
    ]
    for lam in (0.0, 0.4, 1.0):
        alone = [reward.reward(task, r, lam=lam) for r in runs]
        graded = reward.grade_runs([(task, r) for r in runs])
        given = [reward.reward(task, r, lam=lam, correct=c) for r, c in zip(runs, graded)]
        assert given == alone  # exact: the same fp64 operations on the same numbers
    assert alone == [1.5, 1.0, 1.0]
    with pytest.raises(TypeError):
        reward.reward(task, runs[0])  # λ has no default here: settings.Config.lam is its one


# --------------------------------------------------------------------------------------------------
# Grading as the benchmarks grade: an integer is matched only by an equal value


@pytest.fixture(scope="module", params=["isolated", "fallback"])
def mode(request):
    """A test that takes it runs in both sandbox modes (skipped where one is missing)."""
    import sandbox

    try:
        sandbox.start(request.param)
    except sandbox.SandboxUnavailable as e:
        pytest.skip(f"no {request.param} sandbox here: {str(e).splitlines()[0]}")
    yield request.param


def test_an_integer_is_matched_only_by_an_equal_value():
    """An expected integer (a token of stdout, a returned value, a math gold) is matched by the
    same value only, however it is written: 500000250.0 is not 500000000, though it is within
    FLOAT_TOL of it; 500000000.0 and 5e8 are. Non-integers keep their tolerance."""
    wrong = [
        programs.outputs_match("500000250.0\n", "500000000"),
        programs.outputs_match("1 500000250.0", "1 500000000"),
        programs.outputs_match("2.0000001", "2"),
        programs.call_output_match("500000250.0", 500000000),
        programs.call_output_match("[1, 2.0000001]", [1, 2]),
        programs.call_output_match('{"a": 1000000.5}', {"a": 1000000}),
        math_equal("1000000.5", "1000000"),
        math_equal("1000000.5, 3", "1000000, 3"),
        math_equal("\\boxed{1000000.5}", "1000000"),
        math_equal("x = 1000000.5", "1000000"),
        math_equal("\\frac{2000001}{2}", "1000000"),
        math_equal("2.0000001", "2.0"),
        math_equal("x = 2.0000001", "2.0"),
    ]
    assert wrong == [False] * len(wrong)
    right = [
        programs.outputs_match("500000000.0\n", "500000000"),
        programs.outputs_match("5e8", "500000000"),
        programs.outputs_match("0.3333333", "0.333333333"),
        programs.call_output_match("500000000.0", 500000000),
        programs.call_output_match("0.30000000000000004", 0.3),
        programs.call_output_match("[1, 2.0]", [1, 2]),
        math_equal("1000000.0", "1000000"),
        math_equal("1e6", "1000000"),
        math_equal("0.3333333", "\\frac{1}{3}"),
    ]
    assert right == [True] * len(right)


def test_a_wrong_number_printed_as_a_float_fails_its_task(mode):
    """Through the sandbox (both modes): a program off by 250 at 5e8 that prints a float is wrong,
    stdin and call-based alike; the right number printed as a float is right."""
    stdin = {"kind": "code", "tests": {"inputs": ["5\n"], "outputs": ["500000000\n"]}}
    call = {"kind": "code", "tests": {"inputs": [[5]], "outputs": [500000000], "fn_name": "f"}}
    for task, off, exact in (
        (stdin, "print(float(int(input()) * 10**8 + 250))", "print(float(int(input()) * 10**8))"),
        (call, "def f(x):\n    return x * 1e8 + 250", "def f(x):\n    return x * 1e8"),
    ):
        assert reward.correctness(task, f"```python\n{off}\n```") == 0.0
        assert reward.correctness(task, f"```python\n{exact}\n```") == 1.0


# --------------------------------------------------------------------------------------------------
# Grading reveals nothing: which tests ran never depends on the expected outputs


def test_which_tests_ran_says_nothing_of_the_hidden_outputs(mode, monkeypatch):
    """The oracle of an early exit at the first wrong answer: a sequence of programs, each right on
    what it learned and guessing YES on the next test, learns every hidden YES/NO output from how
    many tests ran, and its last program is graded 1.0 without ever knowing them. Every test of a
    task runs (an early exit only at a test that did not finish): every program's grading runs
    all 8, whatever it answered, and the attack learns nothing."""
    hidden = ["YES", "NO", "NO", "YES", "NO", "YES", "YES", "NO"]
    task = {"kind": "code", "tests": {"inputs": [f"{k}\n" for k in range(8)], "outputs": hidden}}
    ran = []  # tests that ran in each grading, as an observer of the grading would count them
    run_tests = programs.run_tests

    def observed(*args, **kwargs):
        outcomes = run_tests(*args, **kwargs)
        ran.append(len(outcomes))
        return outcomes

    monkeypatch.setattr(programs, "run_tests", observed)

    def program(answers):
        return f"```python\nprint({answers!r}[int(input())])\n```"

    learned = []
    for k in range(8):
        guess = learned + ["YES"] * (8 - k)
        passed = reward.correctness(task, program(guess))
        learned.append("YES" if ran[-1] > k + 1 or passed else "NO")
    graded = reward.correctness(task, program(learned))
    assert ran == [8] * 9, f"the tests that ran depend on the answers: {ran}"
    assert graded == 0.0


# --------------------------------------------------------------------------------------------------
# Parsing a reply costs time linear in the reply

# replies of about 1 MB that a quadratic parser takes hours on (each opening scanned to the end:
# ~1e11 steps) and a linear one well under a second
HOSTILE_REPLIES = {
    "boxed": ("reward.extract_answer", "'\\\\boxed{' * 150_000"),
    "fbox": ("reward.extract_answer", "'\\\\fbox {' * 150_000"),
    "answer tags": ("mas.answer_of", "'<answer>' * 130_000"),
    "backticks": ("reward.extract_code", "'`' * 1_000_000"),
    "a fence's info string": ("reward.extract_code", "'```' + 'a' * 1_000_000"),
    "fences": ("reward.extract_code", "'```a' * 250_000"),
    "spaces in an answer": ("reward._clean", "'1' + ' ' * 1_000_000 + '2'"),
}


@pytest.mark.parametrize("name", list(HOSTILE_REPLIES))
def test_parsing_a_reply_is_linear_in_it(name):
    """Each parser of model replies on a hostile reply of ~1 MB, in a process of its own under a
    deadline (60 s) that a linear parser meets ~100 times over and a quadratic one misses by hours
    (it is killed)."""
    fn, text = HOSTILE_REPLIES[name]
    code = f"import sys; sys.path.insert(0, {REPO!r}); import mas, reward; {fn}({text})"
    try:
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{fn} on {name}: still parsing after 60 s (quadratic in the reply)")


def _last_boxed_by_scanning(text):
    """The reference: each box scanned to where its braces close (quadratic), the last that
    closes."""
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            best = text[m.end() : i - 1]
    if best is None:
        m = list(re.finditer(r"\\boxed ([^\s$]+)", text))
        best = m[-1].group(1) if m else None
    return best


def test_the_linear_parsers_read_what_the_regexes_read():
    """On 20,000 random replies made of the pieces that matter (fences, newlines, braces, boxes,
    answer tags): the linear parsers give what the regexes and the scan gave, so no honest reply
    is read differently."""
    pieces = ["`", "```", "\n", "a", "py", " ", "{", "}", "\\boxed{", "\\fbox {", "\\boxed 7"]
    pieces += ["<answer>", "</answer>", "x"]
    rng = random.Random(0)
    fence = re.compile(r"```([\w+-]*)[^\n]*\n(.*?)```", re.S)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(30)))
        blocks, unclosed = programs.fenced(text)
        assert blocks == fence.findall(text), text
        m = re.search(r"```[\w+-]*[^\n]*\n(.*)$", text, re.S)
        assert unclosed == (m.group(1) if m else None), text
        assert reward._last_boxed(text) == _last_boxed_by_scanning(text), text
        assert mas.answers_in(text) == mas.ANSWER_RE.findall(text), text


def test_format_reward_paper_and_authors_tell_replies_apart(sb):
    """format_reward "paper": λ · the share of well-formed executor replies; "authors" (their
    gen_agent term): +0.4 when some reply delivers through the answer tag, +0.4 for a final answer
    that is no placeholder (math) or a program that parses, of 10 characters or more (code)."""
    math_task = {"id": "m", "kind": "math", "question": "?", "answer": "025"}
    # one of three replies tagged: paper 0.4/3; authors: delivered (0.4), "24" no placeholder (0.4)
    run = _run(["draft", "<answer>24</answer>", "no tag"], answer="24")
    assert reward.reward(math_task, run, lam=0.4) == pytest.approx(0.4 / 3)
    assert reward.reward(math_task, run, lam=0.4, format_reward="authors") == pytest.approx(0.8)
    # every reply tagged, but the answer a placeholder name: paper 0.4; authors the delivery only
    named = _run(["<answer>answer</answer>"], answer="{answer}")
    assert reward.reward(math_task, named, lam=0.4) == pytest.approx(0.4)
    assert reward.reward(math_task, named, lam=0.4, format_reward="authors") == pytest.approx(0.4)
    # the authors' term has its own weights: λ does not scale it; correctness adds as before
    right = _run(["<answer>25</answer>"], answer="\\boxed{25}")
    assert reward.reward(math_task, right, lam=0.0, format_reward="authors") == pytest.approx(1.8)
    assert reward.format_score(_run([], answer=None), math_task, "authors") == 0.0
    code_task = {"id": "c", "kind": "code", "question": "?", "tests": ADD}
    short, broken = "print(1)", "```python\ndef f(:\n    return 1\n```"
    prog = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    for answer, authors in ((prog, 1.8), (short, 0.4), (broken, 0.4)):
        run = _run(["<answer>x</answer>", "untagged"], answer=answer)
        paper = (answer == prog) + 0.4 / 2
        assert reward.reward(code_task, run, lam=0.4) == pytest.approx(paper)
        got = reward.reward(code_task, run, lam=0.4, format_reward="authors")
        assert got == pytest.approx(authors), answer
