"""sandbox.py: running untrusted code (workflow scripts and programs under test) safely and fast.

Model-written code runs in child processes that can hurt nothing: not the trainer, not the files, not each
other. Every job is forked from a pre-started fork-server that lives in its own user, mount, network and
PID namespaces (started by `unshare` with a fresh exec, no root needed). There are two: a light one for
programs under test (nothing pre-imported but two small modules of CALL_HEADER's, so fork and exit are
cheap) and one for workflow scripts (mas, the script language, imported once):

    trainer ──socket──▶ fork-server (PID 1 of its namespace; all mounts read-only; no network)
                          └─ fork ─▶ job (PID 1 of its own PID namespace, own tmpfs as working directory,
                                     no capabilities, rlimits, seccomp: no fork/exec/mount/unshare/ptrace)

Each job talks to the trainer over its own socket (never over stdout, which is only captured, capped).
A job that runs past its wall-clock limit is SIGKILLed; it is PID 1 of its own PID namespace and cannot
fork, so nothing it did can outlive it, and the fork-server reaps it at once (no zombies, no orphans).
Its tmpfs disappears with its mount namespace.

    run_code(code, stdin="", timeout=10.0) -> RunResult(stdout, stderr, status, duration, returncode)
    run_tests(code, tests, timeout_per_test=4.0) -> [TestOutcome(status, output, error)]  (one child)
    run_workflows(scripts, tasks, generate, equal=None, limits=mas.Limits()) -> [WorkflowRun]

A program's tests run in grandchildren of its job (the harness, which they cannot touch): a stdin test in
one of its own; call-based tests in one, in turn, as LeetCode and LiveCodeBench run them (module state
persists from call to call), and in a fresh one after any test that does not return.

run_workflows relays every agent call of every live script to the trainer; when every live script is
blocked on an agent call, the trainer makes ONE batched `generate(calls)` (a tick), with calls sorted by
(run, index), so a seeded rollout gives the same batches whatever the timing of the children.

Not covered: jobs share the fork-server's (empty, loopback-down) network namespace, so two jobs of one
batch could meet over an abstract unix socket; CPU and memory bandwidth are shared (no cgroups).

Where the namespaces cannot be had (unprivileged user namespaces disabled), the sandbox refuses to run
model code (SandboxUnavailable, saying why and what to enable) unless METAAGENT_UNSAFE_SANDBOX=1 or
start(unsafe=True) is set; then it runs with rlimits + seccomp only and warns loudly on every start.

Outputs are compared here (outputs_match, call_output_match), for a script's run_tests and for
reward.code_score alike. A script's vote() is counted here too, in the trainer, with the `equal` that
run_workflows was given (rollout gives reward.math_equal).

Needs: mas.py (the script language), data.py (task_text: what a script receives)
"""

import atexit
import collections
import contextlib
import ctypes
import fcntl
import json
import math
import os
import platform
import re
import resource
import selectors
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

HERE = os.path.dirname(os.path.abspath(__file__))
UNSAFE_ENV = "METAAGENT_UNSAFE_SANDBOX"
MEMORY = 1 << 30            # bytes of address space a job may add on top of the pre-imported server
FILE_SIZE = 16 << 20        # largest file a job may write
TMPFS_SIZE = "64m"          # a job's private working directory
STDERR_CAP = 8192
MAX_FRAME = 64 << 20        # largest protocol message the trainer accepts from a job


class SandboxUnavailable(RuntimeError):
    """The isolation the sandbox needs cannot be had here; the message says why and what to enable."""


@dataclass
class RunResult:
    stdout: str
    stderr: str
    status: str             # "ok" | "error" | "timeout" | "memory" | "killed"
    duration: float
    returncode: int | None  # exit code, or -signal; None when it never ran


@dataclass
class TestOutcome:
    status: str             # as RunResult.status
    output: str             # stdout (stdin tests) or JSON of the return value (call tests)
    error: str | None


@dataclass
class AgentCall:
    run: int
    index: int
    role: str
    instructions: str
    message: str
    messages: list


@dataclass
class CallRecord:
    role: str
    messages: list
    reply: str              # the full reply text (only answer_of(reply) went back to the script)
    completion: object      # whatever generate returned (token ids, log-probs, ...)
    index: int = 0


@dataclass
class WorkflowRun:
    answer: str | None
    error: str | None
    calls: list = field(default_factory=list)
    duration: float = 0.0
    stdout: str = ""


# ---------------------------------------------------------------------------------------------------------
# Linux plumbing: namespaces, mounts, capabilities, seccomp (ctypes; the values are the kernel ABI)

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
_MOUNT_FLAGS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
                "strictatime": MS_STRICTATIME}


def _check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _mount(src, target, fstype, flags, data=None):
    _check(_libc.mount(src and src.encode(), target.encode(), fstype and fstype.encode(), ctypes.c_ulong(flags),
                       data and data.encode()), f"mount {target}")


