"""data.py: the task format (JSONL), the paper's data recipe, and the converters from each
published benchmark's shape into tasks.

One task a line, a plain dict in memory:

    {"id": str, "kind": "math" | "code", "question": str,
     "answer": str,                                                       (math, never empty)
     "tests": {"inputs": [...], "outputs": [...], "fn_name": str|None},   (code, hidden; graded)
     "public_tests": same shape,                        (code, visible to the workflow)
     "source": str, "metadata": dict}   (metadata.shown_examples: show only this many public tests)

stdin tests: inputs/outputs are strings. Call tests (fn_name set; LeetCode `class Solution` methods
too): each input is the list of positional arguments, each output the expected return value (JSON
values). task_text is what a workflow sees of a task.

The recipe. `prepare` loads a name's published files (JSONL or parquet, through the `datasets`
package: never a dataset script), takes the paper's split, converts every row and writes
data/NAME.jsonl and data/NAME.manifest.json. One command a name, on a machine with the network:

    python machinery/data.py prepare polaris apps_train codecontests_train        # RL's train sets
    python machinery/data.py prepare aime24 aime25 olympiadbench                  # the benchmarks
    python machinery/data.py prepare apps livecodebench codecontests
    python machinery/data.py prepare apps500                    # the authors' APPS subset

    name                split  published files (RECIPES: hub dataset, files; the problems)
    polaris             train  POLARIS-Project/Polaris-Dataset-53K: polaris-data-53K.jsonl
    apps_train          train  codeparrot/apps: train.jsonl                   (introductory)
    codecontests_train  train  deepmind/code_contests: data/train-*.parquet
    aime24              test   Maxwell-Jia/AIME_2024: aime_2024_problems.parquet              (30)
    aime25              test   yentinglin/aime_2025: data/train-*.parquet                     (30)
    olympiadbench       test   Hothan/OlympiadBench: OlympiadBench/OE_TO_maths_en_COMP/       (674)
                                   OE_TO_maths_en_COMP.parquet
    apps                test   codeparrot/apps: test.jsonl                    (introductory)
    apps500             test   codeparrot/apps: test.jsonl        (its first 500 rows: [authors])
    livecodebench       test   livecodebench/code_generation_lite: test.jsonl ... test5.jsonl
    codecontests        test   deepmind/code_contests: data/test-*.parquet

RL reads train splits only (the Qwen3 presets' data_mix; a test checks it): the sets the paper
reports are test splits, and evaluation alone reads them. LiveCodeBench is release_v5 (the files up
to test5.jsonl) within 2024-08-01 <= contest_date < 2025-02-01 (LCB_WINDOW: why, there). Every set
is a Hugging Face dataset, read at the commit its branch points to when `prepare` runs (recorded in
the manifest). The math benchmarks are the hub datasets the authors' loader reads
(scripts/dataprocess/load_math.py), and `prepare` checks that each holds the problems its published
set does (the counts above; Recipe.problems): a different count from the hub writes nothing, one
from `--from` files is written and said. The same sets as raw GitHub files (QwenLM/Qwen2.5-Math's
evaluation/data/aime24 and olympiadbench test.jsonl, 30 and 675 rows; math-evaluation-harness'
data/aime25/test.jsonl) are a `--from` source: each converter tells the shapes by their fields.
CodeContests tasks are graded on public + private + generated tests (ours, as AlphaCode; the
authors' loader grades its train problems on private tests alone, its test problems on public
tests alone).

    python machinery/data.py prepare apps --from test.jsonl --out /tmp/d   # offline: local files
    python machinery/data.py prepare apps --revision COMMIT                # another hub commit

`--from FILE ...` runs the same path on local files in the published shape; with several names,
each file as NAME=FILE (`prepare polaris aime24 --from polaris=p.jsonl aime24=a.jsonl`).
Without the network, prepare says so in one line that names `--from FILE` and exits non-zero.

The converters, one published row -> one task, for a file of rows you already have (no `datasets`
needed; APPS keeps `--difficulty introductory` unless told `all`):

    python machinery/data.py convert olympiadbench olympiadbench.jsonl out/olympiad.jsonl
    python machinery/data.py convert apps apps_test.jsonl out/apps.jsonl --difficulty introductory

Skip and count. Dataset rows are untrusted: a row that cannot be a task (no tests, an empty gold
answer, an unparsable test blob, a missing field, ...) or that the recipe's filter leaves out is
skipped and counted under a short stable reason (skip_reason: the one place an exception becomes
one); no row stops the others. Both commands print the counts

    wrote 2 tasks to data/polaris.jsonl (skipped 3 rows: empty answer 2, empty question 1)

and write them to the manifest beside the task file (OUT.manifest.json): the source, the revision
read (a hub commit, or each local file's sha256), the split, the filter, rows read, written, skipped
by reason and where the first row of each reason was. A file that is not JSONL is an error naming
file and line; so is a file of which no row could be a task. LiveCodeBench's pickled tests go
through a restricted unpickler that can build nothing but plain data.

Needs: no other file of this project (`prepare` imports the `datasets` package, and only there).
"""

