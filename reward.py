"""reward.py: grading answers and programs the way the benchmarks do, and the RL reward built on it.

The reward of one execution e_ij of workflow d_i on query q (the paper's eq. for R):

    R(e_ij) = correct(e_ij) + λ · format(e_ij)            λ: settings.Config.lam (0.4, the paper's)
    correct  = math_equal(answer, gold)                   (math)
             = 1 if the program passes every hidden test  (code: passes_all), else 0
    format   = share of the execution's executor replies that carry exactly one well-formed
               answer tag

format_reward="authors" (settings.Config.format_reward) puts the authors' term in place of λ·format,
with its own two weights: PettingLLMs' gen_agent adds 0.4 for a `<delivery>...</delivery>` block in
the workflow's output and 0.4 for a `\\boxed{}` that is no placeholder name (math) or a `<solution>`
whose code parses and has 10 characters or more (code), to the Designer's and the Executor's reward
alike. On our reply format their delivery block is the answer tag, their boxed answer or solution
the answer the script returns:

    R = correct + 0.4 · delivered + 0.4 · solution       (format = (delivered + solution) / 2)
    delivered = 1 if some executor reply of the execution carries a well-formed answer tag
    solution  = 1 if the returned answer's graded part is no placeholder (math: not empty, not a
                bare name such as "answer" or "{x}"), or its program parses and has >= 10
                characters (code)

correct is strictly binary, as the paper's is: a program that passes 9 of 10 hidden tests is wrong
(code_score, the fraction passed, stays a diagnostic).

Math equivalence is math-verify (SymPy underneath) behind a pre-normalisation of our own for what it
misses (text answers, degrees vs radians, multiple answers as sets, plain numbers); an integer gold
is matched by its value only (1000000.5 is not 1000000, though within the tolerance that other
numbers get: FLOAT_TOL relative). math-verify's own timeouts use SIGALRM, which only works on the
main thread; so we call it with its timeouts disabled and enforce a hard deadline ourselves: each
comparison that needs SymPy runs in a long-lived grader process (SymPy imported once), and a
comparison that outlives its deadline gets that process killed (answer: not equal). Plain numbers
never leave the caller. Grading happens in the trainer, never inside a sandbox job (whose seccomp
filter forbids starting a grader): a script's vote() is counted there too, by
sandbox.run_workflows(..., equal=math_equal).

Programs run in the sandbox (all tests of one program in one sandbox child); their raw outputs are
compared in the trainer as LiveCodeBench does (programs.outputs_match: whitespace-stripped lines,
integers by value, other numbers with a tolerance), each as it arrives. Every test runs whatever
the outputs before it (what ran never tells a program what passed): the reward's grader
(passes_all) ends the child early only at a test that did not finish, and no program gets more than
GRADE_BUDGET wall seconds for a task's tests. Replies are parsed in time linear in their length.

    from reward import math_equal, code_score, reward
    math_equal("\\boxed{025}", "25")                        # True
    math_equal("x = \\frac12", "0.5")                       # True, in a grader process (safe from
                                                            # threads)
    passes_all(code, tests)                                 # every hidden test passes (each runs,
                                                            # unless one did not finish)
    reward(task, run, lam=0.4)                              # R for one WorkflowRun of
                                                            # sandbox.run_workflows
    correct = grade_runs(pairs)                             # a step's runs, each distinct answer
    reward(task, run, lam=0.4, correct=correct[k])          # graded once; R from that grade

Needs: machinery/programs.py, machinery/isolation.py, machinery/confine.py (programs under test),
mas.py (the answer tag and its regex), machinery/grader.py"""

import ast
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from fractions import Fraction

import mas
from machinery import grader, programs
from mas import ANSWER_TAG

HERE = os.path.dirname(os.path.abspath(__file__))
# relative/absolute tolerance for non-integer numbers (as in program output)
FLOAT_TOL = programs.FLOAT_TOL
MAX_ANSWER_CHARS = 4000  # a longer "answer" is a runaway generation, never a final answer
GRADER_MEMORY = 4 << 30  # address space of one grader process: a blow-up dies, the trainer does not
# wall seconds a program gets for all the hidden tests of one task (4 s a test at most as well): a
# program that passes a 200-test CodeContests task takes a few seconds here
GRADE_BUDGET = 120.0
# [authors] a placeholder where a math answer belongs: a bare name, in braces or not
PLACEHOLDER = re.compile(r"[{}]*[a-zA-Z_][a-zA-Z_0-9]*[{}]*")