def _mountinfo():
    """[(mount point, per-mount flags)] of this mount namespace."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])   # \040: space
            flags = 0
            for opt in parts[5].split(","):
                flags |= _MOUNT_FLAGS.get(opt, 0)
            out.append((point, flags))
    return out


def _readonly_everything(keep):
    """Remount every mount read-only except `keep` (the tmpfs that holds the jobs' working directories).
    Locked flags (nosuid, nodev, noexec, atime) must be repeated or the kernel says EPERM."""
    for point, flags in _mountinfo():
        if point == keep or flags & MS_RDONLY:
            continue
        with contextlib.suppress(OSError):   # a mount hidden under another one; checked below
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    seen = {}
    for point, flags in _mountinfo():         # the last mount at a path is the visible one
        seen[point] = flags
    writable = [p for p, f in seen.items() if p != keep and not f & MS_RDONLY]
    if writable:
        raise OSError(f"could not make these mounts read-only: {writable}")


_ARCH = {"x86_64": dict(audit=0xC000003E, clone=56, clone3=435, deny=[57, 58, 59, 322, 272, 308, 165, 166, 155,
                                                                       161, 101, 321, 323, 250, 298, 428, 429,
                                                                       430, 431, 432, 442, 310, 311]),
         "aarch64": dict(audit=0xC00000B7, clone=220, clone3=435, deny=[221, 281, 97, 268, 40, 39, 41, 51, 117,
                                                                        280, 282, 219, 241, 428, 429, 430, 431,
                                                                        432, 442, 270, 271])}
# denied: fork vfork execve execveat unshare setns mount umount2 pivot_root chroot ptrace bpf userfaultfd
# keyctl perf_event_open open_tree move_mount fsopen fsconfig fsmount mount_setattr process_vm_readv/writev


def _seccomp_no_spawn():
    """Install a seccomp filter: no new processes (threads are fine), no exec, no mount/namespace/ptrace
    syscalls. clone3 says ENOSYS so that libc falls back to clone, whose flags a filter can read."""
    a = _ARCH.get(platform.machine())
    if a is None:
        raise OSError(f"no seccomp table for {platform.machine()}")
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    allow, kill = 0x7FFF0000, 0x80000000
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, a["audit"]), (0x06, 0, 0, kill), (0x20, 0, 0, 0),
            (0x35, 0, 1, 0x40000000), (0x06, 0, 0, eperm)]         # x32 syscalls: no
    for nr in a["deny"]:
        prog += [(0x15, 0, 1, nr), (0x06, 0, 0, eperm)]
    prog += [(0x15, 0, 1, a["clone3"]), (0x06, 0, 0, enosys),
             (0x15, 0, 3, a["clone"]), (0x20, 0, 0, 16), (0x45, 1, 0, 0x00010000),   # CLONE_THREAD?
             (0x06, 0, 0, eperm), (0x06, 0, 0, allow)]
    buf = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    filt = ctypes.create_string_buffer(buf)
    fprog = struct.pack("HxxxxxxP", len(prog), ctypes.addressof(filt))
    _check(_libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
    _check(_libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0), "seccomp")


def _drop_capabilities():
    """No capabilities now or after any exec (bounding set, ambient set, securebits)."""
    _libc.prctl(28, 0x2F, 0, 0, 0)                      # SECBIT_NOROOT etc., locked (needs CAP_SETPCAP)
    try:
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
    except OSError:
        last = 40
    for cap in range(last + 1):
        _libc.prctl(24, cap, 0, 0, 0)                   # PR_CAPBSET_DROP (EPERM when unprivileged: fine)
    _libc.prctl(47, 4, 0, 0, 0)                         # PR_CAP_AMBIENT_CLEAR_ALL
    header = struct.pack("Ii", 0x20080522, 0)
    _check(_libc.capset(ctypes.c_char_p(header), ctypes.c_char_p(bytes(24))), "capset")


def _set_limits(cpu_seconds, memory):
    vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    for res, val in ((resource.RLIMIT_AS, vm + memory), (resource.RLIMIT_CPU, cpu_seconds),
                     (resource.RLIMIT_FSIZE, FILE_SIZE), (resource.RLIMIT_NOFILE, 64),
                     (resource.RLIMIT_NPROC, 4096), (resource.RLIMIT_CORE, 0)):
        hard = resource.getrlimit(res)[1]
        val = val if hard == resource.RLIM_INFINITY else min(val, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(res, (val, val))


# ---------------------------------------------------------------------------------------------------------
# Framing: 4-byte length + JSON, on each job's own socket

def _frame(obj):
    data = json.dumps(obj).encode()
    return len(data).to_bytes(4, "big") + data


def _read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("channel closed")
        buf += chunk
    return buf


def _read_frame(fd):
    n = int.from_bytes(_read_exact(fd, 4), "big")
    return json.loads(_read_exact(fd, n))


class _Channel:
    """The job's side of its socket: synchronous request/reply (used by mas.py's helpers)."""

    def __init__(self, fd):
        self.fd = fd

    def send(self, obj):
        _write_all(self.fd, _frame(obj))

    def request(self, obj):
        self.send(obj)
        reply = _read_frame(self.fd)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["ok"]


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# ---------------------------------------------------------------------------------------------------------
# Job side: what runs in a forked child (all of this is our code; the model's code runs in _exec_program /
# _exec_workflow after the child has no way out)

def _open_std():
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)


def _print_user_traceback(exc):
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _exit_code(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _flush():
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()


def _exec_program(code, name="__main__"):
    """Run a program as `python -c` would; return the exit code."""
    g = {"__name__": name, "__builtins__": __builtins__}
    try:
        exec(compile(code, "<program>", "exec"), g)
        return 0, g
    except SystemExit as e:
        return _exit_code(e), g
    except BaseException as e:  # noqa: BLE001 - the program's own failure, reported like python does
        _print_user_traceback(e)
        return 1, g


def _stdin_file(text):
    with open(".stdin", "w", encoding="utf-8") as f:
        f.write(text)
    fd = os.open(".stdin", os.O_RDONLY)
    os.unlink(".stdin")
    os.dup2(fd, 0)
    os.close(fd)


def _job_code(payload, limits):
    _stdin_file(payload.get("stdin", ""))
    os.close(3)
    _open_std()
    _set_limits(limits["cpu"], limits["memory"])
    _seccomp_no_spawn()
    code, _ = _exec_program(payload["code"])
    _flush()
    return code


def _call_args(inp):
    if isinstance(inp, str):   # LiveCodeBench stores call-based inputs as one JSON value per line
        return [json.loads(line) for line in inp.splitlines() if line.strip()]
    return list(inp) if isinstance(inp, list | tuple) else [inp]


def _job_test_calls(code, inputs, fn_name, result_fd, go_fd, limits):
    """Grandchild: the program once, then each call-based test in turn: one line of JSON (which never holds a
    raw newline) per returned value on result_fd, then wait for the job's go on go_fd (so that what the
    program printed to stderr before that line is all in the pipe and is that test's). The first test that
    does not return ends the process just as it would end a process of its own: exception, exit, crash."""
    _stdin_file("")
    _open_std()
    cpu = limits["cpu"]
    _set_limits(cpu * len(inputs), limits["memory"])

    def cpu_for_one_more_test():   # soft RLIMIT_CPU: each test its own CPU seconds, as in a process of its own
        used = resource.getrusage(resource.RUSAGE_SELF)
        with contextlib.suppress(ValueError, OSError):
            hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
            resource.setrlimit(resource.RLIMIT_CPU, (min(int(used.ru_utime + used.ru_stime) + cpu, hard), hard))

    cpu_for_one_more_test()        # the first test's seconds include running the program
    _seccomp_no_spawn()
    code_, g = _exec_program(code, "solution")
    for k, inp in enumerate(inputs):
        if code_ != 0:
            break
        if k:
            try:
                go = os.read(go_fd, 1)
            except OSError:                 # the program closed it: go on unpaced (only its error texts
                go = b"g"                   # could then be misattributed)
            if go != b"g":                  # the job is gone
                return 120
            cpu_for_one_more_test()
        try:
            sol = g.get("Solution")
            fn = getattr(sol(), fn_name) if sol is not None and hasattr(sol, fn_name) else g[fn_name]
            out = fn(*_call_args(inp))
            data = json.dumps(out, default=lambda o: sorted(o) if isinstance(o, set | frozenset) else repr(o))
            _flush()
            _write_all(result_fd, data.encode() + b"\n")
        except SystemExit as e:
            code_ = _exit_code(e)
            if code_ == 0:      # sys.exit(0) in the call ends the process as it always did: status ok, no output
                break
        except BaseException as e:  # noqa: BLE001
            _print_user_traceback(e)
            code_ = 1
    _flush()
    return code_


def _job_test_one(code, inp, result_fd, limits):
    """Grandchild: one stdin test of one program."""
    _stdin_file(str(inp))
    _open_std()
    _set_limits(limits["cpu"], limits["memory"])
    _seccomp_no_spawn()
    code_, _ = _exec_program(code, "__main__")
    _flush()
    return code_


def _job_tests(payload, limits):
    """PID 1 of the job: runs the tests in grandchildren, reports each outcome as it completes.

    A stdin test gets a grandchild of its own: a fresh interpreter, stdin and __main__. The call-based tests
    of one program share a grandchild, as LeetCode's and LiveCodeBench's harnesses do: the program runs once,
    then each test calls the function in turn (a fresh Solution() each time; module state persists). A test
    that ends any other way than by returning (exception, exit, timeout, crash, memory) ends its grandchild
    with it, exactly as it ended a grandchild of its own, and a fresh grandchild runs the tests after it: no
    test can sink another. Expected outputs never enter the job. payload["isolate_calls"]: a grandchild per
    call-based test too (the same results for any program without state across calls; for tests, bench.py)."""
    chan = _Channel(3)
    inputs = list(payload["tests"].get("inputs", []))
    shared = payload["tests"].get("fn_name") and not payload.get("isolate_calls")
    k = 0
    while k < len(inputs):
        for outcome in _run_grandchild(payload, inputs[k:] if shared else inputs[k:k + 1], limits):
            chan.send(outcome)
            k += 1
    return 0


def _run_grandchild(payload, inputs, limits):
    """Run `inputs` (one stdin test, or call-based tests in turn) in one grandchild; yield each test's
    outcome as it completes, up to and including the first that does not end by returning (at least one)."""
    per = payload["timeout_per_test"]
    fn_name = payload["tests"].get("fn_name")
    lim = dict(limits, cpu=int(math.ceil(per)) + 1)
    cap = payload["max_output"]
    pipes = [os.pipe() for _ in range(3)]   # stdout, stderr, result
    go_r, go_w = os.pipe()                    # call tests: the job's go for the next test
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(pipes[0][1], 1)
            os.dup2(pipes[1][1], 2)
            os.dup2(pipes[2][1], 4)
            os.dup2(go_r, 5)
            os.closerange(6, 1 << 16)
            os.close(3)
            os._exit(_job_test_calls(payload["code"], inputs, fn_name, 4, 5, lim) if fn_name else
                     _job_test_one(payload["code"], inputs[0], 4, lim))
        except BaseException:  # noqa: BLE001
            os._exit(120)
    for _, w in pipes:
        os.close(w)
    os.close(go_r)
    out_fd, err_fd, res_fd = (r for r, _ in pipes)
    os.set_blocking(err_fd, False)
    os.set_blocking(go_w, False)
    caps = {out_fd: cap, err_fd: STDERR_CAP, res_fd: cap}
    bufs = {fd: bytearray() for fd in caps}   # the current test's (stdout: the grandchild's)
    done, timed_out, killed_at = 0, False, None
    deadline = time.monotonic() + per

    def keep(fd, data):
        bufs[fd] += data[: max(0, caps[fd] - len(bufs[fd]))]

    with selectors.DefaultSelector() as sel:
        for fd in caps:
            sel.register(fd, selectors.EVENT_READ)
        open_ = set(caps)
        while open_:
            now = time.monotonic()
            if timed_out and now - killed_at > 1.0:   # killed, and its pipes still not closed: give up on them
                bufs = {fd: bytearray() for fd in caps}
                break
            if not timed_out and now >= deadline:
                os.kill(pid, signal.SIGKILL)
                timed_out, killed_at = True, now
                bufs = {fd: bytearray() for fd in caps}   # a timed-out test: only what comes after the kill
                continue
            for key, _ in sel.select((killed_at + 1.0 if timed_out else deadline) - now):
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(key.fd)
                    open_.discard(key.fd)
                elif key.fd != res_fd or not fn_name or timed_out or done == len(inputs):
                    keep(key.fd, data)
                else:                  # call tests: each line is a test that returned
                    *lines, rest = data.split(b"\n")
                    for line in lines[:len(inputs) - done]:
                        keep(res_fd, line)
                        yield {"status": "ok", "output": bufs[res_fd].decode("utf-8", "replace"), "error": None}
                        done += 1
                        with contextlib.suppress(OSError):   # that test's stderr, to the end
                            while os.read(err_fd, 65536):
                                pass
                        bufs = {fd: bytearray() for fd in caps}
                        deadline = time.monotonic() + per
                        with contextlib.suppress(OSError):   # non-blocking: a program that takes the goes
                            os.write(go_w, b"g")             # cannot stall the job
                    keep(res_fd, rest if done < len(inputs) else b"")
    for fd in (*caps, go_w):
        os.close(fd)
    _, st = os.waitpid(pid, 0)
    if done == len(inputs):
        return
    rc = os.waitstatus_to_exitcode(st)
    err = bufs[err_fd].decode("utf-8", "replace")
    status = _status(rc, err, timed_out)
    yield {"status": status, "output": bufs[res_fd if fn_name else out_fd].decode("utf-8", "replace"),
           "error": None if status == "ok" else (_last_line(err) or ("timeout" if timed_out else f"exit code {rc}"))}


def _job_workflow(payload, limits):
    """The job runs the script in-process; mas.py's helpers talk to the trainer over fd 3."""
    import mas
    chan = _Channel(3)
    mas._channel = chan
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    _open_std()
    _set_limits(limits["cpu"], limits["memory"])
    _seccomp_no_spawn()
    try:
        g = dict(mas.script_globals())
        exec(compile(payload["script"], "<workflow>", "exec"), g)
        wf = g.get("workflow")
        if not callable(wf):
            raise NameError("the script defines no workflow(task) function")
        answer = wf(payload["task"])
        if not isinstance(answer, str):
            msg = {"error": f"workflow returned {type(answer).__name__}, not str"}
        else:
            msg = {"answer": answer[: payload["max_output"]]}
    except SystemExit as e:
        msg = {"error": f"the script called sys.exit({e.code!r})"}
    except BaseException as e:  # noqa: BLE001 - every failure of the script becomes WorkflowRun.error
        msg = {"error": _describe(e)}
    _flush()
    with contextlib.suppress(OSError):
        chan.send(dict(msg, op="done"))
    return 0


