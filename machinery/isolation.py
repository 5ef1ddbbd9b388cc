"""isolation.py: the mechanics under sandbox.py: child processes in which model-written code can
hurt nothing (not the trainer, not the files, not each other), and the trainer's event loop that
drives them.

Every job is forked from one pre-started fork-server. Its mode is chosen once, at its start:

    isolated  (user namespaces, the default where the kernel allows them)
      trainer ──socket──▶ fork-server: PID 1 of its own user, mount, PID, network, IPC and UTS
                          namespaces, in an EMPTY ROOT: the Python install and the system's
                          libraries bound read-only (confine.python_roots), /dev/null, /dev/zero,
                          /dev/urandom, its /proc; no file of the host's else, no network
                            └─ fork ─▶ job: PID 1 of its own PID namespace, its own /proc, its
                                       own tmpfs as its folder (/job), user JOB_UID of a user
                                       namespace of its own (the host's nobody when the trainer
                                       is root, the trainer's user otherwise), no capabilities,
                                       Landlock where the kernel has it, seccomp, rlimits
    fallback  (no user namespaces: Docker's default profile, Ubuntu's AppArmor, many clusters;
               or METAAGENT_SANDBOX=fallback)
      the fork-server runs as the trainer does; each job: Landlock (reads: the Python install and
      its folder; writes: its folder only, no folders inside it; no TCP; signals and abstract
      sockets scoped to the job from ABI 6), the same seccomp filter, rlimits, no capabilities; a
      folder of its own under the server's, watched for size; the trainer and the fork-server
      non-dumpable (no same-user process reads their memory)
    unsafe    (neither, and METAAGENT_UNSAFE_SANDBOX=1: exactly "1") seccomp and rlimits only,
              a warning on every start and every run_workflows
    Without namespaces or Landlock, and without the opt-in, start() raises SandboxUnavailable.

What each mode stops is the table in sandbox.py's docstring; start() prints the mode's line once.

A job gets four descriptors from the trainer (passed over the fork-server's socket): its channel, a
socket that carries one JSON object a line each way (the job's payload; a script's requests and
their replies; a harness's outcomes); stdout and stderr, pipes the trainer reads up to caps (past
a cap it closes the pipe: the job's next write fails); and a status pipe on which the fork-server
writes how and when the job ended, {"rc": exit code or -signal, "why": ..., "at": its
time.monotonic(), one clock in every namespace}. At its deadline the trainer has
the fork-server SIGKILL it: PID 1 of its own namespace, unable to fork, it leaves nothing behind,
and its tmpfs goes with its mount namespace. The fork-server, and so every job, ends when the
trainer's end of its socket closes (the trainer exits or dies).

What a job runs once it has no way out (its kind):
    "code"      a program, as `python -c` would run it, its stdin from a file
    "tests"     a harness (the job's PID 1; the programs under test cannot touch it) that runs a
                program on each test input in grandchildren: a stdin test in one of its own;
                call-based tests in one, in turn (module state persists from call to call), and in
                a fresh one after any test that does not return. After each returned call the
                grandchild writes MARK on stderr, then the value as a line of JSON on fd 4: what
                stderr holds after the last MARK is the failing test's own. The inputs stay with
                a keeper (a child that reads the payload, so the harness never holds them): it
                writes each test's input on its grandchild's fd 3 as that test starts, so no
                program holds a later test's input. A grandchild is a session of its own and is
                killed at its test's deadline, whatever it does to its pipes or with signals.
    "workflow"  a workflow script; mas.py's helpers send its requests over the channel and wait for
                replies

A job's memory: `memory` bytes in all, its folder's SCRATCH bytes (tmpfs: memory too; a fallback
folder on disk: the files it lists and those its processes hold open unlinked) counted in them;
what an address-space limit cannot count (memfd, shared memory) is refused by seccomp.

A job's tasks (processes and threads): at most TASKS at once. The fork-server and all its jobs are
in one pids cgroup (v1 or v2, whichever this process can write), beside the trainer's, capped at
half the host's PIDs: the trainer's pools never share the jobs' budget. An isolated job's own cap
is its RLIMIT_NPROC (its user is its own namespace's: the count is the job's alone); a fallback job
is the trainer's user (RLIMIT_NPROC would count the trainer's tasks, and binds no root), so it gets
a pids cgroup of its own: moving a process into a cgroup waits for an RCU grace period (~13 ms
here), which the isolated jobs' start-up does not pay. No cgroup in the fallback: start()'s line
says NO cap.

The trainer's side, thread-safe (one fork-server; each drive() call its own loop):
    start(mode=None) -> str; stop(); isolation() -> str; server()
                                 the fork-server, started on first use
    Job(kind, payload, timeout, max_output, memory, on_message, on_end)
                                 one job, submitted at once
    drive(jobs, idle, until, busy, wake)
                                 send, read, kill at deadlines; on_message, on_end and idle() are
                                 called here (a message whose handler raises fails its job only);
                                 what came while idle() worked is read before a deadline is checked
    Background()                 run(fn, then): fn in a thread beside drive()'s loop, then(result)
                                 in it
    watching(jobs)               around the trainer's long work: when each job said what drive()
                                 reads after it. A job's clock: wall time from its start, less the
                                 time it waits on the trainer (pause(at): from the line that asked,
                                 or its program's end, to the reply); a line said past its deadline
                                 is not handled, and a job that ended past it timed out
    outcome(job) -> (stdout, stderr, status, seconds, returncode)
                                 status: ok | error | timeout | memory | killed

To copy it: Linux on x86-64 or aarch64, kernel 5.3 or later (pidfd), the stdlib, confine.py, and
mas.py for the "workflow" kind (or drop that kind).

Needs: machinery/confine.py (the locks), mas.py (a workflow job runs its script with mas's helpers)
"""

import atexit
import contextlib
import ctypes
import fcntl
import gc
import itertools
import json
import math
import os
import re
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

try:  # run by path (the fork-server) or imported as machinery.isolation
    from machinery import confine
except ImportError:
    import confine

UNSAFE_ENV = "METAAGENT_UNSAFE_SANDBOX"  # exactly "1": run without a boundary where none exists
MODE_ENV = "METAAGENT_SANDBOX"  # "fallback": Landlock and seccomp even where namespaces exist
MEMORY = 1 << 30  # bytes a job may add to the fork-server's, its folder included
SCRATCH = 64 << 20  # bytes of a job's folder (at most a quarter of its memory)
FOLDER_FILES = 256  # files a fallback job's folder may hold
FILE_SIZE = 16 << 20  # largest file a job may write
TASKS = 256  # processes and threads a job may have at once (a pids cgroup of its own, or nproc)
AT_CAP = "its processes and threads reached their cap"  # what outcome() then says
JOB_DIR = "/job"  # an isolated job's folder (its tmpfs), its working directory and HOME
JOB_UID = 1000  # an isolated job's user inside its own user namespace
NOBODY = 65534  # the host user an isolated job is when the trainer is root
STDERR_CAP = 8192  # bytes of a job's stderr kept: its end, where the error is
STDERR_READ = 1 << 20  # bytes of stderr read at most; then the pipe is closed
MAX_LINE = 4 << 20  # longest message the trainer accepts from a job
MARK = b"\n\0--- end of a test ---\0\n"  # on stderr after each call test that returned
_VM = [0]  # (in a job) bytes of its address space at its start, its rlimit's base
_NPROC = [None]  # (in a job) its RLIMIT_NPROC: TASKS where it has a user of its own (isolated)


