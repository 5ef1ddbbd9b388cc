"""distill.py: SFT data for the cold start, distilled from a teacher (the paper's cold start at
scale).

An OpenAI-compatible chat endpoint (vLLM's `vllm serve`, or a hosted API) plays the Executor, and
the Designer where asked. The work is split into units, one a (task, template) pair:

    design  = mas.script_completion(mas.TEMPLATES[name])  for a template's name (single,
                                                          ensemble, critic, tester)
            = the teacher's reply to mas.designer_messages for "design" (the Designer's choice)
    run     = the design's script run once in the sandbox (sandbox.run_workflows), the teacher
              answering each of its agent calls
    kept    = if reward.reward(task, run, lam=0) == 1 (the run is correct):
                designer sample (Designer prompt, design)
                executor samples (agent-call prompt, reply) of the calls whose own answer is correct
                (reward.correctness); an outvoted sample or a draft the critic fixed is context for
                later calls, never a target; a (prompt, reply) already kept is not kept twice

The paper's cold start, the four templates on every task (--templates' default; add "design" for
the Designer's own choice), in one command, wrapped here (the teacher serves the student's family;
the preset's chat-template switches go with every request):

    python tools/distill.py --teacher http://HOST:8000 --model NAME --tasks data/polaris.jsonl
        --config config/qwen3_8b.py --templates single,ensemble,critic,tester --out data/sft
    counts = distill(url, "NAME", tasks, "DIR", templates=("single", "design"), short=True)

OUT/designer.jsonl and OUT/executor.jsonl are the input of `python sft.py --data OUT`; each row
names its unit (task_id, template). OUT/distill_stats.json counts the whole run (resumed units
included), per template and in all: designs, parsed, runs, correct, designer and executor samples,
teacher_errors (calls that got no usable reply), and every unit that kept nothing by its reason:
context_length (a prompt longer than the teacher's context: the server's 400, listed per task in
context_length_tasks), thinking_cut (a reply that is thinking cut off), thinking_stray (think tags
left after the leading block), max_tokens (a reply cut at --max-tokens: without its end of turn it
would teach the student never to stop), teacher_error (a call failed after the retries), unparsed,
run_error, wrong. Replies dropped inside kept runs are counted too (wrong_replies_dropped,
duplicate_replies_dropped).

The client: the `openai` package (vLLM's own dependency: nothing new to install), streaming. Its
HTTP client's read timeout, --timeout (the silence budget), bounds the gap between two chunks of a
reply, never its length: a long reply from a slow teacher streams for as long as it keeps
streaming; a teacher silent for longer fails that request.
A request is tried up to RETRIES times, with backoff, on a connection error, a silence, a stream
cut off, a 429 or a 5xx; any other 4xx is not retried (a context-length 400 is its own reason). The
client's own retries are off: they would not redo a stream that broke off midway, this loop does.
The key, if the endpoint wants one, from OPENAI_API_KEY.

Rendering: each request carries the chat messages and the preset's chat-template switches
(settings.chat_template_kwargs(PRESET), `--config PRESET`; without it config/tiny.py's, {}) as
vLLM's `chat_template_kwargs` (request_body builds the body). vLLM renders them with the served
model's chat template, add_generation_prompt=True, and those switches: the prompt that
engine.prompt_ids renders for SFT and RL from the same messages and the same switches, when the
teacher's chat template is the student's. A Qwen3 preset sends {"enable_thinking": false}.

Thinking never reaches a target: `reasoning_content` (or `reasoning`) deltas, what a server with a
reasoning parser streams apart, are dropped and counted (reasoning_chars_dropped); a leading
`<think>...</think>` block (a server without one), or the end of a block that the template opened
in the prompt, is stripped (think_blocks_stripped); an unclosed `<think>` is thinking cut off, and
think tags after the leading block are not a reply: such a call fails with its reason.

Concurrency is bounded: --concurrency requests in flight; --width scripts alive at once in the
sandbox (each job holds 4 file handles: thousands at once would exhaust `ulimit -n`); --chunk units
at a time, so memory and handles stay bounded whatever the task file's size.

Files are appended as units finish, so a crash keeps everything finished. A chunk's samples are
written, flushed and fsynced first, then one OUT/done.jsonl line per unit (its key and its counts),
flushed and fsynced. So a unit with a done line has all its samples on disk, and a unit killed
half-written has samples but no done line. `--resume` (resume=True) reads done.jsonl, removes the
samples (and any torn line) of units without a done line, rewriting a file atomically only when
something is removed, and asks the teacher nothing for the units it lists: a resumed run whose
units are all done changes no file. Without --resume, an OUT that holds any of these files is
refused (never deleted). Each call of a unit has its own seed (a hash of task id, template and call
index), so a unit redone asks the same questions.

Needs: machinery/data.py, mas.py, reward.py, sandbox.py, settings.py, machinery/isolation.py,
stagewise.py
"""