def _describe(exc):
    """'ValueError: bad (script line 3)': the exception and the last script line it passed through."""
    line = None
    if isinstance(exc, SyntaxError):
        line = exc.lineno
        text = f"SyntaxError: {exc.msg}"
    else:
        text = traceback.format_exception_only(type(exc), exc)[-1].strip()
        for fr in traceback.extract_tb(exc.__traceback__):
            if fr.filename == "<workflow>":
                line = fr.lineno
    text = text if len(text) < 300 else text[:300] + "..."
    return f"{text} (script line {line})" if line else text


def _job_main(spec, fds, base, isolated):
    """In the forked child: isolate, read the payload, run it, exit. Never returns."""
    code = 121
    try:
        chan, out, err = (fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds[:3])   # no clash with 1-3
        os.setsid()
        _libc.prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE 0: a program under test cannot open its harness's memory
        signal.set_wakeup_fd(-1)
        for s in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        os.dup2(chan, 3)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.closerange(4, 1 << 16)
        if isolated:
            _check(_libc.unshare(CLONE_NEWNS), "unshare(mount)")
            _mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, f"size={TMPFS_SIZE},mode=0755")
            with contextlib.suppress(OSError):   # this job's own /proc: no other job's processes
                _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
            os.chdir(base)
        else:
            _libc.prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG: best effort without a PID namespace
            os.chdir(spec["dir"])
        _drop_capabilities()
        payload = _read_frame(3)
        limits = {"cpu": int(math.ceil(spec["timeout"])) + 1, "memory": spec["memory"]}
        code = {"code": _job_code, "tests": _job_tests, "workflow": _job_workflow}[spec["kind"]](payload, limits)
    except BaseException:  # noqa: BLE001 - our own setup failed: say so on stderr
        with contextlib.suppress(Exception):
            os.write(2, b"sandbox setup failed: " + traceback.format_exc().encode()[-2000:])
    _flush()
    os._exit(code)