class SandboxUnavailable(RuntimeError):
    """The sandbox needs unprivileged user namespaces (isolated mode) or Landlock (the fallback,
    Linux 5.13+ with Landlock enabled), and seccomp. To enable user namespaces: `sysctl -w
    kernel.unprivileged_userns_clone=1` (Debian/Ubuntu), `sysctl -w user.max_user_namespaces=15000`,
    `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (Ubuntu 24.04+); in Docker or
    Kubernetes allow the unshare syscall (e.g. --security-opt seccomp=unconfined). Landlock: boot
    with `lsm=landlock,...`. To run WITHOUT a boundary (seccomp and rlimits only: model code can
    read and write what the trainer can): set METAAGENT_UNSAFE_SANDBOX=1."""


_libc = ctypes.CDLL(None, use_errno=True)


# --------------------------------------------------------------------------------------------------
# The job's side: what runs in a forked child. All of it is our code; model code runs in
# _run_program and _workflow_job once the child has no way out.


def _line(obj):
    return json.dumps(obj).encode() + b"\n"  # JSON never holds a raw newline


class Channel:
    """A job's end of its socket: one JSON object a line, each way (mas.py's helpers call
    request)."""

    def __init__(self, fd):
        self.file = socket.socket(fileno=fd).makefile("rwb")

    def send(self, obj):
        self.file.write(_line(obj))
        self.file.flush()

    def receive(self):
        return json.loads(self.file.readline())

    def request(self, obj):
        self.send(obj)
        return self.receive()["ok"]


