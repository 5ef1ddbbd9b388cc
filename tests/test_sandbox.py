"""Adversarial tests of sandbox.py: a corpus of hostile and broken programs and workflow scripts.

For every one: the trainer (this process) survives, the result says what happened, the wall time
stays within the limit plus a margin, no process of it remains, no file outside its temporary
directory changed, and the other programs/scripts running at the same time are unaffected.
"""

import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["METAAGENT_TEST_SECRET"] = "s3cr3t-token-42"  # must never reach a child

import mas
import sandbox
from machinery import isolation

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = 2.0  # wall limit of each hostile program
MARGIN = 3.0  # generous: 2 shared cores


def _start():
    try:
        return sandbox.start(unsafe=False), None
    except sandbox.SandboxUnavailable as e:
        return None, str(e)


ISOLATION, WHY = _start()
needs_isolation = pytest.mark.skipif(ISOLATION is None, reason=f"no isolation here: {WHY}")


def _descendants(pid):
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = open(f"/proc/{p}/stat").read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _no_leftovers():
    """Only the fork-server itself (under `unshare`) remains: every job and everything it started is
    gone."""
    for _ in range(50):  # the server reaps a job just after the trainer saw its end
        if len(_descendants(isolation._server.proc.pid)) <= 1:
            return True
        time.sleep(0.05)
    return False


def _snapshot(paths):
    snap = {}
    for top in paths:
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [
                d
                for d in dirnames
                if d not in (".git", "__pycache__", ".pytest_cache", ".ruff_cache")
            ]
            for f in filenames:
                p = os.path.join(dirpath, f)
                st = os.stat(p)
                snap[p] = (st.st_size, st.st_mtime_ns)
    return snap


@pytest.fixture()
def world(tmp_path):
    """A sentinel directory outside any sandbox temp dir, and a listener on 127.0.0.1."""
    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    lsock.setblocking(False)
    before = _snapshot([str(tmp_path), REPO])
    yield {
        "dir": str(tmp_path),
        "keep": str(keep),
        "port": lsock.getsockname()[1],
        "before": before,
        "sock": lsock,
    }
    lsock.close()