import argparse
import ast
import base64
import collections
import contextlib
import datetime
import hashlib
import io
import itertools
import json
import os
import pickle
import sys
import zlib
from dataclasses import dataclass

import numpy as np

MAX_EXAMPLES = 3  # visible examples shown in task_text
MAX_EXAMPLE_CHARS = 2000  # per example input/output in task_text
MAX_UNPICKLED = 1 << 30  # bytes a LiveCodeBench test blob may decompress to


class BadRow(ValueError):
    """A row that cannot be a task; `reason` is the short stable key it is skipped and counted
    under ("no tests", "empty answer", ...), the message says what exactly."""

    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason


# --------------------------------------------------------------------------------------------------
# The format


def sample_queries(sources, weights, step, B, seed, pos):
    """B tasks for `step`; pos[s] counts the tasks taken from source s so far (the saved data
    position): source s is read in a fresh permutation each epoch."""
    w = np.asarray(weights, dtype=float)
    out = []
    for s in np.random.default_rng([seed, step]).choice(len(sources), size=B, p=w / w.sum()):
        epoch, k = divmod(pos[s], len(sources[s]))
        order = np.random.default_rng([seed, 1 + s, epoch]).permutation(len(sources[s]))
        out.append(sources[s][order[k]])
        pos[s] += 1
    return out


def _check_tests(tests, name):
    if not isinstance(tests, dict):
        raise BadRow("malformed tests", f"{name} must be an object with inputs/outputs")
    ins, outs = tests.get("inputs"), tests.get("outputs")
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
        raise BadRow(
            "malformed tests", f"{name}: inputs and outputs must be lists of the same length"
        )
    fn = tests.get("fn_name")
    if fn is not None and not isinstance(fn, str):
        raise BadRow("malformed tests", f"{name}: fn_name must be a string or null")
    if fn is None and not all(isinstance(x, str) for x in ins + outs):
        raise BadRow("malformed tests", f"{name}: stdin tests need string inputs and outputs")
    if fn is not None and not all(isinstance(x, list) for x in ins):
        raise BadRow(
            "malformed tests", f"{name}: call tests need each input to be the list of arguments"
        )


def validate_task(task):
    """Raise ValueError saying what is wrong with a task dict (a BadRow where a converted row
    cannot be a task: no question, an empty gold answer, no tests); return it unchanged
    otherwise."""
    if not isinstance(task, dict):
        raise ValueError(f"a task is a JSON object, got {type(task).__name__}")
    for key in ("id", "kind"):
        if not isinstance(task.get(key), str) or not task[key]:
            raise ValueError(f"missing or non-string {key!r}")
    question = task.get("question")
    if not isinstance(question, str) or not question.strip():
        raise BadRow("empty question", "missing, empty or non-string 'question'")
    if task["kind"] not in ("math", "code"):
        raise ValueError(f"kind must be 'math' or 'code', got {task['kind']!r}")
    if task["kind"] == "math":
        if not isinstance(task.get("answer"), str):
            raise BadRow("empty answer", "math task without a string 'answer'")
        if not task["answer"].strip():
            raise BadRow("empty answer", "math task with an empty 'answer': no reply can match it")
    if task["kind"] == "code":
        _check_tests(task.get("tests"), "tests")
        if not task["tests"]["inputs"]:
            raise BadRow("no tests", "code task without hidden tests")
        if task.get("public_tests") is not None:
            _check_tests(task["public_tests"], "public_tests")
    if not isinstance(task.get("metadata", {}), dict):
        raise ValueError("metadata must be an object")
    shown = task.get("metadata", {}).get("shown_examples", 0)
    if not isinstance(shown, int) or isinstance(shown, bool) or shown < 0:
        raise ValueError("metadata.shown_examples must be a non-negative int")
    return task


def _read_jsonl(path):
    """(line number, object) for every non-blank line; a bad line is an error naming file and
    line."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno})"
                ) from None


def load_tasks(path):
    """Every task of a JSONL file, validated."""
    tasks = []
    for n, obj in _read_jsonl(path):
        try:
            tasks.append(validate_task(obj))
        except ValueError as e:
            raise ValueError(f"{path}:{n}: {e}") from None
    return tasks


def read_jsonl(path):
    """Every object of a JSONL file (SFT samples, results)."""
    return [obj for _, obj in _read_jsonl(path)]


def write_jsonl(rows, path):
    """Write rows as JSONL, atomically (a crash leaves the old file or the new one, never half)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    os.replace(tmp, path)


def save_tasks(tasks, path):
    """Write tasks as JSONL (write_jsonl), each validated first."""
    rows = []
    for k, t in enumerate(tasks):
        try:
            rows.append(validate_task(t))
        except ValueError as e:
            raise ValueError(
                f"task {k} ({t.get('id') if isinstance(t, dict) else t!r}): {e}"
            ) from None
    write_jsonl(rows, path)


def _clip(text):
    text = str(text)
    return text if len(text) <= MAX_EXAMPLE_CHARS else text[:MAX_EXAMPLE_CHARS] + "\n...(truncated)"