def _scratch(memory):
    """Bytes of a job's folder: SCRATCH, at most a quarter of its memory, of which it is part."""
    return min(SCRATCH, memory // 4)


def _enter(stdin, cpu_seconds, memory):
    """The last steps before model code runs: fd 0 a deleted file that holds `stdin`, the rlimits
    (the address space: `memory` less the folder's bytes), the seccomp filter. (sys.stdin, stdout
    and stderr, never used in the fork-server, read and write fds 0-2 just as `python -c`'s do.)"""
    with tempfile.TemporaryFile(dir=".") as f:
        os.pwrite(f.fileno(), stdin.encode(), 0)  # (the offset stays at 0)
        os.dup2(f.fileno(), 0)
    confine.limit(_VM[0] + memory - _scratch(memory), cpu_seconds, FILE_SIZE, 64, _NPROC[0])
    confine.seccomp(confine.job_rules(os.getpid()))


def _flush():
    # (a program may have replaced them: whatever flush raises, ignored)
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            s.flush()


def _failed(exc):
    """What Python prints, and exits with, for an uncaught exception: SystemExit(None|int|message)
    or any."""
    code = exc.code if isinstance(exc, SystemExit) else 1
    if not isinstance(exc, SystemExit):
        # from the program's first frame on
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    elif not isinstance(code, int | None):
        print(code, file=sys.stderr)
    return 0 if code is None else code & 0xFF if isinstance(code, int) else 1


def _run_program(code, name="__main__"):
    """Run a program as `python -c` would: (exit code, its globals)."""
    g = {"__name__": name, "__builtins__": __builtins__}
    try:
        exec(compile(code, "<program>", "exec"), g)
        return 0, g
    except BaseException as e:  # the program's own failure, reported as python reports it
        return _failed(e), g


def _program_job(payload, chan, cpu, memory):
    """A program on its stdin: the exit code (its output is flushed as the process exits)."""
    os.close(3)  # the program does not get the channel
    _enter(payload["stdin"], cpu, memory)
    return _run_program(payload["code"])[0]


def _call_args(inp):
    if isinstance(inp, str):  # LiveCodeBench stores call-based inputs as one JSON value per line
        return [json.loads(line) for line in inp.splitlines() if line.strip()]
    return list(inp) if isinstance(inp, list | tuple) else [inp]


def _jsonable(obj):
    """What json.dumps writes for a value JSON lacks: a set as its sorted list, else its repr."""
    return sorted(obj) if isinstance(obj, set | frozenset) else repr(obj)


def _input():
    """(a grandchild) Its next test's input: a line of JSON on fd 3, from the keeper, which writes
    it there only as that test starts."""
    with open(3, "rb", closefd=False) as f:
        return json.loads(f.readline())


def _calls(payload, count, cpu, memory):
    """Grandchild: the program once, then `count` call tests in turn, each one's input read as it
    starts: MARK on stderr and the returned value as a line of JSON on fd 4, so that what the
    program printed on stderr after the last MARK is the failing test's. The first test that does
    not return ends the process, as it would end a process of its own."""
    import resource

    _enter("", cpu * count, memory)

    # the soft RLIMIT_CPU: each test its own seconds, as in a process of its own
    def own_cpu_seconds():
        t = resource.getrusage(resource.RUSAGE_SELF)
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        # (a soft limit at or below the hard one: lowering or raising it is always allowed)
        used = int(t.ru_utime + t.ru_stime)
        resource.setrlimit(resource.RLIMIT_CPU, (min(used + cpu, hard), hard))

    own_cpu_seconds()  # the first test's seconds include running the program
    rc, g = _run_program(payload["code"], "solution")
    for _ in range(count if rc == 0 else 0):
        try:
            inp = _input()  # (a program that closed or read fd 3: its own failure)
            # a method of a fresh Solution() if there is one, as LeetCode calls it
            name = payload["fn_name"]
            fn = getattr(g["Solution"](), name) if hasattr(g.get("Solution"), name) else g[name]
            out = json.dumps(fn(*_call_args(inp)), default=_jsonable)
            _flush()
            os.write(2, MARK)  # whole: a pipe takes up to 4096 bytes at once
            with open(4, "wb", closefd=False) as f:
                f.write(out.encode() + b"\n")
        except BaseException as e:  # ends the process here, as it would end one of its own
            rc = _failed(e)
            break
        own_cpu_seconds()
    return rc


def _tests_job(payload, chan, cpu, memory):
    """PID 1 of a tests job, the harness: runs the tests in grandchildren, sends each outcome as it
    completes. A stdin test gets a grandchild of its own; call tests share one until one does not
    return, and the tests after it get a fresh one, so that no test can sink another. The inputs
    never enter the harness (`payload` is None: the keeper, a child forked before the channel is
    read, reads it), so no grandchild, a fork of the harness, holds another test's input. Expected
    outputs never enter the job."""
    head_r, head_w = os.pipe()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    keeper = os.fork()
    if keeper == 0:
        ours.close()
        _keeper(chan, head_w, theirs)
    os.close(head_w)
    theirs.close()
    with open(head_r, "rb") as f:
        payload = json.loads(f.readline())
    k = 0
    while k < payload["count"]:
        tests = range(k, payload["count"] if payload["fn_name"] else k + 1)
        for outcome in _grandchild(payload, ours, tests, memory):
            chan.send(outcome)
            k += 1
    ours.close()  # the keeper ends
    os.waitpid(keeper, 0)


def _keeper(chan, head, sock):
    """(a child of the harness) Read the payload, hand the harness all of it but the inputs (their
    count instead), then, asked for test k with the write end of a pipe, write test k's input
    there as a line of JSON. Never returns."""
    try:
        _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: it dies with the harness
        payload = chan.receive()
        inputs = payload.pop("inputs")
        with open(head, "wb") as f:
            f.write(_line(dict(payload, count=len(inputs))))
        while True:
            msg, fds, _, _ = socket.recv_fds(sock, 64, 1)
            if not msg:
                break
            # (a grandchild killed before it read its input: EPIPE)
            with contextlib.suppress(OSError), open(fds[0], "wb") as f:
                f.write(_line(inputs[int(msg)]))
    finally:
        os._exit(0)


def _grandchild(payload, keeper, tests, memory):
    """Run `tests` (one stdin test, or call tests in turn: their indices) in one grandchild, in a
    session of its own (a signal it sends its group reaches no one else); yield each test's outcome
    as it completes, up to and including the first that does not return (at least one). Each test
    has its seconds, whatever the program does with its pipes or signals: at its deadline the
    grandchild is killed, and its end is seen on a pidfd. A stdin test's stdout past the cap closes
    the pipe (the program's next write fails); a call test's stdout is not its answer: read, and
    kept up to the cap."""
    per, cap, fn = payload["timeout_per_test"], payload["max_output"], payload["fn_name"]
    (out_r, out_w), (err_r, err_w), (res_r, res_w) = os.pipe(), os.pipe(), os.pipe()
    in_r, in_w = os.pipe()
    _ask(keeper, tests[0], in_w)  # (the keeper writes it while the grandchild starts)
    pid = os.fork()
    if pid == 0:
        code = 120
        try:
            _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: it dies with the harness
            os.setsid()
            for fd, to in ((in_r, 3), (out_w, 1), (err_w, 2), (res_w, 4)):
                os.dup2(fd, to)
            os.closerange(5, 1 << 16)
            cpu = math.ceil(per) + 1
            if fn:
                code = _calls(payload, len(tests), cpu, memory)
            else:
                program = {"code": payload["code"], "stdin": str(_input())}
                code = _program_job(program, None, cpu, memory)
        finally:  # whatever happened: it never returns into the harness's loop
            _flush()
            os._exit(code)
    for fd in (out_w, err_w, res_w, in_r):
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    out, err, res = b"", b"", b""  # stdout, the current test's stderr, the current line of results
    done, killed, rc, deadline = 0, False, None, time.monotonic() + per
    fds = [out_r, err_r, res_r, pidfd]
    while fds:  # (once it has ended, its pipes end too: no process of its own holds them)
        if not killed and time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            killed = True
        wait = None if killed else max(0.0, deadline - time.monotonic())
        for fd in select.select(fds, [], [], wait)[0]:
            data = b"" if fd == pidfd else os.read(fd, 65536)
            if fd == pidfd:
                rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            if fd == out_r:
                out += data[: cap - len(out)]
            if not data or fd == out_r and len(out) >= cap and not fn:  # (a call's: not graded)
                fds.remove(fd)
                os.close(fd)
            elif fd == err_r:
                err = (err + data).rsplit(MARK, 1)[-1][-STDERR_CAP:]
            elif fd == res_r and fn and not killed:  # each full line: a test that returned
                *lines, res = (res + data).split(b"\n")
                for line in lines[: len(tests) - done]:
                    text = line[:cap].decode("utf-8", "replace")
                    yield {"status": "ok", "output": text, "error": None}
                    done += 1
                    deadline = time.monotonic() + per
                    if done < len(tests):
                        _ask(keeper, tests[done], in_w)
                res = res[:cap]
    os.close(in_w)
    if done < len(tests):
        text = err.decode("utf-8", "replace")
        status = _status(rc, text, killed)
        yield {
            "status": status,
            "output": (res if fn else out).decode("utf-8", "replace"),
            "error": None if status == "ok" else last_line(text) or f"{status} (exit code {rc})",
        }


def _ask(keeper, test, pipe):
    """Have the keeper write test `test`'s input into `pipe` (a grandchild's fd 3)."""
    with contextlib.suppress(OSError):  # (a keeper that is gone: the grandchild's read fails)
        socket.send_fds(keeper, [str(test).encode()], [pipe])


def _workflow_job(payload, chan, cpu, memory):
    """A workflow script, in this process; mas.py's helpers talk to the trainer over the channel
    (`mas`: the fork-server imported it, in its __main__ block)."""
    mas._channel = chan
    _enter("", cpu, memory)
    try:
        g = dict(mas.script_globals())
        exec(compile(payload["script"], "<workflow>", "exec"), g)
        if not callable(g.get("workflow")):
            raise NameError("the script defines no workflow(task) function")
        answer = g["workflow"](payload["task"])
        if isinstance(answer, str):
            msg = {"answer": answer[: payload["max_output"]]}
        else:
            msg = {"error": f"workflow returned {type(answer).__name__}, not str"}
    except SystemExit as e:
        msg = {"error": f"the script called sys.exit({e.code!r})"}
    except BaseException as e:  # every failure of the script becomes WorkflowRun.error
        msg = {"error": _describe(e)}
    with contextlib.suppress(OSError):
        chan.send(dict(msg, op="done"))


def _describe(exc):
    """'ValueError: bad (script line 3)': the exception and the last script line it passed
    through."""
    tb = traceback.extract_tb(exc.__traceback__)
    lines = [fr.lineno for fr in tb if fr.filename == "<workflow>"]
    line = lines[-1] if lines else exc.lineno if isinstance(exc, SyntaxError) else None
    text = traceback.format_exception_only(type(exc), exc)[-1].strip()[:300]
    return f"{text} (script line {line})" if line else text


def _beneath(path, roots):
    real = os.path.realpath(path or ".")
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)


def _own_user(owner):
    """(isolated) The job becomes JOB_UID of a user namespace of its own, mapped to `owner` of the
    fork-server's namespace (the host's nobody when the trainer is root, else the trainer's
    user): never the host's root; no capability outside its namespace. /proc/self's files are
    the job's to write only while it is dumpable."""
    if owner:
        os.setgroups([])
        os.setresgid(owner, owner, owner)
        os.setresuid(owner, owner, owner)
    _libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE 1
    confine.check(_libc.unshare(confine.CLONE_NEWUSER), "unshare(user)")
    for name, text in (("setgroups", "deny"), ("uid_map", None), ("gid_map", None)):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text or f"{JOB_UID} {owner} 1\n")
    _libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no program under test opens its harness


