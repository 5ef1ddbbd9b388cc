"""Tests for tools/distill.py: what a teacher says is kept (long replies that stream past the
silence budget; never its thinking), what it cannot say is counted (a prompt past its context, a
wrong answer), what it fails to say is not done and asked again on --resume, appends that survive a
kill, a resume that asks nothing twice; against a streaming stand-in for an external teacher and
against a real `vllm serve` of a tiny cold start: distill started before the server, the server
killed mid-run and restarted, a dead port."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from ports import server_port

import mas
import sft
from machinery import data, engine
from tools import distill
from world import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = ("designer.jsonl", "executor.jsonl")

torch.set_num_threads(1)


def _tasks_file(path, tasks):
    with open(path, "w") as f:
        for t in tasks:
            f.write(json.dumps(t) + "\n")
    return str(path)


def _files(out):
    """OUT's files, as bytes (None where missing)."""
    found = {}
    for name in distill.FILES:
        path = os.path.join(out, name)
        found[name] = open(path, "rb").read() if os.path.isfile(path) else None
    return found


def _long_task(chars):
    """A math task whose question is longer than `chars` characters (a token a character)."""
    terms = "+".join(["1"] * (chars // 2 + 1))
    return {"id": "too-long", "kind": "math", "question": f"Compute {terms}.", "answer": "0"}


class StandIn(BaseHTTPRequestHandler):
    """A streaming OpenAI-compatible chat endpoint: a stand-in for an external teacher (not for
    anything we ship). As Designer it writes the template suited to the task, as Executor it answers
    from the task's solution (or wrongly). Each reply streams as server-sent events in `pieces`
    chunks, `gap` seconds apart, with `silence` seconds after the first; `think` is put before the
    content, `reasoning` streamed as reasoning deltas first. A prompt longer than `context`
    characters gets vLLM's 400; a model other than `model` a 404. Every request's body is kept."""

    tasks, wrong, model = [], False, "oracle"
    pieces, gap, silence, think, reasoning, context = 1, 0.0, 0.0, "", "", None
    ending = "stop"  # the finish_reason (not `finish`: the handler's own method of that name)
    nested = 0  # > 0: a chunk of JSON nested this deep instead of the reply (a RecursionError)
    bodies, streamed = [], []  # set anew by serve()

    def do_GET(self):  # /v1/models: the readiness probe
        out = json.dumps({"object": "list", "data": [{"id": self.model, "object": "model"}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out.encode())

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        prompt = "".join(m["content"] for m in body["messages"])
        if self.context is not None and len(prompt) > self.context:
            return self.error(400, f"This model's maximum context length is {self.context} tokens.")
        if body["model"] != self.model:
            return self.error(404, f"The model `{body['model']}` does not exist.")
        text = self.think + self.answer(body["messages"])
        step = -(-len(text) // self.pieces)
        deltas = [{"role": "assistant", "content": ""}]
        if self.reasoning:
            half = len(self.reasoning) // 2
            deltas.append({"reasoning_content": self.reasoning[:half]})
            deltas.append({"reasoning": self.reasoning[half:]})  # vLLM 0.32's name
        for k in range(0, len(text), step):
            deltas.append({"content": text[k : k + step]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if self.nested:
            self.wfile.write(b"data: " + b"[" * self.nested + b"]" * self.nested + b"\n\n")
            return
        t0 = time.monotonic()
        try:
            for k, delta in enumerate(deltas):
                self.event({"index": 0, "delta": delta, "finish_reason": None})
                time.sleep(self.silence if k == 1 else self.gap)
            self.event({"index": 0, "delta": {}, "finish_reason": self.ending})
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            return  # the client gave up on a silence
        self.streamed.append(time.monotonic() - t0)

    def event(self, choice):
        chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": self.model}
        self.wfile.write(f"data: {json.dumps({**chunk, 'choices': [choice]})}\n\n".encode())
        self.wfile.flush()

    def error(self, status, message):
        out = json.dumps({"error": {"message": message, "type": "BadRequestError"}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def answer(self, messages):
        text = messages[-1]["content"]
        for t in self.tasks:
            if data.task_text(t, short=True) in text or data.task_text(t) in text:
                task = t
                break
        if "workflow" in messages[0]["content"]:
            return f"Here is my design.\n```python\n{mas.TEMPLATES[tiny.SUITED[task['kind']]]}```"
        if not self.wrong:
            return tiny.oracle_reply(task)
        return (
            "<answer>def f(x): return -1</answer>"
            if task["kind"] == "code"
            else "<answer>-1</answer>"
        )

    def log_message(self, *a):
        pass


class Backlog(ThreadingHTTPServer):
    """A server that queues as many connections as distill.py opens at once (socketserver's
    default backlog of 5 refuses some: they would be retried, and counted)."""

    request_queue_size = 512


@contextmanager
def serve(**settings):
    """A StandIn with these settings on a free port: yields (url, its handler class)."""
    handler = type("Teacher", (StandIn,), {**settings, "bodies": [], "streamed": []})
    srv = Backlog(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    finally:
        srv.shutdown()
        srv.server_close()


def test_every_template_and_the_designer_s_choice_kept_where_correct(tmp_path):
    tasks = tiny.make_tasks(6, seed=7)
    names = (*distill.PAPER, "design")
    switches = {"enable_thinking": False}
    with serve(tasks=tasks) as (url, teacher):
        c = distill.distill(
            url,
            "oracle",
            tasks,
            str(tmp_path / "good"),
            templates=names,
            short=True,
            template_kwargs=switches,
            log=None,
        )
        bodies = list(teacher.bodies)
    assert c["units"] == 30 and c["teacher_errors"] == 0 and c["dropped"] == {}
    for name in names:
        per = c["templates"][name]
        assert per["designs"] == per["parsed"] == per["runs"] == per["correct"] == 6, name
        assert per["designer_samples"] == 6 and per["dropped"] == {}, name
    # every request carried the preset's switches; 6 designs and 54 agent calls: a math task's
    # runs make 10 calls (1 + 3 + 2 + 1 + 3 of the suited ensemble), a code task's 8
    assert len(bodies) == c["requests"] == c["teacher_calls"] == 60
    assert all(b["chat_template_kwargs"] == switches and b["stream"] for b in bodies)
    d = data.read_jsonl(str(tmp_path / "good" / "designer.jsonl"))
    e = data.read_jsonl(str(tmp_path / "good" / "executor.jsonl"))
    assert len(d) == 30 and len(e) == c["executor_samples"]
    for row in d:
        if row["template"] != "design":
            assert row["completion"] == mas.script_completion(mas.TEMPLATES[row["template"]])
    assert {r["structure"] for r in d if r["template"] == "design"} == {"ensemble", "tester"}
    # a task's calls ask three prompts (solver, critic, coder); the rest repeat one of them
    assert len(e) == 18 and {r["role"] for r in e} == {"solver", "critic", "coder"}
    assert c["duplicate_replies_dropped"] == 54 - 18
    assert all(r["completion"] == tiny.oracle_reply(_task(tasks, r)) for r in e)
    assert all(r["messages"][-1]["role"] == "user" for r in d + e)
    model, tok = tiny.build_model(seed=0, hidden_size=64, num_layers=2)
    stats = sft.train_sft(model, tok, d + e, steps=2, batch_size=4, log=None)
    assert stats["samples"] == 48
    # a teacher that designs well but answers wrongly: nothing kept, every unit counted as wrong
    with serve(tasks=tasks, wrong=True) as (url, _):
        c = distill.distill(
            url, "oracle", tasks, str(tmp_path / "bad"), templates=names, short=True, log=None
        )
    assert c["correct_runs"] == 0 and c["dropped"] == {"wrong": 30}
    assert all(os.path.getsize(tmp_path / "bad" / name) == 0 for name in SAMPLES)
    # a dead endpoint: nothing is asked; after its wait, one error that says so
    with pytest.raises(distill.DistillError, match=r"did not answer within 1 s .*--wait"):
        distill.distill(
            url,
            "oracle",
            tasks[:2],
            str(tmp_path / "dead"),
            templates=["single"],
            wait_s=1.0,
            log=None,
        )
    assert not os.path.exists(tmp_path / "dead" / "done.jsonl")


def _task(tasks, row):
    return next(t for t in tasks if t["id"] == row["task_id"])


def test_a_reply_longer_than_the_silence_budget_is_kept_a_silence_is_not(tmp_path):
    """--timeout bounds the silence between two chunks, not a reply's length."""
    tasks = tiny.make_tasks(1, seed=7)
    budget = 1.0
    # 9 chunks 0.3 s apart: the reply streams for 2.7 s, never silent for 1 s
    with serve(tasks=tasks, pieces=9, gap=0.3) as (url, teacher):
        c = distill.distill(
            url,
            "oracle",
            tasks,
            str(tmp_path / "slow"),
            templates=["single"],
            short=True,
            timeout=budget,
            log=None,
        )
        assert teacher.streamed[0] > 2 * budget  # it outlived the budget twice
    assert c["requests"] == 1 and c["teacher_errors"] == 0 and c["executor_samples"] == 1
    (row,) = data.read_jsonl(str(tmp_path / "slow" / "executor.jsonl"))
    assert row["completion"] == tiny.oracle_reply(tasks[0])  # whole
    # silent for 2 s after the first chunk: each try fails; the unit is not done, nothing written
    out = str(tmp_path / "silent")
    kw = dict(templates=["single"], short=True, timeout=budget, log=None)
    with serve(tasks=tasks, pieces=4, silence=2 * budget) as (url, teacher):
        c = distill.distill(url, "oracle", tasks, out, **kw)
    assert c["requests"] == distill.RETRIES and c["teacher_errors"] == 1
    assert c["units_failed"] == 1 and c["units"] == 0 and c["dropped"] == {}
    (why,) = c["failed_because"]  # the one failed unit's error: its requests timed out
    assert why.startswith("APITimeoutError") and c["failed_because"][why] == 1
    assert c["executor_samples"] == 0 and not os.path.exists(os.path.join(out, "done.jsonl"))
    # --resume against a teacher that answers asks it again: every unit done, no error left
    with serve(tasks=tasks, pieces=4) as (url, teacher):
        c = distill.distill(url, "oracle", tasks, out, resume=True, **kw)
    assert c["units"] == 1 and c["units_failed"] == c["teacher_errors"] == 0
    assert c["executor_samples"] == 1 and c["requests"] == 1
    stats = json.load(open(os.path.join(out, "distill_stats.json")))
    assert stats["teacher_errors"] == stats["units_failed"] == 0


def test_a_teacher_call_that_raised_leaves_its_unit_not_done(tmp_path):
    """A call that raised something other than a network error (here the client's RecursionError on
    a chunk nested too deep) is that call's failure: its unit is not done (no done line), and
    --resume asks it again."""
    tasks = tiny.make_tasks(1, seed=3)
    out, kw = str(tmp_path / "out"), dict(templates=["single"], short=True, log=None)
    with serve(tasks=tasks, nested=100_000) as (url, teacher):
        c = distill.distill(url, "oracle", tasks, out, **kw)
    assert c["units_failed"] == 1 and c["units"] == 0 and c["teacher_errors"] == 1
    assert "RecursionError" in next(iter(c["failed_because"]))
    assert not os.path.exists(os.path.join(out, "done.jsonl"))
    with serve(tasks=tasks) as (url, teacher):
        c = distill.distill(url, "oracle", tasks, out, resume=True, **kw)
    assert c["units_asked"] == 1 and c["units"] == 1 and c["units_failed"] == 0
    assert c["executor_samples"] == 1


def test_thinking_never_reaches_a_target(tmp_path):
    assert distill.strip_thinking("<think>a</think>\n\nB") == ("B", None, True)
    # the template opened the block in the prompt: the reply starts inside it
    assert distill.strip_thinking("a</think>\nB") == ("B", None, True)
    assert distill.strip_thinking("  B <answer>1</answer>") == (
        "  B <answer>1</answer>",
        None,
        False,
    )
    assert distill.strip_thinking("<think>a and b") == ("", "thinking_cut", False)
    assert distill.strip_thinking("<think>a</think>B<think>c") == ("", "thinking_stray", True)
    tasks = tiny.make_tasks(2, seed=7)
    think = "<think>\nLet me see. <answer>ZZZ</answer>\n</think>\n\n"
    reasoning = "I reason at length about it."
    with serve(tasks=tasks, think=think, reasoning=reasoning) as (url, _):
        c = distill.distill(
            url,
            "oracle",
            tasks,
            str(tmp_path / "think"),
            templates=["single", "design"],
            short=True,
            log=None,
        )
    # 2 designs, 2 single calls, 3 (ensemble on math) + 1 (tester on code) calls of the designs
    calls = 2 + 2 + 3 + 1
    assert c["teacher_calls"] == calls and c["teacher_errors"] == 0 and c["correct_runs"] == 4
    assert c["think_blocks_stripped"] == calls
    assert c["reasoning_chars_dropped"] == calls * len(reasoning)
    for name in SAMPLES:
        text = open(tmp_path / "think" / name).read()
        assert "think" not in text and "reason" not in text and "ZZZ" not in text
    e = data.read_jsonl(str(tmp_path / "think" / "executor.jsonl"))
    assert e and all(r["completion"] == tiny.oracle_reply(_task(tasks, r)) for r in e)
    # thinking cut off at max_tokens: never a target, counted by its reason
    with serve(tasks=tasks, think="<think>\nI think and think", ending="length") as (url, _):
        c = distill.distill(
            url, "oracle", tasks, str(tmp_path / "cut"), templates=["single"], log=None
        )
    assert c["call_failures"] == {"thinking_cut": 2} and c["dropped"] == {"thinking_cut": 2}
    assert all(os.path.getsize(tmp_path / "cut" / name) == 0 for name in SAMPLES)


def test_a_context_length_400_is_reported_per_task_and_not_retried(tmp_path):
    tasks = [*tiny.make_tasks(2, seed=7), _long_task(600)]
    lines = []
    with serve(tasks=tasks, context=500) as (url, _):
        c = distill.distill(
            url,
            "oracle",
            tasks,
            str(tmp_path / "ctx"),
            templates=["single"],
            short=True,
            log=lines.append,
        )
        assert c["context_length_tasks"] == ["too-long"] and c["requests"] == 3
        assert c["dropped"] == {"context_length": 1} and c["correct_runs"] == 2
        assert any("task too-long (single)" in line and "context" in line for line in lines)
        # another 4xx (a model the server does not serve) is not retried either; its unit is not
        # done: a failure, not a drop
        c = distill.distill(
            url, "nope", tasks[:1], str(tmp_path / "404"), templates=["single"], log=None
        )
    assert c["requests"] == 1 and c["dropped"] == {} and c["units_failed"] == 1
    assert "NotFoundError" in next(iter(c["failed_because"]))


def test_resume_asks_nothing_it_has_and_a_used_out_is_refused(tmp_path):
    tasks = tiny.make_tasks(4, seed=7)
    out = str(tmp_path / "out")
    kw = dict(templates=["single", "critic"], short=True, chunk=3, log=None)
    with serve(tasks=tasks) as (url, teacher):
        first = distill.distill(url, "oracle", tasks, out, **kw)
        asked, before = len(teacher.bodies), _files(out)
        assert first["units"] == 8 and first["requests"] == asked == 12
        again = distill.distill(url, "oracle", tasks, out, resume=True, **kw)
        assert len(teacher.bodies) == asked and again["requests"] == 0
        assert again["units_resumed"] == 8 and _files(out) == before
        for key in ("requests", "tokens", "units_asked", "units_resumed"):
            first.pop(key), again.pop(key)
        assert again == first  # the whole run's counts
        # without --resume, an OUT that holds results is refused in one line, and left as it is
        with pytest.raises(distill.DistillError, match="--resume"):
            distill.distill(url, "oracle", tasks, out, **kw)
        path = _tasks_file(tmp_path / "tasks.jsonl", tasks)
        argv = ["--teacher", url, "--model", "oracle", "--tasks", path, "--out", out, "--short"]
        with pytest.raises(SystemExit, match="holds a distillation's results"):
            distill.main(argv)
        with pytest.raises(SystemExit, match="each once, from single"):
            distill.main([*argv, "--resume", "--templates", "single,bogus"])
        assert _files(out) == before
        # an older distill.py's samples (no unit named): a resume refuses them, deletes nothing
        old = tmp_path / "old"
        old.mkdir()
        (old / "designer.jsonl").write_text(json.dumps({"messages": [], "completion": "x"}) + "\n")
        with pytest.raises(distill.DistillError, match="older distill.py"):
            distill.distill(url, "oracle", tasks, str(old), resume=True, **kw)
        assert (old / "designer.jsonl").read_text().count("completion") == 1
        # a unit killed half-written: its samples on disk, no done line (and a torn line after)
        done = open(os.path.join(out, "done.jsonl")).read().splitlines()
        last = json.loads(done[-1])
        with open(os.path.join(out, "done.jsonl"), "w") as f:
            f.write("".join(line + "\n" for line in done[:-1]) + '{"task_id": "tiny-ma')
        with open(os.path.join(out, "executor.jsonl"), "a") as f:
            f.write('{"messages": [{"role": "sys')
        again = distill.distill(url, "oracle", tasks, out, resume=True, **kw)
        calls = {"single": 1, "critic": 2}[last["template"]]
        assert again["units_asked"] == 1 and again["requests"] == calls
        assert len(teacher.bodies) == asked + calls
    after = _files(out)
    for name in (*SAMPLES, "done.jsonl"):  # the same lines, the redone unit's last
        assert sorted(after[name].splitlines()) == sorted(before[name].splitlines()), name
    assert after["distill_stats.json"] == before["distill_stats.json"]


def test_a_killed_run_keeps_what_it_finished_and_resumes_there(tmp_path):
    """The CLI, SIGKILLed after its second unit: a resume asks only what is not done (and the
    preset's switches reach the teacher from --config)."""
    tasks = tiny.make_tasks(6, seed=7)
    path = _tasks_file(tmp_path / "tasks.jsonl", tasks)
    out = str(tmp_path / "out")
    with serve(tasks=tasks, pieces=4, gap=0.15) as (url, teacher):
        argv = ["--teacher", url, "--model", "oracle", "--tasks", path, "--out", out]
        argv += ["--templates", "single", "--short", "--chunk", "1", "--concurrency", "1"]
        argv += ["--width", "1"]
        argv += ["--config", "config/qwen3_8b.py"]
        proc = subprocess.Popen([sys.executable, "tools/distill.py", *argv], cwd=ROOT)
        done, deadline = os.path.join(out, "done.jsonl"), time.time() + 300
        while not (os.path.isfile(done) and open(done).read().count("\n") >= 2):
            assert proc.poll() is None, "distill.py ended before it was killed"
            assert time.time() < deadline, "distill.py finished no unit in 300 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        finished = open(done).read().count("\n")
        asked = len(teacher.bodies)
        assert 2 <= finished < 6
        assert all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in teacher.bodies)
        c = distill.distill(
            url, "oracle", tasks, out, templates=["single"], short=True, resume=True, log=None
        )
        assert c["units_resumed"] == finished and c["requests"] == 6 - finished
        assert len(teacher.bodies) == asked + 6 - finished
        assert all("chat_template_kwargs" not in b for b in teacher.bodies[asked:])  # tiny's {}
    d = data.read_jsonl(os.path.join(out, "designer.jsonl"))
    assert sorted(r["task_id"] for r in d) == sorted(t["id"] for t in tasks)
    assert c["designer_samples"] == c["executor_samples"] == 6


# --------------------------------------------------------------------------------------------------
# The real thing: vLLM's OpenAI-compatible server serving a tiny cold start

COLD_TASKS = 8  # tasks the cold start has learned, and the real server is asked about


@pytest.fixture(scope="module")
def cold_start(tmp_path_factory):
    """A tiny cold start that answers: the traces of COLD_TASKS tasks (every call of the four
    templates with the oracle's replies, and the suited design) learned by heart in 250 Muon steps.
    (150 steps answered 11 of 12 tasks right but wrote 1 parseable design in 9.)"""
    out = str(tmp_path_factory.mktemp("cold") / "model")
    tasks = tiny.make_tasks(COLD_TASKS, seed=7)
    samples = []
    for t in tasks:
        script = mas.TEMPLATES[tiny.SUITED[t["kind"]]]
        prompt = mas.designer_messages(data.task_text(t, short=True), short=True)
        samples.append({"messages": prompt, "completion": mas.script_completion(script)})
    for rows in tiny.executor_contexts(tasks).values():
        for pair in rows:
            if pair is not None:
                samples.append({"messages": pair[0], "completion": pair[1]})
    model, tok = tiny.build_model(seed=0, hidden_size=64, num_layers=2)
    sft.train_sft(
        model,
        tok,
        samples,
        steps=250,
        lr=3e-3,
        batch_size=16,
        out_dir=out,
        seed=0,
        optimizer="muon",
        log=None,
    )
    return out


@contextmanager
def vllm_server(model_dir, log_path, port=None):
    port = port or server_port()
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
    }
    args = ["--model", model_dir, "--served-model-name", "tiny", "--host", "127.0.0.1"]
    args += ["--port", str(port), "--dtype", "float32", "--max-model-len", "2048"]
    args += ["--max-num-seqs", "16", "--gpu-memory-utilization", "0.05", "--enforce-eager"]
    # every prompt prefilled whole: vllm-cpu 0.32 fails a seeded request whose prefill is split
    # ("CPU Generator does not use offset"), and distill.py seeds every call
    args += ["--max-num-batched-tokens", "32768"]
    log = open(log_path, "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    stop = [server]
    try:
        deadline = time.time() + 420
        while True:
            assert server.poll() is None, open(log_path).read()[-3000:]
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=5)
                break
            except OSError:
                assert time.time() < deadline, "vLLM server did not come up"
                time.sleep(2)
        yield url, stop
    finally:
        if stop:
            _stop(server)
        log.close()


def _stop(server):
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _distill(argv, **kw):
    """tools/distill.py with these arguments, in a process of its own (Popen)."""
    cmd = [sys.executable, "tools/distill.py", *argv]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _lines(path):
    return open(path).read().count("\n") if os.path.isfile(path) else 0


def test_a_dead_port_stops_after_its_wait_in_one_line(tmp_path):
    """Nothing answers: distill.py asks for --wait seconds, then exits non-zero, one line."""
    tasks = _tasks_file(tmp_path / "tasks.jsonl", tiny.make_tasks(2, seed=7))
    url = f"http://127.0.0.1:{server_port()}"
    argv = ["--teacher", url, "--model", "m", "--tasks", tasks, "--out", str(tmp_path / "o")]
    out, err = _distill([*argv, "--wait", "3"], text=True).communicate(timeout=300)
    assert err.count("\n") == 1 and err.startswith("distill.py: the teacher at "), err
    assert "did not answer within 3 s" in err and "--wait" in err
    assert "waiting for the teacher" in out


@pytest.mark.skipif(
    not __import__("importlib").util.find_spec("vllm"), reason="vLLM is not installed"
)
def test_distill_against_vllm_serving_a_tiny_cold_start(cold_start, tmp_path):
    """`vllm serve` of a cold start that answers, started after distill.py (as `vllm serve ... &`
    then distill.py are): nothing is lost while it loads. The paper's four templates and the
    Designer's choice in one run, samples of both roles kept, every unit counted; the real server's
    own 400 for a prompt past its context. Then a second run whose server is killed mid-run: it
    exits non-zero naming the units not done, and after a restart `--resume` completes every unit.
    A resume against the stopped server asks nothing and changes nothing; the samples encode and
    train."""
    tasks = [*tiny.make_tasks(COLD_TASKS, seed=7), _long_task(2100)]  # the context: 2048
    path = _tasks_file(tmp_path / "tasks.jsonl", tasks)
    out, port = str(tmp_path / "d"), server_port()
    url = f"http://127.0.0.1:{port}"
    names = [*distill.PAPER, "design"]
    argv = ["--teacher", url, "--model", "tiny", "--tasks", path, "--short"]
    argv += ["--templates", ",".join(names), "--max_tokens", "400", "--timeout", "60"]
    # the Qwen3 preset's switches: the tiny template ignores them, the server takes them
    argv += ["--config", "config/qwen3_8b.py"]
    early = _distill([*argv, "--out", out, "--wait", "600"], text=True)  # before the server
    with vllm_server(cold_start, tmp_path / "server.log", port) as (_, stop):
        stdout, stderr = early.communicate(timeout=900)
        assert early.returncode == 0, stdout[-3000:] + stderr[-3000:]
        assert "waiting for the teacher" in stdout and "the teacher answered after" in stdout
        # the server killed mid-run (SIGKILL, after the second finished unit)
        second = str(tmp_path / "d2")
        argv2 = [*argv, "--out", second, "--wait", "5", "--chunk", "1", "--concurrency", "2"]
        killed = _distill([*argv2, "--width", "2"], text=True)
        deadline = time.time() + 600
        while _lines(os.path.join(second, "done.jsonl")) < 2:
            assert killed.poll() is None, killed.communicate()
            assert time.time() < deadline, "no unit finished in 600 s"
            time.sleep(0.2)
        server = stop.pop()
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        _, stderr2 = killed.communicate(timeout=600)
    ours = [line for line in stderr2.splitlines() if line.startswith("distill.py: ")]
    assert killed.returncode != 0 and len(ours) == 1, stderr2  # (the sandbox says a line too)
    assert "units to ask got no usable reply" in ours[0] or "not started" in ours[0]
    assert ours[0].endswith("they are not done: --resume asks them again")
    units = len(tasks) * len(names)
    assert 2 <= _lines(os.path.join(second, "done.jsonl")) < units
    stats = json.load(open(os.path.join(second, "distill_stats.json")))
    assert stats["units_failed"] + stats["units_not_asked"] > 0
    with vllm_server(cold_start, tmp_path / "server2.log", port):
        r = subprocess.run(
            [sys.executable, "tools/distill.py", *argv2, "--resume"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    resumed = json.load(open(os.path.join(second, "distill_stats.json")))
    assert resumed["units"] == units and _lines(os.path.join(second, "done.jsonl")) == units
    assert resumed["units_failed"] == resumed["teacher_errors"] == 0
    assert resumed["units_not_asked"] == 0
    stats = json.load(open(os.path.join(out, "distill_stats.json")))
    # the run the server came up under: as complete (its counts may differ from the killed one's
    # in which of two equal replies came first, never in the units)
    assert stats["units"] == units and stats["units_failed"] == stats["teacher_errors"] == 0
    d = data.read_jsonl(os.path.join(out, "designer.jsonl"))
    e = data.read_jsonl(os.path.join(out, "executor.jsonl"))
    assert set(stats["templates"]) == set(names)
    for name in names:
        per = stats["templates"][name]
        assert per["designs"] == len(tasks), name
        assert per["correct"] == per["designer_samples"] >= 1, name  # every template keeps
        assert per["correct"] + sum(per["dropped"].values()) == per["designs"], name
        assert per["dropped"].get("context_length") == 1, name
        assert per["executor_samples"] == sum(r["template"] == name for r in e), name
        assert per["designer_samples"] == sum(r["template"] == name for r in d), name
    assert stats["context_length_tasks"] == ["too-long"]
    assert len(d) == stats["designer_samples"] and len(e) == stats["executor_samples"] > 0
    assert {r["role"] for r in e} >= {"solver", "critic", "coder"}
    # a resume against the stopped server: nothing asked, no file changed
    before = _files(out)
    r = subprocess.run(
        [sys.executable, "tools/distill.py", *argv, "--out", out, "--resume"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert '"requests": 0' in r.stdout and _files(out) == before
    # the samples are SFT samples: they encode with the cold start's tokenizer and train
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cold_start)
    encoded, dropped = engine.encode_samples(tok, d + e, max_len=2048)
    assert len(encoded) == len(d) + len(e) and dropped == 0
    model = AutoModelForCausalLM.from_pretrained(cold_start)
    assert sft.train_sft(model, tok, d + e, steps=1, batch_size=8, log=None)["samples"] == len(
        encoded
    )
