"""Adversarial tests of sandbox.py: a corpus of hostile and broken programs and workflow scripts,
in both of the sandbox's modes (isolated: namespaces and an empty root; fallback: Landlock and
seccomp, as on a machine without user namespaces).

For every one: the trainer (this process) survives, the result says what happened, the wall time
stays within the limit plus a margin, no process of it remains, no file outside its temporary
directory changed, and the other programs/scripts running at the same time are unaffected. The
boundary's tests (the second half) attack each class of what a job could reach: the host's files
(and through them its grade), what it returns, sockets, memory, time, devices, the trainer's
process; each attack is written to succeed were the boundary not there.
"""

import functools
import json
import os
import re
import resource
import socket
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["METAAGENT_TEST_SECRET"] = "s3cr3t-token-42"  # must never reach a child

import mas
import reward
import sandbox
from machinery import isolation, programs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = 2.0  # wall limit of each hostile program
MARGIN = 3.0  # generous: 2 shared cores


def _available(mode):
    try:
        sandbox.start(mode)
        return None
    except sandbox.SandboxUnavailable as e:
        return str(e).splitlines()[0]


MISSING = {m: _available(m) for m in ("fallback", "isolated")}  # mode -> why it is missing
ISOLATION = None if MISSING["isolated"] else sandbox.isolation()


@pytest.fixture(scope="module", params=["isolated", "fallback"])
def mode(request):
    """Each test that takes it runs in both modes (the tests of one mode together)."""
    if MISSING[request.param]:
        pytest.skip(f"no {request.param} sandbox here: {MISSING[request.param]}")
    sandbox.start(request.param)
    yield request.param


@pytest.fixture(params=["ticks", "continuous"])
def schedule(request):
    """A workflow test that takes it runs under both of run_workflows' schedules."""
    return request.param