def _job(spec, fds, setup):
    """In the forked child: confine, read the payload, run it, exit. Never returns."""
    code = 121
    try:
        if setup["cgroup"] is not None:  # first: into its own pids cgroup, capped at TASKS
            procs = os.open(f"{spec['id']}/cgroup.procs", os.O_WRONLY, dir_fd=setup["cgroup"])
            os.write(procs, b"0")  # (0: the writer)
            os.close(procs)
        for fd, to in zip([fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds[:3]], (3, 1, 2)):
            os.dup2(fd, to)  # channel, stdout, stderr; then nothing else of the fork-server's
        os.closerange(4, 1 << 16)
        os.setsid()
        _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: it dies with the fork-server
        _libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        memory, read = spec["memory"], list(setup["roots"])
        statm = open("/proc/self/statm").read()  # read now: Landlock shuts /proc below
        _VM[0] = int(statm.split()[0]) * os.sysconf("SC_PAGE_SIZE")
        if setup["mode"] == "isolated":
            _NPROC[0] = TASKS  # (counted for its user in its own user namespace: this job's)
            folder, read = JOB_DIR, read + ["/proc"]  # its own /proc, below
            confine.check(_libc.unshare(confine.CLONE_NEWNS), "unshare(mount)")
            opts = f"size={_scratch(memory)},mode=0700,uid={setup['owner']},gid={setup['owner']}"
            confine.mount("tmpfs", folder, "tmpfs", confine.MS_NOSUID | confine.MS_NODEV, opts)
            # (writable: it writes its own user maps there; Landlock then allows reads only)
            flags = confine.MS_NOSUID | confine.MS_NODEV | confine.MS_NOEXEC
            confine.mount("proc", "/proc", "proc", flags)
            _own_user(setup["owner"])
        else:  # a folder of its own, made by the fork-server
            folder = os.path.join(setup["base"], str(spec["id"]))
        os.chdir(folder)
        os.environ.update(HOME=folder, TMPDIR=folder)
        tempfile.tempdir = None
        # imports come from what it can read (not the project's folder, where the server started)
        sys.path[:] = [p for p in sys.path if _beneath(p, setup["roots"])]
        sys.path_importer_cache.clear()
        confine.drop_capabilities()
        if setup["abi"]:
            rights = confine.WRITE | (confine.FS_MAKE_DIR | confine.FS_REMOVE_DIR)
            rights = rights if setup["mode"] == "isolated" else confine.WRITE  # (fallback: flat)
            confine.landlock(setup["abi"], read, {folder: rights})
        chan = Channel(3)
        run = {"code": _program_job, "tests": _tests_job, "workflow": _workflow_job}[spec["kind"]]
        # its exit code: a program's; 0 for a harness or a script that ran to its end (they return
        # None)
        # (a tests job's harness leaves its payload, the hidden inputs, to its keeper)
        payload = None if spec["kind"] == "tests" else chan.receive()
        code = run(payload, chan, math.ceil(spec["timeout"]) + 1, memory) or 0
    except BaseException:  # noqa: BLE001 - our own set-up failed: say so on stderr
        traceback.print_exc()
    finally:  # whatever happened: this process never returns into the fork-server's loop
        _flush()
        os._exit(code)


# --------------------------------------------------------------------------------------------------
# The fork-server: a fresh exec, confined once; a child forked per job, each one's end reported


def _write_maps(pid, uid, gid):
    """(a helper in the trainer's user namespace) map the new namespace of `pid`: its root is the
    trainer's user, and, when that is root, NOBODY is itself (what a job becomes). Returns the
    user a job becomes in that namespace: NOBODY or 0 (the trainer's own user). A root trainer
    whose namespace lacks NOBODY gets an error, never jobs that are the host's root."""
    if uid == 0:
        try:
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{pid}/{name}", "w") as f:
                    f.write(f"0 0 1\n{NOBODY} {NOBODY} 1\n")
        except OSError as e:
            why = f"cannot map user {NOBODY} (nobody) for the jobs of a root trainer: {e}"
            raise OSError(why) from None
        return NOBODY
    with open(f"/proc/{pid}/setgroups", "w") as f:
        f.write("deny")
    for name, own in (("uid_map", uid), ("gid_map", gid)):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(f"0 {own} 1\n")
    return 0


def _namespaces(sock):
    """(isolated) This process enters new user, mount, PID, network, IPC and UTS namespaces (a
    helper forked first writes its user maps) and forks the fork-server, PID 1 of the new PID
    namespace; this process waits for it and exits with it. Returns in the fork-server: the user a
    job becomes (see _write_maps)."""
    uid, gid = os.geteuid(), os.getegid()
    (go_r, go_w), (done_r, done_w) = os.pipe(), os.pipe()
    helper = os.fork()
    if helper == 0:
        answer = b"no"
        try:
            if os.read(go_r, 1) == b"1":
                answer = str(_write_maps(os.getppid(), uid, gid)).encode()
        except BaseException as e:  # noqa: BLE001 - said to the parent, which raises it
            answer = f"error: {e}".encode()
        os.write(done_w, answer)
        os._exit(0)
    flags = confine.CLONE_NEWUSER | confine.CLONE_NEWNS | confine.CLONE_NEWPID
    flags |= confine.CLONE_NEWNET | confine.CLONE_NEWIPC | confine.CLONE_NEWUTS
    ok = _libc.unshare(flags) == 0
    err = ctypes.get_errno()
    os.write(go_w, b"1" if ok else b"0")
    answer = os.read(done_r, 4096).decode()
    os.waitpid(helper, 0)
    if not ok:
        raise OSError(err, f"unshare(user, mount, pid, net): {os.strerror(err)}")
    if not answer.isdigit():
        raise OSError(f"cannot map the new user namespace: {answer}")
    server = os.fork()
    if server:  # here: wait for it, end with it
        sock.close()
        os._exit(os.waitstatus_to_exitcode(os.waitpid(server, 0)[1]) & 0xFF)
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    return int(answer)


def _folder_over(folder, bound, pid):
    """(fallback) Why a job's folder is over its bounds (`bound` bytes, FOLDER_FILES files), or
    None. Landlock lets it hold files only, no folders: one scan sees them all; the files it holds
    open unlinked are counted from its processes' descriptors (job `pid` and its children)."""
    try:
        entries = list(os.scandir(folder))
        size = sum(e.stat(follow_symlinks=False).st_blocks * 512 for e in entries)
        size += _unlinked(pid, os.stat(folder).st_dev)
    except OSError:
        return None
    if len(entries) > FOLDER_FILES or size > bound:
        return f"its folder holds {len(entries)} files, {size} bytes: more than allowed"
    return None


def _unlinked(pid, dev):
    """(fallback) Bytes of the unlinked files on `dev` that process `pid` and its descendants hold
    open. (/proc/PID/fd of a job, which is not dumpable, opens to a fork-server with CAP_SYS_PTRACE,
    as when the trainer is root; otherwise it counts nothing.)"""
    todo, files = [pid], {}
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in open(f"/proc/{p}/task/{tid}/children").read().split()]
            for fd in os.listdir(f"/proc/{p}/fd"):
                with contextlib.suppress(OSError):
                    st = os.stat(f"/proc/{p}/fd/{fd}")
                    if st.st_nlink == 0 and st.st_dev == dev:
                        files[st.st_ino] = st.st_blocks * 512
    return sum(files.values())


