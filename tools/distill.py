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
the preset's chat-template switches and max_tokens go with every request):

    python tools/distill.py --teacher http://HOST:8000 --model NAME --tasks data/polaris.jsonl
        --config config/qwen3_8b.py --templates single,ensemble,critic,tester --out data/sft
    counts = distill(url, "NAME", tasks, "DIR", templates=("single", "design"), short=True)

OUT/designer.jsonl and OUT/executor.jsonl are the input of `python sft.py --data OUT`; each row
names its unit (task_id, template). OUT/distill_stats.json counts the finished units (resumed units
included), per template and in all: designs, parsed, runs, correct, designer and executor samples,
and every unit that kept nothing by its reason: context_length (a prompt longer than the teacher's
context: the server's 400, listed per task in context_length_tasks), thinking_cut (a reply that is
thinking cut off), thinking_stray (think tags left after the leading block), max_tokens (a reply
cut at --max_tokens: without its end of turn it would teach the student never to stop), unparsed,
run_error, wrong. Replies dropped inside kept runs are counted too (wrong_replies_dropped,
duplicate_replies_dropped). Those are drops: the unit is done.

Nothing is lost to a failing teacher. A unit one of whose calls got no usable reply after RETRIES
tries (a refused connection, a silence, a stream cut off, a 5xx or 429, any other 4xx, anything else
the call raised) is not done: it writes nothing, `--resume` asks it again, and the run exits
non-zero naming how many units failed and why. distill_stats.json's units_failed and teacher_errors
(the failed calls of those units) count them, so once a resumed run has finished every unit both are
0. The run starts once the teacher answers (GET /v1/models): it waits up to --wait seconds (WAIT: a
32B model loads in minutes, its first download takes longer), then stops with one line; so `vllm
serve ... &` then distill.py, at once, loses nothing.