@pytest.fixture()
def isolated():
    if MISSING["isolated"]:
        pytest.skip(f"no isolated sandbox here: {MISSING['isolated']}")
    if isolation._server is None or isolation._server.mode != "isolated":
        sandbox.start("isolated")


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
    """Only the fork-server itself remains (isolated: the process that waits for it, and it): every
    job and everything it started is gone."""
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
        {"error"},
        lambda r: len(r.stdout) == 1 << 20 and "output limit" in r.stderr,
    ),
    (
        "huge_output_once",
        "import sys\nsys.stdout.write('y' * (50 << 20))",
        {"error", "memory"},
        lambda r: len(r.stdout) <= 1 << 20,
    ),
    (
        "write_outside",
        "open('{dir}/new.txt', 'w').write('x')",
        {"error"},
        lambda r: "PermissionError" in r.stderr or "FileNotFoundError" in r.stderr,
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
        lambda r: "PermissionError" in r.stderr,
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


def test_hostile_programs_concurrently(mode, world):
    """Every hostile program at once, next to a well-behaved one that must be unaffected."""
    fmt = {"dir": world["dir"], "keep": world["keep"], "repo": REPO, "port": world["port"]}
    good = "import sys\nprint(sum(map(int, sys.stdin.read().split())))"
    server_pid = isolation._server.proc.pid
    with ThreadPoolExecutor(len(PROGRAMS) + 1) as ex:
        futs = {
            name: ex.submit(programs.run_code, code.format(**fmt), "", T, memory=128 << 20)
            for name, code, _, _ in PROGRAMS
        }
        time.sleep(0.3)
        goods = [ex.submit(programs.run_code, good, "1 2 3", 10.0) for _ in range(3)]
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
    assert programs.run_code("print(1)").stdout == "1\n"


def test_each_job_gets_a_fresh_private_tmp(mode):
    r1 = programs.run_code(
        "import os\nopen('mine.txt', 'w').write('a')\nprint(sorted(os.listdir('.')))"
    )
    r2 = programs.run_code("import os\nprint(sorted(os.listdir('.')))")
    assert r1.stdout.strip() == "['mine.txt']" and r2.stdout.strip() == "[]"
    r3 = programs.run_code("import os\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]))")
    if mode == "isolated":
        assert r3.stdout.strip() == "1"  # alone in its PID namespace
    else:  # no /proc at all
        assert r3.status == "error" and "PermissionError" in r3.stderr


def test_run_tests_stdin_and_call_based(mode):
    out = programs.run_tests(
        "print(int(input()) * 2)", {"inputs": ["2\n", "5\n", "x\n"], "outputs": ["4", "10", ""]}
    )
    assert [o.status for o in out] == ["ok", "ok", "error"]
    assert [o.output for o in out[:2]] == ["4\n", "10\n"] and "ValueError" in out[2].error
    code = "class Solution:\n    def add(self, a, b):\n        return [a + b]\n"
    out = programs.run_tests(
        code, {"inputs": [[1, 2], "3\n4"], "outputs": [[3], [7]], "fn_name": "add"}
    )
    assert [(o.status, o.output) for o in out] == [("ok", "[3]"), ("ok", "[7]")]
    # a program cannot reach into the harness that records its outputs (/proc/1/mem is the harness)
    tamper = """try:
    open('/proc/1/mem', 'r+b')
    print('tampered')
except OSError:
    print('denied')"""
    assert [o.output for o in programs.run_tests(tamper, {"inputs": [""], "outputs": [""]})] == [
        "denied\n"
    ]
    t0 = time.monotonic()
    out = programs.run_tests(
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


def test_run_tests_stops_where_the_trainer_says_and_within_its_budget(mode):
    """stop(k, outcome), asked in the trainer as each outcome arrives, ends the job: a program that
    never ends, on 100 tests, comes back with one outcome (its first test's timeout), not 100."""
    hundred = {"inputs": [str(k) for k in range(100)], "outputs": [str(k) for k in range(100)]}
    asked = []

    def stop(k, outcome):
        asked.append((k, outcome.status))
        return outcome.status != "ok"

    out = programs.run_tests("while True:\n    pass", hundred, timeout_per_test=1.0, stop=stop)
    assert [o.status for o in out] == ["timeout"] and asked == [(0, "timeout")]
    # a stop that never holds changes nothing: every outcome, as without it
    echo = "print(input())"
    full = programs.run_tests(echo, hundred)
    assert programs.run_tests(echo, hundred, stop=lambda k, o: False) == full
    assert [o.output for o in full] == [f"{k}\n" for k in range(100)]
    # stop on test 3 of a call-based set: the outcomes up to it
    calls = {"inputs": [[k] for k in range(6)], "outputs": list(range(6)), "fn_name": "f"}
    out = programs.run_tests("def f(x):\n    return x", calls, stop=lambda k, o: k == 3)
    assert [o.output for o in out] == ["0", "1", "2", "3"]
    # the budget: the tests it leaves unrun are timeouts
    slow = "import time\ntime.sleep(0.5)\nprint(input())"
    out = programs.run_tests(slow, hundred, budget=2.0)
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


def test_call_tests_share_a_process_with_the_outcomes_of_one_each(mode):
    tests = {"inputs": [[1], [2], [3], [4]], "outputs": [0] * 4, "fn_name": "f"}

    # isolate: each test in a sandbox job of its own, so in a process of its own
    def run(code, isolate):
        batches = [[x] for x in tests["inputs"]] if isolate else [tests["inputs"]]
        return [
            (o.status, o.output, o.error)
            for inputs in batches
            for o in programs.run_tests(
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
    assert programs.outputs_match("YES\nNO\n", "YES\nNO")
    assert programs.outputs_match("  1 2 3  \n\n", "1 2 3")
    assert programs.outputs_match("1.0000001\n", "1.0")
    assert programs.outputs_match("0.5 2\n", "0.50 2")
    assert not programs.outputs_match("1.01", "1.0")
    # integers: exact
    assert not programs.outputs_match("1000000000000000001", "1000000000000000000")
    assert not programs.outputs_match("YES\nNO", "YES\nYES")
    assert not programs.outputs_match("YES", "YES\nNO")
    assert not programs.outputs_match("yes", "YES")
    assert programs.outputs_match("abc \n", "abc")
    assert not programs.outputs_match("nan", "nan 1")


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
        # (not 0: its own process group, which is itself in the fallback)
        "import os\ndef workflow(task):\n    for pid in (os.getppid(), -1, 1):\n"
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


def test_hostile_workflows_in_one_batch(mode, schedule, world):
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
    limits = mas.Limits(max_calls=8, timeout=T)
    runs = sandbox.run_workflows(
        scripts, tasks, gen, equal=str.__eq__, limits=limits, schedule=schedule
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
    for batch in seen if schedule == "ticks" else []:  # (continuous: in the order made)
        assert batch == sorted(batch)
    assert _snapshot([world["dir"], REPO]) == world["before"]
    assert _no_leftovers()


def test_ticks_batch_all_pending_calls(mode):
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


class Polled:
    """A deterministic engine with the engine's submit and poll: each call's reply is a function of
    the call alone (a coder writes a wrong program on some first tries), and it is done after a
    number of polls drawn from a hash of (run, index): 1 to 6."""

    def __init__(self):
        self.running = []

    def submit(self, calls):
        for c in calls:
            self.running.append([c, 1 + zlib.crc32(f"{c.run}/{c.index}".encode()) % 6])

    def poll(self):
        for r in self.running:
            r[1] -= 1
        done = [c for c, left in self.running if left <= 0]
        self.running = [r for r in self.running if r[1] > 0]
        return [(c, self.reply(c)) for c in done]

    @staticmethod
    def reply(c):
        if c.role == "coder":
            wrong = c.index == 0 and c.run % 3 == 0
            return f"<answer>print(int(input()) * {3 if wrong else 2})</answer>"
        return f"<answer>{c.role}:{c.index}:{len(c.message) % 7}</answer>"


CHAIN = """def workflow(task):
    a = Agent("step", "Go on.")
    for _ in range(5):
        task = a(task + "!")
    return task
"""


def test_continuous_runs_equal_ticks_runs(mode):
    """64 scripts (the four templates, 5-call chains, sample(3), run_tests with repairs) through an
    engine whose calls finish after a hash-drawn number of polls: each call submitted when made
    (continuous) gives the runs of the reference schedule (ticks) call for call."""
    code = {
        "id": "c",
        "kind": "code",
        "question": "Double it.",
        "public_tests": {"inputs": ["2\n", "5\n"], "outputs": ["4\n", "10\n"], "fn_name": None},
    }
    kinds = [*mas.TEMPLATES.values(), CHAIN]
    scripts = [kinds[k % len(kinds)] for k in range(64)]
    tasks = [code if "run_tests" in sc else f"task {k}" for k, sc in enumerate(scripts)]
    runs = {}
    for schedule in ("ticks", "continuous"):
        engine = Polled()
        got = sandbox.run_workflows(scripts, tasks, engine, equal=str.__eq__, schedule=schedule)
        runs[schedule] = [(r.answer, r.error, [(c.index, c.reply) for c in r.calls]) for r in got]
        assert all(r.error is None for r in got), [r.error for r in got if r.error]
    assert runs["ticks"] == runs["continuous"]
    repaired = [r for r, sc in zip(runs["ticks"], scripts) if "run_tests" in sc and len(r[2]) == 2]
    assert repaired  # the tester's second call happened


TWO_AT_ONCE = (
    'import os\ndef workflow(task):\n    line = b\'{"op": "agent", "role": "s", '
    '"instructions": "x", "message": "m", "n": 1}\\n\'\n    os.write(3, line + line)\n'
    "    return 'x'"
)


def test_a_script_that_ends_while_its_call_decodes_leaves_nothing_in_the_engine(mode):
    """(continuous) A script killed while its agent call is in the engine (here: a second request
    before the first's reply): run_workflows polls its call out, so the next call of run_workflows
    on the same engine starts clean and gets only its own replies."""
    engine = Polled()
    scripts = [TWO_AT_ONCE, CHAIN]
    runs = sandbox.run_workflows(scripts, ["q", "q"], engine, schedule="continuous")
    assert "protocol violation" in runs[0].error
    assert runs[1].error is None and runs[1].answer.startswith("step:4:")
    assert engine.running == []
    again = sandbox.run_workflows([CHAIN], ["t"], engine, schedule="continuous")
    assert again[0].error is None and [c.index for c in again[0].calls] == [0, 1, 2, 3, 4]


class FailsAfter(Polled):
    """Polled, whose submit fails once it has taken `ok` calls (an engine that died)."""

    def __init__(self, ok):
        super().__init__()
        self.ok, self.failed = ok, 0

    def submit(self, calls):
        for c in calls:
            if self.ok == 0:
                self.failed += 1
                raise RuntimeError("engine on fire")
            self.ok -= 1
            super().submit([c])


@pytest.mark.parametrize("schedule", ["ticks", "continuous"])
def test_a_failed_submit_fails_the_waiting_runs_and_asks_nothing_more(mode, schedule):
    """A submit that fails part way (some calls in the engine, some not): the runs still going
    fail with the engine's error (continuous: a run done before it keeps its answer), none hangs,
    and nothing is submitted after."""
    engine = FailsAfter(ok=5)
    runs = sandbox.run_workflows([CHAIN] * 4, ["q"] * 4, engine, schedule=schedule)
    failed = [r for r in runs if r.answer is None]
    assert all("engine on fire" in r.error for r in failed) and len(failed) >= 3, runs
    assert all(r.answer == "step:4:2" for r in runs if r.answer is not None)
    assert engine.failed == 1  # one failed submit, then nothing more asked


def test_templates_run_with_visible_tests_only(mode):
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


def test_programs_take_turns_each_on_its_own_clock(mode):
    """Programs take turns: at most PROGRAMS_PER_CORE a usable core run at once, and each one's
    clock starts when it starts. On one core, four turns of programs that sleep 0.6 s: each ends
    within its 2 s though the last turn starts 1.8 s or more after the scripts asked (at once)."""
    sandbox.start(mode)  # the fork-server keeps every core; this thread alone is pinned, then freed
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


def test_vote_is_counted_by_the_given_equal_on_the_scripts_clock(mode):
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


SLOW = 3.5  # seconds each stub generation takes: longer than the runs' budget below
OK = "<answer>ok</answer>"


def _slow_generate(calls):
    """A plain generate function whose generation outlasts the runs' budget."""
    time.sleep(SLOW)
    return [OK for _ in calls]


class SlowPolled:
    """A submit/poll engine whose every poll generates all it holds, at once and slowly (as the
    transformers backend does)."""

    def __init__(self):
        self.queued = []

    def submit(self, calls):
        self.queued += calls

    def poll(self):
        time.sleep(SLOW if self.queued else 0)
        done, self.queued = self.queued, []
        return [(c, OK) for c in done]


ASKS = "import time\ndef workflow(task):\n    time.sleep(%s)\n    return Agent('s', 'x')(task)"
SAYS = "import time\ndef workflow(task):\n    time.sleep(%s)\n    return %s"


@pytest.mark.parametrize("engine", ["function", "polled"])
def test_a_runs_clock_is_its_own_time(mode, schedule, engine):
    """A run's clock counts its own time (compute, programs, sleeps), never the trainer's time in
    the engine: with a generation that outlasts the 2 s budget, runs that answer within it (at
    once, after a program, as a tick starts) keep their answers; a run that truly overruns,
    answering past its budget or never, is still timed out, near its budget."""
    gen = _slow_generate if engine == "function" else SlowPolled()
    limits = mas.Limits(timeout=2.0)
    honest = [
        ASKS % 0,
        SAYS % (0.3, "'quick'"),
        SAYS % (0.3, "run_python('print(2)').strip()"),
        ASKS % 0.6,
        SAYS % (0.9, "'late'"),  # (ticks: its answer comes as the tick starts)
    ]
    runs = sandbox.run_workflows(honest, ["q"] * 5, gen, limits=limits, schedule=schedule)
    got = [(r.answer, r.error) for r in runs]
    assert got == [("ok", None), ("quick", None), ("2", None), ("ok", None), ("late", None)]
    overrun = [ASKS % 0, SAYS % (2.6, "'over'"), SAYS % (60, "'never'")]
    runs = sandbox.run_workflows(overrun, ["q"] * 3, gen, limits=limits, schedule=schedule)
    assert (runs[0].answer, runs[0].error) == ("ok", None)
    for r in runs[1:]:
        assert r.answer is None and "timeout after 2s" in r.error, r
        assert r.duration < 2.0 + SLOW + MARGIN, r


def test_a_run_killed_while_its_call_decodes_keeps_no_completion(mode, schedule):
    """A run killed while its agent call is in the engine (here: a second request before the
    first's reply) is handed nothing of that call, under either schedule: its run has no calls
    (nothing to train on or to score its format by)."""
    runs = sandbox.run_workflows([TWO_AT_ONCE, CHAIN], ["q", "q"], Polled(), schedule=schedule)
    assert "protocol violation" in runs[0].error and runs[0].calls == [], runs[0]
    assert runs[1].error is None and len(runs[1].calls) == 5


def test_a_script_hands_the_trainer_capped_messages(mode, schedule):
    """An agent call's message (role, instructions and message) over mas.Limits.max_message
    characters, or a run's over max_messages in all (sample(m, n) counting n), is the script's
    failure, counted; a message within both caps is served."""
    say = "def workflow(task):\n    a = Agent('s', 'x')\n    return %s"
    scripts = [
        say % "a('m' * 1000)",
        say % "a('m' * 40000)",
        say % "''.join(a('m' * 30000) for _ in range(10))",
        say % "''.join(a.sample('m' * 20000, 16))",
    ]
    before = programs.failures["limit exceeded"]
    runs = sandbox.run_workflows(scripts, ["q"] * 4, _instant, schedule=schedule)
    assert (runs[0].answer, runs[0].error) == ("s:0", None), runs[0]
    for r in runs[1:]:
        assert r.answer is None and "max_message" in r.error, r
    assert programs.failures["limit exceeded"] - before == 3
    assert len(runs[2].calls) == 8  # (8 x 30,000 characters: within the run's 262,144)


def test_a_code_tasks_vote_compares_programs_as_text(mode):
    """Two programs are the same answer only as text (up to whitespace): the math `equal` is never
    asked on a code task, whose vote would otherwise take SymPy's time on the script's clock (the
    count is stopped at the deadline, so the outcome would follow the machine's load) and call
    `print(x*2)` and `print(2*x)` one answer."""
    asked = []

    def equal(a, b):
        asked.append((a, b))
        return True

    script = "def workflow(task):\n    return vote(['print(x*2)', 'print(2*x)', ' print(2*x) '])"
    code = {"kind": "code", "question": "q", "public_tests": None}
    math = {"kind": "math", "question": "q"}
    runs = sandbox.run_workflows([script, script], [code, math], _instant, equal=equal)
    assert (runs[0].answer, runs[0].error) == ("print(2*x)", None)
    assert (runs[1].answer, runs[1].error) == ("print(x*2)", None)  # math: equal() says one answer
    assert asked == [("print(2*x)", "print(x*2)")] * 2  # the math task's only


def test_votes_are_counted_off_the_event_loop(mode, schedule):
    """Six scripts whose votes take 3 s each to count (a slow `equal`) do not hold the trainer: a
    program that another script asks for meanwhile starts before any count ends (it prints the
    time it started: one clock for jobs and trainer), and every vote is counted on its own
    script's clock."""
    ends = []

    def slow(a, b):
        time.sleep(3.0)
        ends.append(time.monotonic())
        return False

    voter = "def workflow(task):\n    return vote(['a', 'b'])"
    asks = "def workflow(task):\n    return run_python('import time\\nprint(time.monotonic())')"
    runs = sandbox.run_workflows(
        [voter] * 6 + [asks],
        ["q"] * 7,
        _instant,
        equal=slow,
        limits=mas.Limits(timeout=30.0),
        schedule=schedule,
    )
    assert [(r.answer, r.error) for r in runs[:6]] == [("a", None)] * 6
    assert runs[6].error is None and float(runs[6].answer) < min(ends), (runs[6], ends)


def test_generate_failure_becomes_run_error(mode):

    def broken(calls):
        raise RuntimeError("engine on fire")

    runs = sandbox.run_workflows([mas.TEMPLATES["single"]] * 2, ["q", "q"], broken)
    assert all(r.answer is None and "engine on fire" in r.error for r in runs)
    runs = sandbox.run_workflows([mas.TEMPLATES["single"]], ["q"], lambda calls: [None])
    assert "without text" in runs[0].error


# --------------------------------------------------------------------------------------------------
# The boundary: each class of what a job could reach, attacked in both modes


def _host_uid():
    """The host user an isolated job runs as: nobody under a root trainer, else the trainer's."""
    return isolation.NOBODY if os.geteuid() == 0 else os.geteuid()


@pytest.fixture()
def host(tmp_path):
    """What a job must not reach: a secret only the trainer's user can read, a task file in the
    layout `machinery/data.py prepare` writes (a hidden test's input and its expected output), a
    unix socket and a TCP port listening on the host, an abstract unix socket of the trainer's."""
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cr3t-token-42")
    secret.chmod(0o600)
    data = tmp_path / "work" / "data"
    data.mkdir(parents=True)
    row = {"id": "c9", "stdin": "7 9 unique-424242\n", "output": "forged-777", "args": [424242]}
    (data / "code.jsonl").write_text(json.dumps(row) + "\n")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "host.sock"))
    unix.listen(4)
    unix.setblocking(False)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0metaagent-test-{os.getpid()}")
    abstract.listen(4)
    abstract.setblocking(False)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    tcp.setblocking(False)
    yield {
        "dir": str(tmp_path),
        "secret": str(secret),
        "data": str(data / "code.jsonl"),
        "row": row,
        "unix": str(tmp_path / "host.sock"),
        "abstract": f"\0metaagent-test-{os.getpid()}",
        "port": tcp.getsockname()[1],
        "listeners": (unix, abstract, tcp),
    }
    for s in (unix, abstract, tcp):
        with pytest.raises(BlockingIOError):  # no job ever connected
            s.accept()
        s.close()


def _run(code, **kw):
    """run_code on a program that prints one JSON line: that value."""
    r = programs.run_code(textwrap.dedent(code), **kw)
    assert r.status == "ok", r
    return json.loads(r.stdout)


def test_a_job_reads_no_file_of_the_host(mode, host):
    """Every file the trainer's user can read, the project, the run folder, the home folder, the
    host's /proc and /sys, other jobs' folders: none can be opened or listed. In the isolated mode
    they do not even exist (an empty root); in the fallback Landlock refuses them."""
    me = os.getpid()
    paths = [
        host["secret"],
        host["data"],
        host["dir"],
        REPO,
        os.path.join(REPO, "README.md"),
        os.path.join(REPO, ".git", "config"),
        os.path.join(REPO, "out"),  # the run folders
        os.path.expanduser("~"),
        "/etc/passwd",
        "/etc/hostname",
        f"/proc/{me}/environ",
        f"/proc/{me}/cmdline",
        f"/proc/{me}/mem",
        "/sys/kernel",
        "/dev/shm",
        "/run",
        "/tmp",
        "/",
        isolation._server.base,
    ]
    code = f"""
    import json, os
    seen = {{}}
    for p in {paths!r}:
        try:
            seen[p] = os.listdir(p)[:3] if os.path.isdir(p) else open(p, "rb").read(40).decode()
        except OSError as e:
            seen[p] = type(e).__name__
    exists = [p for p in {paths!r} if os.path.exists(p)]
    print(json.dumps({{"seen": seen, "exists": exists, "env": dict(os.environ)}}))
    """
    out = _run(code)
    opened = {p: v for p, v in out["seen"].items() if not isinstance(v, str) or "Error" not in v}
    assert opened == {}, opened
    assert "s3cr3t" not in json.dumps(out)
    if mode == "isolated":  # an empty root: "/" and the folders on the way to the Python install
        ways = {os.path.dirname(r) for r in isolation._server.roots}
        while not ways >= {os.path.dirname(w) for w in ways}:
            ways |= {os.path.dirname(w) for w in ways}
        assert set(out["exists"]) <= ways, out["exists"]


def test_a_program_cannot_forge_its_grade(mode, host):
    """A program that looks for the task files on disk, finds its own hidden test's input there and
    prints the stored output: outside the sandbox it passes (the attack is real); inside, graded by
    reward.passes_all, it fails, stdin and call-based alike."""
    search = f"""
    import glob, json, os
    def rows():
        found = [{host["data"]!r}]  # where it is, as if guessed; and wherever it might be
        for depth in range(1, 7):
            found += glob.glob("/*" * depth + "/data/*.jsonl")
        for path in found:
            try:
                yield from (json.loads(line) for line in open(path))
            except (OSError, ValueError):
                pass
    """
    stdin_program = textwrap.dedent(search) + textwrap.dedent("""
    import sys
    mine = sys.stdin.read()
    print(next((r["output"] for r in rows() if r.get("stdin") == mine), "nothing found"))
    """)
    call_program = textwrap.dedent(search) + textwrap.dedent("""
    def f(x):
        return next((r["output"] for r in rows() if r.get("args") == [x]), "nothing found")
    """)
    row = host["row"]
    outside = subprocess.run(
        [sys.executable, "-c", stdin_program], input=row["stdin"], capture_output=True, text=True
    )
    assert outside.stdout.strip() == "forged-777"  # the attack works on an open machine
    stdin_tests = {"inputs": [row["stdin"]], "outputs": [row["output"]], "fn_name": None}
    call_tests = {"inputs": [row["args"]], "outputs": [row["output"]], "fn_name": "f"}
    assert not reward.passes_all(stdin_program, stdin_tests)
    assert not reward.passes_all(call_program, call_tests)
    task = {"id": "c9", "kind": "code", "tests": stdin_tests}
    assert reward.correctness(task, f"```python\n{stdin_program}\n```") == 0.0


def test_nothing_a_program_returns_raises_in_the_trainer(mode, schedule):
    """A call-based program that returns a list nested 3,000 deep, or writes '[' x 5000 on its
    result descriptor; a stdin program that prints a number past Decimal's range; a script that
    sends a message nested 5,000 deep: each is that program's or script's failure, counted; the
    trainer, and the other scripts of the batch, go on."""
    deep = "import sys\nsys.setrecursionlimit(100000)\ndef f(x):\n    a = []\n"
    deep += "    for _ in range(3000):\n        a = [a]\n    return a"
    forged = "import os\ndef f(x):\n    os.write(4, b'[' * 5000 + b'\\n')\n    return 1"
    calls = {"inputs": [[1], [2]], "outputs": [[1], [2]], "fn_name": "f"}
    before = programs.failures["unreadable result"]
    for code in (deep, forged):
        assert reward.correctness({"kind": "code", "tests": calls}, code) == 0.0
        assert reward.code_score(code, calls) == 0.0
    huge = {"inputs": ["1\n"], "outputs": ["1.5"], "fn_name": None}
    assert reward.correctness({"kind": "code", "tests": huge}, "print('1e999999999')") == 0.0
    assert programs.failures["unreadable result"] >= before + 5
    nested = b'{"op": "agent", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}\\n"
    bad = f"import os\ndef workflow(task):\n    os.write(3, {nested!r})\n    return 'x'"
    tester = {
        "id": "c",
        "kind": "code",
        "question": "q",
        "public_tests": {"inputs": [[1]], "outputs": [[1]], "fn_name": "f"},
    }
    report = f"def workflow(task):\n    return run_tests({deep!r})"
    runs = sandbox.run_workflows(
        [bad, mas.TEMPLATES["single"], report],
        ["q", "q", tester],
        _instant,
        equal=str.__eq__,
        schedule=schedule,
    )
    assert runs[0].answer is None and "protocol violation" in runs[0].error
    assert (runs[1].answer, runs[1].error) == ("solver:0", None)
    assert runs[2].answer.startswith("FAIL 0/1"), runs[2]


def test_no_socket_reaches_the_host_or_another_job(mode, host):
    """Unix sockets on the host by path and by abstract name, TCP and UDP on loopback, netlink and
    raw sockets, a rendezvous between two jobs over an abstract socket: all refused. A socket pair
    of its own (asyncio's) works."""
    attempts = f"""
    import asyncio, json, socket
    out = {{}}
    def attempt(name, family, kind, address, send=False):
        try:
            s = socket.socket(family, kind)
            s.settimeout(1)
            if send:
                s.sendto(b"hello", address)
            else:
                s.connect(address)
                s.sendall(b"hello")
            out[name] = "connected"
        except OSError as e:
            out[name] = type(e).__name__
    attempt("unix", socket.AF_UNIX, socket.SOCK_STREAM, {host["unix"]!r})
    attempt("abstract", socket.AF_UNIX, socket.SOCK_STREAM, {host["abstract"]!r})
    attempt("tcp", socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", {host["port"]}))
    attempt("udp", socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", {host["port"]}), send=True)
    attempt("unix_dgram", socket.AF_UNIX, socket.SOCK_DGRAM, {host["unix"]!r}, send=True)
    for name, family in (("netlink", socket.AF_NETLINK), ("packet", socket.AF_PACKET)):
        try:
            socket.socket(family, socket.SOCK_RAW)
            out[name] = "opened"
        except OSError as e:
            out[name] = type(e).__name__
    async def echo():
        r, w = await asyncio.open_connection(sock=socket.socketpair()[0])
        return "ok"
    out["socketpair"] = asyncio.run(echo())
    print(json.dumps(out))
    """
    out = _run(attempts)
    assert out.pop("socketpair") == "ok"
    assert not {k: v for k, v in out.items() if v in ("connected", "opened")}, out
    listen = """
    import json, socket, time
    try:
        s = socket.socket(socket.AF_UNIX)
        s.bind("\\0metaagent-rendezvous")
        s.listen(1)
        s.settimeout(2)
        s.accept()
        print(json.dumps("met"))
    except OSError as e:
        print(json.dumps(type(e).__name__))
    """
    call = """
    import json, socket, time
    time.sleep(0.5)
    try:
        socket.socket(socket.AF_UNIX).connect("\\0metaagent-rendezvous")
        print(json.dumps("met"))
    except OSError as e:
        print(json.dumps(type(e).__name__))
    """
    with ThreadPoolExecutor(2) as ex:
        met = list(ex.map(_run, (listen, call)))
    assert "met" not in met, met


def test_memory_a_limit_cannot_count_is_refused(mode):
    """memfd, SysV and POSIX shared memory and queues are refused; the job's folder is part of its
    memory: with a 64 MiB limit, what it writes to its folder and what it allocates stay within
    64 MiB."""
    refused = """
    import ctypes, json, mmap, os
    libc = ctypes.CDLL(None, use_errno=True)
    out = {"shmget": libc.shmget(0, 16 << 20, 0o1600), "msgget": libc.msgget(0, 0o1600)}
    out["semget"] = libc.semget(0, 1, 0o1600)
    try:
        os.memfd_create("hold")
        out["memfd"] = "created"
    except OSError as e:
        out["memfd"] = type(e).__name__
    try:
        open("/dev/shm/hold", "wb").write(b"x" * (16 << 20))
        out["dev_shm"] = "written"
    except OSError as e:
        out["dev_shm"] = type(e).__name__
    print(json.dumps(out))
    """
    out = _run(refused)
    assert out == {
        "shmget": -1,
        "msgget": -1,
        "semget": -1,
        "memfd": "PermissionError",
        "dev_shm": out["dev_shm"] if "Error" in out["dev_shm"] else "refused",
    }, out
    fill = """
    import json, os, time
    written = held = 0
    try:
        for k in range(64):
            with open(f"f{k}", "wb") as f:
                for _ in range(4):
                    f.write(bytes(1 << 20))
                    written += 1
    except OSError:
        pass
    time.sleep(0.5)  # a fallback folder is watched: over its bound, the job is killed
    chunks = []
    try:
        while True:
            chunks.append(bytearray(1 << 20))
            held += 1
    except MemoryError:
        chunks.clear()
    print(json.dumps([written, held]))
    """
    r = programs.run_code(textwrap.dedent(fill), memory=64 << 20)
    if r.status == "ok":
        written, held = json.loads(r.stdout)
        assert written <= 16 and written + held <= 64, (written, held)
    else:  # the fallback's watcher killed it once its folder passed its bound
        assert mode == "fallback" and "its folder holds" in r.stderr, r


def test_budgets_hold_in_workflows(mode, schedule):
    """A script's wall budget counts its programs' time; run_python / run_tests calls are capped
    (mas.Limits.max_programs); vote's answers are capped in size, whether the script goes through
    mas.vote or writes the request itself; a channel message is capped (MAX_LINE). Each cap is hit
    whatever the machine's speed: the sleeper's programs sleep 16 x 0.3 s against its 1 s, the
    others have 60 s for what a cap stops."""
    sleepy = "def workflow(task):\n    for _ in range(25):\n"
    sleepy += "        run_python('import time\\ntime.sleep(0.3)')\n    return 'done'"
    t0 = time.monotonic()
    run = sandbox.run_workflows(
        [sleepy], ["q"], _instant, limits=mas.Limits(timeout=1.0), schedule=schedule
    )[0]
    assert time.monotonic() - t0 < 1.0 + 2 * MARGIN
    assert "timeout" in run.error and run.duration < 1.0 + MARGIN, run
    many = "def workflow(task):\n    for _ in range(100):\n        run_python('print(1)')\n"
    many += "    return 'done'"
    big_vote = "def workflow(task):\n    return vote(['x' * 260000] * 64)"
    raw = json.dumps({"op": "vote", "answers": ["y" * 20000] * 20}) + "\n"
    raw_vote = f"import os\ndef workflow(task):\n    os.write(3, {raw.encode()!r})\n    return 'x'"
    line = json.dumps({"op": "vote", "answers": ["z" * 300000] * 64}) + "\n"
    flood = (
        f"def workflow(task):\n    import os\n    os.write(3, {line.encode()!r})\n    return 'x'"
    )
    runs = sandbox.run_workflows(
        [many, big_vote, raw_vote, flood],
        ["q"] * 4,
        _instant,
        equal=str.__eq__,
        limits=mas.Limits(timeout=60.0),
        schedule=schedule,
    )
    assert "max_programs" in runs[0].error, runs[0]
    assert "vote takes answers of at most" in runs[1].error, runs[1]
    assert "an answer over" in runs[2].error, runs[2]
    assert "oversized message" in runs[3].error, runs[3]


def test_output_past_the_cap_closes_the_pipe(mode):
    """A program that floods stdout or stderr is cut off at the cap: the pipe closes, its next
    write fails, and the trainer reads no more than the caps (its CPU time says so)."""
    cpu = time.process_time()
    out = programs.run_code("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", timeout=3)
    err = programs.run_code("import sys\nwhile True:\n    sys.stderr.write('e' * 65536)", timeout=3)
    used = time.process_time() - cpu
    assert out.status == "error" and "output limit" in out.stderr and len(out.stdout) == 1 << 20
    assert err.status == "error", err
    assert used < 1.0, used  # reading 2 MiB, not 3 s of a flood (over 1 s of CPU before the cap)


def test_no_device_but_null_zero_urandom(mode):
    """/dev/null, /dev/zero and /dev/urandom work; kvm, fuse, loop devices, disks, memory and
    terminals cannot be opened."""
    code = """
    import json, os
    out = {}
    for dev in ("null", "zero", "urandom", "kvm", "fuse", "loop-control", "loop0", "vda",
                "mem", "tty", "console", "net/tun"):
        try:
            os.close(os.open(f"/dev/{dev}", os.O_RDWR))
            out[dev] = "opened"
        except OSError as e:
            out[dev] = type(e).__name__
    print(json.dumps(out))
    """
    out = _run(code)
    assert [out.pop(d) for d in ("null", "zero", "urandom")] == ["opened"] * 3
    assert "opened" not in out.values(), out


def test_the_trainer_is_out_of_reach(mode, host):
    """Signals (to the trainer, to every process, on I/O), its rlimits, CPUs and priority, its
    memory (/proc, ptrace, process_vm_readv), a pidfd, io_uring; the mode, times and links of its
    files: every attempt fails, and the trainer is as it was."""
    me, keep = os.getpid(), host["secret"]
    code = f"""
    import ctypes, fcntl, json, os, resource, signal
    libc = ctypes.CDLL(None, use_errno=True)
    out = {{}}
    def attempt(name, call, *args):
        try:
            ret = call(*args)
            out[name] = "done" if ret is None or ret is not None and ret != -1 else "refused"
        except OSError as e:
            out[name] = type(e).__name__
    attempt("kill", os.kill, {me}, signal.SIGKILL)
    attempt("kill_all", os.kill, -1, signal.SIGKILL)
    attempt("prlimit", resource.prlimit, {me}, resource.RLIMIT_NOFILE, (3, 3))
    attempt("affinity", os.sched_setaffinity, {me}, {{0}})
    attempt("nice", os.setpriority, os.PRIO_PROCESS, {me}, 19)
    attempt("nice_user", os.setpriority, os.PRIO_USER, os.getuid(), 19)
    attempt("environ", open, "/proc/{me}/environ")
    attempt("mem", open, "/proc/{me}/mem", "r+b")
    attempt("pidfd", os.pidfd_open, {me})
    attempt("ptrace", libc.ptrace, 16, {me}, 0, 0)
    local = (ctypes.c_char * 8)()
    iov = (ctypes.c_void_p * 2)(ctypes.addressof(local), 8)
    attempt("vm_read", libc.process_vm_readv, {me}, iov, 1, iov, 1, 0)
    attempt("io_uring", libc.syscall, 425, 8, ctypes.create_string_buffer(120))
    r, w = os.pipe()
    attempt("sigio_owner", fcntl.fcntl, r, fcntl.F_SETOWN, {me})
    attempt("chmod", os.chmod, {keep!r}, 0o777)
    attempt("utime", os.utime, {keep!r}, (0, 0))
    attempt("truncate", os.truncate, {keep!r}, 0)
    attempt("link", os.link, {keep!r}, "stolen")
    attempt("symlink_read", lambda: os.symlink({keep!r}, "s") or open("s").read())
    print(json.dumps(out))
    """
    limits, cpus = resource.getrlimit(resource.RLIMIT_NOFILE), os.sched_getaffinity(0)
    nice, stat = os.getpriority(os.PRIO_PROCESS, 0), os.stat(keep)
    out = _run(code)
    assert "done" not in out.values(), out
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == limits and os.sched_getaffinity(0) == cpus
    assert os.getpriority(os.PRIO_PROCESS, 0) == nice
    after = os.stat(keep)
    assert (after.st_mode, after.st_mtime_ns, after.st_size) == (
        stat.st_mode,
        stat.st_mtime_ns,
        stat.st_size,
    )
    assert open(keep).read() == "s3cr3t-token-42"


def _tasks_on_host():
    return sum(len(os.listdir(f"/proc/{p}/task")) for p in os.listdir("/proc") if p.isdigit())


def test_a_job_cannot_exhaust_the_hosts_tasks(mode):
    """A program that starts threads until it cannot (small stacks: its memory limit does not stop
    it) is held at its job's cap of tasks (a pids cgroup of its own, else RLIMIT_NPROC), and an
    honest program that starts a thread meanwhile, here or in a job, runs. The attack stops itself
    at 3,000 threads, and runs only where the host has room for it four times over."""
    headroom = int(open("/proc/sys/kernel/pid_max").read()) - _tasks_on_host()
    if headroom < 4 * 3000:
        pytest.skip(f"only {headroom} free PIDs on this host")
    attack = """
    import _thread, threading, time
    threading.stack_size(1 << 15)
    n = 0
    try:
        for _ in range(3000):
            _thread.start_new_thread(time.sleep, (2.5,))
            n += 1
    except RuntimeError:
        pass
    print(n, flush=True)
    time.sleep(2.5)
    """
    honest = "import threading\nt = threading.Thread(target=print, args=(7,))\nt.start()\nt.join()"
    capped = programs.failures["task cap"]
    with ThreadPoolExecutor(2) as ex:
        held = ex.submit(programs.run_code, textwrap.dedent(attack), timeout=20)
        time.sleep(1.0)
        beside = programs.run_code(honest)
        tests = {"inputs": ["1", "2"], "outputs": ["7", "7"]}
        graded = programs.run_tests(honest, tests)
        r = held.result()
    assert r.stdout.strip().isdigit() and int(r.stdout) < 256, r
    assert int(r.stdout) < isolation.TASKS and "tasks" in sandbox.isolation(), r
    assert beside.stdout == "7\n" and [o.output for o in graded] == ["7\n", "7\n"]
    if "a pids cgroup of its own" in sandbox.isolation():  # a fallback job's cgroup: counted
        assert programs.failures["task cap"] == capped + 1 and isolation.AT_CAP in r.stderr
    assert _no_leftovers()


def test_without_a_pids_cgroup_the_cap_is_nproc_or_said_missing(mode, monkeypatch):
    """Where no pids cgroup can be written: an isolated job, a user of its own namespace, is held
    by RLIMIT_NPROC; the fallback's jobs are the trainer's user (RLIMIT_NPROC would count the
    trainer's threads, and binds no root): its start-up line says the cap is missing."""
    monkeypatch.setattr(isolation, "task_cgroup", _no_cgroup)
    try:
        line = sandbox.start(mode)
        attack = "import _thread, threading, time\nthreading.stack_size(1 << 15)\nn = 0\n"
        attack += "try:\n    for _ in range(600):\n        _thread.start_new_thread(time.sleep, "
        r = programs.run_code(attack + "(2,))\n        n += 1\nfinally:\n    print(n)", timeout=20)
        if mode == "isolated":
            assert "RLIMIT_NPROC" in line and int(r.stdout) < isolation.TASKS, (line, r)
        else:
            assert "NO cap on a job's tasks" in line, line
    finally:
        monkeypatch.undo()
        sandbox.start(mode)


def _no_cgroup(name):
    return ""


def test_a_program_holds_only_the_input_of_its_test(mode):
    """Each test's program holds its own input and no other test's: not among its objects, not in
    its memory (read where it can read /proc/self/mem), stdin and call tests."""
    look = """
    import gc, re, sys
    def seen():
        found = set()
        for o in gc.get_objects():
            found |= set(re.findall(r"hidden-(\\d+)-", repr(o)[:100000]))
        try:
            mem = open("/proc/self/mem", "rb", buffering=0)
            for line in open("/proc/self/maps"):
                span, perms = line.split()[:2]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if perms.startswith("r") and hi - lo < (1 << 30):
                    try:
                        mem.seek(lo)
                        found |= set(re.findall(rb"hidden-(\\d+)-", mem.read(hi - lo)))
                    except (OSError, ValueError, OverflowError):
                        pass
        except OSError:
            pass
        return " ".join(sorted({x if isinstance(x, str) else x.decode() for x in found}))
    """
    stdin = textwrap.dedent(look) + "x = input()\nprint(seen())"
    inputs = [f"hidden-{k}-" for k in range(5)]
    out = programs.run_tests(stdin, {"inputs": inputs, "outputs": [""] * 5})
    assert [o.output for o in out] == [f"{k}\n" for k in range(5)], out
    call = textwrap.dedent(look) + "def f(x):\n    return seen()"
    tests = {"inputs": [[x] for x in inputs], "outputs": [""] * 5, "fn_name": "f"}
    out = programs.run_tests(call, tests)
    # a call test's process may have kept the tests before its own (they were its own), no later
    for k, o in enumerate(out):
        seen = set(json.loads(o.output).split())
        assert str(k) in seen and seen <= {str(j) for j in range(k + 1)}, out


def test_jobs_share_no_watch_lock_or_mount_list(mode):
    """inotify, fanotify, dnotify, flock and fcntl's locks and leases, listmount/statmount: each a
    way for one job to see another's (or the trainer's) files being used; fchmod, fchown and
    fsetxattr on a descriptor: a way around the path-based denials. All refused."""
    probe = """
    import ctypes, fcntl, json, os, struct, sys
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    lib = os.path.dirname(os.__file__) + "/os.py"
    fd = os.open(lib, os.O_RDONLY)
    def ok(name, ret):
        out[name] = "allowed" if ret >= 0 else os.strerror(ctypes.get_errno())
    ok("inotify_init1", libc.inotify_init1(0))
    ok("fanotify_init", libc.fanotify_init(0, 0))
    ok("flock", libc.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
    lock = struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0)
    for name, cmd in (("F_SETLK", fcntl.F_SETLK), ("F_GETLK", fcntl.F_GETLK), ("F_OFD_SETLK", 37)):
        try:
            fcntl.fcntl(fd, cmd, lock)
            out[name] = "allowed"
        except OSError as e:
            out[name] = e.strerror
    ok("F_NOTIFY", libc.fcntl(os.open(".", os.O_RDONLY), 1026, 0x80000001))
    buf = ctypes.create_string_buffer(4096)
    req = struct.pack("IIQQQ", 32, 0, 0xFFFFFFFFFFFFFFFF, 0, 0)  # the root mount, from the start
    ok("listmount", libc.syscall(458, req, buf, 512, 0))
    ok("statmount", libc.syscall(457, req, buf, 4096, 0))
    st = os.fstat(fd)  # (to what it is: the probe changes nothing where it succeeds)
    ok("fchmod", libc.fchmod(fd, st.st_mode & 0o7777))
    ok("fchown", libc.fchown(fd, st.st_uid, st.st_gid))
    ok("fsetxattr", libc.fsetxattr(fd, b"user.x", b"1", 1, 0))
    ok("fremovexattr", libc.fremovexattr(fd, b"user.x"))  # (what it set, if it could)
    # the page cache: drop another's pages, or ask which are there (not by timing)
    ok("fadvise_dontneed", libc.posix_fadvise(fd, 0, 4096, 4) and -1)  # (it returns the errno)
    libc.mmap.restype = ctypes.c_void_p
    page = ctypes.c_void_p(libc.mmap(None, 4096, 1, 1, fd, ctypes.c_long(0)))  # read, shared
    ok("mincore", libc.mincore(page, 4096, ctypes.create_string_buffer(1)))
    ok("madvise_pageout", libc.madvise(page, 4096, 21))
    cstat = ctypes.create_string_buffer(64)
    ok("cachestat", libc.syscall(451, fd, struct.pack("QQ", 0, 4096), cstat, 0))
    print(json.dumps(out))
    """
    out = _run(probe)
    assert "allowed" not in out.values(), out


def test_a_test_limit_holds_whatever_the_program_does(mode):
    """The first test's program closes its pipes and sleeps, or stops its process group: it is
    that test's timeout, and the tests after it run in their own time (were the harness waiting on
    it, or stopped with it, they would time out too)."""
    prelude = "import os, signal, time\nx = input()\nif x == '0':\n"
    for attack in (
        "    for fd in (1, 2, 4):\n        os.close(fd)\n    time.sleep(60)\n",
        "    os.kill(0, signal.SIGSTOP)\n",
        "    os.killpg(0, signal.SIGSTOP)\n",
    ):
        tests = {"inputs": ["0", "1", "2"], "outputs": ["0", "1", "2"]}
        out = programs.run_tests(prelude + attack + "print(x)", tests, 2.0, budget=25.0)
        assert [o.status for o in out] == ["timeout", "ok", "ok"], (attack, out)
    assert _no_leftovers()


def test_a_fallback_folder_counts_its_unlinked_files(mode):
    """Files written, held open and unlinked count in the folder's bound: a program that writes
    128 MiB that way into a 64 MiB folder is stopped (isolated: its tmpfs is full; fallback: the
    watcher kills it)."""
    fill = """
    import os, time
    held, written = [], 0
    try:
        for k in range(12):
            f = open(f"u{k}", "wb")
            held.append(f)
            os.unlink(f"u{k}")
            for _ in range(11):
                f.write(bytes(1 << 20))
                f.flush()
                written += 1
    except OSError:
        pass
    time.sleep(1.5)
    print(written)
    """
    r = programs.run_code(textwrap.dedent(fill), timeout=20)
    if r.status == "ok":
        assert int(r.stdout) <= isolation.SCRATCH >> 20, r
    else:
        assert "folder" in r.stderr, r


def test_an_isolated_job_is_never_the_host_root(isolated):
    """An isolated job is JOB_UID inside its own user namespace and, seen from the host, nobody
    under a root trainer (else the trainer's own user), with no capability."""
    seen = []

    def watch():
        time.sleep(0.5)
        for pid in _descendants(isolation._server.proc.pid):
            status = open(f"/proc/{pid}/status").read()
            uids = re.search(r"^Uid:\s+(.*)$", status, re.M)[1].split()
            caps = re.search(r"^CapEff:\s+(\w+)$", status, re.M)[1]
            seen.append((uids, int(caps, 16)))

    with ThreadPoolExecutor(1) as ex:
        f = ex.submit(watch)
        r = programs.run_code("import os, time\nprint(os.getuid(), os.geteuid())\ntime.sleep(1.5)")
        f.result()
    assert r.stdout.split() == [str(isolation.JOB_UID)] * 2
    jobs = [(uids, caps) for uids, caps in seen if uids == [str(_host_uid())] * 4]
    assert jobs and all(caps == 0 for _, caps in jobs), seen
    assert not [u for u, _ in seen if u != ["0"] * 4 and u != [str(_host_uid())] * 4], seen


def test_honest_programs_still_work(mode):
    """The standard library, numpy where installed, recursion, a file in its folder, /dev/urandom,
    the tester template's run_tests: what honest programs do."""
    code = """
    import bisect, collections, dataclasses, datetime, decimal, fractions, functools, heapq
    import itertools, json, math, random, re, statistics, string, sys, tempfile, typing
    sys.setrecursionlimit(20000)
    def depth(n):
        return 0 if n == 0 else 1 + depth(n - 1)
    with tempfile.NamedTemporaryFile("w+") as f:
        f.write("kept")
        f.seek(0)
        text = f.read()
    try:
        import numpy
        total = int(numpy.arange(10).sum())
    except ImportError:
        total = 45
    print(json.dumps([depth(10000), text, total, len(open("/dev/urandom", "rb").read(8))]))
    """
    assert _run(code) == [10000, "kept", 45, 8]


def test_the_unsafe_switch_takes_exactly_1_and_the_mode_is_said_once(monkeypatch, capfd):
    """METAAGENT_UNSAFE_SANDBOX and METAAGENT_SANDBOX take their documented values or fail (no
    guess: "false" once turned the unsafe mode on); METAAGENT_SANDBOX=fallback forces the
    fallback; start() prints its mode, and what it stops, once."""
    try:
        for name, value in ((sandbox.UNSAFE_ENV, "false"), (sandbox.UNSAFE_ENV, "yes")):
            monkeypatch.setenv(name, value)
            with pytest.raises(sandbox.SandboxUnavailable, match="exactly 1"):
                sandbox.start()
            monkeypatch.delenv(name)
        monkeypatch.setenv(sandbox.MODE_ENV, "namespaces")
        with pytest.raises(sandbox.SandboxUnavailable, match="fallback"):
            sandbox.start()
        if not MISSING["fallback"]:
            monkeypatch.setenv(sandbox.MODE_ENV, "fallback")
            capfd.readouterr()
            assert sandbox.start().startswith("fallback")
            lines = [x for x in capfd.readouterr().err.splitlines() if x.startswith("sandbox:")]
            assert len(lines) == 1 and "Landlock ABI" in lines[0], lines
    finally:
        monkeypatch.undo()
        sandbox.start()


# a trainer in a container that forbids unshare (as Docker's default seccomp profile does), and one
# that also lacks Landlock (ENOSYS, as an old kernel answers): the filter goes to every process
# it starts
WITHOUT = """
import sys
sys.path.insert(0, {repo!r})
from machinery import confine
rules = {{"unshare": ("deny",)}}
if {no_landlock}:
    rules["landlock_create_ruleset"] = ("enosys",)
confine.seccomp(rules)
import sandbox
from machinery import programs
try:
    mode = sandbox.start().split(":")[0]
except sandbox.SandboxUnavailable as e:
    mode = None
    print("unavailable:", str(e).splitlines()[0])
if mode is not None:
    print(mode)
    r = programs.run_code("import os\\nprint(6 * 7)\\nos.fork()")
    print(r.stdout.strip(), "PermissionError" in r.stderr)
    r = programs.run_code("print(open('/etc/hostname').read())")
    print(r.status)
"""


@pytest.mark.parametrize(
    "no_landlock, unsafe, said",
    [
        (False, "", ["fallback (no user namespaces)", "42 True", "error"]),
        (True, "", ["unavailable: the isolated sandbox cannot start here: [Errno 1] ..."]),
        (True, "1", ["UNSAFE", "42 True", "ok"]),
    ],
)
def test_without_user_namespaces(no_landlock, unsafe, said):
    """No user namespaces: Landlock and seccomp hold the line (the fallback, chosen by itself); no
    Landlock either: the sandbox refuses, unless METAAGENT_UNSAFE_SANDBOX=1 (seccomp and rlimits
    only: it reads what the trainer can, and says so)."""
    if MISSING["fallback"] and not no_landlock:
        pytest.skip(f"no Landlock here: {MISSING['fallback']}")
    env = {k: v for k, v in os.environ.items() if k not in (sandbox.UNSAFE_ENV, sandbox.MODE_ENV)}
    env[sandbox.UNSAFE_ENV] = unsafe
    code = WITHOUT.format(repo=REPO, no_landlock=no_landlock)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0, out.stderr[-2000:]
    if said[0].startswith("unavailable"):
        assert lines[0].startswith("unavailable: the isolated sandbox cannot start"), lines
        assert "Operation not permitted" in lines[0], lines
    else:
        assert [lines[0].split(":")[0].split(" (")[0], *lines[1:]] == [
            said[0].split(" (")[0],
            *said[1:],
        ], lines
    if unsafe:
        assert "WARNING" in out.stderr


def test_trainer_exit_takes_the_server_down():
    """The fork-server and its jobs die with the trainer (no orphans when the trainer crashes)."""
    code = (
        f"import sys, time; sys.path.insert(0, {REPO!r}); import sandbox; "
        "from machinery import isolation, programs; sandbox.start(); import threading; "
        "threading.Thread(target=programs.run_code, args=('import time; time.sleep(100)',),"
        " kwargs={'timeout': 100}, daemon=True).start(); time.sleep(1.5); "
        "print(isolation._server.proc.pid, flush=True); "
        "import os; os._exit(0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pids = list(map(int, out.stdout.split()))
    assert pids, out.stderr[-2000:]
    for pid in pids:
        for _ in range(100):
            if (
                not os.path.exists(f"/proc/{pid}")
                or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
            ):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the sandbox outlived its trainer")


def test_background_work_ends_however_many_wait_to_be_collected():
    """isolation.Background (where votes are counted): 3,000 counts that end while nothing reads
    the wake socket (the event loop busy elsewhere) are each collected. A full wake socket once
    held a count's thread inside the lock that collect() takes, and the final table's thousands of
    votes froze the main job there."""
    bg, got = isolation.Background(), []

    def then(out, at):
        got.append(out)

    def count_all():
        for k in range(3000):
            bg.run(functools.partial(int, k), then)
        end = time.monotonic() + 120
        while len(got) < 3000 and time.monotonic() < end:
            time.sleep(0.5)  # the counts pile up before anything is collected
            bg.collect()

    worker = threading.Thread(target=count_all, daemon=True)  # (a frozen one is left behind)
    worker.start()
    worker.join(60)
    frozen = worker.is_alive()
    if not frozen:
        bg.close()
    assert not frozen and sorted(got) == list(range(3000))