def _job_cgroup(cgroup, jid):
    """(the fork-server) A pids cgroup for job `jid` inside `cgroup` (an open folder), capped at
    TASKS; the job moves itself into it before anything else (_job)."""
    os.mkdir(str(jid), dir_fd=cgroup)
    fd = os.open(f"{jid}/pids.max", os.O_WRONLY, dir_fd=cgroup)
    try:
        os.write(fd, str(TASKS).encode())
    finally:
        os.close(fd)


def _capped(cgroup, jid):
    """(the fork-server) Did job `jid` reach its cap of tasks ("max N" in its pids.events)?"""
    try:
        with open(f"{jid}/pids.events", opener=_at(cgroup)) as f:
            return f.read().split()[-1] != "0"
    except OSError:
        return False


def _end_cgroup(cgroup, jid):
    """(the fork-server) Remove job `jid`'s cgroup: False while a task remains (retried later)."""
    try:
        os.rmdir(str(jid), dir_fd=cgroup)
    except FileNotFoundError:
        return True
    except OSError:  # EBUSY: a grandchild killed with the job has not yet gone
        return False
    return True


def _at(dirfd):
    def opener(path, flags):
        return os.open(path, flags, dir_fd=dirfd)

    return opener


def _serve(sock_fd, base, mode, abi, cgroup):
    sock = socket.socket(fileno=sock_fd)
    setup = {"mode": mode, "base": base, "abi": abi, "owner": 0, "cgroup": None}
    if cgroup:  # this process and what it forks: in the jobs' cgroup, beside the trainer's
        with contextlib.suppress(OSError):  # (the trainer made it: this write does not fail)
            _write(os.path.join(cgroup, "server", "cgroup.procs"), "0")
    if cgroup and mode != "isolated":  # opened here (the empty root has no /sys)
        setup["cgroup"] = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:  # (a failure is said to the trainer, which raises SandboxUnavailable with it)
        if mode == "isolated":
            setup["owner"] = _namespaces(sock)
            setup["roots"] = confine.python_roots()
            confine.empty_root(base, setup["roots"], JOB_DIR)
            pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
        else:
            _libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no same-user job reads this process
            setup["roots"] = confine.python_roots()
    except Exception as e:  # noqa: BLE001
        sock.send(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
        raise
    sock.send(json.dumps({"ready": True, "roots": setup["roots"]}).encode())
    gc.freeze()  # the forked jobs share these pages; the collector must not dirty them
    jobs = {}  # job id -> (pid, pidfd, status fd, why it was killed)
    bounds = {}  # job id -> bytes its folder may hold (fallback)
    ended = []  # the ended jobs whose cgroups are still there
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    while True:
        watch = mode != "isolated" and jobs or ended  # a fallback folder is on disk: watched
        for jid in list(ended):
            if _end_cgroup(setup["cgroup"], jid):
                ended.remove(jid)
        for key, _ in sel.select(0.2 if watch else None):
            if key.fileobj is not sock:  # a job ended: say how on its status pipe
                pid, pidfd, sfd, why = jobs.pop(key.data)
                bounds.pop(key.data)
                sel.unregister(pidfd)
                os.close(pidfd)
                rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                capped = setup["cgroup"] is not None and _capped(setup["cgroup"], key.data)
                if capped and why is None:
                    why = f"{AT_CAP} ({TASKS})"
                with contextlib.suppress(OSError):
                    os.write(sfd, _line({"rc": rc, "why": why, "at": time.monotonic()}))
                os.close(sfd)
                shutil.rmtree(os.path.join(base, str(key.data)), ignore_errors=True)
                if setup["cgroup"] is not None and not _end_cgroup(setup["cgroup"], key.data):
                    ended.append(key.data)
                continue
            data, fds, _, _ = socket.recv_fds(sock, 65536, 8)
            # the trainer is gone: so are its jobs (with this process, their PID 1 or parent)
            if not data:
                return  # (an error here, ECONNRESET, ends this process just the same)
            spec = json.loads(data)
            if spec["op"] == "kill":  # (the harness's grandchildren die with it)
                with contextlib.suppress(KeyError, OSError):
                    os.kill(jobs[spec["id"]][0], signal.SIGKILL)
                continue
            try:
                if mode == "isolated":  # the next child: PID 1 of a new one
                    confine.check(_libc.unshare(confine.CLONE_NEWPID), "unshare(pid)")
                else:
                    os.mkdir(os.path.join(base, str(spec["id"])), 0o700)
                if setup["cgroup"] is not None:
                    _job_cgroup(setup["cgroup"], spec["id"])
                pid = os.fork()
                if pid == 0:
                    _job(spec, fds, setup)
            # no fork (memory, pids): this job fails (no exit status), the server goes on
            except OSError:
                os.close(fds[3])
                continue
            finally:  # (only the fork-server gets here: a child never returns from _job)
                if mode == "isolated":  # later children (and this one's retry) in a fresh one
                    confine.check(_libc.setns(pidns, confine.CLONE_NEWPID), "setns(pid)")
                for fd in fds[:3]:  # the child's copies are its own
                    os.close(fd)
            jobs[spec["id"]] = (pid, os.pidfd_open(pid), fds[3], None)
            bounds[spec["id"]] = _scratch(spec["memory"])
            sel.register(jobs[spec["id"]][1], selectors.EVENT_READ, spec["id"])
        for jid, (pid, pidfd, sfd, why) in list(jobs.items()) if watch else []:
            over = why is None and _folder_over(os.path.join(base, str(jid)), bounds[jid], pid)
            if over:
                os.kill(pid, signal.SIGKILL)
                jobs[jid] = (pid, pidfd, sfd, over)


# --------------------------------------------------------------------------------------------------
# The trainer's side: the fork-server process, jobs, and the event loop that drives them
# (thread-safe)


def remove_stale_bases(tmp=None):
    """Delete the fork-servers' base folders that dead processes left in the temp directory (a
    SIGKILLed trainer cannot clean up; the folder's name holds its pid). Called whenever a
    fork-server starts."""
    tmp = tmp or tempfile.gettempdir()
    stale = _stale(tmp)
    for d in stale:
        shutil.rmtree(os.path.join(tmp, d), ignore_errors=True)
    return stale


def _pids_cgroups():
    """[(this process's cgroup in a hierarchy with the pids controller, v2?)]: v1's pids
    hierarchy, v2's unified one, whichever the kernel mounts (v2's: pids if it delegates it)."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            own[names] = path
    v1 = [path for names, path in own.items() if "pids" in names.split(",")]
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point, fstype, opts = fields[4], fields[-3], fields[-1].split(",")
            if fstype == "cgroup" and "pids" in opts and v1:
                found.append((point + v1[0], False))
            elif fstype == "cgroup2" and "" in own:
                found.append((point + own[""], True))
    return found


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def task_cgroup(name):
    """(the trainer) A pids cgroup `name` beside the trainer's own that holds a fork-server and all
    its jobs to half the host's PIDs: the trainer and its pools stay outside, the jobs' budget is
    never theirs. In it: "server", the fork-server's (and an isolated job's: its own cap is its
    RLIMIT_NPROC), and a fallback job's own, capped at TASKS. Its path, or "" where no pids
    controller can be written here. Those of dead trainers are removed."""
    total = int(open("/proc/sys/kernel/pid_max").read()) // 2
    for own, v2 in _pids_cgroups():
        for stale in _stale(own):
            remove_cgroup(os.path.join(own, stale))
        path = os.path.join(own, name)
        try:
            if v2:  # (where the trainer's own cgroup holds processes this fails: EBUSY)
                _write(os.path.join(own, "cgroup.subtree_control"), "+pids")
            os.mkdir(path)
            if v2:
                _write(os.path.join(path, "cgroup.subtree_control"), "+pids")
            _write(os.path.join(path, "pids.max"), str(total))
            os.mkdir(os.path.join(path, "server"))
            return path
        except OSError:
            remove_cgroup(path)
    return ""


def remove_cgroup(path, tries=20):
    """Remove a cgroup of task_cgroup's and its jobs', waiting up to a second for the tasks that
    are dying (a job killed with its fork-server) to be gone."""
    for _ in range(tries):
        with contextlib.suppress(OSError):
            for d in os.scandir(path):
                if d.is_dir():
                    with contextlib.suppress(OSError):
                        os.rmdir(d.path)
            os.rmdir(path)
        if not path or not os.path.exists(path):
            return
        time.sleep(0.05)


def _stale(folder):
    """The names in `folder` that a dead process's fork-server left (the name holds its pid)."""
    stale = []  # (this process's own is alive)
    with contextlib.suppress(OSError):
        for d in os.listdir(folder):
            m = re.fullmatch(r"metaagent-sandbox-(\d+)-\w+", d)
            if m and not os.path.exists(f"/proc/{m[1]}"):
                stale.append(d)
    return stale