# --------------------------------------------------------------------------------------------------
# Answer extraction


_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _last_boxed(text):
    """Content of the last \\boxed{...} (or \\fbox{...}) whose braces close, nested braces counted;
    None if there is none. Linear in the text: one pass pairs every brace with a stack, so no box
    that never closes is scanned to the end."""
    boxes = {m.end() - 1 for m in _BOX_RE.finditer(text)}  # each box's own opening brace
    last, opened = None, []
    for m in re.finditer(r"[{}]", text):
        if m.group() == "{":
            opened.append(m.start())
        elif opened and (k := opened.pop()) in boxes and (last is None or k > last[0]):
            last = (k, m.start())
    if last is not None:
        return text[last[0] + 1 : last[1]]
    # "\boxed 5" (no braces), as some models write it
    m = list(re.finditer(r"\\boxed ([^\s$]+)", text))
    return m[-1].group(1) if m else None


def extract_answer(text):
    """The content of the last answer tag; failing that, of the last \\boxed{}; failing that,
    None."""
    tagged = mas.answer_of(text)  # (None for a non-string too)
    if tagged is not None or not isinstance(text, str):
        return tagged
    boxed = _last_boxed(text)
    return boxed.strip() if boxed is not None else None


# --------------------------------------------------------------------------------------------------
# Math equivalence: normalisation (cheap, pure Python), then math-verify

_UNICODE = {
    "−": "-",
    "–": "-",
    "π": "\\pi ",
    "∞": "\\infty ",
    "√": "\\sqrt",
    "×": "\\times ",
    "·": "\\cdot ",
    "°": "^\\circ",
    "≤": "\\le ",
    "≥": "\\ge ",
    "±": "\\pm ",
    "∪": "\\cup ",
    "∈": "\\in ",
}
_NUM_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?")
_FRAC_RE = re.compile(r"([+-]?\d{1,50})\s*/\s*(\d{1,50})")
_WORDS_RE = re.compile(r"[A-Za-z]+(?: [A-Za-z]+)*")
_DEGREE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:\^\s*\{?\s*\\circ\s*\}?|\\degree)")
# "x = 3", "x_1 = 3", "\alpha = 3", "f(x) = 3": the right-hand side is the answer
_ASSIGN_RE = re.compile(
    r"^\s*(?:[A-Za-z](?:_\{?[\w\\ ]+\}?)?|\\[A-Za-z]+|[A-Za-z]\([A-Za-z]\))"
    r"\s*=\s*(?P<rhs>[^=]+)$"
)
_TEXT_RE = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")


def _clean(s):
    """Strip what never changes an answer's value: delimiters, boxes, spacing commands, a trailing
    period."""
    s = str(s).strip()
    boxed = _last_boxed(s)
    if boxed is not None:
        s = boxed
    for k, v in _UNICODE.items():
        s = s.replace(k, v)
    s = s.replace("\\$", "").replace("$", "").replace("\\(", "").replace("\\)", "")
    s = s.replace("\\[", "").replace("\\]", "")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\(?:left|right|big|Big|bigl|bigr|Bigl|Bigr)(?![A-Za-z])", "", s)
    s = re.sub(r"\\[,;:! ]|~|\\quad|\\qquad", " ", s)
    s = re.sub(r"(?<!\\)%", r"\\%", s)
    s = re.sub(r"\s+", " ", s)  # first: \s+(?:and|or) would scan a long run from each space
    s = re.sub(r"\s+(?:and|or)\s+|\\text\{\s*(?:and|or)\s*\}", ", ", s)
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):  # 1,000 is a thousand, not a set
        s = s.replace(",", "")
    return s


def _number(s):
    """A plain number as a Fraction ("025", "70.0", "-3/4", "1e3"); None for anything else."""
    s = s.replace(" ", "")
    if len(s) > 100:
        return None
    if _NUM_RE.fullmatch(s):
        return Fraction(Decimal(s))
    m = _FRAC_RE.fullmatch(s)
    return Fraction(int(m.group(1)), int(m.group(2))) if m and int(m.group(2)) != 0 else None


def _words(s):
    """Lower-cased text of a text answer ("Yes", "\\text{no solution}"); None for anything
    mathematical."""
    t = _TEXT_RE.sub(r"\1", s).strip()
    return t.lower() if _WORDS_RE.fullmatch(t) and len(t.replace(" ", "")) >= 3 else None