import argparse
import hashlib
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import openai

# run by path (python tools/distill.py): the project's root first on the path, for its imports below
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mas
import reward as reward_lib
import sandbox
import settings
from machinery import data

MAX_TOKENS = settings.Config.max_tokens  # the presets' per-completion limit [paper]: 8192
TEMPERATURE = 0.7
TIMEOUT = 300.0  # seconds of silence a request may have (queueing and prefill included)
RETRIES = 3  # tries a request
CONCURRENCY = 8  # requests in flight
WIDTH = 64  # scripts alive at once in the sandbox
CHUNK = 128  # units at a time: written when the chunk ends
DESIGN = "design"  # the Designer's free choice, beside mas.TEMPLATES' names
PAPER = ("single", "ensemble", "critic", "tester")  # the paper's cold start
FILES = ("designer.jsonl", "executor.jsonl", "done.jsonl", "distill_stats.json")
# a 400 that says the prompt does not fit (vLLM's two messages, OpenAI's code)
CONTEXT_RE = re.compile(r"maximum context length|context length|context_length_exceeded", re.I)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# what the openai client takes as arguments; the rest of a body goes as extra_body
CLIENT_FIELDS = ("model", "messages", "max_tokens", "temperature", "seed", "stream")
UNIT_COUNTS = ("designs", "parsed", "runs", "correct", "designer_samples", "executor_samples")


class DistillError(ValueError):
    """A run that cannot start (an OUT that holds results, unknown templates): one line."""


def request_body(model, messages, max_tokens=MAX_TOKENS, template_kwargs=None, *, seed=None):
    """The JSON body of one chat request, as the teacher receives it: the messages, the sampling,
    and the chat template's switches as `chat_template_kwargs` (omitted when there are none)."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": TEMPERATURE,
        "stream": True,
    }
    if seed is not None:
        body["seed"] = seed
    if template_kwargs:
        body["chat_template_kwargs"] = dict(template_kwargs)
    return body


def strip_thinking(text):
    """(reply, reason, stripped): the reply without its leading think block. reason is None, or
    "thinking_cut" (a <think> never closed) or "thinking_stray" (think tags after the block), and
    then reply is ""."""
    head, sep, tail = text.partition(THINK_CLOSE)
    stripped = False
    if text.lstrip().startswith(THINK_OPEN) or (sep and THINK_OPEN not in head):
        if not sep:
            return "", "thinking_cut", False
        text, stripped = tail.lstrip(), True
    if THINK_OPEN in text or THINK_CLOSE in text:
        return "", "thinking_stray", stripped
    return text, None, stripped


@dataclass
class Reply:
    """One call's outcome: text ("" when it failed), and why it failed (reason, error)."""

    text: str
    error: str | None = None
    reason: str | None = None  # context_length | thinking_cut | ... | teacher_error
    reasoning_chars: int = 0  # reasoning deltas dropped
    think_stripped: bool = False