def _describe_mode(mode, abi, cgroup):
    """The line start() prints: the mode and what it stops."""
    lock = f"Landlock ABI {abi}" if abi else "no Landlock"
    tasks = f"a job's tasks capped at {TASKS}"
    if mode == "isolated":
        tasks += " (RLIMIT_NPROC of its own user)"
    elif cgroup:
        tasks += " (a pids cgroup of its own)"
    else:
        tasks = "NO cap on a job's tasks (no pids cgroup this process can write)"
    if cgroup:
        tasks += ", all jobs' at half the host's PIDs (a pids cgroup)"
    if mode == "isolated":
        return (
            f"isolated: user, mount, PID, network and IPC namespaces, an empty root, {lock}, "
            f"seccomp, rlimits, {tasks}: a job sees the Python install read-only and a folder of "
            "its own; no host file, socket, device or process"
        )
    if mode == "fallback":
        scoped = "scoped" if abi >= 6 else "denied by seccomp"
        return (
            f"fallback (no user namespaces): {lock} (reads: the Python install and its folder; "
            f"writes: its folder), seccomp (no network, no other process), rlimits, {tasks}; "
            f"signals and abstract sockets {scoped}; the trainer non-dumpable. Not hidden: the "
            "host's file names and sizes (stat), its process list"
        )
    return (
        f"UNSAFE: seccomp and rlimits only, {tasks}: no namespaces, no Landlock; model code reads "
        "and writes what the trainer can"
    )


class Server:
    """The fork-server process, seen from the trainer: start it, submit a job, close it."""

    def __init__(self, mode, abi):
        self.mode, self.abi = mode, abi
        self.unsafe = mode == "unsafe"
        self.ids = itertools.count(1)  # (next() on a count is atomic: no lock)
        remove_stale_bases()
        self.base = tempfile.mkdtemp(prefix=f"metaagent-sandbox-{os.getpid()}-")
        self.cgroup = task_cgroup(os.path.basename(self.base))
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()
        # -E -s: no environment variables, no user site; run by path (its __main__ block finds
        # mas.py)
        script = os.path.abspath(__file__)
        cmd = [sys.executable, "-E", "-s", script, str(child.fileno()), self.base, mode, str(abi)]
        cmd.append(self.cgroup)
        self.sock.settimeout(120)  # for every exchange: a fork-server that hangs is an error
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.base}
        try:
            self.proc = subprocess.Popen(
                cmd,
                pass_fds=[child.fileno()],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self.log,
                stderr=self.log,
                cwd="/",
                start_new_session=True,
            )
            child.close()  # now its end closes when the fork-server's does
            said = self.sock.recv(1 << 20) or b'{"error": "the fork-server exited at start-up"}'
            hello = json.loads(said)
        except OSError as e:
            hello = {"error": f"cannot start {cmd[0]}: {e}"}
        child.close()
        if "error" in hello:
            self.log.seek(0)
            log = self.log.read().decode("utf-8", "replace").strip()[-1500:]
            self.close()
            raise SandboxUnavailable(
                f"the {mode} sandbox cannot start here: {hello['error']}\n{log}"
            )
        self.roots = hello["roots"]
        self.isolation = _describe_mode(mode, abi, self.cgroup)
        print(f"sandbox: {self.isolation}", file=sys.stderr, flush=True)
        if mode == "fallback":
            _libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no job reads the trainer's memory
        if self.unsafe:
            print("WARNING: model code can touch this machine", file=sys.stderr, flush=True)

    def submit(self, kind, timeout, memory):
        """Start one job: (its id, the trainer's ends of its channel, stdout, stderr and status)."""
        chan, chan_job = socket.socketpair()
        (out, out_w), (err, err_w), (st, st_w) = os.pipe(), os.pipe(), os.pipe()
        jid = next(self.ids)
        spec = {"op": "run", "id": jid, "kind": kind, "timeout": timeout, "memory": memory}
        try:  # one message each, whole: threads may submit at once
            fds = [chan_job.fileno(), out_w, err_w, st_w]
            socket.send_fds(self.sock, [json.dumps(spec).encode()], fds)
        except OSError:  # not sent: the trainer's ends too
            chan.close()
            for fd in (out, err, st):
                os.close(fd)
            raise
        finally:  # the fork-server has its own copies now
            for fd in (chan_job.detach(), out_w, err_w, st_w):
                os.close(fd)
        return jid, chan, out, err, st

    def close(self):
        """End the fork-server and every job: it reads its socket's end and exits, and its jobs end
        with it (isolated: it is PID 1 of the namespace they live in, and its parent returns once
        that namespace is empty; otherwise: PR_SET_PDEATHSIG); killed after 5 s."""
        self.sock.close()
        if hasattr(self, "proc"):
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)
        remove_cgroup(self.cgroup)


def _wanted():
    """The mode the environment asks for: "isolated", "fallback" or None (the best there is), and
    whether METAAGENT_UNSAFE_SANDBOX allows running without a boundary. Any other value is an
    error, not a guess."""
    mode, unsafe = os.environ.get(MODE_ENV, ""), os.environ.get(UNSAFE_ENV, "")
    if mode not in ("", "isolated", "fallback"):
        raise SandboxUnavailable(f"{MODE_ENV}={mode!r}: set it to 'fallback', or leave it unset")
    if unsafe not in ("", "0", "1"):
        raise SandboxUnavailable(f"{UNSAFE_ENV}={unsafe!r}: it takes exactly 1 (or 0, or unset)")
    return mode or None, unsafe == "1"