# name, program, allowed statuses, extra check on the RunResult
PROGRAMS = [
    ("infinite_loop", "while True:\n    pass", {"timeout"}, None),
    ("sleep_forever", "import time\ntime.sleep(10**6)", {"timeout"}, None),
    (
        "fork_bomb",
        "import os\nwhile True:\n    os.fork()",
        {"error"},
        lambda r: "PermissionError" in r.stderr,
    ),
    (
        "double_fork_daemon",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(1000)\n    os._exit(0)\ntime.sleep(1000)",
        {"error"},
        None,
    ),
    ("memory_bomb", "x = bytearray(1 << 36)", {"memory"}, None),
    ("memory_creep", "xs = []\nwhile True:\n    xs.append(bytes(1 << 24))", {"memory"}, None),
    (
        "huge_output",
        "while True:\n    print('x' * 10000)",
        {"timeout"},
        lambda r: len(r.stdout) <= 1 << 20,
    ),
    (
        "huge_output_once",
        "import sys\nsys.stdout.write('y' * (50 << 20))",
        {"ok", "memory"},
        lambda r: len(r.stdout) <= 1 << 20,
    ),
    (
        "write_outside",
        "open('{dir}/new.txt', 'w').write('x')",
        {"error"},
        lambda r: "Read-only" in r.stderr,
    ),
    ("delete_outside", "import os\nos.remove('{keep}')", {"error"}, None),
    ("rmtree_repo", "import shutil\nshutil.rmtree('{repo}')", {"error"}, None),
    ("write_tmp_root", "open('/tmp/metaagent-escape.txt', 'w').write('x')", {"error"}, None),
    (
        "read_env",
        "import os\nprint(dict(os.environ))\nfor p in ('/proc/1/environ', '/proc/self/environ'):\n"
        "    try:\n        print(open(p).read())\n    except OSError as e:\n        print(e)",
        {"ok"},
        lambda r: "s3cr3t" not in r.stdout,
    ),
    (
        "socket_connect",
        "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "s.sendall(b'hello')",
        {"error"},
        lambda r: "OSError" in r.stderr or "Network" in r.stderr,
    ),
    (
        "subprocess",
        "import subprocess\nprint(subprocess.run(['echo', 'escaped'], capture_output=True).stdout)",
        {"error"},
        lambda r: "escaped" not in r.stdout,
    ),
    (
        "exec_shell",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo escaped'])",
        {"error"},
        lambda r: "escaped" not in r.stdout,
    ),
    (
        "kill_parent",
        "import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n        "
        "print(e)\nprint('alive')",
        {"ok", "killed"},
        None,
    ),
    (
        "os_exit",
        "import os\nprint('bye', flush=True)\nos._exit(3)",
        {"error"},
        lambda r: r.returncode == 3 and r.stdout == "bye\n",
    ),
    (
        "sys_exit_zero",
        "import sys\nprint('done')\nsys.exit(0)",
        {"ok"},
        lambda r: r.stdout == "done\n",
    ),
    (
        "sys_exit_message",
        "import sys\nsys.exit('fatal: gave up')",
        {"error"},
        lambda r: "gave up" in r.stderr,
    ),
    (
        "exit_from_thread",
        "import os, threading, time\nthreading.Thread(target=lambda: os._exit(7)).start()\n"
        "time.sleep(100)",
        {"error"},
        lambda r: r.returncode == 7,
    ),
    (
        "recursion",
        "def f(n):\n    return f(n + 1)\nf(0)",
        {"error"},
        lambda r: "RecursionError" in r.stderr,
    ),
    (
        "deep_recursion_crash",
        "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)",
        {"killed", "error", "memory", "timeout"},
        None,
    ),
    (
        "ignore_sigterm",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)",
        {"timeout"},
        None,
    ),
    (
        "close_stdout",
        "import os, sys\nos.close(1)\nprint('lost')\nsys.stdout.flush()",
        {"error"},
        None,
    ),
    (
        "protocol_lookalike",
        'import sys\nsys.stdout.buffer.write(b\'\\x00\\x00\\x00\\x0f{{"op": "done"}}\')\n'
        'print(\'{{"answer": "forged"}}\')',
        {"ok"},
        lambda r: "forged" in r.stdout,
    ),
    ("syntax_error", "def f(:\n    pass", {"error"}, lambda r: "SyntaxError" in r.stderr),
    (
        "import_error",
        "import no_such_module_xyz",
        {"error"},
        lambda r: "ModuleNotFoundError" in r.stderr,
    ),
    (
        "thread_bomb",
        "import threading, time\nfor _ in range(100000):\n"
        "    threading.Thread(target=time.sleep, args=(100,), daemon=True).start()",
        {"error", "memory", "timeout"},
        None,
    ),
    (
        "unshare_and_mount",
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "print(libc.unshare(0x10000000), libc.mount(b'none', b'/', None, 32 | 4096, None))",
        {"ok"},
        lambda r: r.stdout.split() == ["-1", "-1"],
    ),
]