def shown_examples(task):
    """The (input, output) pairs of the public tests that task_text shows: at most MAX_EXAMPLES, and
    at most metadata.shown_examples (run_tests still checks them all)."""
    pub = task.get("public_tests") or {}
    n_shown = min(MAX_EXAMPLES, (task.get("metadata") or {}).get("shown_examples", MAX_EXAMPLES))
    return list(zip(pub.get("inputs") or [], pub.get("outputs") or []))[:n_shown]


def task_text(task, short=False):
    """What a workflow sees: the question; for code, the starter code and the visible examples.

    short=True (the tiny character-level world, where every character is a token): the examples
    alone, one per line (`f(3)==7`), without the instructions around them."""
    text = task["question"].strip()
    if task.get("kind") != "code":
        return text
    pub = task.get("public_tests") or {}
    fn = pub.get("fn_name") or (task.get("tests") or {}).get("fn_name")
    shown = shown_examples(task)
    if fn:
        eq = "==" if short else " == "
        ex = [
            f"{fn}({_clip(', '.join(map(json.dumps, i)))}){eq}{_clip(json.dumps(o))}"
            for i, o in shown
        ]
    else:
        form = "in: {}\nout: {}" if short else "Input:\n{}\nOutput:\n{}"
        ex = [form.format(_clip(i).rstrip(), _clip(o).rstrip()) for i, o in shown]
    if short:
        return "\n".join([text] + ex)
    starter = (task.get("metadata") or {}).get("starter_code")
    if starter:
        text += f"\n\nStarter code:\n```python\n{starter.rstrip()}\n```"
    text += (
        f"\n\nWrite a Python function `{fn}` (a method of `class Solution` is fine)."
        if fn
        else "\n\nWrite a Python program that reads standard input and writes standard output."
    )
    return text + "".join(f"\n\nExample {k}:\n{e}" for k, e in enumerate(ex, 1))


# --------------------------------------------------------------------------------------------------
# Converters: one published row -> one task (index: the row's position, for sources without ids)


def _text(x):
    """A published field as stripped text; a missing one (None) is empty, never "None"."""
    return "" if x is None else str(x).strip()


def _math(source, id_, question, answer, **metadata):
    return {
        "id": f"{source}-{id_}",
        "kind": "math",
        "question": _text(question),
        "answer": _text(answer),  # an empty one: validate_task refuses the task
        "source": source,
        "metadata": metadata,
    }


def _aime_answer(a):
    a = _text(a)
    return str(int(a)) if a.isdigit() else a  # "025" -> "25" (math_equal accepts either)


def from_aime24(row, index=0):
    """Maxwell-Jia/AIME_2024 (the hub's): ID ("2024-I-1"), Problem, Solution, Answer (an int); or
    QwenLM/Qwen2.5-Math's evaluation/data/aime24 (GitHub): id, problem, solution, answer ("025"),
    url."""
    if "Problem" in row:  # the hub's shape
        return _math("aime24", row["ID"], row["Problem"], _aime_answer(row["Answer"]))
    return _math(
        "aime24",
        row.get("id", index),
        row["problem"],
        _aime_answer(row["answer"]),
        url=row.get("url"),
    )


def from_aime25(row, index=0):
    """yentinglin/aime_2025 (the hub's): id, problem, answer; or math-evaluation-harness'
    data/aime25 (GitHub): problem, answer."""
    return _math("aime25", row.get("id", index), row["problem"], _aime_answer(row["answer"]))


def from_olympiadbench(row, index=0):
    """Hothan/OlympiadBench's OE_TO_maths_en_COMP (the hub's) or Qwen2.5-Math's
    evaluation/data/olympiadbench (GitHub), one shape: id, question, final_answer (a list, or a
    Python-list literal as a string), context, is_multiple_answer, unit, ... A literal is read by
    ast.literal_eval: a dataset row never gets to run code. Multiple answers are joined with ", "
    (math_equal compares such lists as sets); `$` delimiters go."""
    answers = row["final_answer"]
    if isinstance(answers, str):
        try:
            answers = ast.literal_eval(answers)
        except (ValueError, SyntaxError, RecursionError) as e:
            why = f"final_answer is not a list literal: {answers[:80]!r} ({e})"
            raise BadRow("unparsable answer", why) from None
    if not isinstance(answers, list | tuple) or not all(isinstance(a, str) for a in answers):
        why = f"final_answer must be a list of strings, got {answers!r:.80}"
        raise BadRow("unparsable answer", why)
    answer = ", ".join(a.replace("$", "").strip() for a in answers)
    question = row["question"]
    if row.get("context"):
        question = f"{row['context'].strip()}\n\n{question}"
    return _math(
        "olympiadbench",
        row.get("id", index),
        question,
        answer,
        multiple_answer=bool(row.get("is_multiple_answer")),
        unit=row.get("unit"),
        answer_type=row.get("answer_type"),
        subfield=row.get("subfield"),
    )


def from_polaris(row, index=0):
    """POLARIS-Project/Polaris-Dataset-53K: problem, answer, difficulty. A row with an empty answer
    is skipped ("empty answer"): no reply could ever match it."""
    return _math(
        "polaris",
        row.get("id", index),
        row["problem"],
        row["answer"],
        difficulty=row.get("difficulty"),
    )