def _start(mode):
    """A started Server in `mode` ("isolated" | "fallback" | "unsafe"), or, for None, in the best
    mode this machine has: isolated, else fallback (Landlock), else unsafe if allowed."""
    abi = confine.landlock_abi()
    asked, unsafe = _wanted()
    mode = mode or asked
    if mode is not None:
        if mode == "fallback" and not abi:
            raise SandboxUnavailable("the fallback needs Landlock, which this kernel lacks")
        return Server(mode, 0 if mode == "unsafe" else abi)
    try:
        return Server("isolated", abi)
    except SandboxUnavailable as e:
        why = str(e)
    if abi:
        print(f"sandbox: no isolated mode here ({why.splitlines()[0]})", file=sys.stderr)
        return Server("fallback", abi)
    if unsafe:
        return Server("unsafe", 0)
    raise SandboxUnavailable(f"{why}\nand no Landlock either.\n{SandboxUnavailable.__doc__}")


_server, _mode, _lock = None, None, threading.RLock()
atexit.register(lambda: stop())


def server():
    """The running fork-server, (re)started when there is none or it died."""
    global _server
    with _lock:
        if _server is None or _server.proc.poll() is not None:
            stop()
            _server = _start(_mode)
        return _server


def start(mode=None):
    """Start (or restart) the fork-server and return the line that describes its isolation, for the
    log (it is printed once, too).

    mode: "isolated", "fallback", "unsafe" (tests), or None: what METAAGENT_SANDBOX asks, else the
    best this machine has. Call it early (before torch/vLLM start threads is best; it is a fresh
    exec either way). Raises SandboxUnavailable when no boundary can be had."""
    global _mode
    stop()
    _mode = mode
    return server().isolation


def stop():
    global _server
    with _lock:
        if _server is not None:
            _server.close()
        _server = None


def isolation():
    """The isolation line of the running fork-server (starting it if need be): for every log."""
    return server().isolation


def _nothing(*args):
    return None


class Job:
    """One job seen from the trainer: its descriptors, capped output, messages, deadline, how it
    ended.

    drive() calls on_message(job, msg) for each message on its channel (while it is not being
    killed; all of them are kept in job.messages too) and on_end(job) once, when it has ended. A
    message its handler raises on kills the job, saying why: nothing a job sends raises in the
    trainer."""

    def __init__(
        self, kind, payload, timeout, max_output, memory=MEMORY, on_message=None, on_end=None
    ):
        self.server, self.timeout, self.max_output = server(), timeout, max_output
        self.on_message, self.on_end = on_message or _nothing, on_end or _nothing
        self.messages, self.t0 = [], time.monotonic()
        self.deadline = self.t0 + timeout
        self.paused_at = self.kill_reason = self.rc = self.chan = self.why = self.heard = None
        self.said_at = self.t0  # when the job last said something: a line, or its end
        self.out, self.err, self.status, self.inbuf = bytearray(), b"", b"", bytearray()
        self.open, self.cut, self.err_read = set(), set(), 0
        self.sendbuf = bytearray(_line(payload))
        self.id = self.out_r = self.err_r = self.st_r = -1
        try:
            self.id, self.chan, self.out_r, self.err_r, self.st_r = self.server.submit(
                kind, timeout, memory
            )
            self.chan.setblocking(False)
            self.open = {self.chan.fileno(), self.out_r, self.err_r, self.st_r}
        except OSError as e:
            self.kill_reason = f"sandbox server failed: {e}"

    @property
    def finished(self):
        return not self.open

    def kill(self, reason):  # the fork-server SIGKILLs it
        if self.kill_reason is None:
            self.kill_reason = reason
            with contextlib.suppress(OSError):  # (a fork-server that is gone took it along)
                self.server.sock.send(json.dumps({"op": "kill", "id": self.id}).encode())

    def pause(self, at):  # its clock stops at `at` (when it asked) while it waits on the trainer
        self.paused_at = at

    def resume(self):  # and runs again
        if self.paused_at is not None:
            self.deadline += time.monotonic() - self.paused_at
        self.paused_at = None

    def reply(self, obj):
        self.sendbuf += _line(obj)
        self.resume()

    def on_readable(self, fd):
        """Read what is there; False when `fd` has closed, or is past its cap (drive() then
        unregisters it and cut() closes it: the job's next write there fails)."""
        try:
            data = os.read(fd, 65536)
        except OSError:  # ECONNRESET: the job is gone (after select, a read never waits)
            data = b""
        if not data:
            self.open.discard(fd)
        elif fd == self.out_r:
            self.out += data[: self.max_output - len(self.out)]
            if len(self.out) >= self.max_output:
                self.cut.add(fd)
        elif fd == self.err_r:
            self.err = (self.err + data)[-STDERR_CAP:]
            self.err_read += len(data)
            if self.err_read > STDERR_READ:
                self.cut.add(fd)
        elif fd == self.st_r:
            self.status += data
        elif self.kill_reason is None:  # the channel: one JSON object a line
            self.said_at = self.heard or time.monotonic()  # (heard: watching() saw it come)
            self.inbuf += data
            if len(self.inbuf) > MAX_LINE:
                self.kill("protocol violation: oversized message on the sandbox channel")
            elif b"\n" in data:
                *lines, self.inbuf = self.inbuf.split(b"\n")
                self.take(lines)
        return bool(data) and fd not in self.cut

    def take(self, lines):
        """The channel's complete lines, each a message to its handler until one kills the job."""
        for raw in lines:
            try:
                msg = json.loads(raw)
            except Exception:  # noqa: BLE001 - any failure to parse (RecursionError too)
                msg = None
            if not isinstance(msg, dict):
                self.kill("protocol violation: malformed message on the sandbox channel")
            if self.paused_at is None and self.said_at >= self.deadline:  # said too late
                self.kill(f"timeout after {self.timeout:g}s")
            if self.kill_reason is not None:
                return
            self.messages.append(msg)
            try:
                self.on_message(self, msg)
            except Exception as e:  # noqa: BLE001 - this job's failure, not the trainer's
                self.kill(f"sandbox error on its request: {type(e).__name__}: {e}"[:500])

    def cut_off(self, fd):
        """Close a pipe past its cap (drive() has unregistered it)."""
        if fd in self.cut:
            self.open.discard(fd)
            os.close(fd)

    def flush_send(self):
        if self.sendbuf and self.chan is not None:
            try:
                del self.sendbuf[: self.chan.send(self.sendbuf, socket.MSG_NOSIGNAL)]
            except BlockingIOError:  # its socket is full: later
                pass
            except OSError:  # it is gone
                self.sendbuf.clear()

    def close(self):
        if self.chan is not None:
            for fd in (self.chan.detach(), self.out_r, self.err_r, self.st_r):
                if fd not in self.cut:
                    os.close(fd)
            self.chan, self.open = None, set()
            try:  # {"rc": ..., "why": ..., "at": ...}; nothing when it never started
                status = json.loads(self.status or b"{}")
                self.rc, self.why, at = status.get("rc"), status.get("why"), status.get("at")
            except Exception:  # noqa: BLE001 - then it has no exit status
                at = None
            late = isinstance(at, float) and at >= self.deadline  # it ended past its deadline
            self.said_at = at if isinstance(at, float) else time.monotonic()
            if late and self.kill_reason is None and self.paused_at is None:
                self.kill_reason = f"timeout after {self.timeout:g}s"