def _fast_equal(pred, gold):
    """Decide without SymPy where that is safe: True/False, or None (needs math-verify).

    An integer gold is matched by its value only, other numbers within FLOAT_TOL; a text answer
    equals only the same text."""
    p, g = _clean(pred), _clean(gold)
    if not p or not g:
        return False
    if p.replace(" ", "") == g.replace(" ", ""):
        return True
    a, b = _number(p), _number(g)
    if a is not None and b is not None:  # an integer gold: its value only
        return a == b if b.denominator == 1 else abs(a - b) <= FLOAT_TOL * max(1, abs(b))
    # two programs (a vote over code) are the same answer
    if p.startswith("def ") and g.startswith("def "):
        return False  # only as text (above): math-verify would call
        # `def f(): return 3` and `def g(): return 3` equal (it reads the constant), and a test
        # calls f, not g
    wp, wg = _words(p), _words(g)
    if wp is not None or wg is not None:
        return wp == wg
    return None


def _split_top(s):
    """Split at commas outside brackets: "(1,2), (3,4)" -> ["(1,2)", "(3,4)"] (a set's \\{ \\} are
    brackets too: their braces count)."""
    items, depth, cur = [], 0, ""
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += c
    items.append(cur.strip())
    return [x for x in items if x]


def _items(s):
    """The answers of a multiple answer: "\\{1, 2\\}" -> ["1", "2"] (a set written as a set compares
    like a list); "1 \\pm \\sqrt 2" -> ["1+(\\sqrt 2)", "1-(\\sqrt 2)"] (one \\pm only; more:
    math-verify's)."""
    if s.startswith("\\{") and s.endswith("\\}") and len(_split_top(s)) == 1:
        s = s[2:-2].strip()
    if s.count("\\pm") == 1 and "," not in s:
        a, b = (x.strip() for x in s.split("\\pm"))
        s = f"{a}+({b}), {a}-({b})" if a else f"{b}, -({b})"
    return _split_top(s)


def _to_radians(s):
    return _DEGREE_RE.sub(lambda m: f"\\frac{{{m.group(1)}\\pi}}{{180}}", s)


def _verify(p, g):
    """math-verify with its own (SIGALRM) timeouts off. Imported here, not at the top: it pulls in
    SymPy, which a grader process needs and the trainer does not."""
    import math_verify as mv

    gp, pp = mv.parse(f"${g}$", parsing_timeout=None), mv.parse(f"${p}$", parsing_timeout=None)
    return bool(gp and pp and mv.verify(gp, pp, timeout_seconds=None))


def _equal_one(p, g):
    fast = _fast_equal(p, g)
    if fast is not None:
        return fast
    n = _number(g)
    # an integer gold ("2.0" too) written as one: math-verify matches an Integer by its value only
    if n is not None and n.denominator == 1:  # (a Float gold, by rounding both to 6 decimals)
        g = str(n.numerator)
    if ("=" in p) != ("=" in g):  # "x = 3" vs "3"
        p, g = (_ASSIGN_RE.sub(r"\g<rhs>", s).strip() for s in (p, g))
    if "\\pi" in p + g:  # "90^\circ" vs "\frac{\pi}{2}"
        p, g = _to_radians(p), _to_radians(g)
    return _verify(p, g)


def _equal(pred, gold):
    """The whole comparison (SymPy included); what a grader process runs."""
    p, g = _clean(pred), _clean(gold)
    if not p or not g:
        return False
    if _equal_one(p, g):
        return True
    # several answers: compare as multisets, item by item (math-verify's own set parsing misses
    # many)
    ps, gs = _items(p), _items(g)
    if len(ps) != len(gs) or len(gs) < 2:
        return False
    left = list(gs)
    for x in ps:
        hit = next((k for k, y in enumerate(left) if _equal_one(x, y)), None)
        if hit is None:
            return False
        left.pop(hit)
    return True


def _serve_grader():
    """A grader process (grader.Pool's worker): _equal on each [pred, gold] it is sent, SymPy
    imported and math-verify's parsers built before the first deadline."""
    # its threaded-mode warning: deadlines are ours
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    for p, g in (("\\frac12", "0.5"), ("x+1", "1+x"), ("[1,2)", "[1,2)"), ("x=1", "1")):
        _equal(p, g)  # math-verify builds its parsers on first use: before any deadline
    grader.serve(_equal, GRADER_MEMORY)