class Teacher:
    """The teacher endpoint: ask(messages, seed) -> Reply, never raising; ask_many in parallel (at
    most `concurrency` requests in flight). `requests` counts HTTP requests, retries included."""

    def __init__(self, url, model, *, max_tokens, template_kwargs, timeout, concurrency, api_key):
        base = url.rstrip("/")
        self.client = openai.OpenAI(
            base_url=base if base.endswith("/v1") else base + "/v1",
            api_key=api_key or "none",
            timeout=openai.Timeout(timeout),  # connect, each read, write, pool: the silence budget
            max_retries=0,
        )
        self.model, self.max_tokens = model, max_tokens
        self.template_kwargs = dict(template_kwargs or {})
        self.pool = ThreadPoolExecutor(max_workers=concurrency)
        self.requests, self.lock = 0, threading.Lock()

    def ask_many(self, questions):
        """[(messages, seed)] -> [Reply], in order."""
        return list(self.pool.map(self.ask_one, questions))

    def ask_one(self, question):
        messages, seed = question
        return self.ask(messages, seed)

    def ask(self, messages, seed=None):
        body = request_body(
            self.model,
            messages,
            max_tokens=self.max_tokens,
            template_kwargs=self.template_kwargs,
            seed=seed,
        )
        error = "no attempt"
        for attempt in range(RETRIES):
            if attempt:
                time.sleep(min(8.0, 0.5 * 2 ** (attempt - 1)))
            with self.lock:
                self.requests += 1
            try:
                return self._stream(body)
            except openai.APIStatusError as e:
                error = f"{type(e).__name__}: {e}"[:500]
                if e.status_code == 400 and CONTEXT_RE.search(error):
                    return Reply("", error, "context_length")
                if e.status_code < 500 and e.status_code != 429:
                    break  # a 4xx other than rate limiting will not get better by retrying
            # a refused connection, a silence past the budget, a stream cut off or malformed
            except (openai.OpenAIError, ValueError, TypeError, AttributeError, KeyError) as e:
                error = f"{type(e).__name__}: {e}"[:500]
                if CONTEXT_RE.search(error):  # said inside the stream
                    return Reply("", error, "context_length")
        return Reply("", error, "teacher_error")

    def _stream(self, body):
        args = {k: v for k, v in body.items() if k in CLIENT_FIELDS}
        extra = {k: v for k, v in body.items() if k not in CLIENT_FIELDS}
        parts, reasoning, finish = [], 0, None
        with self.client.chat.completions.create(**args, extra_body=extra or None) as stream:
            for chunk in stream:
                for choice in chunk.choices or ():
                    delta = choice.delta
                    if delta is not None and isinstance(delta.content, str):
                        parts.append(delta.content)
                    for name in ("reasoning_content", "reasoning"):  # vLLM's old name, its new
                        thought = getattr(delta, name, None)
                        reasoning += len(thought) if isinstance(thought, str) else 0
                    finish = choice.finish_reason or finish
        if finish is None:
            raise ValueError("the stream ended without a finish_reason")
        text, reason, stripped = strip_thinking("".join(parts))
        if reason is None and finish == "length":
            reason = "max_tokens"
        if reason is not None:
            return Reply("", f"{reason} (finish_reason {finish})", reason, reasoning, stripped)
        return Reply(text, None, None, reasoning, stripped)

    def close(self):
        self.pool.shutdown()
        self.client.close()


def seed_of(*key):
    """A call's seed: a stable hash of its unit and index (the same questions when redone)."""
    return int(hashlib.sha256(json.dumps(key).encode()).hexdigest()[:8], 16) % (1 << 31)