The client keeps the teacher busy. The `openai` package's AsyncOpenAI (vLLM's own dependency)
streams every request on one event loop in a thread of its own; up to --concurrency requests are in
flight (CONCURRENCY, a few hundred: one vLLM server batches that many sequences), each sent the
moment its unit needs it. Units run on their own: a pool of --width threads each takes the next
unit, runs its script in the sandbox (its own run_workflows call: a unit waits on its own calls
alone, never on another unit's) and grades it, so there is no round in which every unit waits for
the slowest call. Finished units are appended --chunk at a time, and a progress line (units done,
failed, tokens a second, requests in flight, the time left at the rate so far) goes out every
PROGRESS_S seconds. Tokens are the server's count (stream_options include_usage), else the streamed
chunks.

Each request's HTTP read timeout, --timeout (the silence budget), bounds the gap between two chunks
of a reply, never its length: a long reply from a slow teacher streams for as long as it keeps
streaming. A 400 for a prompt past the teacher's context is a drop (context_length), not retried.
The client's own retries are off: they would not redo a stream that broke off midway; ask() does,
with backoff. The key, if the endpoint wants one, from OPENAI_API_KEY.

Rendering: each request carries the chat messages and the preset's chat-template switches
(settings.chat_template_kwargs(PRESET), `--config PRESET`; without it config/tiny.py's, {}) as
vLLM's `chat_template_kwargs` (request_body builds the body), and the preset's max_tokens (8192 in
the Qwen3 presets, [paper]) unless --max_tokens says otherwise. vLLM renders them with the served
model's chat template, add_generation_prompt=True, and those switches: the prompt that
engine.prompt_ids renders for SFT and RL from the same messages and the same switches, when the
teacher's chat template is the student's. A Qwen3 preset sends {"enable_thinking": false}.

Thinking never reaches a target: `reasoning_content` (or `reasoning`) deltas, what a server with a
reasoning parser streams apart, are dropped and counted (reasoning_chars_dropped); a leading
`<think>...</think>` block (a server without one), or the end of a block that the template opened
in the prompt, is stripped (think_blocks_stripped); an unclosed `<think>` is thinking cut off, and
think tags after the leading block are not a reply: such a call fails with its reason.

Files are appended as units finish, so a crash keeps everything finished. Samples are written,
flushed and fsynced first, then one OUT/done.jsonl line per unit (its key and its counts), flushed
and fsynced. So a unit with a done line has all its samples on disk, and a unit killed half-written
has samples but no done line. `--resume` (resume=True) reads done.jsonl, removes the samples (and
any torn line) of units without a done line, rewriting a file atomically only when something is
removed, and asks the teacher nothing for the units it lists: a resumed run whose units are all
done changes no file. Without --resume, an OUT that holds any of these files is refused (never
deleted). Each call of a unit has its own seed (a hash of task id, template and call index), so a
unit redone asks the same questions. Which of two equal executor samples is kept (the first to
finish) depends on timing; how many are kept does not.

Needs: mas.py, reward.py, sandbox.py, settings.py, stagewise.py, machinery/confine.py,
machinery/cpu_bits.py, machinery/data.py, machinery/grader.py, machinery/isolation.py,
machinery/plans.py, machinery/programs.py, machinery/provenance.py, machinery/rundir.py"""

import argparse
import asyncio
import hashlib
import json
import os
import re
import resource
import sys
import threading
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

import openai

# run by path (python tools/distill.py): the project's root first on the path, for its imports below
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mas
import reward as reward_lib
import sandbox
import settings
from machinery import data

MAX_TOKENS = settings.Config.max_tokens  # without --config: Config's per-completion limit, 8192
TEMPERATURE = 0.7
TIMEOUT = 300.0  # seconds of silence a request may have (queueing and prefill included)
RETRIES = 4  # tries a request, BACKOFF_S, twice that, ... apart (1 + 2 + 4 s)
BACKOFF_S = 1.0
WAIT = 1800.0  # seconds to wait for the teacher to answer at the start (a 32B model's load)
CONCURRENCY = 256  # requests in flight
WIDTH = 256  # units at work at once (threads; each holds a script in the sandbox)
CHUNK = 128  # finished units appended at a time
PROGRESS_S = 30.0  # seconds between progress lines
DESIGN = "design"  # the Designer's free choice, beside mas.TEMPLATES' names
PAPER = ("single", "ensemble", "critic", "tester")  # the paper's cold start
FILES = ("designer.jsonl", "executor.jsonl", "done.jsonl", "distill_stats.json")
# a 400 that says the prompt does not fit (vLLM's two messages, OpenAI's code)
CONTEXT_RE = re.compile(r"maximum context length|context length|context_length_exceeded", re.I)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# what the openai client takes as arguments; the rest of a body goes as extra_body
CLIENT_FIELDS = ("model", "messages", "max_tokens", "temperature", "seed", "stream")
UNIT_COUNTS = ("designs", "parsed", "runs", "correct", "designer_samples", "executor_samples")
FAILED = "teacher_error"  # a call's reason that leaves its unit not done


class DistillError(ValueError):
    """A run that cannot start (an OUT that holds results, unknown templates, a teacher that never
    answers): one line."""


def request_body(model, messages, max_tokens=MAX_TOKENS, template_kwargs=None, *, seed=None):
    """The JSON body of one chat request, as the teacher receives it: the messages, the sampling,
    the server's token count asked for, and the chat template's switches as
    `chat_template_kwargs` (omitted when there are none)."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": TEMPERATURE,
        "stream": True,
        "stream_options": {"include_usage": True},
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
    """The teacher endpoint, asked from any thread: submit(messages, seed) returns a Future of a
    Reply, which never raises. An asyncio loop in a thread of its own holds the AsyncOpenAI client
    and sends each request when it is submitted, at most `concurrency` in flight. `requests`
    counts HTTP requests (retries included), `tokens` the completion tokens received, `in_flight`
    the requests streaming now."""

    def __init__(self, url, model, *, max_tokens, template_kwargs, timeout, concurrency, api_key):
        base = url.rstrip("/")
        self.url = base if base.endswith("/v1") else base + "/v1"
        self.model, self.max_tokens = model, max_tokens
        self.template_kwargs = dict(template_kwargs or {})
        self.requests = self.tokens = self.in_flight = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client = self._call(self._client(api_key, timeout))
        self.slots = asyncio.Semaphore(concurrency)

    async def _client(self, api_key, timeout):
        return openai.AsyncOpenAI(
            base_url=self.url,
            api_key=api_key or "none",
            timeout=openai.Timeout(timeout),  # connect, each read, write, pool: the silence budget
            max_retries=0,
        )

    def _call(self, coroutine):
        """Run a coroutine on the teacher's loop from another thread; its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def submit(self, messages, seed=None):
        """Send one request now; a concurrent.futures.Future of its Reply."""
        return asyncio.run_coroutine_threadsafe(self.ask(messages, seed), self.loop)

    def wait_ready(self, budget, log=None):
        """Ask GET /v1/models until the server answers, at most `budget` seconds: (seconds waited,
        the models it serves); DistillError with the last failure after that."""
        return self._call(self._ready(budget, log))

    async def _ready(self, budget, log):
        t0, said, error = time.monotonic(), False, "no attempt"
        while True:
            try:
                page = await self.client.models.list(timeout=min(30.0, max(1.0, budget)))
                return time.monotonic() - t0, [m.id for m in page.data]
            except openai.APIStatusError as e:  # it answers, but not this endpoint: go on
                if e.status_code in (401, 403, 404, 405):
                    return time.monotonic() - t0, []
                error = f"{type(e).__name__}: {e}"[:300]
            except openai.OpenAIError as e:
                error = f"{type(e).__name__}: {e}"[:300]
            waited = time.monotonic() - t0
            if waited >= budget:
                raise DistillError(
                    f"the teacher at {self.url} did not answer within {budget:g} s ({error}): is "
                    "the server up? (--wait SECONDS waits longer)"
                )
            if not said and log is not None:
                log(f"distill: waiting for the teacher at {self.url} (at most {budget:g} s)")
                said = True
            await asyncio.sleep(min(2.0, budget - waited))

    async def ask(self, messages, seed=None):
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
                await asyncio.sleep(min(8.0, BACKOFF_S * 2 ** (attempt - 1)))
            self.requests += 1  # (the loop's one thread counts)
            try:
                async with self.slots:
                    return await self._stream(body)
            except openai.APIStatusError as e:
                error = f"{type(e).__name__}: {e}"[:500]
                if e.status_code == 400 and CONTEXT_RE.search(error):
                    return Reply("", error, "context_length")
                if e.status_code < 500 and e.status_code != 429:
                    break  # a 4xx other than rate limiting will not get better by retrying
            # a refused connection, a silence past the budget, a stream cut off or malformed, or
            # anything else this call raised (a RecursionError on JSON nested too deep, a bug):
            # the call's failure, never the run's error (that unit would be done, not asked again)
            except Exception as e:  # noqa: BLE001
                error = f"{type(e).__name__}: {e}"[:500]
                if CONTEXT_RE.search(error):  # said inside the stream
                    return Reply("", error, "context_length")
        return Reply("", error, FAILED)

    async def _stream(self, body):
        args = {k: v for k, v in body.items() if k in CLIENT_FIELDS}
        extra = {k: v for k, v in body.items() if k not in CLIENT_FIELDS}
        parts, reasoning, finish, chunks, usage = [], 0, None, 0, None
        self.in_flight += 1
        try:
            stream = await self.client.chat.completions.create(**args, extra_body=extra or None)
            async with stream:
                async for chunk in stream:
                    usage = getattr(chunk, "usage", None) or usage
                    for choice in chunk.choices or ():
                        delta = choice.delta
                        if delta is not None and isinstance(delta.content, str):
                            parts.append(delta.content)
                            chunks += 1
                        for name in ("reasoning_content", "reasoning"):  # vLLM's old name, new
                            thought = getattr(delta, name, None)
                            reasoning += len(thought) if isinstance(thought, str) else 0
                        finish = choice.finish_reason or finish
        finally:
            self.in_flight -= 1
        tokens = getattr(usage, "completion_tokens", None)
        self.tokens += tokens if isinstance(tokens, int) else chunks
        if finish is None:
            raise ValueError("the stream ended without a finish_reason")
        text, reason, stripped = strip_thinking("".join(parts))
        if reason is None and finish == "length":
            reason = "max_tokens"
        if reason is not None:
            return Reply("", f"{reason} (finish_reason {finish})", reason, reasoning, stripped)
        return Reply(text, None, None, reasoning, stripped)

    def close(self):
        """Cancel the requests still in flight (their units fail: a unit's thread never waits on a
        request that cannot end), close the client, stop the loop."""
        try:
            self._call(self._cancel())
            self._call(self.client.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()

    async def _cancel(self):
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


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
# A unit: its design, its run, its grade, its samples


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
    """Count one teacher call of a unit; the first failure's message is the unit's error (a failed
    call's, a teacher_error, before any other)."""
    record["calls"] += 1
    record["reasoning_chars"] += reply.reasoning_chars
    record["think_stripped"] += int(reply.think_stripped)
    if reply.reason is not None:
        failures = record["call_failures"]
        failures[reply.reason] = failures.get(reply.reason, 0) + 1
        if reply.reason == FAILED and record.get("first_failure") != FAILED:
            record["error"], record["first_failure"] = reply.error, FAILED
        record["error"] = record["error"] or reply.error
        record["first_failure"] = record.get("first_failure") or reply.reason


def failed(record):
    """Whether a unit's record is of a unit not done: a call of it got no usable reply."""
    return record["call_failures"].get(FAILED, 0) > 0


def run_unit(unit, teacher, *, short):
    """One (task, template name) unit, start to end, in the calling thread: (its done record, its
    designer rows, its executor rows). The teacher's calls go out as the unit needs them; a unit
    whose call failed (failed(record)) keeps nothing. Never raises: an unexpected error is the
    unit's failure, named."""
    task, name = unit
    record = _record(task, name)
    try:
        designer, executor = _run_unit(unit, record, teacher, short)
    except Exception as e:  # a bug or a broken sandbox: this unit fails, named; the run goes on
        record["call_failures"][FAILED] = record["call_failures"].get(FAILED, 0) + 1
        record["error"], record["first_failure"] = f"{type(e).__name__}: {e}"[:500], FAILED
        designer, executor = [], []
    if failed(record):
        record["outcome"], designer, executor = FAILED, [], []
    elif record["correct"]:
        record["outcome"] = "kept"
    elif record.get("first_failure") is not None:  # the teacher's drop comes first
        record["outcome"] = record["first_failure"]
    record.pop("first_failure", None)
    record["outcome"] = record["outcome"] or "wrong"
    return record, designer, executor


def _run_unit(unit, record, teacher, short):
    task, name = unit
    prompt = mas.designer_messages(data.task_text(task, short=short), short=short)
    if name == DESIGN:
        reply = teacher.submit(prompt, seed_of(task["id"], DESIGN, -1)).result()
        _note(record, reply)
        if reply.reason is not None:
            return [], []
        design = reply.text
    else:
        design = mas.script_completion(mas.TEMPLATES[name])
    script, why = mas.parse_script(design)
    if script is None:
        record["outcome"], record["error"] = "unparsed", why
        return [], []
    record["parsed"] = 1

    def generate(calls):
        """The unit's waiting calls, sent at once; their replies, in order."""
        asked = [teacher.submit(c.messages, seed_of(task["id"], name, c.index)) for c in calls]
        return [f.result() for f in asked]

    (run,) = sandbox.run_workflows(
        [script], [task], generate, equal=reward_lib.math_equal, short=short
    )
    record["runs"] = 1
    for call in run.calls:
        _note(record, call.completion)
    if failed(record):
        return [], []
    return _kept(unit, record, (design, script), prompt, run)


def _kept(unit, record, design, prompt, run):
    """A run's samples: (designer rows, executor rows), nothing unless it is correct. design:
    (the designer completion, its script)."""
    (task, name), (completion, script) = unit, design
    if reward_lib.reward(task, run, lam=0.0) != 1.0:
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
    executor = []
    graded = {run.answer: 1.0}  # each distinct answer graded once; the run's own is right
    for c in run.calls:
        if c.completion.reason is not None:
            continue
        answer = mas.answer_of(c.reply)
        if answer not in graded:
            graded[answer] = reward_lib.correctness(task, answer)
        if graded[answer] != 1.0:
            record["wrong_replies"] += 1
            continue
        row = {"messages": c.messages, "completion": c.reply, "task_id": task["id"]}
        executor.append({**row, "template": name, "role": c.role})
    return designer, executor


# --------------------------------------------------------------------------------------------------
# The run


def summarize(records, tasks, duplicate_ids, failures=()):
    """distill_stats.json from the done records (the whole run, resumed units included) and this
    run's failed units' records (`failures`: units not done, which a resume asks again)."""
    stats = {"tasks": len(tasks), "duplicate_task_ids": duplicate_ids, "units": len(records)}
    totals = Counter()
    calls, dropped, unusable, templates, too_long = Counter(), Counter(), Counter(), {}, set()
    for r in records:
        per = templates.setdefault(r["template"], {key: 0 for key in UNIT_COUNTS})
        per.setdefault("dropped", {})
        for key in UNIT_COUNTS:
            per[key] += r[key]
            totals[key] += r[key]
        totals["teacher_calls"] += r["calls"]
        calls.update(r["call_failures"])
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
    why = Counter(str(r["error"])[:200] for r in failures)
    stats.update(
        designs=totals["designs"],
        parsed=totals["parsed"],
        runs=totals["runs"],
        correct_runs=totals["correct"],
        designer_samples=totals["designer_samples"],
        executor_samples=totals["executor_samples"],
        teacher_calls=totals["teacher_calls"],
        units_failed=len(failures),
        teacher_errors=sum(r["call_failures"].get(FAILED, 0) for r in failures),
        failed_because=dict(why.most_common(10)),
        call_failures=dict(sorted(calls.items())),
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


def _open_files(width, concurrency):
    """Raise the open-file limit towards what `width` scripts (4 descriptors each, and a program
    each) and `concurrency` connections need, as far as the hard limit allows; the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 10 * width + 2 * concurrency + 256
    if soft != resource.RLIM_INFINITY and soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def _clock(seconds):
    """A duration as "1 h 05 min", "12 min", "40 s"."""
    if seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min" if s >= 60 else f"{s} s"


class Progress:
    """The progress line: units done (and failed) of those asked, tokens a second, requests in
    flight, and the time left at the rate of units so far."""

    def __init__(self, total, teacher, log):
        self.total, self.teacher, self.log = total, teacher, log
        self.t0 = self.last = time.monotonic()
        self.done = self.failed = 0

    def line(self):
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        finished = self.done + self.failed
        left = (self.total - finished) * elapsed / finished if finished else float("inf")
        return (
            f"distill: {finished}/{self.total} units ({self.failed} failed), "
            f"{self.teacher.tokens / elapsed:,.0f} tokens/s, {self.teacher.in_flight} requests in "
            f"flight, {_clock(elapsed)} so far, {_clock(left)} left"
        )

    def tick(self, force=False):
        if self.log is not None and (force or time.monotonic() - self.last >= PROGRESS_S):
            self.last = time.monotonic()
            self.log(self.line())


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
    wait_s=WAIT,
    resume=False,
    api_key=None,
    log=print,
):
    """Distill SFT data from the teacher at URL `teacher` serving `model`: every (task, template)
    unit not done yet (the module docstring says what a unit keeps and writes). Returns
    distill_stats.json's counts, plus this call's: requests (HTTP requests, retries included),
    tokens (completion tokens received), units_asked and units_resumed. Units whose calls failed
    are not done (units_failed; the caller decides what that means: main exits non-zero). Raises
    DistillError for an OUT that holds results without resume=True, for unknown templates, and for
    a teacher that does not answer within wait_s seconds."""
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
    stats_path = store.path("distill_stats.json")
    client, failures, not_asked, stopped = None, [], 0, None
    if units:
        _open_files(width, concurrency)
        client = Teacher(
            teacher,
            model,
            max_tokens=max_tokens,
            template_kwargs=template_kwargs,
            timeout=timeout,
            concurrency=concurrency,
            api_key=api_key,
        )
    try:
        if client is not None:
            waited, served = client.wait_ready(wait_s, log)
            if log is not None:
                log(
                    f"distill: the teacher answered after {waited:.0f} s; {len(units)} units to "
                    f"ask ({resumed} done before), {concurrency} requests in flight at most"
                )
                if served and model not in served:
                    log(f"distill: the server lists {served}, not {model!r}: requests may fail")
            failures, not_asked, stopped = _run_units(
                units, client, store, short, width, chunk, wait_s, log
            )
    finally:
        if client is not None:
            client.close()
    stats = summarize(list(store.done.values()), tasks, duplicate_ids, failures)
    stats.update(units_not_asked=not_asked, stopped_because=stopped)
    _write_stats(stats_path, stats)
    here = {
        "requests": client.requests if client else 0,
        "tokens": client.tokens if client else 0,
        "units_asked": len(units),
        "units_resumed": resumed,
    }
    if log is not None:
        brief = {k: v for k, v in stats.items() if k not in ("templates", "context_length_tasks")}
        log("distill: " + json.dumps({**here, **brief}))
        for name, per in stats["templates"].items():
            log(f"distill: {name}: " + json.dumps(per))
    return {**stats, **here}


def _run_units(units, client, store, short, width, chunk, wait_s, log):
    """Every unit, `width` at work at once, each starting when one ends; finished units appended
    `chunk` at a time (and at the end, or on the way out of an interruption). After a unit fails,
    no unit starts before the teacher answers again (wait_ready, at most wait_s seconds); one that
    does not ends the run there. Returns (the records of the units that failed, the units never
    started, why they were not)."""
    progress, pending = Progress(len(units), client, log), iter(units)
    running, finished, failures, stopped, check = {}, [], [], None, False

    def flush():
        if finished:
            store.append(finished)
            finished.clear()

    pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="unit")
    try:
        while True:
            if check and stopped is None:  # a unit failed: is the teacher there?
                check = False
                try:
                    client.wait_ready(wait_s, log)
                except DistillError as e:
                    stopped = str(e)
                    if log is not None:
                        log(f"distill: no unit starts any more: {e}")
            while stopped is None and len(running) < width:
                unit = next(pending, None)
                if unit is None:
                    break
                running[pool.submit(run_unit, unit, client, short=short)] = unit
            if not running:
                break
            ended, _ = wait(running, timeout=PROGRESS_S, return_when=FIRST_COMPLETED)
            for future in ended:
                del running[future]
                record, designer, executor = future.result()
                if failed(record):
                    failures.append(record)
                    progress.failed += 1
                    check = True
                    continue
                finished.append(_dedup(record, designer, executor, store.seen))
                progress.done += 1
                if record["call_failures"].get("context_length") and log is not None:
                    log(
                        f"distill: task {record['task_id']} ({record['template']}): a prompt is "
                        f"longer than the teacher's context: {record['error']}"
                    )
            if len(finished) >= chunk:
                flush()
            progress.tick()
        flush()
        progress.tick(force=True)
    finally:
        flush()  # what finished is kept, whatever stopped the run
        pool.shutdown(wait=False, cancel_futures=True)
    return failures, sum(1 for _ in pending), stopped


def _dedup(record, designer, executor, seen):
    """The unit's rows, the executor samples kept before (a vote's repeats) left out, counted."""
    kept = []
    for row in executor:
        key = sample_key(row)
        if key in seen:
            record["duplicate_replies"] += 1
        else:
            seen.add(key)
            kept.append(row)
    record["designer_samples"] = len(designer)
    record["executor_samples"] = len(kept)
    return record, designer, kept


def failure_line(stats):
    """The one line for units not done: how many, why, and what asks them again."""
    why = "; ".join(f"{n}: {reason}" for reason, n in list(stats["failed_because"].items())[:3])
    parts = []
    if stats["units_failed"]:
        parts.append(
            f"{stats['units_failed']} of {stats['units_asked']} units to ask got no usable reply "
            f"after {RETRIES} tries ({why})"
        )
    if stats["units_not_asked"]:
        parts.append(
            f"{stats['units_not_asked']} not started: the teacher stopped answering "
            f"({stats['stopped_because']})"
        )
    return "; ".join(parts) + "; they are not done: --resume asks them again"


def main(argv):
    p = argparse.ArgumentParser(description="distill SFT data from a teacher endpoint")
    p.add_argument("--teacher", required=True, help="base URL of an OpenAI-compatible server")
    p.add_argument("--model", required=True, help="model name the server serves")
    p.add_argument("--tasks", required=True, help="tasks JSONL (data.py format)")
    p.add_argument("--out", default="out/distill")
    p.add_argument(
        "--config",
        default=None,
        help="preset whose chat_template_kwargs are sent and whose max_tokens caps a reply "
        "(default: config/tiny.py's switches, {}, and Config's 8192 tokens)",
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
        "--max_tokens",
        type=int,
        default=None,
        help="tokens a reply at most (default: --config's max_tokens, the presets' 8192)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT,
        help=f"seconds of silence a request may have, not its length (default {TIMEOUT:g})",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=WAIT,
        help=f"seconds to wait for the teacher to answer at the start (default {WAIT:g})",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help=f"requests in flight (default {CONCURRENCY})",
    )
    p.add_argument(
        "--width", type=int, default=WIDTH, help=f"units at work at once (default {WIDTH})"
    )
    p.add_argument("--chunk", type=int, default=CHUNK, help="finished units appended at a time")
    p.add_argument("--resume", action="store_true", help="continue OUT: ask nothing it has")
    a = p.parse_args(argv)
    if not os.path.isfile(a.tasks):
        sys.exit(
            f"distill.py: no task file {a.tasks} (data.py's format: python machinery/data.py "
            "prepare ...)"
        )
    positive = {"--concurrency": a.concurrency, "--width": a.width, "--chunk": a.chunk}
    for flag, value in positive.items():
        if value < 1:
            sys.exit(f"distill.py: {flag} must be at least 1, got {value}")
    try:
        template_kwargs = settings.chat_template_kwargs(a.config)
        max_tokens = a.max_tokens or (
            settings.parse_config([a.config]).max_tokens if a.config else MAX_TOKENS
        )
        tasks = data.load_tasks(a.tasks)
    except (settings.ConfigError, ValueError) as e:  # a bad preset or task file: one line
        sys.exit(f"distill.py: {e}")
    try:
        stats = distill(
            a.teacher,
            a.model,
            tasks,
            a.out,
            templates=a.templates.split(","),
            short=a.short,
            max_tokens=max_tokens,
            template_kwargs=template_kwargs,
            timeout=a.timeout,
            concurrency=a.concurrency,
            width=a.width,
            chunk=a.chunk,
            wait_s=a.wait,
            resume=a.resume,
            api_key=os.environ.get("OPENAI_API_KEY"),
        )
    except DistillError as e:
        sys.exit(f"distill.py: {e}")
    if stats["units_failed"] or stats["units_not_asked"]:
        sys.exit(f"distill.py: {failure_line(stats)}")


if __name__ == "__main__":
    main(sys.argv[1:])