def _code(source, id_, question, tests, public, **metadata):
    return {
        "id": f"{source}-{id_}",
        "kind": "code",
        "question": _text(question),
        "tests": tests,
        "public_tests": public,
        "source": source,
        "metadata": metadata,
    }


def _stdin_text(x):
    return "\n".join(map(str, x)) + "\n" if isinstance(x, list) else str(x)


def _apps_tests(io_json):
    ins, outs, fn_name = io_json["inputs"], io_json.get("outputs") or [], io_json.get("fn_name")
    if not isinstance(ins, list) or not isinstance(outs, list):
        raise BadRow("malformed tests", "input_output's inputs and outputs must be lists")
    if fn_name:
        # APPS wraps each call-based return value in a one-element list ([[1, 2]] means "returns [1,
        # 2]")
        ins = [a if isinstance(a, list) else [a] for a in ins]
        outs = [o[0] if isinstance(o, list) and len(o) == 1 else o for o in outs]
        return {"inputs": ins, "outputs": outs, "fn_name": fn_name}
    return {
        "inputs": [_stdin_text(i) for i in ins],
        "outputs": [_stdin_text(o) for o in outs],
        "fn_name": None,
    }


def from_apps(row, index=0):
    """codeparrot/apps: question, input_output (JSON string: inputs, outputs, optional fn_name),
    starter_code, difficulty. APPS has no separate visible tests; the first two double as
    examples. Some train rows publish an empty input_output (the APPS card says so): "no
    tests"."""
    raw = row.get("input_output")
    if not raw:
        raise BadRow("no tests", "input_output is empty")
    try:
        io_json = json.loads(raw)
    except (json.JSONDecodeError, TypeError) as e:
        raise BadRow("unparsable tests", f"input_output is not JSON ({e})") from None
    if not isinstance(io_json, dict) or not io_json.get("inputs"):
        raise BadRow("no tests", "row has no tests in input_output")
    tests = _apps_tests(io_json)
    public = {**tests, "inputs": tests["inputs"][:2], "outputs": tests["outputs"][:2]}
    return _code(
        "apps",
        row.get("problem_id", index),
        row["question"],
        tests,
        public,
        difficulty=row.get("difficulty"),
        url=row.get("url"),
        starter_code=row.get("starter_code") or "",
    )


class _PlainUnpickler(pickle.Unpickler):
    """Builds only what pickle's own opcodes build (str, list, dict, numbers, ...): every global
    lookup (the only way a pickle reaches a callable to run) is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            f"refused: the pickle asks for {module}.{name}; LiveCodeBench test "
            "data is plain data, so this row is rejected"
        )

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused: the pickle uses persistent ids")


_PLAIN = (str, list, dict, int, float, bool, type(None))


def _check_plain(obj, depth=0):
    if depth > 100 or not isinstance(obj, _PLAIN):
        raise pickle.UnpicklingError(
            f"refused: the pickle holds a {type(obj).__name__}, not plain data"
        )
    for x in (
        obj if isinstance(obj, list) else [*obj, *obj.values()] if isinstance(obj, dict) else []
    ):
        _check_plain(x, depth + 1)


def safe_unpickle(blob):
    """pickle bytes -> plain data (str/list/dict/int/float/bool/None), or UnpicklingError saying
    why."""
    obj = _PlainUnpickler(io.BytesIO(blob)).load()
    _check_plain(obj)
    return obj


def decode_lcb_tests(text):
    """LiveCodeBench test cases: a JSON string, or base64 -> zlib -> pickle -> JSON string. Raises
    BadRow: "unparsable tests", or "refused pickle" for a pickle that asks for more than plain
    data."""
    with contextlib.suppress(json.JSONDecodeError):
        return json.loads(text)
    try:
        d = zlib.decompressobj()
        raw = d.decompress(base64.b64decode(text, validate=False), MAX_UNPICKLED)
        if d.unconsumed_tail:
            raise ValueError(f"private tests decompress to more than {MAX_UNPICKLED} bytes")
    except (ValueError, zlib.error) as e:
        why = f"private_test_cases is neither JSON nor base64+zlib ({e})"
        raise BadRow("unparsable tests", why) from None
    try:
        obj = safe_unpickle(raw)
    except pickle.UnpicklingError as e:
        raise BadRow("refused pickle", f"private_test_cases: {e}") from None
    except Exception as e:  # noqa: BLE001 - truncated or garbled pickle
        why = f"private_test_cases: unreadable pickle ({type(e).__name__}: {e})"
        raise BadRow("unparsable tests", why) from None
    try:
        return json.loads(obj) if isinstance(obj, str) else obj
    except json.JSONDecodeError as e:
        raise BadRow("unparsable tests", f"private_test_cases: not JSON inside ({e})") from None


def _lcb_tests(cases, fn_name):
    if fn_name:  # one JSON value per line for the arguments, JSON for the return value
        ins = [[json.loads(line) for line in c["input"].split("\n") if line.strip()] for c in cases]
        return {
            "inputs": ins,
            "outputs": [json.loads(c["output"]) for c in cases],
            "fn_name": fn_name,
        }
    return {
        "inputs": [c["input"] for c in cases],
        "outputs": [c["output"] for c in cases],
        "fn_name": None,
    }


def _iso_day(value):
    """A contest date as published (an ISO string; `datasets` reads it as a datetime) -> the ISO
    day, "2024-08-01"; ValueError when there is none."""
    if not isinstance(value, datetime.datetime):
        value = datetime.datetime.fromisoformat(str(value))
    return value.date().isoformat()


def from_livecodebench(row, index=0):
    """livecodebench/code_generation_lite: question_content, starter_code, public_test_cases (JSON),
    private_test_cases (JSON or base64/zlib/pickle), metadata (JSON; func_name for functional
    problems). Hidden tests are public + private, as LiveCodeBench grades."""
    fn_name = json.loads(row.get("metadata") or "{}").get("func_name")
    try:
        public = _lcb_tests(decode_lcb_tests(row.get("public_test_cases") or "[]"), fn_name)
        private = _lcb_tests(decode_lcb_tests(row.get("private_test_cases") or "[]"), fn_name)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        why = f"test cases are not input/output pairs ({type(e).__name__}: {e})"
        raise BadRow("unparsable tests", why) from None
    tests = {k: public[k] + private[k] for k in ("inputs", "outputs")} | {"fn_name": fn_name}
    day = None  # the metadata's; a row without a date converts (only the window needs one)
    with contextlib.suppress(ValueError):
        day = _iso_day(row.get("contest_date"))
    return _code(
        "livecodebench",
        row.get("question_id", index),
        row["question_content"],
        tests,
        public,
        title=row.get("question_title"),
        platform=row.get("platform"),
        contest_date=day,
        difficulty=row.get("difficulty"),
        starter_code=row.get("starter_code") or "",
    )


def _cc_tests(row, *parts):
    """CodeContests' test parts of a row ({input: [...], output: [...]} each), one after another."""
    tests = {"inputs": [], "outputs": [], "fn_name": None}
    for part in parts:
        got = row.get(part) or {}
        tests["inputs"] += got.get("input") or []
        tests["outputs"] += got.get("output") or []
    return tests