_POOL = grader.Pool("reward._serve_grader", HERE)


def math_equal(pred, gold, timeout=5.0):
    """Is the answer `pred` equivalent to the reference `gold`? Safe from any thread; a comparison
    that needs more than `timeout` seconds of SymPy is killed and counts as not equal."""
    if pred is None or gold is None:
        return False
    pred, gold = str(pred), str(gold)
    if len(pred) > MAX_ANSWER_CHARS or len(gold) > MAX_ANSWER_CHARS:
        return False
    fast = _fast_equal(pred, gold)
    if fast is not None:
        return fast
    # in a grader process; stuck on a pathological expression (or died): killed, not equal
    return _POOL.ask([pred, gold], timeout) is True


def text_equal(a, b):
    """The same text, whitespace aside: how a vote over a code task's answers (programs, or their
    outputs) compares them (sandbox.py). Not math_equal: SymPy would call `print(x*2)` and
    `print(2*x)` one answer, its cleaning `print(a and b)` and `print(a, b)`, and its time would
    count on the voting script's clock, where the count stops at the deadline."""
    return "".join(str(a).split()) == "".join(str(b).split())


# --------------------------------------------------------------------------------------------------
# Programs


def extract_code(text):
    """The program in a reply: inside the answer tag if there is one, the last ```python block (or
    the last fenced block, or an unclosed one cut off by the length limit), else the text itself."""
    if not isinstance(text, str):
        return ""
    inner = mas.answers_in(text)
    if inner:
        text = inner[-1]
    blocks, unclosed = programs.fenced(text)
    if blocks:
        py = [code for lang, code in blocks if lang.lower() in ("python", "py", "python3")]
        return (py or [blocks[-1][1]])[-1].strip("\n")
    # an unclosed block: cut off by the length limit
    return (text if unclosed is None else unclosed).strip("\n")


def code_score(code, tests, timeout=4.0):
    """Fraction of `tests` ({"inputs", "outputs", "fn_name"}) the program passes: every test, in one
    sandbox child with `timeout` seconds each; outputs compared as programs.passed does. A
    diagnostic: the reward needs only passes_all."""
    if not tests["inputs"] or not code.strip():
        return 0.0
    call = bool(tests.get("fn_name"))
    outcomes = programs.run_tests(programs.program(code, tests), tests, timeout_per_test=timeout)
    return sum(programs.passed(o, exp, call) for o, exp in zip(outcomes, tests["outputs"])) / len(
        tests["inputs"]
    )


def passes_all(code, tests, timeout=4.0, budget=GRADE_BUDGET, early_exit=True):
    """Does the program pass every test (code_score == 1)? The tests run in one sandbox child,
    `timeout` seconds each and `budget` wall seconds in all (None: every test's timeout). Every
    test runs, whatever the outputs before it: a grading that stopped at a wrong answer would tell
    the program on the next test that the one before passed (an oracle a sequence of programs can
    learn hidden outputs from). The early exit (early_exit) ends the child at the first test that
    did not finish (a timeout, a crash, a limit): that says nothing of the expected outputs, and
    one never-ending program costs one test's seconds, not the task's. early_exit=False runs every
    test, as code_score does (tools/bench.py grade times both)."""
    if not tests["inputs"] or not code.strip():
        return False
    call, expected = bool(tests.get("fn_name")), tests["outputs"]

    def unfinished(k, outcome):  # the program's own doing, never a comparison with `expected`
        return outcome.status != "ok"

    outcomes = programs.run_tests(
        programs.program(code, tests),
        tests,
        timeout_per_test=timeout,
        budget=budget,
        stop=unfinished if early_exit else None,
    )
    n = len(tests["inputs"])
    return len(outcomes) == n and all(map(programs.passed, outcomes, expected, [call] * n))


# --------------------------------------------------------------------------------------------------
# Format and the reward


def well_formed(reply):
    """Exactly one <answer>...</answer>, opened before it is closed, with something inside."""
    o, c = f"<{ANSWER_TAG}>", f"</{ANSWER_TAG}>"
    if not isinstance(reply, str) or reply.count(o) != 1 or reply.count(c) != 1:
        return False
    i, j = reply.index(o), reply.index(c)
    return i < j and reply[i + len(o) : j].strip() != ""