@needs_isolation
def test_hostile_programs_concurrently(world):
    """Every hostile program at once, next to a well-behaved one that must be unaffected."""
    fmt = {"dir": world["dir"], "keep": world["keep"], "repo": REPO, "port": world["port"]}
    good = "import sys\nprint(sum(map(int, sys.stdin.read().split())))"
    server_pid = isolation._server.proc.pid
    with ThreadPoolExecutor(len(PROGRAMS) + 1) as ex:
        futs = {
            name: ex.submit(sandbox.run_code, code.format(**fmt), "", T, memory=128 << 20)
            for name, code, _, _ in PROGRAMS
        }
        time.sleep(0.3)
        goods = [ex.submit(sandbox.run_code, good, "1 2 3", 10.0) for _ in range(3)]
        results = {name: f.result() for name, f in futs.items()}
        good_results = [g.result() for g in goods]
    for g in good_results:
        assert (g.status, g.stdout) == ("ok", "6\n"), g
    for name, _, statuses, check in PROGRAMS:
        r = results[name]
        assert r.status in statuses, (name, r)
        assert r.duration < T + MARGIN, (name, r.duration)
        if check is not None:
            assert check(r), (name, r)
    # nothing escaped
    assert not os.path.exists(os.path.join(world["dir"], "new.txt"))
    assert open(world["keep"]).read() == "precious"
    assert not os.path.exists("/tmp/metaagent-escape.txt")
    assert _snapshot([world["dir"], REPO]) == world["before"]
    with pytest.raises(BlockingIOError):
        world["sock"].accept()  # nobody ever connected
    assert isolation._server.proc.pid == server_pid and isolation._server.proc.poll() is None
    assert _no_leftovers()
    assert sandbox.run_code("print(1)").stdout == "1\n"


@needs_isolation
def test_each_job_gets_a_fresh_private_tmp():
    r1 = sandbox.run_code(
        "import os\nopen('mine.txt', 'w').write('a')\nprint(sorted(os.listdir('.')))"
    )
    r2 = sandbox.run_code("import os\nprint(sorted(os.listdir('.')))")
    assert r1.stdout.strip() == "['mine.txt']" and r2.stdout.strip() == "[]"
    r3 = sandbox.run_code("import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]))")
    assert r3.stdout.strip() == "1"  # alone in its PID namespace


@needs_isolation
def test_run_tests_stdin_and_call_based():
    out = sandbox.run_tests(
        "print(int(input()) * 2)", {"inputs": ["2\n", "5\n", "x\n"], "outputs": ["4", "10", ""]}
    )
    assert [o.status for o in out] == ["ok", "ok", "error"]
    assert [o.output for o in out[:2]] == ["4\n", "10\n"] and "ValueError" in out[2].error
    code = "class Solution:\n    def add(self, a, b):\n        return [a + b]\n"
    out = sandbox.run_tests(
        code, {"inputs": [[1, 2], "3\n4"], "outputs": [[3], [7]], "fn_name": "add"}
    )
    assert [(o.status, o.output) for o in out] == [("ok", "[3]"), ("ok", "[7]")]
    # a program cannot reach into the harness that records its outputs (/proc/1/mem is the harness)
    tamper = """try:
    open('/proc/1/mem', 'r+b')
    print('tampered')
except OSError:
    print('denied')"""
    assert [o.output for o in sandbox.run_tests(tamper, {"inputs": [""], "outputs": [""]})] == [
        "denied\n"
    ]
    t0 = time.monotonic()
    out = sandbox.run_tests(
        "import time\nn = int(input())\ntime.sleep(n)\nprint(n)",
        {"inputs": ["0", "100", "0"], "outputs": ["0", "100", "0"]},
        timeout_per_test=1.0,
    )
    # one slow test does not sink the others
    assert [o.status for o in out] == [
        "ok",
        "timeout",
        "ok",
    ]
    assert time.monotonic() - t0 < 3 * 1.0 + MARGIN
    assert _no_leftovers()


@needs_isolation
def test_run_tests_stops_where_the_trainer_says_and_within_its_budget():
    """stop(k, outcome), asked in the trainer as each outcome arrives, ends the job: a program that
    never ends, on 100 tests, comes back with one outcome (its first test's timeout), not 100."""
    hundred = {"inputs": [str(k) for k in range(100)], "outputs": [str(k) for k in range(100)]}
    asked = []

    def stop(k, outcome):
        asked.append((k, outcome.status))
        return outcome.status != "ok"

    out = sandbox.run_tests("while True:\n    pass", hundred, timeout_per_test=1.0, stop=stop)
    assert [o.status for o in out] == ["timeout"] and asked == [(0, "timeout")]
    # a stop that never holds changes nothing: every outcome, as without it
    echo = "print(input())"
    full = sandbox.run_tests(echo, hundred)
    assert sandbox.run_tests(echo, hundred, stop=lambda k, o: False) == full
    assert [o.output for o in full] == [f"{k}\n" for k in range(100)]
    # stop on test 3 of a call-based set: the outcomes up to it
    calls = {"inputs": [[k] for k in range(6)], "outputs": list(range(6)), "fn_name": "f"}
    out = sandbox.run_tests("def f(x):\n    return x", calls, stop=lambda k, o: k == 3)
    assert [o.output for o in out] == ["0", "1", "2", "3"]
    # the budget: the tests it leaves unrun are timeouts
    slow = "import time\ntime.sleep(0.5)\nprint(input())"
    out = sandbox.run_tests(slow, hundred, budget=2.0)
    assert out[-1].status == "timeout" and len(out) == 100
    assert sum(o.status == "ok" for o in out) < 100
    assert _no_leftovers()


