"""data.py: the task format (JSONL), task files, and converters from each published benchmark's
shape into it.

One task a line, a plain dict in memory:

    {"id": str, "kind": "math" | "code", "question": str,
     "answer": str,                                                       (math)
     "tests": {"inputs": [...], "outputs": [...], "fn_name": str|None},   (code, hidden; graded)
     "public_tests": same shape,                        (code, visible to the workflow)
     "source": str, "metadata": dict}   (metadata.shown_examples: show only this many public tests)

stdin tests: inputs/outputs are strings. Call tests (fn_name set; LeetCode `class Solution` methods
too): each input is the list of positional arguments, each output the expected return value (JSON
values). task_text is what a workflow sees of a task.

    python machinery/data.py convert olympiadbench olympiadbench.jsonl out/olympiad.jsonl
    python machinery/data.py convert apps apps_test.jsonl out/apps.jsonl --difficulty introductory

The hub-hosted benchmarks' rows come as JSONL from the `datasets` package, on a machine with the
network:

    ds = datasets.load_dataset(...)   # one of:
        # polaris:       "POLARIS-Project/Polaris-Dataset-53K", split="train"
        # apps:          "codeparrot/apps", "all", split="test", trust_remote_code=True
        # codecontests:  "deepmind/code_contests", split="test"
        # livecodebench: "livecodebench/code_generation_lite", split="test",
        #                version_tag="release_v5", trust_remote_code=True
    ds.to_json("rows.jsonl")
    # then: python machinery/data.py convert NAME rows.jsonl data/NAME.jsonl

Dataset rows are untrusted: a malformed row is an error naming the file and line, never silently
dropped, and LiveCodeBench's pickled tests go through a restricted unpickler that can build nothing
but plain data.

Needs: no other file of this project.
"""

import argparse
import ast
import base64
import contextlib
import io
import json
import os
import pickle
import sys
import zlib

MAX_EXAMPLES = 3  # visible examples shown in task_text
MAX_EXAMPLE_CHARS = 2000  # per example input/output in task_text
MAX_UNPICKLED = 1 << 30  # bytes a LiveCodeBench test blob may decompress to


# --------------------------------------------------------------------------------------------------
# The format


def _check_tests(tests, name):
    if not isinstance(tests, dict):
        raise ValueError(f"{name} must be an object with inputs/outputs")
    ins, outs = tests.get("inputs"), tests.get("outputs")
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
        raise ValueError(f"{name}: inputs and outputs must be lists of the same length")
    fn = tests.get("fn_name")
    if fn is not None and not isinstance(fn, str):
        raise ValueError(f"{name}: fn_name must be a string or null")
    if fn is None and not all(isinstance(x, str) for x in ins + outs):
        raise ValueError(f"{name}: stdin tests need string inputs and outputs")
    if fn is not None and not all(isinstance(x, list) for x in ins):
        raise ValueError(f"{name}: call tests need each input to be the list of arguments")


def validate_task(task):
    """Raise ValueError saying what is wrong with a task dict; return it unchanged otherwise."""
    if not isinstance(task, dict):
        raise ValueError(f"a task is a JSON object, got {type(task).__name__}")
    for key in ("id", "kind", "question"):
        if not isinstance(task.get(key), str) or not task[key]:
            raise ValueError(f"missing or non-string {key!r}")
    if task["kind"] not in ("math", "code"):
        raise ValueError(f"kind must be 'math' or 'code', got {task['kind']!r}")
    if task["kind"] == "math" and not isinstance(task.get("answer"), str):
        raise ValueError("math task without a string 'answer'")
    if task["kind"] == "code":
        _check_tests(task.get("tests"), "tests")
        if not task["tests"]["inputs"]:
            raise ValueError("code task without hidden tests")
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


def _math(source, id_, question, answer, **metadata):
    return {
        "id": f"{source}-{id_}",
        "kind": "math",
        "question": str(question).strip(),
        "answer": str(answer).strip(),
        "source": source,
        "metadata": metadata,
    }


def _aime_answer(a):
    a = str(a).strip()
    return str(int(a)) if a.isdigit() else a  # "025" -> "25" (math_equal accepts either)


def from_aime24(row, index=0):
    """QwenLM/Qwen2.5-Math evaluation/data/aime24: id, problem, solution, answer ("025"), url."""
    return _math(
        "aime24",
        row.get("id", index),
        row["problem"],
        _aime_answer(row["answer"]),
        url=row.get("url"),
    )


def from_aime25(row, index=0):
    """math-evaluation-harness data/aime25: problem, answer."""
    return _math("aime25", row.get("id", index), row["problem"], _aime_answer(row["answer"]))