def format_score(run, task=None, format_reward="paper"):
    """The paper's format reward (weighted by λ in R): the share of the execution's executor
    replies (run.calls[k].reply) that carry exactly one well-formed answer tag; 0 when there were no
    replies. Only the tag's content goes back to the script: a reply without one gives the script ""
    from agent(message), so a badly formatted reply also starves the workflow. format_reward
    "authors": authors_format(task, run) instead."""
    if format_reward == "authors":
        return authors_format(task, run)
    return sum(well_formed(c.reply) for c in run.calls) / len(run.calls) if run.calls else 0.0


def graded_part(kind, answer):
    """The part of an answer that correctness grades on a task of this kind: the answer, or what its
    answer tag or \\boxed{} holds (math); the program it holds (code); None for no answer.
    correctness(task, answer) depends on nothing but the task and this, so two answers with the same
    graded part score the same."""
    if answer is None:
        return None
    answer = str(answer)
    if kind == "math" and (mas.answers_in(answer) or "\\boxed" in answer):
        return extract_answer(answer) or ""
    if kind == "code":
        return extract_code(answer)
    return answer


def correctness(task, answer, budget=GRADE_BUDGET, math_timeout=5.0):
    """correct(e) in {0, 1}: math_equal on the returned answer (math_timeout seconds of SymPy at
    most), or whether its program passes every hidden test (budget wall seconds for all of them;
    settings.Config's grade_budget and math_timeout)."""
    if answer is None:
        return 0.0
    kind = task.get("kind")
    graded = graded_part(kind, answer)
    if kind == "math":
        return float(math_equal(graded, task.get("answer"), timeout=math_timeout))
    if kind == "code":
        return float(passes_all(graded, task["tests"], budget=budget))
    raise ValueError(f"task {task.get('id')!r}: unknown kind {kind!r} (expected 'math' or 'code')")


def authors_format(task, run):
    """The authors' format term on our replies, as a share of its two checks (the module
    docstring): (delivered + solution) / 2."""
    delivered = any(well_formed(c.reply) for c in run.calls)
    graded = (graded_part(task.get("kind"), run.answer) or "").strip()
    if task.get("kind") != "code":  # math: an answer that is no placeholder name
        return (delivered + bool(graded and not PLACEHOLDER.fullmatch(graded))) / 2
    try:  # code: a program of 10 characters or more that parses (ast.parse raises if not)
        return (delivered + (len(graded) >= 10 and ast.parse(graded) is not None)) / 2
    except (SyntaxError, ValueError):  # (ValueError: a null byte)
        return delivered / 2


def reward(task, run, *, lam, correct=None, fmt=None, format_reward="paper"):
    """R = correct + λ·format (the paper's; a run that failed to parse or run just earns no
    correctness), or format_reward "authors": correct + 0.8 · authors_format (their two 0.4s; λ
    unused). λ has no default here: settings.Config.lam is its one (0.4, the paper's).
    correct, fmt: the run's correctness and format share when they are already known (grade_runs
    and format_score, as rollout.py grades a step's runs), else None: computed here."""
    correct = correctness(task, run.answer) if correct is None else correct
    fmt = format_score(run, task, format_reward) if fmt is None else fmt
    return correct + (lam if format_reward == "paper" else 0.8) * fmt  # (authors: 0.4 a check)


def grade_runs(pairs, workers=4, **limits):
    """[correctness(task, run.answer, **limits) for (task, run) in pairs], each distinct (task,
    graded part)
    graded once. Many runs of a step return the same program or answer (the N executions of a
    script, designs with the same template), and correctness depends on nothing else (graded_part),
    so each is graded once, keyed by the task object itself (every run of a query holds the same
    dict). In threads: grading waits on sandbox children (hidden tests) and grader processes
    (math_equal), both safe to drive from threads."""
    keys = [(id(task), graded_part(task.get("kind"), run.answer)) for task, run in pairs]
    first = {}  # key -> the first run that has it: that run's answer is graded
    for k, key in enumerate(keys):
        first.setdefault(key, k)

    def grade(k):
        return correctness(pairs[k][0], pairs[k][1].answer, **limits)

    with ThreadPoolExecutor(max(1, min(workers, len(first)))) as ex:
        correct = dict(zip(first, ex.map(grade, first.values())))
    return [correct[key] for key in keys]