# call-based programs whose tests share one process: the outcomes must be those of a process per
# test
CALL_PROGRAMS = [
    ("pure", "def f(x):\n    return x * 2"),
    ("solution_class", "class Solution:\n    def f(self, x):\n        return [x] * 2"),
    ("raise_on_2", "def f(x):\n    if x == 2:\n        raise ValueError('two')\n    return x"),
    ("exit_0_on_2", "import sys\ndef f(x):\n    if x == 2:\n        sys.exit(0)\n    return x"),
    ("exit_3_on_3", "import sys\ndef f(x):\n    if x == 3:\n        sys.exit(3)\n    return x"),
    (
        "exit_message",
        "import sys\ndef f(x):\n    if x == 1:\n        sys.exit('bad one')\n    return x",
    ),
    ("os_exit_on_2", "import os\ndef f(x):\n    if x == 2:\n        os._exit(7)\n    return x"),
    ("loop_on_2", "def f(x):\n    while x == 2:\n        pass\n    return x"),
    (
        "memory_on_1",
        "def f(x):\n    if x == 1:\n        return len(bytearray(1 << 36))\n    return x",
    ),
    (
        "segfault_on_3",
        "import ctypes\ndef f(x):\n    if x == 3:\n        ctypes.string_at(0)\n    return x",
    ),
    (
        "stderr_then_raise",
        "import sys\ndef f(x):\n    print('debug', x, file=sys.stderr)\n"
        "    if x == 4:\n        raise KeyError(x)\n    return x",
    ),
    (
        "stderr_then_exit",
        "import sys\ndef f(x):\n    print('note', x, file=sys.stderr)\n    if x == 3:\n"
        "        sys.exit(2)\n    return x",
    ),
    ("module_error", "undefined_name\ndef f(x):\n    return x"),
    ("syntax_error", "def f(x) return x"),
    ("no_function", "def g(x):\n    return x"),
    ("sets_and_objects", "def f(x):\n    return {x, 1} if x % 2 else object"),
    ("newlines_in_result", "def f(x):\n    return 'a\\nb\\u2028c'"),
    ("huge_result", "def f(x):\n    return 'y' * (3 << 20) if x == 2 else x"),
    ("stdout_flood", "def f(x):\n    print('z' * 100000)\n    return x"),
    ("circular_result", "def f(x):\n    a = []\n    a.append(a)\n    return a"),
    ("writes_its_result_pipe", "import os\ndef f(x):\n    os.write(4, b'junk')\n    return x"),
    (
        "newlines_on_its_result_pipe",
        "import os\ndef f(x):\n    os.write(4, b'\\n' * 200000)\n    return x",
    ),
    ("closes_the_harness_pipe", "import os\nos.close(5)\ndef f(x):\n    return x"),
]