def from_olympiadbench(row, index=0):
    """Qwen2.5-Math evaluation/data/olympiadbench: question, final_answer (a list, or a Python-list
    literal as a string), is_multiple_answer, unit, ... A literal is read by ast.literal_eval: a
    dataset row never gets to run code. Multiple answers are joined with ", " (math_equal compares
    such lists as sets); `$` delimiters go."""
    answers = row["final_answer"]
    if isinstance(answers, str):
        try:
            answers = ast.literal_eval(answers)
        except (ValueError, SyntaxError) as e:
            raise ValueError(
                f"final_answer is not a list literal: {answers[:80]!r} ({e})"
            ) from None
    if not isinstance(answers, list | tuple) or not all(isinstance(a, str) for a in answers):
        raise ValueError(f"final_answer must be a list of strings, got {answers!r:.80}")
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
    """POLARIS-Project/Polaris-Dataset-53K: problem, answer, difficulty."""
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
        "question": str(question).strip(),
        "tests": tests,
        "public_tests": public,
        "source": source,
        "metadata": metadata,
    }


def _stdin_text(x):
    return "\n".join(map(str, x)) + "\n" if isinstance(x, list) else str(x)


def _apps_tests(io_json):
    ins, outs, fn_name = io_json["inputs"], io_json.get("outputs") or [], io_json.get("fn_name")
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
    examples."""
    try:
        io_json = json.loads(row.get("input_output") or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"input_output is not JSON ({e.msg})") from None
    if not isinstance(io_json, dict) or not io_json.get("inputs"):
        raise ValueError("row has no tests in input_output")
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
    """LiveCodeBench test cases: a JSON string, or base64 -> zlib -> pickle -> JSON string."""
    with contextlib.suppress(json.JSONDecodeError):
        return json.loads(text)
    try:
        d = zlib.decompressobj()
        raw = d.decompress(base64.b64decode(text, validate=False), MAX_UNPICKLED)
        if d.unconsumed_tail:
            raise ValueError(f"private tests decompress to more than {MAX_UNPICKLED} bytes")
    except (ValueError, zlib.error) as e:
        raise ValueError(f"private_test_cases is neither JSON nor base64+zlib ({e})") from None
    try:
        obj = safe_unpickle(raw)
    except pickle.UnpicklingError as e:
        raise ValueError(f"private_test_cases: {e}") from None
    except Exception as e:  # noqa: BLE001 - truncated or garbled pickle
        raise ValueError(
            f"private_test_cases: unreadable pickle ({type(e).__name__}: {e})"
        ) from None
    return json.loads(obj) if isinstance(obj, str) else obj


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


def from_livecodebench(row, index=0):
    """livecodebench/code_generation_lite: question_content, starter_code, public_test_cases (JSON),
    private_test_cases (JSON or base64/zlib/pickle), metadata (JSON; func_name for functional
    problems). Hidden tests are public + private, as LiveCodeBench grades."""
    fn_name = json.loads(row.get("metadata") or "{}").get("func_name")
    public = _lcb_tests(decode_lcb_tests(row.get("public_test_cases") or "[]"), fn_name)
    private = _lcb_tests(decode_lcb_tests(row.get("private_test_cases") or "[]"), fn_name)
    tests = {k: public[k] + private[k] for k in ("inputs", "outputs")} | {"fn_name": fn_name}
    return _code(
        "livecodebench",
        row.get("question_id", index),
        row["question_content"],
        tests,
        public,
        title=row.get("question_title"),
        platform=row.get("platform"),
        contest_date=row.get("contest_date"),
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
    {input: [...], output: [...]}. The hidden tests are all three, as AlphaCode's evaluation."""
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


def convert(source, in_path, out_path, difficulty="introductory"):
    """Convert a JSONL file of published rows to our format; returns (written, filtered out).
    `difficulty` filters APPS only (None keeps every split)."""
    fn, tasks, skipped = CONVERTERS[source], [], 0
    for k, (n, row) in enumerate(_read_jsonl(in_path)):
        try:
            task = validate_task(fn(row, k))  # converted first: a row of another shape is an error
            if source == "apps" and difficulty and task["metadata"]["difficulty"] != difficulty:
                skipped += 1  # another APPS split
                continue
            tasks.append(task)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            why = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            raise ValueError(f"{in_path}:{n}: cannot convert this {source} row: {why}") from None
    save_tasks(tasks, out_path)
    return len(tasks), skipped


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Convert published benchmark rows to MetaAgent-X tasks."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="convert a JSONL file of published rows")
    c.add_argument("source", choices=sorted(CONVERTERS))
    c.add_argument("inp")
    c.add_argument("out")
    c.add_argument(
        "--difficulty", default="introductory", help="APPS split to keep ('all' keeps every one)"
    )
    a = ap.parse_args(argv)
    try:
        n, skipped = convert(
            a.source, a.inp, a.out, None if a.difficulty == "all" else a.difficulty
        )
    except (ValueError, OSError) as e:
        sys.exit(f"error: {e}")
    print(f"wrote {n} tasks to {a.out}" + (f" ({skipped} rows filtered out)" if skipped else ""))


if __name__ == "__main__":
    main()