# ---------------------------------------------------------------------------------------------------------
# The fork-server: started with a fresh exec, runs inside the namespaces, forks one child per job

def _serve(sock_fd, base, isolated, heavy):
    sock = socket.socket(fileno=sock_fd)
    sys.path.insert(0, HERE)
    if heavy:   # the script language, imported once here rather than in every job
        import mas  # noqa: F401
    else:       # what CALL_HEADER imports that this file does not: 1.3 ms of every call-based program's run
        import heapq  # noqa: F401
        import string  # noqa: F401
    try:
        if isolated:
            _mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            if os.path.isdir("/run"):   # hide the host's unix sockets
                _mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k")
            _readonly_everything(keep=base)
            pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
            probe = os.fork()               # check that a job can do what it must (seccomp, capset, ...)
            if probe == 0:
                os.closerange(3, 1 << 16)
                _drop_capabilities()
                _seccomp_no_spawn()
                os._exit(0)
            if os.waitpid(probe, 0)[1] != 0:
                raise OSError("seccomp/capability set-up failed in a probe child")
        else:
            with contextlib.suppress(OSError):
                probe = os.fork()
                if probe == 0:
                    _drop_capabilities()
                    _seccomp_no_spawn()
                    os._exit(0)
                os.waitpid(probe, 0)
    except OSError as e:
        sock.send(json.dumps({"error": str(e)}).encode())
        return
    sock.send(json.dumps({"ready": True}).encode())
    import gc
    gc.freeze()   # the forked jobs share these pages; the collector must not dirty them
    rpipe, wpipe = os.pipe()
    os.set_blocking(wpipe, False)
    os.set_blocking(rpipe, False)
    signal.set_wakeup_fd(wpipe)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    jobs = {}       # pid -> (job id, status fd, dir)
    by_id = {}
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(rpipe, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fd == rpipe:
                with contextlib.suppress(BlockingIOError):
                    os.read(rpipe, 4096)
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, 65536, 8)
            except OSError:
                data, fds = b"", []
            if not data:        # the trainer is gone: exiting kills every job (we are their PID 1's parent)
                for pid in jobs:
                    with contextlib.suppress(OSError):
                        os.killpg(pid, signal.SIGKILL)
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                return
            spec = json.loads(data)
            if spec["op"] == "kill":
                pid = by_id.get(spec["id"])
                if pid is not None:
                    with contextlib.suppress(OSError):
                        os.killpg(pid, signal.SIGKILL)
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                continue
            d = None
            try:
                d = None if isolated else tempfile.mkdtemp(dir=base)
                spec["dir"] = d
                if isolated:
                    _check(_libc.unshare(CLONE_NEWPID), "unshare(pid)")   # next child: PID 1 of a new ns
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    _job_main(spec, fds, base, isolated)     # never returns
            except OSError as e:    # no fork (memory, pids): this job fails, the server goes on
                with contextlib.suppress(OSError):
                    os.write(fds[3], json.dumps({"rc": None, "error": f"cannot start the job: {e}"}).encode())
                for fd in fds:
                    os.close(fd)
                if d:
                    shutil.rmtree(d, ignore_errors=True)
                continue
            finally:
                if isolated:   # later children (and a failed fork's retry) in a fresh namespace again
                    _check(_libc.setns(pidns, CLONE_NEWPID), "setns(pid)")
            for fd in fds[:3]:
                os.close(fd)
            jobs[pid] = (spec["id"], fds[3], d)
            by_id[spec["id"]] = pid
        while jobs:             # reap every finished job; tell the trainer how it ended
            try:
                pid, st, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid not in jobs:
                continue
            jid, sfd, d = jobs.pop(pid)
            by_id.pop(jid, None)
            with contextlib.suppress(OSError):
                os.write(sfd, json.dumps({"rc": os.waitstatus_to_exitcode(st),
                                          "maxrss": ru.ru_maxrss}).encode())
            os.close(sfd)
            if d:
                shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------
# Trainer side: one shared fork-server, jobs driven by a selector loop per call (thread-safe)

_REFUSAL = """the sandbox cannot isolate model code here: {why}
It needs unprivileged user namespaces (with mount, network and PID namespaces) and seccomp, via `unshare`
from util-linux. To enable: `sysctl -w kernel.unprivileged_userns_clone=1` (Debian/Ubuntu),
`sysctl -w user.max_user_namespaces=15000`, `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`
(Ubuntu 24.04+); in Docker/Kubernetes allow the unshare/clone syscalls (e.g. --security-opt
seccomp=unconfined) or run with a user namespace. To run WITHOUT this isolation (rlimits + seccomp only, no
read-only filesystem, network or PID namespace): set {env}=1 or call sandbox.start(unsafe=True)."""


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # alive, someone else's
        return True
    return True


