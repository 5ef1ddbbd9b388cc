"""isolation.py: the mechanics under sandbox.py: child processes in which model-written code can
hurt nothing (not the trainer, not the files, not each other), and the trainer's event loop that
drives them.

Every job is forked from one pre-started fork-server that lives in its own user, mount, network and
PID namespaces (started by `unshare` with a fresh exec; no root needed):

    trainer ──socket──▶ fork-server (PID 1 of its namespace; every mount read-only; no network)
                          └─ fork ─▶ job (PID 1 of its own PID namespace, its own tmpfs as its
                                     folder, no capabilities, rlimits, seccomp: no fork, exec,
                                     mount, unshare or ptrace)

A job gets four descriptors from the trainer (passed over the fork-server's socket): its channel, a
socket that carries one JSON object a line each way (the job's payload; a script's requests and
their replies; a harness's outcomes); stdout and stderr, pipes the trainer reads up to caps; and a
status pipe on which the fork-server writes how the job ended, {"rc": exit code or -signal}. At its
deadline the trainer has the fork-server SIGKILL it: PID 1 of its own namespace, unable to fork, it
leaves nothing behind, and its tmpfs goes with its mount namespace. The fork-server, and so every
job, ends when the trainer's end of its socket closes (the trainer exits or dies).

What a job runs once it has no way out (its kind):
    "code"      a program, as `python -c` would run it, its stdin from a file
    "tests"     a harness (the job's PID 1; the programs under test cannot touch it) that runs a
                program on each test input in grandchildren: a stdin test in one of its own;
                call-based tests in one, in turn (module state persists from call to call), and in a
                fresh one after any test that does not return. After each returned call the
                grandchild writes MARK on stderr, then the value as a line of JSON on fd 4: what
                stderr holds after the last MARK is the failing test's own.
    "workflow"  a workflow script; mas.py's helpers send its requests over the channel and wait for
                replies

The trainer's side, thread-safe (one fork-server; each drive() call its own loop):
    start(unsafe=None) -> str; stop(); isolation() -> str; server()
                                 the fork-server, started on first use
    Job(kind, payload, timeout, max_output, memory, on_message, on_end)
                                 one job, submitted at once
    drive(jobs, idle, until)     send, read, kill at deadlines; on_message, on_end and idle() are
                                 called here
    outcome(job) -> (stdout, stderr, status, seconds, returncode)
                                 status: ok | error | timeout | memory | killed

Where user namespaces cannot be had, start() raises SandboxUnavailable (saying why and what to
enable) unless METAAGENT_UNSAFE_SANDBOX=1 or start(unsafe=True): then rlimits + seccomp only, and a
warning on every start. Not covered: jobs share the fork-server's (empty, loopback-down) network
namespace, so two jobs could meet over an abstract unix socket; CPU and memory bandwidth are shared
(no cgroups).

To copy it: Linux on x86-64 or aarch64, kernel 5.3 or later (pidfd), `unshare` from util-linux, the
stdlib, and mas.py for the "workflow" kind (or drop that kind).

Needs: mas.py (a workflow job runs its script with mas's helpers)
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
import resource
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

UNSAFE_ENV = "METAAGENT_UNSAFE_SANDBOX"
MEMORY = 1 << 30  # bytes of address space a job may add to the fork-server's
FILE_SIZE = 16 << 20  # largest file a job may write
TMPFS_SIZE = "64m"  # a job's private working directory
STDERR_CAP = 8192  # bytes of a job's stderr kept: its end, where the error is
MAX_LINE = 64 << 20  # longest message the trainer accepts from a job
MARK = b"\n\0--- end of a test ---\0\n"  # on stderr after each call test that returned


class SandboxUnavailable(RuntimeError):
    """The sandbox needs unprivileged user namespaces (with mount, network and PID namespaces) and
    seccomp, via `unshare` from util-linux. To enable: `sysctl -w
    kernel.unprivileged_userns_clone=1` (Debian/Ubuntu), `sysctl -w user.max_user_namespaces=15000`,
    `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (Ubuntu 24.04+); in Docker/Kubernetes
    allow the unshare/clone syscalls (e.g. --security-opt seccomp=unconfined) or run with a user
    namespace. To run WITHOUT this isolation (rlimits + seccomp only, no read-only filesystem,
    network or PID namespace): set METAAGENT_UNSAFE_SANDBOX=1 or call sandbox.start(unsafe=True)."""


# --------------------------------------------------------------------------------------------------
# Linux plumbing: mounts, seccomp, capabilities, rlimits (ctypes; the numbers are the kernel's ABI)

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
_MOUNT_FLAGS = {
    "ro": MS_RDONLY,
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": 1024,
    "nodiratime": 2048,
    "relatime": 1 << 21,
    "strictatime": 1 << 24,
}


def _check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _mount(src, target, fstype, flags, data=None):
    def c(s):
        return s and s.encode()

    _check(
        _libc.mount(c(src), c(target), c(fstype), ctypes.c_ulong(flags), c(data)), f"mount {target}"
    )


def _mounts():
    """{mount point: its flags} of this mount namespace (the last mount at a path is the visible
    one), the points' octal escapes decoded (\\040: a space)."""
    with open("/proc/self/mountinfo") as f:
        fields = [line.split()[4:6] for line in f]

    def unescape(point):
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), point)

    return {
        unescape(point): sum(_MOUNT_FLAGS.get(o, 0) for o in opts.split(","))
        for point, opts in fields
    }


def _readonly_everything():
    """Remount every mount read-only. The flags the kernel has locked (nosuid, nodev, noexec, atime)
    must be repeated, or it says EPERM."""
    for point, flags in _mounts().items():
        if not flags & MS_RDONLY:
            with contextlib.suppress(OSError):  # checked below
                _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    writable = [p for p, f in _mounts().items() if not f & MS_RDONLY]
    if writable:
        raise OSError(f"could not make these mounts read-only: {writable}")


_ARCH = {  # machine: (audit arch, clone, clone3, the syscalls denied: the list below)
    "x86_64": (
        0xC000003E,
        56,
        435,
        [
            57,
            58,
            59,
            322,
            272,
            308,
            165,
            166,
            155,
            161,
            101,
            321,
            323,
            250,
            298,
            428,
            429,
            430,
            431,
            432,
            442,
            310,
            311,
        ],
    ),
    "aarch64": (
        0xC00000B7,
        220,
        435,
        [
            221,
            281,
            97,
            268,
            40,
            39,
            41,
            51,
            117,
            280,
            282,
            219,
            241,
            428,
            429,
            430,
            431,
            432,
            442,
            270,
            271,
        ],
    ),
}
# denied: fork vfork execve execveat unshare setns mount umount2 pivot_root chroot ptrace bpf
# userfaultfd keyctl perf_event_open open_tree move_mount fsopen fsconfig fsmount mount_setattr
# process_vm_readv/writev


def _seccomp_no_spawn():
    """A seccomp filter: no new processes (threads are fine), no exec, no mount/namespace/ptrace
    syscalls. clone3 says ENOSYS so that libc falls back to clone, whose flags a filter can read."""
    if os.uname().machine not in _ARCH:
        raise OSError(f"no seccomp table for {os.uname().machine}")
    audit, clone, clone3, deny = _ARCH[os.uname().machine]
    eperm, enosys, allow, kill = 0x00050000 | 1, 0x00050000 | 38, 0x7FFF0000, 0x80000000
    prog = [
        (0x20, 0, 0, 4),
        (0x15, 1, 0, audit),
        (0x06, 0, 0, kill),
        (0x20, 0, 0, 0),
        (0x35, 0, 1, 0x40000000),  # x32 syscalls: no
        (0x06, 0, 0, eperm),
    ]
    for nr in deny:  # each denied syscall: EPERM
        prog += [(0x15, 0, 1, nr), (0x06, 0, 0, eperm)]
    prog += [
        (0x15, 0, 1, clone3),
        (0x06, 0, 0, enosys),
        (0x15, 0, 3, clone),
        (0x20, 0, 0, 16),
        (0x45, 1, 0, 0x00010000),  # CLONE_THREAD?
        (0x06, 0, 0, eperm),
        (0x06, 0, 0, allow),
    ]
    filt = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *ins) for ins in prog))
    fprog = struct.pack("HxxxxxxP", len(prog), ctypes.addressof(filt))
    _check(_libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
    _check(_libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0), "seccomp")


def _drop_capabilities():
    """No capabilities now or after any exec (securebits, bounding set, ambient set, then none at
    all)."""
    _libc.prctl(28, 0x2F, 0, 0, 0)  # SECBIT_NOROOT etc., locked (needs CAP_SETPCAP)
    for cap in range(64):
        _libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EPERM/EINVAL where it cannot: fine)
    _libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    # v3, this process: none
    _check(_libc.capset(struct.pack("Ii", 0x20080522, 0), bytes(24)), "capset")


def _enter(stdin, cpu_seconds, memory):
    """The last steps before model code runs: fd 0 a deleted file that holds `stdin`, the rlimits,
    the seccomp filter. (sys.stdin/stdout/stderr, never used in the fork-server, read and write fds
    0-2 just as `python -c`'s do.)"""
    with tempfile.TemporaryFile(dir=".") as f:
        os.pwrite(f.fileno(), stdin.encode(), 0)  # (the offset stays at 0)
        os.dup2(f.fileno(), 0)
    vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    for res, val in (
        (resource.RLIMIT_AS, vm + memory),
        (resource.RLIMIT_CPU, cpu_seconds),
        (resource.RLIMIT_FSIZE, FILE_SIZE),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_NPROC, 4096),
        (resource.RLIMIT_CORE, 0),
    ):
        # above a hard limit: that one is stricter still
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(res, (val, val))
    _seccomp_no_spawn()


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


def _calls(payload, inputs, cpu, memory):
    """Grandchild: the program once, then each call test in turn: MARK on stderr and the returned
    value as a line of JSON on fd 4, so that what the program printed on stderr after the last MARK
    is the failing test's. The first test that does not return ends the process, as it would end a
    process of its own."""
    os.close(3)
    _enter("", cpu * len(inputs), memory)

    # the soft RLIMIT_CPU: each test its own seconds, as in a process of its own
    def own_cpu_seconds():
        t, hard = (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrlimit(resource.RLIMIT_CPU)[1],
        )
        # (a soft limit at or below the hard one: lowering or raising it is always allowed)
        resource.setrlimit(
            resource.RLIMIT_CPU, (min(int(t.ru_utime + t.ru_stime) + cpu, hard), hard)
        )

    own_cpu_seconds()  # the first test's seconds include running the program
    rc, g = _run_program(payload["code"], "solution")
    for inp in inputs if rc == 0 else []:
        try:
            # a method of a fresh Solution() if there is one, as LeetCode calls it
            name = payload["fn_name"]
            fn = getattr(g["Solution"](), name) if hasattr(g.get("Solution"), name) else g[name]
            out = json.dumps(
                fn(*_call_args(inp)),
                default=lambda o: sorted(o) if isinstance(o, set | frozenset) else repr(o),
            )
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
    return, and the tests after it get a fresh one, so that no test can sink another. Expected
    outputs never enter the job."""
    inputs, k = payload["inputs"], 0
    while k < len(inputs):
        for outcome in _grandchild(
            payload, inputs[k:] if payload["fn_name"] else inputs[k : k + 1], memory
        ):
            chan.send(outcome)
            k += 1


def _grandchild(payload, inputs, memory):
    """Run `inputs` (one stdin test, or call tests in turn) in one grandchild; yield each test's
    outcome as it completes, up to and including the first that does not return (at least one)."""
    per, cap, fn = payload["timeout_per_test"], payload["max_output"], payload["fn_name"]
    (out_r, out_w), (err_r, err_w), (res_r, res_w) = os.pipe(), os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 120
        try:
            _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: it dies with the harness
            for fd, to in ((out_w, 1), (err_w, 2), (res_w, 4)):
                os.dup2(fd, to)
            os.closerange(5, 1 << 16)
            cpu = math.ceil(per) + 1
            code = (
                _calls(payload, inputs, cpu, memory)
                if fn
                else _program_job(
                    {"code": payload["code"], "stdin": str(inputs[0])}, None, cpu, memory
                )
            )
        finally:  # whatever happened: it never returns into the harness's loop
            _flush()
            os._exit(code)
    for fd in (out_w, err_w, res_w):
        os.close(fd)
    out, err, res = b"", b"", b""  # stdout, the current test's stderr, the current line of results
    done, killed, deadline, fds = 0, False, time.monotonic() + per, [out_r, err_r, res_r]
    while fds:
        if not killed and time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            killed = True
        for fd in select.select(
            fds, [], [], None if killed else max(0.0, deadline - time.monotonic())
        )[0]:
            data = os.read(fd, 65536)
            if not data:
                fds.remove(fd)
                os.close(fd)
            elif fd == out_r:
                out += data[: cap - len(out)]
            elif fd == err_r:
                err = (err + data).rsplit(MARK, 1)[-1][-STDERR_CAP:]
            elif fn and not killed:  # each full line: a test that returned
                *lines, res = (res + data).split(b"\n")
                for line in lines[: len(inputs) - done]:
                    yield {
                        "status": "ok",
                        "output": line[:cap].decode("utf-8", "replace"),
                        "error": None,
                    }
                    done += 1
                    deadline = time.monotonic() + per
                res = res[:cap]
    rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if done < len(inputs):
        text = err.decode("utf-8", "replace")
        status = _status(rc, text, killed)
        yield {
            "status": status,
            "output": (res if fn else out).decode("utf-8", "replace"),
            "error": None if status == "ok" else last_line(text) or f"{status} (exit code {rc})",
        }


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
        msg = (
            {"answer": answer[: payload["max_output"]]}
            if isinstance(answer, str)
            else {"error": f"workflow returned {type(answer).__name__}, not str"}
        )
    except SystemExit as e:
        msg = {"error": f"the script called sys.exit({e.code!r})"}
    except BaseException as e:  # every failure of the script becomes WorkflowRun.error
        msg = {"error": _describe(e)}
    with contextlib.suppress(OSError):
        chan.send(dict(msg, op="done"))


def _describe(exc):
    """'ValueError: bad (script line 3)': the exception and the last script line it passed
    through."""
    lines = [
        fr.lineno for fr in traceback.extract_tb(exc.__traceback__) if fr.filename == "<workflow>"
    ]
    line = lines[-1] if lines else exc.lineno if isinstance(exc, SyntaxError) else None
    text = traceback.format_exception_only(type(exc), exc)[-1].strip()[:300]
    return f"{text} (script line {line})" if line else text


def _job(spec, fds, base, isolated):
    """In the forked child: isolate, read the payload, run it, exit. Never returns."""
    code = 121
    try:
        for fd, to in zip([fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds[:3]], (3, 1, 2)):
            os.dup2(fd, to)  # channel, stdout, stderr; then nothing else of the fork-server's
        os.closerange(4, 1 << 16)
        os.setsid()
        # PR_SET_DUMPABLE 0: no program under test opens its harness's memory
        _libc.prctl(4, 0, 0, 0, 0)
        if isolated:
            _check(_libc.unshare(CLONE_NEWNS), "unshare(mount)")
            _mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, f"size={TMPFS_SIZE},mode=0755")
            with contextlib.suppress(OSError):  # this job's own /proc: no other job's processes
                _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
        else:
            # PR_SET_PDEATHSIG: best effort without a PID namespace
            _libc.prctl(1, signal.SIGKILL, 0, 0, 0)
            # a folder of its own, removed by the fork-server
            base = os.path.join(base, str(spec["id"]))
            os.mkdir(base)
        os.chdir(base)
        _drop_capabilities()
        chan = Channel(3)
        run = {"code": _program_job, "tests": _tests_job, "workflow": _workflow_job}[spec["kind"]]
        # its exit code: a program's; 0 for a harness or a script that ran to its end (they return
        # None)
        code = run(chan.receive(), chan, math.ceil(spec["timeout"]) + 1, spec["memory"]) or 0
    except BaseException:  # noqa: BLE001 - our own set-up failed: say so on stderr
        traceback.print_exc()
    finally:  # whatever happened: this process never returns into the fork-server's loop
        _flush()
        os._exit(code)


# --------------------------------------------------------------------------------------------------
# The fork-server: a fresh exec inside the namespaces; a child forked per job, each one's end
# reported


def _serve(sock_fd, base, isolated):
    sock = socket.socket(fileno=sock_fd)
    # (a failure ends this process; its traceback is in the trainer's SandboxUnavailable)
    if isolated:
        if os.path.isdir("/run"):  # hide the host's unix sockets
            _mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k")
        # base too: each job mounts its own tmpfs there, in its own mount namespace
        _readonly_everything()
        pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
    sock.send(b'{"ready": true}')
    gc.freeze()  # the forked jobs share these pages; the collector must not dirty them
    jobs = {}  # job id -> (pid, pidfd, status fd)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is not sock:  # a job ended: say how on its status pipe
                pid, pidfd, sfd = jobs.pop(key.data)
                sel.unregister(pidfd)
                os.close(pidfd)
                with contextlib.suppress(OSError):
                    os.write(sfd, _line({"rc": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}))
                os.close(sfd)
                # (unsafe mode's)
                shutil.rmtree(os.path.join(base, str(key.data)), ignore_errors=True)
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
                if isolated:
                    # the next child: PID 1 of a new one
                    _check(_libc.unshare(CLONE_NEWPID), "unshare(pid)")
                pid = os.fork()
                if pid == 0:
                    _job(spec, fds, base, isolated)
            # no fork (memory, pids): this job fails (no exit status), the server goes on
            except OSError:
                os.close(fds[3])
                continue
            finally:  # (only the fork-server gets here: a child never returns from _job)
                if isolated:  # later children (and this one's retry) in a fresh namespace again
                    _check(_libc.setns(pidns, CLONE_NEWPID), "setns(pid)")
                for fd in fds[:3]:  # the child's copies are its own
                    os.close(fd)
            jobs[spec["id"]] = (pid, os.pidfd_open(pid), fds[3])
            sel.register(jobs[spec["id"]][1], selectors.EVENT_READ, spec["id"])


# --------------------------------------------------------------------------------------------------
# The trainer's side: the fork-server process, jobs, and the event loop that drives them
# (thread-safe)


def remove_stale_bases(tmp=None):
    """Delete the fork-servers' base folders that dead processes left in the temp directory (a
    SIGKILLed trainer cannot clean up; the folder's name holds its pid). Called whenever a
    fork-server starts."""
    tmp = tmp or tempfile.gettempdir()
    # (this process's own is alive)
    stale = [
        d
        for d in os.listdir(tmp)
        if (m := re.fullmatch(r"metaagent-sandbox-(\d+)-\w+", d))
        and not os.path.exists(f"/proc/{m[1]}")
    ]
    for d in stale:
        shutil.rmtree(os.path.join(tmp, d), ignore_errors=True)
    return stale


class Server:
    """The fork-server process, seen from the trainer: start it, submit a job, close it."""

    def __init__(self, unsafe):
        self.unsafe, self.ids = unsafe, itertools.count(1)  # (next() on a count is atomic: no lock)
        remove_stale_bases()
        self.base = tempfile.mkdtemp(prefix=f"metaagent-sandbox-{os.getpid()}-")
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()
        # -E -s: no environment variables, no user site; run by path (its __main__ block finds
        # mas.py)
        cmd = [
            sys.executable,
            "-E",
            "-s",
            os.path.abspath(__file__),
            str(child.fileno()),
            self.base,
            "unsafe" if unsafe else "isolated",
        ]
        if not unsafe:
            cmd = [
                shutil.which("unshare") or "/usr/bin/unshare",
                "--user",
                "--map-root-user",
                "--net",
                "--pid",
                "--fork",
                "--mount",
                "--mount-proc",
                "--kill-child",
                "--",
                *cmd,
            ]
        self.sock.settimeout(120)  # for every exchange: a fork-server that hangs is an error
        try:
            # no more
            env = {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "LANG": "C.UTF-8",
                "HOME": self.base,
            }
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
            hello = json.loads(
                self.sock.recv(65536) or b'{"error": "the fork-server exited at start-up"}'
            )
        except OSError as e:
            hello = {"error": f"cannot start {cmd[0]}: {e}"}
        child.close()
        if "error" in hello:
            self.log.seek(0)
            log = self.log.read().decode("utf-8", "replace").strip()[-1500:]
            self.close()
            raise SandboxUnavailable(
                f"the sandbox cannot isolate model code here: {hello['error']}\n{log}\n"
                + SandboxUnavailable.__doc__
            )
        self.isolation = (
            "UNSAFE: rlimits + seccomp only; no namespaces, no read-only files, network open"
            if unsafe
            else "isolated: user+mount+net+pid namespaces, read-only fs, seccomp, rlimits"
        )
        if unsafe:
            print(
                f"WARNING: sandbox running {self.isolation}; model code can touch this machine",
                file=sys.stderr,
                flush=True,
            )

    def submit(self, kind, timeout, memory):
        """Start one job: (its id, the trainer's ends of its channel, stdout, stderr and status)."""
        chan, chan_job = socket.socketpair()
        (out, out_w), (err, err_w), (st, st_w) = os.pipe(), os.pipe(), os.pipe()
        spec = {
            "op": "run",
            "id": next(self.ids),
            "kind": kind,
            "timeout": timeout,
            "memory": memory,
        }
        try:  # one message each, whole: threads may submit at once
            socket.send_fds(
                self.sock, [json.dumps(spec).encode()], [chan_job.fileno(), out_w, err_w, st_w]
            )
        finally:  # the fork-server has its own copies now
            for fd in (chan_job.detach(), out_w, err_w, st_w):
                os.close(fd)
        return spec["id"], chan, out, err, st

    def close(self):
        """End the fork-server and every job: it reads its socket's end and exits, and its jobs end
        with it (it is PID 1 of the namespace they live in; unsafe: their parent, PR_SET_PDEATHSIG).
        `unshare` returns once its whole namespace is gone, so waiting on it leaves nothing behind;
        killed after 5 s."""
        self.sock.close()
        if hasattr(self, "proc"):
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)


_server, _unsafe, _lock = None, None, threading.RLock()
atexit.register(lambda: stop())


def server():
    """The running fork-server, (re)started when there is none or it died."""
    global _server
    with _lock:
        if _server is None or _server.proc.poll() is not None:
            stop()
            unsafe = os.environ.get(UNSAFE_ENV, "") not in ("", "0") if _unsafe is None else _unsafe
            _server = Server(unsafe)
        return _server


def start(unsafe=None):
    """Start (or restart) the fork-server and return the line that describes its isolation, for the
    log.

    Call it early (before torch/vLLM start threads is best; it is a fresh exec either way).
    unsafe=None reads METAAGENT_UNSAFE_SANDBOX. Raises SandboxUnavailable when the isolation cannot
    be had."""
    global _unsafe
    stop()
    _unsafe = unsafe
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


class Job:
    """One job seen from the trainer: its descriptors, capped output, messages, deadline, how it
    ended.

    drive() calls on_message(job, msg) for each message on its channel (while it is not being
    killed; all of them are kept in job.messages too) and on_end(job) once, when it has ended."""

    def __init__(
        self,
        kind,
        payload,
        timeout,
        max_output,
        memory=MEMORY,
        on_message=lambda job, msg: None,
        on_end=lambda job: None,
    ):
        self.server, self.timeout, self.max_output = server(), timeout, max_output
        self.on_message, self.on_end, self.messages = on_message, on_end, []
        self.t0, self.deadline = time.monotonic(), time.monotonic() + timeout
        self.paused_at = self.kill_reason = self.rc = self.chan = None
        self.out, self.err, self.status, self.inbuf, self.open = (
            bytearray(),
            b"",
            b"",
            bytearray(),
            set(),
        )
        self.sendbuf = bytearray(_line(payload))
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

    def reply(self, obj):  # its clock, stopped while it waited on the trainer, runs again
        self.sendbuf += _line(obj)
        self.deadline += 0 if self.paused_at is None else time.monotonic() - self.paused_at
        self.paused_at = None

    def on_readable(self, fd):
        """Read what is there; False when `fd` has closed."""
        try:
            data = os.read(fd, 65536)
        except OSError:  # ECONNRESET: the job is gone (after select, a read never waits)
            data = b""
        if not data:
            self.open.discard(fd)
        elif fd == self.out_r:
            self.out += data[: self.max_output - len(self.out)]
        elif fd == self.err_r:
            self.err = (self.err + data)[-STDERR_CAP:]
        elif fd == self.st_r:
            self.status += data
        elif self.kill_reason is None:  # the channel: one JSON object a line
            self.inbuf += data
            if len(self.inbuf) > MAX_LINE:
                self.kill("protocol violation: oversized message on the sandbox channel")
            elif b"\n" in data:
                *lines, self.inbuf = self.inbuf.split(b"\n")
                for raw in lines:
                    try:
                        msg = json.loads(raw)
                    except ValueError:
                        msg = None
                    if not isinstance(msg, dict):
                        self.kill("protocol violation: malformed message on the sandbox channel")
                    if self.kill_reason is not None:
                        break
                    self.messages.append(msg)
                    self.on_message(self, msg)
        return bool(data)

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
                os.close(fd)
            self.chan, self.open = None, set()
            with contextlib.suppress(ValueError):  # {"rc": ...}; nothing when it never started
                self.rc = json.loads(self.status or b"{}").get("rc")


def last_line(text):
    """The last non-blank line of `text` (that of the stripped text), at most 500 characters: "" if
    none."""
    return (text.strip().splitlines() or [""])[-1].strip()[:500]


def _status(rc, stderr, timed_out):
    """How a process ended: timeout (its deadline or CPU seconds), ok, memory, killed (by a signal),
    error."""
    return (
        "timeout"
        if timed_out or rc == -signal.SIGXCPU
        else "ok"
        if rc == 0
        else "memory"
        if "MemoryError" in last_line(stderr)
        else "killed"
        if rc is not None and rc < 0
        else "error"
    )


def outcome(job):
    """(stdout, stderr, status, seconds, returncode) of an ended job; stderr ends with why it was
    stopped."""
    rc, err = job.rc, job.err.decode("utf-8", "replace")
    status = _status(rc, err, (job.kill_reason or "").startswith("timeout"))
    why = job.kill_reason or (
        "no exit status: the fork-server could not start the job, or died"
        if rc is None
        else f"killed by signal {-rc} ({signal.strsignal(-rc)})"
        if rc < 0
        else ""
    )
    return (
        job.out.decode("utf-8", "replace"),
        f"{err}\n{why}".strip(),
        status,
        time.monotonic() - job.t0,
        rc,
    )


def drive(jobs, idle=lambda: None, until=lambda: False):
    """The trainer's event loop over `jobs`, a list its callbacks may extend: send payloads and
    replies, collect output and messages, kill each job at its deadline (a paused job's clock stands
    still), call job.on_end once a job has ended and idle() after every turn. Returns when every job
    has ended, or as soon as until() holds; the jobs still running then are killed, as when the loop
    is left any other way."""
    sel, live, seen = selectors.DefaultSelector(), [], 0  # live: the jobs not yet ended
    try:
        while True:
            for j in jobs[seen:]:
                for fd in j.open:
                    sel.register(fd, selectors.EVENT_READ, j)
            live, seen = live + jobs[seen:], len(jobs)
            for j in [j for j in live if j.finished]:
                j.close()
                j.on_end(j)
            live = [j for j in live if not j.finished]
            idle()
            if not live and seen == len(jobs) or until():
                return
            now = time.monotonic()
            for j in live:
                j.flush_send()
                if j.kill_reason is None and j.paused_at is None and now >= j.deadline:
                    j.kill(f"timeout after {j.timeout:g}s")
            waits = [
                j.deadline - now for j in live if j.kill_reason is None and j.paused_at is None
            ] + [0.5]
            # new jobs: at once; lines to send: soon; else the next deadline
            wait = (
                0.0
                if seen < len(jobs)
                else 0.001
                if any(j.sendbuf for j in live)
                else max(0, min(waits))
            )
            for key, _ in sel.select(wait):
                if not key.data.on_readable(key.fd):
                    sel.unregister(key.fd)
    finally:
        for j in jobs:
            if not j.finished:
                j.kill("aborted")
            j.close()
        sel.close()


# the fork-server: `python -E -s machinery/isolation.py FD BASE isolated|unsafe`
if __name__ == "__main__":
    # Run by path, so the project's root goes first on the path, for mas.py: imported here, by the
    # fork-server alone and before its first fork, it is the `mas` of every workflow job
    # (_workflow_job)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import mas

    _serve(int(sys.argv[1]), sys.argv[2], sys.argv[3] == "isolated")