@needs_isolation
def test_call_tests_share_a_process_with_the_outcomes_of_one_each():
    tests = {"inputs": [[1], [2], [3], [4]], "outputs": [0] * 4, "fn_name": "f"}

    # isolate: each test in a sandbox job of its own, so in a process of its own
    def run(code, isolate):
        batches = [[x] for x in tests["inputs"]] if isolate else [tests["inputs"]]
        return [
            (o.status, o.output, o.error)
            for inputs in batches
            for o in sandbox.run_tests(
                code, dict(tests, inputs=inputs), timeout_per_test=1.0, max_output=1 << 16
            )
        ]

    with ThreadPoolExecutor(4) as ex:
        shared = list(ex.map(lambda p: run(p[1], False), CALL_PROGRAMS))
        alone = list(ex.map(lambda p: run(p[1], True), CALL_PROGRAMS))
    for (name, _), a, b in zip(CALL_PROGRAMS, shared, alone):
        assert a == b, name
    got = dict(zip([n for n, _ in CALL_PROGRAMS], shared))
    assert got["pure"] == [("ok", str(2 * x), None) for x in (1, 2, 3, 4)]
    # the tests after it still ran
    assert [s for s, _, _ in got["loop_on_2"]] == [
        "ok",
        "timeout",
        "ok",
        "ok",
    ]
    assert got["memory_on_1"][0][0] == "memory" and got["segfault_on_3"][2][0] == "killed"
    # its own stderr, not the tests' before
    assert got["stderr_then_raise"][3] == (
        "error",
        "",
        "KeyError: 4",
    )
    assert got["stderr_then_exit"][2] == ("error", "", "note 3")
    assert got["huge_result"][1][0] == "ok" and len(got["huge_result"][1][1]) == 1 << 16
    # state: module globals persist from call to call (as under LeetCode's and LiveCodeBench's
    # harnesses), until a test fails: the tests after it get a fresh process
    counter = """n = []
def f(x):
    n.append(x)
    if x == 2:
        raise ValueError
    return len(n)"""
    assert [o for _, o, _ in run(counter, False)] == ["1", "", "1", "2"]
    assert [o for _, o, _ in run(counter, True)] == ["1", "", "1", "1"]
    assert _no_leftovers()


def test_outputs_match_livecodebench_style():
    assert sandbox.outputs_match("YES\nNO\n", "YES\nNO")
    assert sandbox.outputs_match("  1 2 3  \n\n", "1 2 3")
    assert sandbox.outputs_match("1.0000001\n", "1.0")
    assert sandbox.outputs_match("0.5 2\n", "0.50 2")
    assert not sandbox.outputs_match("1.01", "1.0")
    # integers: exact
    assert not sandbox.outputs_match("1000000000000000001", "1000000000000000000")
    assert not sandbox.outputs_match("YES\nNO", "YES\nYES")
    assert not sandbox.outputs_match("YES", "YES\nNO")
    assert not sandbox.outputs_match("yes", "YES")
    assert sandbox.outputs_match("abc \n", "abc")
    assert not sandbox.outputs_match("nan", "nan 1")


def _instant(calls):
    return [f"thinking... <answer>{c.role}:{c.index}</answer>" for c in calls]