def from_codecontests(row, index=0):
    """deepmind/code_contests: description, public_tests / private_tests / generated_tests, each
    {input: [...], output: [...]}. The hidden tests are all three, as AlphaCode's evaluation (ours:
    the authors' loader grades train problems on private tests alone, test problems on public
    tests alone). A problem with none is skipped ("no tests")."""
    tl = row.get("time_limit") or {}
    seconds = (tl.get("seconds") or 0) + (tl.get("nanos") or 0) / 1e9
    tests = _cc_tests(row, "public_tests", "private_tests", "generated_tests")
    return _code(
        "codecontests",
        row.get("name", index),
        row["description"],
        tests,
        _cc_tests(row, "public_tests"),
        difficulty=row.get("difficulty"),
        time_limit=seconds or None,
        cf_rating=row.get("cf_rating"),
    )


CONVERTERS = {
    "aime24": from_aime24,
    "aime25": from_aime25,
    "olympiadbench": from_olympiadbench,
    "polaris": from_polaris,
    "apps": from_apps,
    "livecodebench": from_livecodebench,
    "codecontests": from_codecontests,
}


# --------------------------------------------------------------------------------------------------
# Skip and count: a row that cannot be a task, or that a filter leaves out, is counted by reason

# what a converter may raise on a row of another shape (anything else is a bug of ours: it stops)
ROW_ERRORS = (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError)


def skip_reason(error):
    """The one place a converter's exception becomes a skip reason: a BadRow names its own; a
    missing field or a value of another type is a row in another shape."""
    if isinstance(error, BadRow):
        return error.reason
    if isinstance(error, KeyError):
        return "missing field"
    return "malformed row"