def sample_key(row):
    """What makes two executor samples the same: prompt and reply."""
    text = json.dumps([row["messages"], row["completion"]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------------------------------
# OUT: appended as units finish; resumed from done.jsonl


def _read_lines(path):
    """The lines of a file, streamed; none when it is missing."""
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            yield from f


def _unit(line):
    """(row, its unit's key (task_id, template)), or None for a line that is not a whole row: a
    torn line (the process died while writing it) or one without its newline."""
    if not line.endswith("\n"):
        return None
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict) or not isinstance(row.get("template"), str):
        return None
    if not isinstance(row.get("task_id"), str | int):
        return None
    return row, (row["task_id"], row["template"])


def _foreign(line):
    """A whole JSON object that names no unit."""
    try:
        row = json.loads(line)
    except ValueError:
        return False
    return line.endswith("\n") and isinstance(row, dict) and "template" not in row


def _replace(path, lines):
    """Write these lines as the file `path`, atomically (a crash leaves the old file or the new)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _kept_lines(path, keep):
    for line in _read_lines(path):
        if keep(line):
            yield line


def _rewrite(path, keep):
    """Drop the lines of `path` that keep(line) refuses: the file rewritten, streamed, only when
    there are any. Returns how many."""
    dropped = 0
    for line in _read_lines(path):
        dropped += not keep(line)
    if dropped:
        _replace(path, _kept_lines(path, keep))
    return dropped


class Out:
    """OUT's files: done records by unit key, the executor samples kept (their keys), appends."""

    def __init__(self, out_dir, resume, log):
        self.dir = out_dir
        held = [n for n in FILES if os.path.exists(os.path.join(out_dir, n))]
        if held and not resume:
            raise DistillError(
                f"{out_dir} holds a distillation's results ({', '.join(held)}): --resume "
                "continues it; or choose another --out"
            )
        os.makedirs(out_dir, exist_ok=True)
        self.done, self.seen, good, torn = {}, set(), [], 0
        for line in _read_lines(self.path("done.jsonl")):
            unit = _unit(line)
            if unit is None or unit[1] in self.done:
                torn += 1
                continue
            self.done[unit[1]] = unit[0]
            good.append(line)
        if torn:
            _replace(self.path("done.jsonl"), good)
        removed = _rewrite(self.path("designer.jsonl"), self.finished)
        removed += _rewrite(self.path("executor.jsonl"), self.finished_executor)
        if log is not None and (self.done or torn or removed):
            log(
                f"distill: resuming {out_dir}: {len(self.done)} units done; removed {removed} "
                f"sample lines of unfinished units and {torn} torn or repeated done lines"
            )

    def finished(self, line):
        """Whether a sample line is whole and of a finished unit. A whole row that names no unit
        was written by an older distill.py: refused, never removed."""
        unit = _unit(line)
        if unit is None and _foreign(line):
            raise DistillError(
                f"{self.dir}: a sample without task_id and template (an older distill.py's "
                "output): --resume cannot continue it; choose another --out"
            )
        return unit is not None and unit[1] in self.done

    def finished_executor(self, line):
        """finished(line), and its (prompt, reply) noted as kept."""
        if not self.finished(line):
            return False
        self.seen.add(sample_key(json.loads(line)))
        return True

    def path(self, name):
        return os.path.join(self.dir, name)

    def append(self, results):
        """results: [(done record, designer rows, executor rows)], a chunk's. Samples first, on
        disk, then the done records."""
        for k, name in ((1, "designer.jsonl"), (2, "executor.jsonl")):
            with open(self.path(name), "a", encoding="utf-8") as f:
                for result in results:
                    for row in result[k]:
                        f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
        with open(self.path("done.jsonl"), "a", encoding="utf-8") as f:
            for record, _, _ in results:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                self.done[(record["task_id"], record["template"])] = record
            f.flush()
            os.fsync(f.fileno())


# --------------------------------------------------------------------------------------------------
# A chunk of units: designs, runs, grading, samples


def _record(task, name):
    record = {"task_id": task["id"], "template": name, "outcome": None, "designs": 1}
    for key in UNIT_COUNTS[1:]:
        record[key] = 0
    record.update(
        calls=0,
        call_failures={},
        wrong_replies=0,
        duplicate_replies=0,
        reasoning_chars=0,
        think_stripped=0,
        error=None,
    )
    return record


def _note(record, reply):
    """Count one teacher call of a unit; the first failure's message is the unit's error."""
    record["calls"] += 1
    record["reasoning_chars"] += reply.reasoning_chars
    record["think_stripped"] += int(reply.think_stripped)
    if reply.reason is not None:
        failures = record["call_failures"]
        failures[reply.reason] = failures.get(reply.reason, 0) + 1
        record["error"] = record["error"] or reply.error
        record["first_failure"] = record.get("first_failure") or reply.reason


def _run_chunk(units, teacher, seen, *, short, width):
    """units: [(task, template name)] -> [(done record, designer rows, executor rows)]."""
    records = [_record(task, name) for task, name in units]
    prompts = [mas.designer_messages(data.task_text(t, short=short), short=short) for t, _ in units]
    designs = [None] * len(units)
    asked = []
    for k, (_, name) in enumerate(units):
        if name == DESIGN:
            asked.append(k)
        else:
            designs[k] = mas.script_completion(mas.TEMPLATES[name])
    questions = [(prompts[k], seed_of(units[k][0]["id"], DESIGN, -1)) for k in asked]
    for k, reply in zip(asked, teacher.ask_many(questions)):
        _note(records[k], reply)
        designs[k] = reply.text if reply.reason is None else None
    parsed = []  # (unit's index, script)
    for k, design in enumerate(designs):
        if design is None:
            continue
        script, why = mas.parse_script(design)
        if script is None:
            records[k]["outcome"], records[k]["error"] = "unparsed", why
        else:
            records[k]["parsed"] = 1
            parsed.append((k, script))

    def generate(calls):
        questions = []
        for c in calls:
            task, name = units[parsed[c.run][0]]
            questions.append((c.messages, seed_of(task["id"], name, c.index)))
        return teacher.ask_many(questions)

    runs = []
    if parsed:
        runs = sandbox.run_workflows(
            [script for _, script in parsed],
            [units[k][0] for k, _ in parsed],
            generate,
            equal=reward_lib.math_equal,
            short=short,
            width=width,
        )
    with ThreadPoolExecutor(max_workers=4) as graders:  # graders wait on processes: threads do
        scores = list(graders.map(_score, [units[k][0] for k, _ in parsed], runs))
        results = []
        for (k, script), run, score in zip(parsed, runs, scores):
            design = (designs[k], script)
            results.append(_kept(units[k], records[k], design, prompts[k], run, score, graders))
    by_unit = {k: result for (k, _), result in zip(parsed, results)}
    out = []
    for k, record in enumerate(records):
        designer_rows, executor_rows = by_unit.get(k, ([], []))
        executor_kept = []
        for row in executor_rows:  # a (prompt, reply) kept before (a vote's repeats) is not
            key = sample_key(row)
            if key in seen:
                record["duplicate_replies"] += 1
            else:
                seen.add(key)
                executor_kept.append(row)
        record["designer_samples"] = len(designer_rows)
        record["executor_samples"] = len(executor_kept)
        if record["correct"]:
            record["outcome"] = "kept"
        elif record.get("first_failure") is not None:  # the teacher's failure comes first
            record["outcome"] = record["first_failure"]
        record.pop("first_failure", None)
        record["outcome"] = record["outcome"] or "wrong"
        out.append((record, designer_rows, executor_kept))
    return out


def _score(task, run):
    return reward_lib.reward(task, run, lam=0.0)


def _kept(unit, record, design, prompt, run, score, graders):
    """A run's samples: (designer rows, executor rows), nothing unless it is correct. design:
    (the designer completion, its script)."""
    (task, name), (completion, script) = unit, design
    record["runs"] = 1
    for call in run.calls:
        _note(record, call.completion)
    if score != 1.0:
        if run.error is not None and record.get("first_failure") is None:
            record["outcome"], record["error"] = "run_error", run.error[:300]
        return [], []
    record["correct"] = 1
    designer = [
        {
            "messages": prompt,
            "completion": completion,
            "task_id": task["id"],
            "template": name,
            "structure": mas.structure_of(script),
        }
    ]
    answered = [c for c in run.calls if c.completion.reason is None]
    answers = [mas.answer_of(c.reply) for c in answered]
    oks = list(graders.map(reward_lib.correctness, [task] * len(answered), answers))
    executor = []
    for c, ok in zip(answered, oks):
        if ok != 1.0:
            record["wrong_replies"] += 1
            continue
        row = {"messages": c.messages, "completion": c.reply, "task_id": task["id"]}
        executor.append({**row, "template": name, "role": c.role})
    return designer, executor


# --------------------------------------------------------------------------------------------------
# The run


def summarize(records, tasks, duplicate_ids):
    """distill_stats.json from the done records (the whole run, resumed units included)."""
    stats = {"tasks": len(tasks), "duplicate_task_ids": duplicate_ids, "units": len(records)}
    totals = Counter()
    failures, dropped, unusable, templates, too_long = Counter(), Counter(), Counter(), {}, set()
    for r in records:
        per = templates.setdefault(r["template"], {key: 0 for key in UNIT_COUNTS})
        per.setdefault("teacher_errors", 0)
        per.setdefault("dropped", {})
        for key in UNIT_COUNTS:
            per[key] += r[key]
            totals[key] += r[key]
        n_failed = sum(r["call_failures"].values())
        per["teacher_errors"] += n_failed
        totals["teacher_errors"] += n_failed
        totals["teacher_calls"] += r["calls"]
        failures.update(r["call_failures"])
        for key in ("wrong_replies", "duplicate_replies", "reasoning_chars"):
            totals[key] += r[key]
        totals["think_stripped"] += r["think_stripped"]
        if r["outcome"] != "kept":
            dropped[r["outcome"]] += 1
            per["dropped"][r["outcome"]] = per["dropped"].get(r["outcome"], 0) + 1
        if r["outcome"] == "unparsed":
            unusable[str(r["error"]).split(":")[0]] += 1
        if r["call_failures"].get("context_length"):
            too_long.add(str(r["task_id"]))
    stats.update(
        designs=totals["designs"],
        parsed=totals["parsed"],
        runs=totals["runs"],
        correct_runs=totals["correct"],
        designer_samples=totals["designer_samples"],
        executor_samples=totals["executor_samples"],
        teacher_calls=totals["teacher_calls"],
        teacher_errors=totals["teacher_errors"],
        call_failures=dict(sorted(failures.items())),
        dropped=dict(sorted(dropped.items())),
        unusable=dict(sorted(unusable.items())),
        wrong_replies_dropped=totals["wrong_replies"],
        duplicate_replies_dropped=totals["duplicate_replies"],
        reasoning_chars_dropped=totals["reasoning_chars"],
        think_blocks_stripped=totals["think_stripped"],
        context_length_tasks=sorted(too_long),
        templates=templates,
    )
    for per in templates.values():
        per["dropped"] = dict(sorted(per["dropped"].items()))
    return stats


def _write_stats(path, stats):
    """Write the stats atomically, and only when they changed (a resumed run that asks nothing
    leaves the file as it was)."""
    text = json.dumps(stats, indent=1) + "\n"
    if os.path.isfile(path):
        with open(path) as f:
            if f.read() == text:
                return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def check_templates(templates):
    """The chosen template names, checked: mas.TEMPLATES' names and "design", each once."""
    if isinstance(templates, str):
        templates = templates.split(",")
    names = [n.strip() for n in templates if n.strip()]
    unknown = [n for n in names if n != DESIGN and n not in mas.TEMPLATES]
    if not names or unknown or len(set(names)) < len(names):
        raise DistillError(
            f"templates {','.join(names) or '(none)'}: each once, from "
            f"{', '.join([*mas.TEMPLATES, DESIGN])}"
        )
    return names


def distill(
    teacher,
    model,
    tasks,
    out_dir,
    *,
    templates=PAPER,
    short=False,
    max_tokens=MAX_TOKENS,
    template_kwargs=None,
    timeout=TIMEOUT,
    concurrency=CONCURRENCY,
    width=WIDTH,
    chunk=CHUNK,
    resume=False,
    api_key=None,
    log=print,
):
    """Distill SFT data from the teacher at URL `teacher` serving `model`: every (task, template)
    unit not done yet (the module docstring says what a unit keeps and writes). Returns
    distill_stats.json's counts, plus this call's: requests (HTTP requests, retries included),
    units_asked and units_resumed. Raises DistillError for an OUT that holds results without
    resume=True and for unknown templates; a failing teacher never raises."""
    names = check_templates(templates)
    store = Out(out_dir, resume, log)
    ids, unique = set(), []
    for t in tasks:
        if t["id"] not in ids:
            ids.add(t["id"])
            unique.append(t)
    duplicate_ids = len(tasks) - len(unique)
    if duplicate_ids and log is not None:
        log(f"distill: {duplicate_ids} tasks skipped: their id repeats an earlier task's")
    units, resumed = [], 0
    for t in unique:
        for name in names:
            if (t["id"], name) in store.done:
                resumed += 1
            else:
                units.append((t, name))
    client = None
    if units:
        client = Teacher(
            teacher,
            model,
            max_tokens=max_tokens,
            template_kwargs=template_kwargs,
            timeout=timeout,
            concurrency=concurrency,
            api_key=api_key,
        )
    stats_path = store.path("distill_stats.json")
    try:
        for start in range(0, len(units), chunk):
            results = _run_chunk(
                units[start : start + chunk], client, store.seen, short=short, width=width
            )
            store.append(results)
            for record, _, _ in results:
                if record["call_failures"].get("context_length") and log is not None:
                    log(
                        f"distill: task {record['task_id']} ({record['template']}): a prompt is "
                        f"longer than the teacher's context: {record['error']}"
                    )
            stats = summarize(list(store.done.values()), tasks, duplicate_ids)
            _write_stats(stats_path, stats)
            if log is not None:
                log(
                    f"distill: {min(start + chunk, len(units))}/{len(units)} units asked; in all "
                    f"{stats['designer_samples']} designer, {stats['executor_samples']} executor "
                    f"samples; dropped {stats['dropped']}; requests {client.requests}"
                )
    finally:
        if client is not None:
            client.close()
    stats = summarize(list(store.done.values()), tasks, duplicate_ids)
    _write_stats(stats_path, stats)
    here = {
        "requests": client.requests if client else 0,
        "units_asked": len(units),
        "units_resumed": resumed,
    }
    if log is not None:
        brief = {k: v for k, v in stats.items() if k not in ("templates", "context_length_tasks")}
        log("distill: " + json.dumps({**here, **brief}))
        for name, per in stats["templates"].items():
            log(f"distill: {name}: " + json.dumps(per))
    return {**stats, **here}


def main(argv):
    p = argparse.ArgumentParser(description="distill SFT data from a teacher endpoint")
    p.add_argument("--teacher", required=True, help="base URL of an OpenAI-compatible server")
    p.add_argument("--model", required=True, help="model name the server serves")
    p.add_argument("--tasks", required=True, help="tasks JSONL (data.py format)")
    p.add_argument("--out", default="out/distill")
    p.add_argument(
        "--config",
        default=None,
        help="preset whose chat_template_kwargs are sent (default: config/tiny.py's, {})",
    )
    p.add_argument(
        "--templates",
        default=",".join(PAPER),
        help=f"comma-separated: {', '.join(mas.TEMPLATES)}, and {DESIGN} (the Designer's choice)",
    )
    p.add_argument(
        "--short", action="store_true", help="the tiny world's compact Designer and agent prompts"
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help=f"tokens a reply at most (default {MAX_TOKENS}: the presets' max_tokens)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT,
        help=f"seconds of silence a request may have, not its length (default {TIMEOUT:g})",
    )
    p.add_argument("--concurrency", type=int, default=CONCURRENCY, help="requests in flight")
    p.add_argument("--width", type=int, default=WIDTH, help="scripts alive at once in the sandbox")
    p.add_argument("--chunk", type=int, default=CHUNK, help="units written at a time")
    p.add_argument("--resume", action="store_true", help="continue OUT: ask nothing it has")
    a = p.parse_args(argv)
    if not os.path.isfile(a.tasks):
        sys.exit(
            f"distill.py: no task file {a.tasks} (data.py's format: python machinery/data.py "
            "convert ...)"
        )
    positive = {"--concurrency": a.concurrency, "--width": a.width, "--chunk": a.chunk}
    for flag, value in positive.items():
        if value < 1:
            sys.exit(f"distill.py: {flag} must be at least 1, got {value}")
    try:
        template_kwargs = settings.chat_template_kwargs(a.config)
        tasks = data.load_tasks(a.tasks)
    except (settings.ConfigError, ValueError) as e:  # a bad preset or task file: one line
        sys.exit(f"distill.py: {e}")
    try:
        distill(
            a.teacher,
            a.model,
            tasks,
            a.out,
            templates=a.templates.split(","),
            short=a.short,
            max_tokens=a.max_tokens,
            template_kwargs=template_kwargs,
            timeout=a.timeout,
            concurrency=a.concurrency,
            width=a.width,
            chunk=a.chunk,
            resume=a.resume,
            api_key=os.environ.get("OPENAI_API_KEY"),
        )
    except DistillError as e:
        sys.exit(f"distill.py: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