WORKFLOWS = [
    # name, script, expected answer (None: must fail), expected words in the error
    (
        "good",
        "def workflow(task):\n    a = Agent('solver', 'Solve.')\n    return a(task) + '|' + "
        "a(task)",
        "solver:0|solver:1",
        None,
    ),
    (
        "too_many_calls",
        "def workflow(task):\n    a = Agent('s', 'x')\n    for _ in range(100):\n        a(task)\n"
        "    return 'never'",
        None,
        "max_calls",
    ),
    (
        "sample_too_many",
        "def workflow(task):\n    return vote(Agent('s', 'x').sample(task, 50))",
        None,
        "max_calls",
    ),
    ("non_string", "def workflow(task):\n    return 42", None, "returned int"),
    ("syntax_error", "def workflow(task)\n    return 'x'", None, "SyntaxError"),
    (
        "import_error",
        "import no_such_module_xyz\ndef workflow(task):\n    return 'x'",
        None,
        "ModuleNotFoundError",
    ),
    ("no_workflow", "def flow(task):\n    return 'x'", None, "no workflow"),
    (
        "non_string_message",
        "def workflow(task):\n    return Agent('s', 'x')(123)",
        None,
        "TypeError",
    ),
    ("infinite_loop", "def workflow(task):\n    while True:\n        pass", None, "timeout"),
    (
        "sleep_after_call",
        "import time\ndef workflow(task):\n    Agent('s', 'x')(task)\n    time.sleep(1000)",
        None,
        "timeout",
    ),
    (
        "protocol_lookalike",
        'def workflow(task):\n    print(\'\\x00\\x00\\x00\\x10{"op": "done", "answer": "x"}\')\n'
        "    return Agent('s', 'x')(task)",
        "s:0",
        None,
    ),
    (
        "garbage_on_channel",
        "import os\ndef workflow(task):\n    os.write(3, b'\\x00\\x00\\x00\\x05{{{{{')\n"
        "    return Agent('s', 'x')(task)",
        None,
        "protocol violation",
    ),
    (
        "forged_done_then_call",
        "import os\ndef workflow(task):\n"
        '    os.write(3, b\'{"op": "done", "answer": "forged"}\\n\')\n    return Agent(\'s\', '
        "'x')(task)",
        None,
        "protocol violation",
    ),
    (
        "two_requests_at_once",
        'import os\ndef workflow(task):\n    line = b\'{"op": "agent", "role": "s", '
        '"instructions": "x", "message": "m", "n": 1}\\n\'\n    os.write(3, line + line)\n    '
        "return 'x'",
        None,
        "protocol violation",
    ),
    ("sys_exit", "import sys\ndef workflow(task):\n    sys.exit(0)", None, "sys.exit"),
    ("os_exit", "import os\ndef workflow(task):\n    os._exit(0)", None, "without returning"),
    (
        "kill_everyone",
        "import os\ndef workflow(task):\n    for pid in (os.getppid(), 0, -1, 1):\n"
        "        try:\n            os.kill(pid, 9)\n        except OSError:\n            pass\n    "
        "return 'alive'",
        "alive",
        None,
    ),
    ("memory_bomb", "def workflow(task):\n    return 'x' * (1 << 36)", None, "MemoryError"),
    ("raise", "def workflow(task):\n    x = 1\n    return str(x / 0)", None, "ZeroDivisionError"),
    (
        "fork",
        "import os\ndef workflow(task):\n    os.fork()\n    return 'x'",
        None,
        "PermissionError",
    ),
    ("ensemble", mas.TEMPLATES["ensemble"].replace("solver", "voter"), "7", None),
    ("vote_too_many", "def workflow(task):\n    return vote(['a'] * 65)", None, "at most 64"),
]


@needs_isolation
def test_hostile_workflows_in_one_batch(world):
    scripts = [s for _, s, _, _ in WORKFLOWS]
    tasks = ["What is 2+2?"] * len(scripts)
    seen = []

    def gen(calls):
        seen.append([(c.run, c.index) for c in calls])
        return [
            f"<answer>{c.role}:{c.index}</answer>"
            if c.role != "voter"
            else f"<answer>{[7, 3, 7][c.index]}</answer>"
            for c in calls
        ]

    t0 = time.monotonic()
    runs = sandbox.run_workflows(
        scripts, tasks, gen, equal=str.__eq__, limits=mas.Limits(max_calls=8, timeout=T)
    )
    wall = time.monotonic() - t0
    assert wall < T + 2 * MARGIN
    for (name, _, answer, err), r in zip(WORKFLOWS, runs):
        if answer is not None:
            assert (r.answer, r.error) == (answer, None), (name, r)
        else:
            assert r.answer is None and err in r.error, (name, r.error)
        assert r.duration < T + 2 * MARGIN
    assert [c.index for c in runs[-2].calls] == [0, 1, 2]  # one parallel call of n=3
    assert len(runs[0].calls) == 2 and runs[0].calls[1].reply == "<answer>solver:1</answer>"
    assert runs[0].calls[0].messages == mas.agent_messages("solver", "Solve.", "What is 2+2?")
    for batch in seen:
        assert batch == sorted(batch)
    assert _snapshot([world["dir"], REPO]) == world["before"]
    assert _no_leftovers()