class Skipped:
    """The rows left out: how many under each reason, and where the first of each was and why."""

    def __init__(self):
        self.counts = collections.Counter()
        self.first = {}

    def add(self, reason, where, why=""):
        self.counts[reason] += 1
        self.first.setdefault(reason, f"{where}: {why}" if why else where)

    def by_reason(self):
        """{reason: rows}, the most frequent first."""
        return dict(sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def summary(self):
        return skip_summary(self.by_reason())


def skip_summary(by_reason):
    """{reason: rows} -> 'skipped 3 rows: no tests 2, empty answer 1', or '' when no row was."""
    n = sum(by_reason.values())
    if not n:
        return ""
    parts = ", ".join(f"{reason} {k}" for reason, k in by_reason.items())
    return f"skipped {n} row{'s' if n > 1 else ''}: {parts}"


def _filtered_out(row, difficulty=None, dates=None):
    """The filter's reason for leaving a published row out, or None to keep it: APPS' difficulty,
    LiveCodeBench's window of contest dates (start <= day < end, ISO dates)."""
    if difficulty and row.get("difficulty") != difficulty:
        return "other difficulty"
    if dates:
        try:
            day = _iso_day(row.get("contest_date"))
        except ValueError:
            raise BadRow("no contest date", f"contest_date {row.get('contest_date')!r}") from None
        if not dates[0] <= day < dates[1]:
            return "outside date window"
    return None


def convert_rows(source, rows, difficulty=None, dates=None):
    """Published rows -> (tasks, Skipped, rows read). `rows` yields (where, row): where names the
    row in what is printed (FILE:LINE, or "row K"). Each row is filtered, converted by
    CONVERTERS[source] and validated; one that fails is skipped and counted, never stops the
    others."""
    fn, tasks, skipped, n = CONVERTERS[source], [], Skipped(), 0
    for n, (where, row) in enumerate(rows, 1):
        try:
            reason = _filtered_out(row, difficulty, dates)
            if reason is None:
                tasks.append(validate_task(fn(row, n - 1)))
            else:
                skipped.add(reason, where)
        except ROW_ERRORS as e:
            why = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            skipped.add(skip_reason(e), where, why[:300])
    return tasks, skipped, n


def _filter_text(difficulty=None, dates=None):
    if difficulty:
        return f"difficulty == {difficulty}"
    if dates:
        return f"{dates[0]} <= contest_date < {dates[1]}"
    return None


def manifest_path(out_path):
    """Where the manifest of a task file goes: data/apps.jsonl -> data/apps.manifest.json."""
    return out_path.removesuffix(".jsonl") + ".manifest.json"


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _write(tasks, skipped, n_read, out_path, manifest):
    """Write the tasks and their manifest; a source of which no row could be a task is an error
    (a file of another shape, or a filter that keeps nothing), and then nothing is written."""
    if not tasks:
        firsts = "; ".join(f"{r} at {w}" for r, w in skipped.first.items())
        raise ValueError(
            f"no task to write to {out_path}: {n_read} rows read, "
            f"{skipped.summary() or 'none'}" + (f" (first: {firsts})" if firsts else "")
        )
    save_tasks(tasks, out_path)
    manifest = manifest | {
        "rows_read": n_read,
        "written": len(tasks),
        "skipped": skipped.by_reason(),
        "first_skipped": skipped.first,
    }
    tmp = f"{manifest_path(out_path)}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, manifest_path(out_path))
    return manifest


def convert(source, in_path, out_path, difficulty="introductory"):
    """Convert a JSONL file of published rows to our format and write its manifest beside it;
    returns the manifest (written, skipped: {reason: rows}, ...). `difficulty` filters APPS only
    (None keeps every one). A line that is not JSON is an error naming file and line."""
    difficulty = difficulty if source == "apps" else None
    rows = ((f"{in_path}:{n}", row) for n, row in _read_jsonl(in_path))
    tasks, skipped, n_read = convert_rows(source, rows, difficulty)
    manifest = {
        "name": source,
        "tool": "machinery/data.py convert",
        "source": "a local file of published rows",
        "files": [in_path],
        "revision": {in_path: _sha256(in_path)},
        "split": None,
        "converter": source,
        "filter": _filter_text(difficulty),
    }
    return _write(tasks, skipped, n_read, out_path, manifest)


# --------------------------------------------------------------------------------------------------
# The recipe: what `prepare NAME` loads, which split, and why

# LiveCodeBench release_v5 is every problem up to test5.jsonl; the paper names release_v5 and no
# window. Ours: contests from 2024-08-01 to 2025-01-31, the window most reports on release_v5 use
# (DeepSeek-R1: 2024-08 to 2025-01; DeepCoder: 8/1/24 to 2/1/25, 279 problems as it counts them),
# so that our numbers sit beside theirs. The authors' released loader reads test6.jsonl (the
# problems release_v6 adds) with no window instead.
LCB_WINDOW = ("2024-08-01", "2025-02-01")


@dataclass(frozen=True)
class Recipe:
    """Where a prepared task file comes from. host "hf": a Hugging Face dataset repo, its files
    read at the commit `revision` points to when `prepare` runs."""

    host: str  # "hf"
    repo: str  # owner/name
    files: tuple  # paths or glob patterns in the repo: JSONL or parquet, never a dataset script
    split: str  # "train" (RL may read it) or "test" (a benchmark: evaluation alone reads it)
    converter: str  # a key of CONVERTERS
    revision: str = "main"
    difficulty: str | None = None  # APPS: keep this difficulty only
    dates: tuple | None = None  # LiveCodeBench: keep start <= contest_date < end
    rows: int | None = None  # keep the first `rows` rows read, in the published order (a subset)
    problems: int | None = None  # the problems the published set holds: prepare checks the count
    note: str = ""  # why this split; where we differ from the authors


CC_TESTS = (
    "graded on public + private + generated tests (ours, as AlphaCode); the authors' loader grades "
    "train problems on private tests alone, test problems on public tests alone"
)
RECIPES = {
    "polaris": Recipe(
        "hf",
        "POLARIS-Project/Polaris-Dataset-53K",
        ("polaris-data-53K.jsonl",),
        "train",
        "polaris",
        note="[paper] RL's math: the whole set, its one (train) file",
    ),
    "apps_train": Recipe(
        "hf",
        "codeparrot/apps",
        ("train.jsonl",),
        "train",
        "apps",
        difficulty="introductory",
        note="[paper] RL's code: APPS train, introductory (the authors' loader takes rows 500-4500 "
        "of test.jsonl instead: the benchmark's own split)",
    ),
    "codecontests_train": Recipe(
        "hf",
        "deepmind/code_contests",
        ("data/train-*.parquet",),
        "train",
        "codecontests",
        note=f"[paper] RL's code: CodeContests train; {CC_TESTS}",
    ),
    "aime24": Recipe(
        "hf",
        "Maxwell-Jia/AIME_2024",
        ("aime_2024_problems.parquet",),
        "test",
        "aime24",
        problems=30,
        note="[paper] benchmark: AIME 2024, 30 problems ([authors] their loader's AIME24); the "
        "gold: its Answer field (ours; their loader's key order reads Solution first and takes "
        "its \\boxed{} or last line)",
    ),
    "aime25": Recipe(
        "hf",
        "yentinglin/aime_2025",
        ("data/train-*.parquet",),
        "test",
        "aime25",
        problems=30,
        note="[paper] benchmark: AIME 2025, 30 problems ([authors] their loader's AIME25)",
    ),
    "olympiadbench": Recipe(
        "hf",
        "Hothan/OlympiadBench",
        ("OlympiadBench/OE_TO_maths_en_COMP/OE_TO_maths_en_COMP.parquet",),
        "test",
        "olympiadbench",
        problems=674,
        note="[paper] benchmark: OlympiadBench's English text-only open-ended maths, the "
        "OE_TO_maths_en_COMP set ([authors] their loader's); 674 problems (Qwen2.5-Math's GitHub "
        "file of it: 675)",
    ),
    "apps": Recipe(
        "hf",
        "codeparrot/apps",
        ("test.jsonl",),
        "test",
        "apps",
        difficulty="introductory",
        note="[paper] benchmark: APPS test, introductory",
    ),
    "apps500": Recipe(
        "hf",
        "codeparrot/apps",
        ("test.jsonl",),
        "test",
        "apps",
        rows=500,
        note="[authors] benchmark: the authors' APPS set, the first 500 rows of test.jsonl (every "
        "difficulty; their loader's process_apps_test, scripts/dataprocess/load_code.py)",
    ),
    "livecodebench": Recipe(
        "hf",
        "livecodebench/code_generation_lite",
        ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl"),
        "test",
        "livecodebench",
        dates=LCB_WINDOW,
        note="[paper] benchmark: release_v5 (test.jsonl to test5.jsonl); the window: LCB_WINDOW",
    ),
    "codecontests": Recipe(
        "hf",
        "deepmind/code_contests",
        ("data/test-*.parquet",),
        "test",
        "codecontests",
        note=f"[paper] benchmark: CodeContests test; {CC_TESTS}",
    ),
}


class Unreachable(OSError):
    """The published files could not be read: no network, or a host that does not answer."""


def _network_error(e):
    """Whether e is the network's or a hub client's (OSError, or raised by httpx, aiohttp,
    requests, urllib3, fsspec or huggingface_hub), not a bug of ours."""
    clients = ("httpx", "aiohttp", "requests", "urllib3", "fsspec", "huggingface_hub")
    return isinstance(e, OSError) or type(e).__module__.split(".")[0].startswith(clients)


def _unreachable(name, recipe, error):
    """The one line for published files that could not be read, naming the offline way."""
    why = (str(error).strip().splitlines() or [""])[0][:160]
    return (
        f"{name}: cannot read the published files ({recipe.host}:{recipe.repo}; "
        f"{type(error).__name__}: {why}); offline, prepare from files you have in the published "
        f"shape: python machinery/data.py prepare {name} --from FILE"
    )


def _published_files(recipe, revision=None):
    """(commit, data_files) of a recipe's published files: a hub branch is resolved to its commit
    first, so that the files read are the commit recorded."""
    revision = revision or recipe.revision
    from huggingface_hub import HfApi  # a dependency of datasets

    sha = HfApi().dataset_info(recipe.repo, revision=revision).sha
    return sha, [f"hf://datasets/{recipe.repo}@{sha}/{f}" for f in recipe.files]


def _first_bad_line(paths):
    """Name the first line that is not JSON in local JSONL files (ValueError), if there is one."""
    for path in paths:
        for _ in _read_jsonl(path):
            pass


def prepare(name, out_dir="data", from_files=None, revision=None, cache_dir=None):
    """Load RECIPES[name]'s published files (or `from_files`, local files in the published shape),
    convert them, write OUT_DIR/NAME.jsonl and its manifest; returns the manifest."""
    try:
        import datasets  # only here: the method's modules and `convert` run without it
    except ImportError:
        raise ImportError(
            "prepare needs the datasets package: pip install datasets (requirements.txt pins it)"
        ) from None
    recipe = RECIPES[name]
    if from_files:
        for path in from_files:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"--from: no file {path}")
        files = list(from_files)
        read = {path: _sha256(path) for path in files}
    else:
        try:
            read, files = _published_files(recipe, revision)
        except Exception as e:  # no network, a hub that does not answer: one line, not a traceback
            if not _network_error(e):
                raise  # a bug of ours is one, not "offline"
            raise Unreachable(_unreachable(name, recipe, e)) from None
    kinds = {f.endswith(".parquet") for f in files}
    if len(kinds) > 1:
        raise ValueError(f"{name}: give files of one format, parquet or JSONL: {files}")
    builder = "parquet" if kinds == {True} else "json"
    try:
        rows = datasets.load_dataset(
            builder, data_files=files, split="train", streaming=True, cache_dir=cache_dir
        )
        numbered = ((f"row {k}", row) for k, row in enumerate(rows, 1))
        tasks, skipped, n_read = convert_rows(
            recipe.converter,
            itertools.islice(numbered, recipe.rows),  # the recipe's subset: its first rows
            recipe.difficulty,
            recipe.dates,
        )
    except (ValueError, datasets.exceptions.DatasetsError) as e:  # the files themselves do not read
        if from_files and builder == "json":
            _first_bad_line(files)  # names the file and line
        if not from_files and not isinstance(e, datasets.exceptions.DatasetGenerationError):
            raise Unreachable(_unreachable(name, recipe, e)) from None
        raise ValueError(f"{name}: the files do not read as {builder}: {e}") from None
    except Exception as e:  # reading the published files over the network failed
        if from_files or not _network_error(e):
            raise  # a converter's bug is one, not "offline"
        raise Unreachable(_unreachable(name, recipe, e)) from None
    problems = count_check(name, recipe, len(tasks), local=bool(from_files))
    manifest = {
        "name": name,
        "tool": "machinery/data.py prepare" + (" --from" if from_files else ""),
        "source": f"{recipe.host}:{recipe.repo}",
        "files": files,
        "revision": read,
        "split": recipe.split,
        "converter": recipe.converter,
        "filter": _filter_text(recipe.difficulty, recipe.dates),
        "subset": f"the first {recipe.rows} rows" if recipe.rows else None,
        "problems": problems,
        "note": recipe.note,
        "datasets": datasets.__version__,
    }
    return _write(tasks, skipped, n_read, os.path.join(out_dir, f"{name}.jsonl"), manifest)


