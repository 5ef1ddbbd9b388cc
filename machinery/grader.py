"""grader.py: a function computed in long-lived worker processes, each call under a hard deadline.
reward.math_equal runs SymPy this way: math-verify's own timeouts use SIGALRM, which works on the
main thread alone, and a pathological expression can take minutes or all the memory. A call that
outlives its deadline has its process killed (the next call starts a fresh one); the trainer never
waits longer than the deadline, and a blow-up dies in the worker.

    pool = Pool("reward._serve_grader", root)    # workers: import reward; reward._serve_grader()
    pool.ask(["x+1", "1+x"], timeout=5.0)        # the function's result, or TIMEOUT
    serve(fn, memory)                            # the worker's loop (what _serve_grader ends in)

Each worker reads one JSON list of arguments a line on stdin and writes one JSON result a line
(null when fn raised); a thread takes an idle worker per call, so callers in threads are served in
parallel. Workers are the caller's own: a forked child starts with none.

Needs: no other file of this project.
"""

import atexit
import contextlib
import json
import os
import resource
import select
import subprocess
import sys
import threading

STARTUP = 120.0  # seconds a worker may take to start (to import SymPy, on a busy machine)
TIMEOUT = object()  # ask's answer when the deadline passed or the worker died


def serve(fn, memory):
    """A worker's loop: fn(*args) for each line of JSON args on stdin, its JSON result on stdout
    (null if fn raised: a MemoryError from the `memory` bytes of address space included)."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints must not corrupt the protocol
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            result = fn(*json.loads(line))
        except Exception:  # noqa: BLE001 - the call's failure: null
            result = None
        out.write(json.dumps(result) + "\n")
        out.flush()


class Worker:
    """One worker process, spoken to over pipes, one line each way."""

    def __init__(self, entry, root):
        module = entry.rsplit(".", 1)[0]
        boot = f"import sys; sys.path.insert(0, sys.argv[1]); import {module}; {entry}()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", boot, root],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        if self.readline(STARTUP) != b"ready":
            self.kill()
            raise OSError(f"a worker of {entry} failed to start")

    def readline(self, timeout):
        """The next line, or None after `timeout` seconds or at the process's end. Each line is
        written at once (shorter than PIPE_BUF), so once the pipe is readable the whole line is
        there."""
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            return None
        return self.proc.stdout.readline().rstrip(b"\n") or None

    def ask(self, args, timeout):
        try:
            self.proc.stdin.write((json.dumps(args) + "\n").encode())
        except OSError:
            return TIMEOUT
        line = self.readline(timeout)
        return TIMEOUT if line is None else json.loads(line)

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


class Pool:
    """Idle workers of `entry` ("module.function", importable from `root`); a thread takes one per
    call."""

    def __init__(self, entry, root):
        self.entry, self.root = entry, root
        self.lock, self.idle = threading.Lock(), []
        atexit.register(self.close)
        os.register_at_fork(after_in_child=self.forget)

    def ask(self, args, timeout):
        """fn(*args) in a worker, or TIMEOUT: the worker was stuck (killed) or died."""
        with self.lock:
            w = self.idle.pop() if self.idle else None
        w = w or Worker(self.entry, self.root)
        result = w.ask(args, timeout)
        if result is TIMEOUT:
            w.kill()
            return TIMEOUT
        with self.lock:
            self.idle.append(w)
        return result

    def forget(self):  # (a forked child: the parent's workers are not its own)
        self.lock, self.idle = threading.Lock(), []

    def close(self):
        with self.lock:
            idle, self.idle = self.idle, []
        for w in idle:
            w.kill()