@needs_isolation
def test_ticks_batch_all_pending_calls():
    """64 scripts x 3 sequential calls: generate runs once per tick (3 times), not 192 times."""
    script = "def workflow(task):\n    a = Agent('s', 'x')\n    return a(task) + a(task) + a(task)"
    batches = []

    class Comp:
        def __init__(self, text):
            self.text, self.token_ids = text, [1, 2, 3]

    def gen(calls):
        batches.append(len(calls))
        return [Comp(f"<answer>{c.index}</answer>") for c in calls]

    runs = sandbox.run_workflows([script] * 64, [f"t{k}" for k in range(64)], gen)
    assert batches == [64, 64, 64]
    assert all(r.answer == "012" and r.error is None for r in runs)
    assert runs[5].calls[2].completion.token_ids == [1, 2, 3]


@needs_isolation
def test_templates_run_with_visible_tests_only():
    task = {
        "id": "c1",
        "kind": "code",
        "question": "Print the input doubled.",
        "public_tests": {"inputs": ["2\n"], "outputs": ["4\n"], "fn_name": None},
        "tests": {"inputs": ["SECRET-HIDDEN-INPUT\n"], "outputs": ["x"], "fn_name": None},
    }
    good = "print(int(input()) * 2)"
    replies = iter(
        [f"```python\n{good}\n```<answer>{good}</answer>", "<answer>print(0)</answer>"] * 4
    )

    def gen(calls):
        return [next(replies) for _ in calls]

    probe = (
        "def workflow(task):\n    return task + run_python('print(1+1)') + run_tests('print(5)')"
    )
    runs = sandbox.run_workflows([mas.TEMPLATES["tester"], probe], [task, task], gen)
    assert runs[0].answer == good and len(runs[0].calls) == 1  # PASS on the first try
    text = runs[1].answer
    assert "Print the input doubled." in text and "SECRET-HIDDEN" not in text
    assert "2\n" in text and "FAIL 0/1" in text
    # a script's run_tests is answered once every outcome is in (its job may still be exiting):
    # calls right after one another each get their own report, in order, for call-based tests too
    fn = {
        "id": "c2",
        "kind": "code",
        "question": "f",
        "public_tests": {"inputs": [[1], [2], [3]], "outputs": [2, 3, 4], "fn_name": "f"},
    }
    many = (
        "def workflow(task):\n    out = [run_tests('def f(x):\\n    return x + %d' % k) for k in "
        "range(4)]\n"
        "    return '|'.join(r.split('\\n')[0] for r in out) + '|' + run_python('print(7)')"
    )
    runs = sandbox.run_workflows([many] * 3, [fn] * 3, gen)
    assert [r.answer for r in runs] == ["FAIL 0/3|PASS 3/3|FAIL 0/3|FAIL 0/3|7\n"] * 3, runs[0]


@needs_isolation
def test_programs_take_turns_each_on_its_own_clock():
    """Programs take turns: at most PROGRAMS_PER_CORE a usable core run at once, and each one's
    clock starts when it starts. On one core, four turns of programs that sleep 0.6 s: each ends
    within its 2 s though the last turn starts 1.8 s or more after the scripts asked (at once)."""
    sandbox.start()  # the fork-server keeps every core; this thread alone is pinned, then freed
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})
    try:
        slots = sandbox.PROGRAMS_PER_CORE
        program = (
            "import time\\na = time.monotonic()\\ntime.sleep(0.6)\\nprint(a, time.monotonic())"
        )
        script = f"def workflow(task):\n    return run_python('{program}')"
        limits = mas.Limits(timeout=10.0, code_timeout=2.0)
        runs = sandbox.run_workflows(
            [script] * (4 * slots), ["q"] * (4 * slots), _instant, limits=limits
        )
    finally:
        os.sched_setaffinity(0, cores)
    outs = [r.answer or r.error for r in runs]
    # every program printed its span (one that timed out prints "timeout: ...")
    assert all(re.fullmatch(r"[0-9.]+ [0-9.]+\n", o) for o in outs), outs
    spans = [tuple(map(float, o.split())) for o in outs]
    # programs running as each one starts: those started by then and not yet ended
    most = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    assert most <= slots, (most, slots)