def count_check(name, recipe, written, local):
    """The line saying whether the `written` tasks are the problems recipe's published set holds
    (None for a recipe without a count). Another count from the published files (another version
    of them) is a ValueError: nothing is written; from `local` (--from) files it is said."""
    if recipe.problems is None:
        return None
    if written == recipe.problems:
        return f"{name}: {written} problems, as many as the published set holds"
    line = (
        f"{name}: {written} problems, where {recipe.host}:{recipe.repo} publishes {recipe.problems}"
    )
    if not local:
        raise ValueError(
            f"{line}: another version of its files? nothing written (--revision COMMIT reads "
            f"another commit; --from FILE files you have)"
        )
    return f"{line} (your --from files: written as they are)"


# --------------------------------------------------------------------------------------------------
# The command line


def _report(manifest, out):
    skipped = skip_summary(manifest["skipped"])
    print(f"wrote {manifest['written']} tasks to {out}" + (f" ({skipped})" if skipped else ""))
    for reason, where in manifest["first_skipped"].items():
        print(f"  first {reason}: {where}")
    if manifest.get("problems"):
        print(manifest["problems"])


def _from_files(names, given):
    """{name: [its local files]} from --from: FILE ... for one name; NAME=FILE ... for several
    (each name given at least one file)."""
    if not given:
        return {}
    if len(names) == 1 and not any(f.partition("=")[0] in RECIPES for f in given):
        return {names[0]: list(given)}
    files = {}
    for f in given:
        name, sep, path = f.partition("=")
        if not sep or name not in names:
            sys.exit(f"error: --from {f}: with several names, give each file as NAME=FILE")
        files.setdefault(name, []).append(path)
    if missing := [n for n in names if n not in files]:
        sys.exit(f"error: --from names no file of {', '.join(missing)}")
    return files