def remove_stale_bases(tmp=None):
    """Delete the fork-servers' base folders that dead processes left in the temp directory (a SIGKILLed
    trainer cannot clean up; the folder's name holds its pid). Called whenever fork-servers start."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    with contextlib.suppress(OSError):
        for d in os.listdir(tmp):
            m = re.fullmatch(r"metaagent-sandbox-(\d+)-\w+", d)
            if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
                shutil.rmtree(os.path.join(tmp, d), ignore_errors=True)
                removed.append(d)
    return removed


class _Server:
    def __init__(self, unsafe, heavy=False):
        self.unsafe, self.heavy = unsafe, heavy
        remove_stale_bases()
        self.base = tempfile.mkdtemp(prefix=f"metaagent-sandbox-{os.getpid()}-")
        self.lock = threading.Lock()
        self.next_id = 0
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = parent
        self.log = tempfile.TemporaryFile()
        cmd = [sys.executable, "-I", os.path.abspath(__file__), "--serve", str(child.fileno()), self.base,
               "unsafe" if unsafe else "isolated", "heavy" if heavy else "light"]
        if not unsafe:
            unshare = shutil.which("unshare") or "/usr/bin/unshare"
            cmd = [unshare, "--user", "--map-root-user", "--net", "--pid", "--fork", "--mount", "--mount-proc",
                   "--kill-child", "--"] + cmd
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.base}
        try:
            self.proc = __import__("subprocess").Popen(cmd, pass_fds=[child.fileno()], env=env,
                                                       stdin=-3, stdout=self.log, stderr=self.log,
                                                       cwd="/", start_new_session=True)
        except OSError as e:
            child.close()
            raise SandboxUnavailable(_REFUSAL.format(why=f"cannot start {cmd[0]}: {e}", env=UNSAFE_ENV)) from e
        child.close()
        self.sock.settimeout(120)
        try:
            hello = self.sock.recv(65536)
        except OSError:
            hello = b""
        self.sock.settimeout(None)
        msg = json.loads(hello) if hello else {"error": "the fork-server exited at start-up"}
        if "error" in msg:
            self.log.seek(0)
            detail = self.log.read().decode("utf-8", "replace").strip()[-1500:]
            self.close()
            why = msg["error"] + (f"\n{detail}" if detail else "")
            raise SandboxUnavailable(_REFUSAL.format(why=why, env=UNSAFE_ENV))
        self.isolation = ("UNSAFE: no namespaces, no read-only filesystem, network allowed (rlimits + seccomp "
                          "only)" if unsafe else "isolated: user+mount+net+pid namespaces, read-only fs, "
                          "seccomp, rlimits")
        if unsafe:
            print(f"WARNING: sandbox running {self.isolation}; model code can touch this machine",
                  file=sys.stderr, flush=True)

    def alive(self):
        return self.proc.poll() is None

    def submit(self, kind, timeout, memory):
        """Start one job; returns (id, chan, out, err, status) parent-side fds."""
        chan_p, chan_c = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st_r, st_w = os.pipe()
        with self.lock:
            self.next_id += 1
            jid = self.next_id
            spec = {"op": "run", "id": jid, "kind": kind, "timeout": timeout, "memory": memory}
            try:
                socket.send_fds(self.sock, [json.dumps(spec).encode()], [chan_c.fileno(), out_w, err_w, st_w])
            finally:
                chan_c.close()
                for fd in (out_w, err_w, st_w):
                    os.close(fd)
        return jid, chan_p, out_r, err_r, st_r

    def kill(self, jid):
        with self.lock, contextlib.suppress(OSError):
            self.sock.send(json.dumps({"op": "kill", "id": jid}).encode())

    def close(self):
        with contextlib.suppress(OSError):
            self.sock.close()
        proc = getattr(self, "proc", None)
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)


# Two fork-servers: a light one (nothing pre-imported: forks and exits fast) for programs under test, and
# a heavy one (mas pre-imported) for workflow scripts.
_servers = {}
_server_lock = threading.Lock()
_unsafe = None
atexit.register(lambda: stop())


def _env_unsafe():
    return os.environ.get(UNSAFE_ENV, "") not in ("", "0")


def start(unsafe=None):
    """Start (or restart) the fork-servers and return a line describing their isolation.

    Call it early (before torch/vLLM spawn threads is best; it is a fresh exec either way). unsafe=None
    reads METAAGENT_UNSAFE_SANDBOX. Raises SandboxUnavailable when isolation cannot be had."""
    global _unsafe
    stop()
    with _server_lock:
        _unsafe = _env_unsafe() if unsafe is None else bool(unsafe)
        for heavy in (False, True):
            _servers[heavy] = _Server(_unsafe, heavy)
        return _servers[False].isolation


def isolation():
    """The isolation line of the running fork-servers (starting them if needed): for every log."""
    return _get().isolation


def stop():
    with _server_lock:
        for s in _servers.values():
            s.close()
        _servers.clear()


def _get(heavy=False):
    with _server_lock:
        s = _servers.get(heavy)
        if s is None or not s.alive():
            if s is not None:
                s.close()
            s = _servers[heavy] = _Server(_env_unsafe() if _unsafe is None else _unsafe, heavy)
        return s


class _Job:
    """One job seen from the trainer: its fds, buffers, deadline, and how it ended."""

    def __init__(self, server, kind, payload, timeout, max_output, memory=MEMORY):
        self.server, self.kind, self.timeout = server, kind, timeout
        self.max_output = max_output
        self.t0 = time.monotonic()
        self.deadline = self.t0 + timeout
        self.paused_at = None
        self.out, self.err, self.err_tail = bytearray(), bytearray(), b""
        self.inbuf, self.sendbuf = bytearray(), bytearray(_frame(payload))
        self.messages = []
        self.status_raw = b""
        self.rc = None
        self.kill_reason = None
        self.killed_at = None
        self.open = set()
        try:
            self.id, self.chan, self.out_fd, self.err_fd, self.st_fd = server.submit(kind, timeout, memory)
        except OSError as e:
            self.id, self.chan = None, None
            self.kill_reason = f"sandbox server failed: {e}"
            return
        self.chan.setblocking(False)
        self.open = {self.chan.fileno(), self.out_fd, self.err_fd, self.st_fd}

    @property
    def finished(self):
        return not self.open

    def kill(self, reason):
        if self.kill_reason is None:
            self.kill_reason = reason
        if self.killed_at is None:
            self.killed_at = time.monotonic()
        if self.id is not None:
            self.server.kill(self.id)

    def pause(self):
        self.paused_at = time.monotonic()

    def resume(self):
        if self.paused_at is not None:
            self.deadline += time.monotonic() - self.paused_at
            self.paused_at = None

    def reply(self, obj):
        self.sendbuf += _frame(obj)
        self.resume()

    def on_readable(self, fd):
        try:
            data = self.chan.recv(65536) if fd == self.chan.fileno() else os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.open.discard(fd)
            return
        if fd == self.out_fd:
            if len(self.out) < self.max_output:
                self.out += data[: self.max_output - len(self.out)]
        elif fd == self.err_fd:
            if len(self.err) < STDERR_CAP:
                self.err += data[: STDERR_CAP - len(self.err)]
            else:
                self.err_tail = (self.err_tail + data)[-1024:]
        elif fd == self.st_fd:
            self.status_raw += data
        else:
            self.inbuf += data
            while len(self.inbuf) >= 4:
                n = int.from_bytes(self.inbuf[:4], "big")
                if n > MAX_FRAME:
                    self.inbuf.clear()
                    self.kill("protocol violation: oversized message on the sandbox channel")
                    return
                if len(self.inbuf) < 4 + n:
                    break
                raw, self.inbuf = bytes(self.inbuf[4:4 + n]), self.inbuf[4 + n:]
                try:
                    msg = json.loads(raw)
                    if not isinstance(msg, dict):
                        raise ValueError
                except ValueError:
                    self.kill("protocol violation: malformed message on the sandbox channel")
                    return
                self.messages.append(msg)

    def flush_send(self):
        if not self.sendbuf or self.chan is None:
            return
        try:
            n = self.chan.send(self.sendbuf, socket.MSG_NOSIGNAL)
            del self.sendbuf[:n]
        except BlockingIOError:
            pass
        except OSError:
            self.sendbuf.clear()

    def close(self):
        if self.chan is not None:
            self.chan.close()
            for fd in (self.out_fd, self.err_fd, self.st_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.chan = None
        if self.status_raw:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                st = json.loads(self.status_raw)
                self.rc = st["rc"]
                if st.get("error") and self.kill_reason is None:
                    self.kill_reason = f"sandbox server: {st['error']}"

    def stderr_text(self):
        s = self.err.decode("utf-8", "replace")
        if self.err_tail:
            s += "\n...[stderr truncated]...\n" + self.err_tail.decode("utf-8", "replace")
        return s


def _last_line(text):
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:500] if lines else ""


def _status(rc, stderr, timed_out):
    if timed_out or rc == -signal.SIGXCPU:
        return "timeout"
    if rc == 0:
        return "ok"
    if "MemoryError" in _last_line(stderr):
        return "memory"
    if rc is None or rc < 0:
        return "killed"
    return "error"


def _drive(jobs, on_message=None, on_idle=None, on_finish=None, until=None):
    """The trainer-side event loop over jobs (a list the callbacks may extend): feed payloads, collect
    output and messages, enforce deadlines, report each job once when it has ended. until(): stop as soon
    as it holds (the jobs not yet ended are killed, as when the loop is left any other way)."""
    sel = selectors.DefaultSelector()
    reg, done = {}, set()
    # Only the jobs not yet reported are visited: a rollout of thousands of scripts would otherwise make
    # every turn of this loop walk every job ever started (the SFT traces spent seconds on that alone).
    live, seen = [], 0
    try:
        while True:
            live.extend(jobs[seen:])
            seen = len(jobs)
            for j in list(live):
                if id(j) in done:
                    continue
                fds = reg.setdefault(id(j), set())
                for fd in j.open - fds:
                    sel.register(fd, selectors.EVENT_READ, j)
                    fds.add(fd)
                for fd in fds - j.open:
                    sel.unregister(fd)
                    fds.discard(fd)
                msgs, j.messages = j.messages, []
                for m in msgs:
                    if on_message:
                        on_message(j, m)
                if j.finished:
                    done.add(id(j))
                    j.close()
                    if on_finish:
                        on_finish(j)
            if on_idle:
                on_idle()
            live.extend(jobs[seen:])   # jobs the callbacks started this turn
            seen = len(jobs)
            live = [j for j in live if id(j) not in done]
            if not live or (until is not None and until()):
                return
            now = time.monotonic()
            for j in live:
                j.flush_send()
                if j.kill_reason is None and j.paused_at is None and now >= j.deadline:
                    j.kill(f"timeout after {j.timeout:g}s")
                elif j.killed_at is not None and now - j.killed_at > 10.0:   # the server is gone: give up
                    j.open.clear()
            running = [j for j in live if j.kill_reason is None and j.paused_at is None]
            wait = min([j.deadline - now for j in running] + [0.5])
            if any(j.sendbuf for j in live) or any(j.finished for j in live):
                wait = 0.0
            for key, _ in sel.select(max(0.0, wait)):
                key.data.on_readable(key.fd)
    finally:
        for j in jobs:
            if not j.finished:
                j.kill("aborted")
            j.close()
        sel.close()


def _code_payload(code, stdin):
    return {"code": str(code), "stdin": str(stdin)}


def _to_result(job):
    err = job.stderr_text()
    if job.kill_reason and job.kill_reason.startswith("sandbox server"):
        return RunResult(job.out.decode("utf-8", "replace"), job.kill_reason, "error",
                         time.monotonic() - job.t0, None)
    timed_out = bool(job.kill_reason and job.kill_reason.startswith("timeout"))
    if job.rc is None and not timed_out:
        err += "\nsandbox: the fork-server died during the job"
    status = _status(job.rc, err, timed_out)
    if status == "killed" and job.rc is not None and job.rc < 0:
        err += f"\nkilled by signal {signal.Signals(-job.rc).name}"
    if timed_out:
        err += f"\n{job.kill_reason}"
    elif job.kill_reason:
        err += f"\n{job.kill_reason}"
    return RunResult(job.out.decode("utf-8", "replace"), err.strip(), status, time.monotonic() - job.t0, job.rc)


def run_code(code, stdin="", timeout=10.0, *, max_output=1 << 20, memory=MEMORY):
    """Run one Python program in a sandbox child; never raises for anything the program does."""
    job = _Job(_get(), "code", _code_payload(code, stdin), timeout, max_output, memory)
    _drive([job])
    return _to_result(job)


def _tests_payload(code, tests, timeout_per_test, max_output, isolate_calls=False):
    t = {"inputs": list((tests or {}).get("inputs") or []), "fn_name": (tests or {}).get("fn_name")}
    return {"code": str(code), "tests": t, "timeout_per_test": timeout_per_test, "max_output": max_output,
            "isolate_calls": bool(isolate_calls)}


def _tests_outcomes(job, n):
    outs = [TestOutcome(m.get("status", "error"), str(m.get("output", "")), m.get("error"))
            for m in job.messages_seen][:n]
    if len(outs) < n:   # the harness was killed (overall deadline) or died: the rest did not run
        res = _to_result(job)
        why = res.status if res.status != "ok" else "error"
        outs += [TestOutcome(why, "", _last_line(res.stderr) or why) for _ in range(n - len(outs))]
    return outs


def _new_tests_job(server, code, tests, timeout_per_test, max_output, memory, isolate_calls=False):
    payload = _tests_payload(code, tests, timeout_per_test, max_output, isolate_calls)
    n = len(payload["tests"]["inputs"])
    job = _Job(server, "tests", payload, n * (timeout_per_test + 0.5) + 5.0, max_output, memory)
    job.messages_seen = []
    job.n_tests = n
    return job


def run_tests(code, tests, timeout_per_test=4.0, *, max_output=1 << 20, memory=MEMORY, isolate_calls=False):
    """Run one program on every test (all in ONE sandbox child); raw outputs back, no comparison here.

    tests: {"inputs": [...], "outputs": [...], "fn_name": str|None}. For stdin tests each input is the stdin
    text and the outcome's output is stdout; for call tests each input is the list of positional arguments
    and the output is the JSON of the return value. Call tests share one process until one fails (see
    _job_tests); isolate_calls=True gives each its own, as stdin tests always have."""
    if not (tests or {}).get("inputs"):
        return []
    job = _new_tests_job(_get(), code, tests, timeout_per_test, max_output, memory, isolate_calls)
    _drive([job], on_message=lambda j, m: j.messages_seen.append(m),
           until=lambda: len(job.messages_seen) >= job.n_tests)    # every outcome is in: not its exit too
    return _tests_outcomes(job, job.n_tests)


# ---------------------------------------------------------------------------------------------------------
# Workflows

def _task_parts(task, short=False):
    """(text the script receives, visible tests) of a task dict (data.py format) or plain text."""
    if isinstance(task, str):
        return task, None
    import data  # here, not at the top: the fork-servers run this file with nothing else on their path
    return data.task_text(task, short=short), task.get("public_tests") or None


# ---------------------------------------------------------------------------------------------------------
# Comparing outputs with expected ones, as LiveCodeBench does: for a script's run_tests here and for the
# hidden tests' grader, reward.code_score

FLOAT_TOL = 1e-6            # relative/absolute tolerance for non-integer numbers in outputs
# What LeetCode-style solutions take for granted (their starter code says `List[int]`), as LiveCodeBench's
# harness provides it; prepended to programs under call-based tests.
CALL_HEADER = ("from typing import *\nfrom collections import *\nfrom heapq import *\nfrom bisect import *\n"
               "from itertools import *\nfrom functools import *\n"
               "import bisect, collections, functools, heapq, itertools, math, re, string\n")


def _stripped_lines(text):
    return [line.strip() for line in str(text).strip().split("\n")]


def _tokens_equal(a, b):
    try:
        x, y = Decimal(a), Decimal(b)
    except InvalidOperation:
        return False
    if not (x.is_finite() and y.is_finite()):
        return False
    if x == y:
        return True
    if "." not in a + b and "e" not in (a + b).lower():
        return False                  # integers compare exactly
    return abs(x - y) <= Decimal(FLOAT_TOL) * max(Decimal(1), abs(y))


def outputs_match(got, expected):
    """LiveCodeBench's stdout comparison: same number of whitespace-stripped lines, each equal as text or,
    token by token, as numbers (integers exactly, others within FLOAT_TOL)."""
    g, e = _stripped_lines(got), _stripped_lines(expected)
    if len(g) != len(e):
        return False
    for a, b in zip(g, e):
        if a == b:
            continue
        ta, tb = a.split(), b.split()
        if len(ta) != len(tb) or not all(_tokens_equal(x, y) for x, y in zip(ta, tb)):
            return False
    return True


def _values_equal(got, expected):
    """Return values compared as JSON values; floats within FLOAT_TOL, tuples as lists."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return got is expected if isinstance(got, bool) and isinstance(expected, bool) else False
    if isinstance(expected, int | float) and isinstance(got, int | float):
        if isinstance(expected, int) and isinstance(got, int):
            return got == expected
        return math.isclose(got, expected, rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL)
    if isinstance(expected, list | tuple) and isinstance(got, list | tuple):
        return len(got) == len(expected) and all(_values_equal(a, b) for a, b in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(_values_equal(got[k], expected[k]) for k in expected)
    return got == expected


def call_output_match(output, expected):
    """A call test: `output` is the JSON text of the return value, `expected` the expected JSON value."""
    try:
        got = json.loads(output)
    except (ValueError, TypeError):
        return False
    return _values_equal(got, expected)


def tests_report(outcomes, tests):
    """The text run_tests(code) gives a script: 'PASS 3/3', or 'FAIL 1/3' and the first failing case.
    Outputs are compared as reward.code_score compares them (the hidden tests' grader)."""
    expected = list((tests or {}).get("outputs") or [])
    inputs = list((tests or {}).get("inputs") or [])
    call = bool((tests or {}).get("fn_name"))
    fails = []
    for k, (o, e) in enumerate(zip(outcomes, expected)):
        ok = o.status == "ok" and (call_output_match(o.output, e) if call else
                                   outputs_match(o.output, e if isinstance(e, str) else json.dumps(e)))
        if not ok:
            fails.append(k)
    n = len(expected)
    if not fails:
        return f"PASS {n}/{n}"
    k = fails[0]
    o = outcomes[k]
    got = o.output if o.status == "ok" else f"{o.status}: {o.error}"
    inp = inputs[k] if isinstance(inputs[k], str) else json.dumps(inputs[k])
    exp = expected[k] if isinstance(expected[k], str) else json.dumps(expected[k])
    return f"FAIL {n - len(fails)}/{n}\ninput: {inp[:300]}\nexpected: {exp[:300]}\ngot: {got[:300]}"


def run_workflows(scripts, tasks, generate, *, equal=None, limits=None, timeout=None, max_calls=None,
                  width=None, code_timeout=None, short=False):
    """Run every (scripts[k], tasks[k]) pair concurrently in sandbox children; return one WorkflowRun each.

    Agent calls are relayed here: when every live script waits on an agent call, generate(calls) runs once
    for all of them (calls sorted by (run, index)). A script's wall-clock limit pauses while it waits on
    the trainer (but not while its vote is counted). Nothing a script does raises here: every failure is
    WorkflowRun.error.
    equal: equal(a, b) -> bool, how a script's vote() compares two answers (mas.majority), here in the
      trainer; rollout passes reward.math_equal. None: a script that votes fails, saying so.
    width: at most this many scripts alive at once (default: all).
    short: the tiny world's compact prompts (data.task_text(short=True), mas.agent_messages(short=True))."""
    import mas  # here, not at the top: the light fork-server runs this file and imports nothing else
    lim = limits or mas.Limits()
    timeout = float(timeout if timeout is not None else lim.timeout)
    max_calls = int(max_calls if max_calls is not None else lim.max_calls)
    max_output = int(lim.max_output)
    code_timeout = float(code_timeout if code_timeout is not None else getattr(lim, "code_timeout", 10.0))
    n = len(scripts)
    results = [WorkflowRun(None, None, [], 0.0) for _ in range(n)]
    if len(tasks) != n:
        for r in results:
            r.error = f"run_workflows: {n} scripts but {len(tasks)} tasks"
        return results
    server, light = _get(heavy=True), _get()
    if server.unsafe:   # the opt-in is repeated in every step's log
        print(f"WARNING: sandbox {server.isolation}", file=sys.stderr, flush=True)
    width = n if width is None else max(1, int(width))
    parts = [_task_parts(t, short) for t in tasks]
    jobs, pending, state = [], [], {}   # state[id(job)] = dict(run, used, waiting)
    todo = collections.deque(range(n))
    scripts_live = {}                   # id -> workflow job not yet reported finished (launch order)

    def launch():
        while todo and len(scripts_live) < width:
            k = todo.popleft()
            payload = {"script": str(scripts[k]), "task": parts[k][0], "max_output": max_output}
            job = _Job(server, "workflow", payload, timeout, max_output)
            state[id(job)] = {"run": k, "used": 0, "waiting": None}
            jobs.append(job)
            scripts_live[id(job)] = job

    def fail(job, why):
        st = state[id(job)]
        if results[st["run"]].error is None:
            results[st["run"]].error = why
        job.kill(why)

    def on_message(job, msg):
        if job.kind != "workflow":
            job.messages_seen.append(msg)
            if job.kind == "run_tests" and len(job.messages_seen) == job.n_tests:
                answer_sub_job(job)   # every outcome is in: the script goes on while the job exits
            return
        st = state[id(job)]
        op = msg.get("op")
        if st["waiting"] is not None and op != "done":
            return fail(job, "protocol violation: a request while another was pending")
        if op == "done":
            st["done"] = True
            if "answer" in msg and isinstance(msg["answer"], str):
                results[st["run"]].answer = msg["answer"][:max_output]
            elif results[st["run"]].error is None:
                results[st["run"]].error = str(msg.get("error", "unknown error"))[:1000]
        elif op == "agent":
            role, ins, message, k = msg.get("role"), msg.get("instructions"), msg.get("message"), msg.get("n", 1)
            if not all(isinstance(x, str) for x in (role, ins, message)) or not isinstance(k, int) or k < 1:
                return fail(job, "bad agent call: role, instructions and message must be strings, n >= 1")
            if st["used"] + k > max_calls:
                return fail(job, f"limit exceeded: more than max_calls={max_calls} agent calls")
            msgs = mas.agent_messages(role, ins, message, short)
            calls = [AgentCall(st["run"], st["used"] + i, role, ins, message, msgs) for i in range(k)]
            st["used"] += k
            st["waiting"] = ("agent", calls, bool(msg.get("many")))
            job.pause()
            pending.extend((job, c) for c in calls)
        elif op == "vote":
            answers = msg.get("answers")
            if not isinstance(answers, list) or len(answers) > mas.MAX_VOTE or \
                    not all(isinstance(a, str) for a in answers):
                return fail(job, f"bad vote call: at most {mas.MAX_VOTE} answers, each a string")
            if equal is None:
                return fail(job, "vote() needs run_workflows(..., equal=...): how two answers are compared")

            def equal_in_time(a, b):   # the count runs on the voting script's clock
                if time.monotonic() >= job.deadline:
                    raise TimeoutError
                return bool(equal(a, b))
            t0 = time.monotonic()
            try:
                job.reply({"ok": mas.majority(answers, equal_in_time)})
            except TimeoutError:
                fail(job, f"timeout after {job.timeout:g}s (counting a vote)")
            except Exception as e:  # noqa: BLE001 - a grader failing on odd answers fails this run only
                fail(job, f"vote failed: {type(e).__name__}: {e}")
            for other in jobs:         # and on no other script's: they waited on this loop meanwhile
                if other is not job and other.paused_at is None:
                    other.deadline += time.monotonic() - t0
        elif op in ("run_python", "run_tests"):
            code = msg.get("code")
            if not isinstance(code, str) or not isinstance(msg.get("input", ""), str):
                return fail(job, f"bad {op} call: code and input must be strings")
            if op == "run_python":
                sub = _Job(light, "code", _code_payload(code, msg.get("input", "")), code_timeout, max_output)
            else:
                pub = parts[st["run"]][1]
                if not pub or not pub.get("inputs"):
                    job.reply({"ok": "PASS 0/0 (no visible tests)"})
                    return
                if pub.get("fn_name"):   # the imports code_score gives call-based programs
                    code = CALL_HEADER + code
                sub = _new_tests_job(light, code, pub, min(4.0, code_timeout), max_output, MEMORY)
            sub.kind = op
            sub.messages_seen = getattr(sub, "messages_seen", [])
            sub.parent_job = job
            st["waiting"] = (op, sub, False)
            job.pause()
            jobs.append(sub)
        else:
            return fail(job, f"protocol violation: unknown request {str(op)[:40]!r}")

    def on_finish(job):
        if job.kind == "workflow":
            st = state[id(job)]
            r = results[st["run"]]
            r.duration = time.monotonic() - job.t0
            r.stdout = job.out.decode("utf-8", "replace")
            if r.answer is None and r.error is None:
                res = _to_result(job)
                why = job.kill_reason or (f"killed by signal {signal.Signals(-job.rc).name}"
                                          if job.rc is not None and job.rc < 0 else None)
                r.error = why or f"the script exited (code {job.rc}) without returning: " + \
                    (_last_line(res.stderr) or "no message")
            elif job.kill_reason and r.error is None:
                r.error, r.answer = job.kill_reason, None
            # drop its pending calls (it died waiting)
            pending[:] = [(j, c) for j, c in pending if j is not job]
            scripts_live.pop(id(job), None)
            launch()
            return
        answer_sub_job(job)

    def answer_sub_job(job):
        """Reply to the script that waits on this run_python/run_tests job (once; it may wait on a later one)."""
        parent = job.parent_job
        st = state[id(parent)]
        if parent.finished or st["waiting"] is None or st["waiting"][1] is not job:
            return
        st["waiting"] = None
        if job.kind == "run_python":
            res = _to_result(job)
            text = res.stdout if res.status == "ok" else \
                f"{res.stdout}{res.status}: {_last_line(res.stderr) or res.status}"
            parent.reply({"ok": text[:max_output]})
        else:
            pub = parts[st["run"]][1]
            parent.reply({"ok": tests_report(_tests_outcomes(job, job.n_tests), pub)[:max_output]})

    def on_idle():
        live = [j for j in scripts_live.values() if not j.finished]
        if not pending or any(state[id(j)]["waiting"] is None or state[id(j)]["waiting"][0] != "agent"
                              for j in live if j.kill_reason is None and not state[id(j)].get("done")):
            return
        batch = sorted(((j, c) for j, c in pending if j.kill_reason is None and not j.finished),
                       key=lambda jc: (jc[1].run, jc[1].index))
        pending.clear()
        if not batch:
            return
        calls = [c for _, c in batch]
        try:
            outs = list(generate(calls))
            if len(outs) != len(calls):
                raise ValueError(f"generate returned {len(outs)} completions for {len(calls)} calls")
        except Exception as e:  # noqa: BLE001 - the engine failed; those runs fail, the trainer goes on
            for job, _ in batch:
                fail(job, f"generate failed: {type(e).__name__}: {e}")
            return
        replies = {}
        for (job, call), comp in zip(batch, outs):
            text = comp if isinstance(comp, str) else getattr(comp, "text", None)
            if not isinstance(text, str):
                fail(job, "generate returned a completion without text")
                continue
            results[call.run].calls.append(CallRecord(call.role, call.messages, text, comp, call.index))
            replies.setdefault(id(job), (job, []))[1].append(mas.answer_of(text) or "")
        for job, answers in replies.values():
            st = state[id(job)]
            if job.finished or job.kill_reason is not None or st["waiting"] is None:
                continue
            many = st["waiting"][2]
            st["waiting"] = None
            job.reply({"ok": answers if many else answers[0]})

    launch()
    _drive(jobs, on_message=on_message, on_idle=on_idle, on_finish=on_finish)
    for r in results:
        r.calls.sort(key=lambda c: c.index)
    return results


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "--serve":
    _serve(int(sys.argv[2]), sys.argv[3], sys.argv[4] == "isolated", sys.argv[5] == "heavy")