@needs_isolation
def test_vote_is_counted_by_the_given_equal_on_the_scripts_clock():
    script = "def workflow(task):\n    return vote(['3', 'three', 'III', 'x'])"
    words = {"3": 3, "three": 3, "III": 3}
    runs = sandbox.run_workflows(
        [script], ["q"], _instant, equal=lambda a, b: words.get(a, a) == words.get(b, b)
    )
    assert (runs[0].answer, runs[0].error) == ("3", None)
    runs = sandbox.run_workflows([script], ["q"], _instant)  # no equal: the run fails, saying why
    assert runs[0].answer is None and "equal=" in runs[0].error

    def slow(a, b):
        time.sleep(0.4)
        return False

    sleeper = "import time\ndef workflow(task):\n    time.sleep(0.5)\n    return 'b'"
    t0 = time.monotonic()
    runs = sandbox.run_workflows(
        [script, sleeper], ["q", "q"], _instant, equal=slow, limits=mas.Limits(timeout=1.0)
    )
    assert (
        runs[0].answer is None
        and "timeout" in runs[0].error
        and time.monotonic() - t0 < 1.0 + MARGIN
    )
    # the count's time is not the other script's
    assert (runs[1].answer, runs[1].error) == (
        "b",
        None,
    )


@needs_isolation
def test_generate_failure_becomes_run_error():

    def broken(calls):
        raise RuntimeError("engine on fire")

    runs = sandbox.run_workflows([mas.TEMPLATES["single"]] * 2, ["q", "q"], broken)
    assert all(r.answer is None and "engine on fire" in r.error for r in runs)
    runs = sandbox.run_workflows([mas.TEMPLATES["single"]], ["q"], lambda calls: [None])
    assert "without text" in runs[0].error


def test_refuses_without_isolation_and_unsafe_opt_in(tmp_path, monkeypatch, capfd):
    """A host without user namespaces (simulated by an `unshare` that fails as it would there):
    refuse, say why and how to opt in; with the opt-in, run anyway and warn."""
    fake = tmp_path / "unshare"
    fake.write_text(
        "#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    try:
        with pytest.raises(sandbox.SandboxUnavailable) as e:
            sandbox.start(unsafe=False)
        assert "Operation not permitted" in str(e.value) and sandbox.UNSAFE_ENV in str(e.value)
        line = sandbox.start(unsafe=True)
        assert "UNSAFE" in line and "WARNING" in capfd.readouterr().err
        r = sandbox.run_code("print(6 * 7)")
        assert (r.status, r.stdout) == ("ok", "42\n")
        r = sandbox.run_code("import os\nos.fork()")  # seccomp still applies
        assert r.status == "error" and "PermissionError" in r.stderr
        r = sandbox.run_code("while True: pass", timeout=1.0)
        assert r.status == "timeout" and r.duration < 1.0 + MARGIN
    finally:
        monkeypatch.undo()
        sandbox.stop()
        if ISOLATION is not None:
            sandbox.start(unsafe=False)


def test_trainer_exit_takes_the_server_down():
    """The fork-server and its jobs die with the trainer (no orphans when the trainer crashes)."""
    code = (
        f"import sys, time; sys.path.insert(0, {REPO!r}); import sandbox; "
        f"sandbox.start(unsafe={ISOLATION is None!r}); import threading; "
        "threading.Thread(target=sandbox.run_code, args=('import time; time.sleep(100)',),"
        " kwargs={'timeout': 100}, daemon=True).start(); time.sleep(1.5); "
        "import isolation; print(isolation._server.proc.pid, flush=True); "
        "import os; os._exit(0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    for pid in map(int, out.stdout.split()):
        for _ in range(100):
            if (
                not os.path.exists(f"/proc/{pid}")
                or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
            ):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the sandbox outlived its trainer")