def main(argv=None):
    ap = argparse.ArgumentParser(description="MetaAgent-X task files from published benchmarks.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="load a recipe's published files, write data/NAME.jsonl")
    names = ", ".join(RECIPES)
    p.add_argument("names", nargs="+", choices=list(RECIPES), metavar="NAME", help=names)
    p.add_argument("--out", default="data", help="the folder of NAME.jsonl (default: data)")
    p.add_argument(
        "--from",
        dest="from_files",
        nargs="+",
        metavar="FILE",
        help="local files in the published shape (one NAME), or NAME=FILE for several names",
    )
    p.add_argument("--revision", help="a hub branch or commit to read instead")
    c = sub.add_parser("convert", help="convert a JSONL file of published rows")
    c.add_argument("source", choices=sorted(CONVERTERS))
    c.add_argument("inp")
    c.add_argument("out")
    c.add_argument(
        "--difficulty", default="introductory", help="APPS split to keep ('all' keeps every one)"
    )
    a = ap.parse_args(argv)
    try:
        if a.cmd == "convert":
            difficulty = None if a.difficulty == "all" else a.difficulty
            _report(convert(a.source, a.inp, a.out, difficulty), a.out)
            return
        if a.from_files and a.revision:
            sys.exit("error: --revision picks a commit of the published files; --from reads yours")
        files = _from_files(a.names, a.from_files)
        for name in a.names:
            manifest = prepare(name, a.out, files.get(name), a.revision)
            _report(manifest, os.path.join(a.out, f"{name}.jsonl"))
    except (ValueError, OSError, ImportError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