def last_line(text):
    """The last non-blank line of `text` (that of the stripped text), at most 500 characters: "" if
    none."""
    return (text.strip().splitlines() or [""])[-1].strip()[:500]


def _status(rc, stderr, timed_out):
    """How a process ended: timeout (its deadline or CPU seconds), ok, memory, killed (by a signal),
    error."""
    if timed_out or rc == -signal.SIGXCPU:
        return "timeout"
    if rc == 0:
        return "ok"
    if "MemoryError" in last_line(stderr):
        return "memory"
    return "killed" if rc is not None and rc < 0 else "error"


def outcome(job):
    """(stdout, stderr, status, seconds, returncode) of an ended job; stderr ends with why it was
    stopped. Its stdout past the cap makes it an error: the pipe was closed on it."""
    rc, err = job.rc, job.err.decode("utf-8", "replace")
    status = _status(rc, err, (job.kill_reason or "").startswith("timeout"))
    why = job.kill_reason or job.why or ""
    if not why and rc is None:
        why = "no exit status: the fork-server could not start the job, or died"
    elif not why and rc < 0:
        why = f"killed by signal {-rc} ({signal.strsignal(-rc)})"
    if job.out_r in job.cut and status in ("ok", "error", "killed"):
        status, why = "error", f"output limit: more than {job.max_output} bytes on stdout"
    elif job.why and status == "killed":
        status = "error"
    return (
        job.out.decode("utf-8", "replace"),
        f"{err}\n{why}".strip(),
        status,
        time.monotonic() - job.t0,
        rc,
    )


def drive(jobs, idle=_nothing, until=_nothing, busy=_nothing, wake=None):
    """The trainer's event loop over `jobs`, a list its callbacks may extend: send payloads and
    replies, collect output and messages, kill each job at its deadline (a paused job's clock stands
    still), call job.on_end once a job has ended and idle() after every turn (while busy() holds,
    without waiting for the jobs in between; a byte on the pipe `wake` ends a wait too). Returns
    when every job has ended, or as soon as until() holds; the jobs still running then are killed,
    as when the loop is left any other way."""
    sel, live, seen = selectors.DefaultSelector(), [], 0  # live: the jobs not yet ended
    if wake is not None:
        sel.register(wake, selectors.EVENT_READ, None)
    try:
        while True:
            live = _end(live)
            idle()
            for j in jobs[seen:]:  # (jobs idle() started too: they ran while it worked)
                for fd in j.open:
                    sel.register(fd, selectors.EVENT_READ, j)
            live, seen = live + jobs[seen:], len(jobs)
            if not live or until():
                return
            # what came while idle() worked (an engine call can take a minute) is read, at the
            # times it came (watching()), and the jobs that ended meanwhile are ended, before any
            # deadline is checked: a job that spoke or ended in time is not timed out
            for _ in range(16):
                if not _read_ready(sel, 0):
                    break
            for j in live:
                j.heard = None
            live = _end(live)
            now = time.monotonic()
            waits = [0.5 if live else 0.0]
            for j in live:
                j.flush_send()
                running = j.kill_reason is None and j.paused_at is None
                if running and now >= j.deadline:
                    j.kill(f"timeout after {j.timeout:g}s")
                elif running:
                    waits.append(j.deadline - now)
            # new jobs: at once; lines to send: soon; else the next deadline
            wait = max(0, min(waits))
            if any(j.sendbuf for j in live):
                wait = 0.001
            if seen < len(jobs) or busy():
                wait = 0.0
            _read_ready(sel, wait)
    finally:
        for j in jobs:
            if not j.finished:
                j.kill("aborted")
            j.close()
        sel.close()


def _end(jobs):
    """The jobs that have not ended; each that has is closed, and its on_end called."""
    for j in [j for j in jobs if j.finished]:
        j.close()
        j.on_end(j)
    return [j for j in jobs if not j.finished]


def _read_ready(sel, wait):
    """Read what every job's ready descriptor holds, waiting at most `wait` seconds for one (a
    byte on the wake pipe ends the wait); how many were ready."""
    ready = sel.select(wait)
    for key, _ in ready:
        if key.data is None:  # the wake pipe
            os.read(key.fd, 4096)
        elif not key.data.on_readable(key.fd):
            sel.unregister(key.fd)
            key.data.cut_off(key.fd)
    return len(ready)


class Background:
    """Work beside drive()'s loop that must not hold it up (a vote's count can take seconds):
    run(fn, then) calls fn() in a thread of its own; once it has returned (or raised), collect(),
    called in the loop (idle()), calls then(its result or exception, the time it ended). Its end
    wakes drive(wake=background.fd) at once."""

    def __init__(self):
        self.finished, self.lock, self.wake = [], threading.Lock(), socket.socketpair()
        self.fd = self.wake[0].fileno()
        self.wake[1].setblocking(False)  # a full pipe means a wake waits already: never block

    def run(self, fn, then):
        threading.Thread(target=self._work, args=(fn, then), daemon=True).start()

    def _work(self, fn, then):
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - then() says what it means
            out = e
        with self.lock:
            self.finished.append((then, out, time.monotonic()))
            if self.wake is not None:
                with contextlib.suppress(BlockingIOError):  # (collect() waits on this lock)
                    self.wake[1].send(b"x")

    def collect(self):
        with self.lock:
            finished, self.finished = self.finished, []
        for then, out, at in finished:
            then(out, at)

    def close(self):  # (work still going on is of jobs that are gone: never collected)
        with self.lock:
            for sock in self.wake:
                sock.close()
            self.wake = None


@contextlib.contextmanager
def watching(jobs):
    """While the trainer works elsewhere (an engine call can take a minute), a thread notes when
    each running job's channel last received something: drive() then reads it as said at that
    time (Job.said_at), so that waiting on the trainer is never counted on the job's clock, and
    a line said past the deadline still is. (Edge-triggered: each arrival wakes it once.)"""
    ep, (stop_r, stop_w), heard, by_fd = select.epoll(), os.pipe(), {}, {}
    ep.register(stop_r, select.EPOLLIN)
    for j in jobs:
        j.flush_send()  # first what the trainer has to say: payloads, replies
        if j.chan is not None and j.chan.fileno() in j.open:
            by_fd[j.chan.fileno()] = j
            ep.register(j.chan.fileno(), select.EPOLLIN | select.EPOLLET)

    def watch():
        while True:
            events = ep.poll()
            now = time.monotonic()
            heard.update((fd, now) for fd, _ in events)
            if stop_r in heard:
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        os.write(stop_w, b"x")
        thread.join()
        for fd, j in by_fd.items():
            j.heard = heard.get(fd, j.heard)
        ep.close()
        os.close(stop_r)
        os.close(stop_w)


# the fork-server: `python -E -s machinery/isolation.py FD BASE MODE ABI`
if __name__ == "__main__":
    # Run by path, so the project's root goes first on the path, for mas.py: imported here, by the
    # fork-server alone and before its first fork, it is the `mas` of every workflow job
    # (_workflow_job)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import mas

    _serve(int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
