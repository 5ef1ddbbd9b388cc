"""confine.py: the kernel's locks on one process before it runs model-written code. Each function
sets one lock and says what it stops; isolation.py calls them in order, in its fork-server and in
each job it forks.

    empty_root(new, readable, job_dir)
                                (a fresh user+mount namespace) the process's root becomes a tmpfs
                                that holds only `readable` (the Python install and the shared
                                libraries, bound read-only), /dev/null, /dev/zero, /dev/urandom, a
                                /proc of its PID namespace and `job_dir`, the mount point of a
                                job's folder
    python_roots()              what `readable` is: the interpreter's prefixes, the folders of
                                every shared library it has loaded, the system's library folders
    landlock_abi() -> int       the kernel's Landlock ABI (0: none)
    landlock(abi, read, write, devices)
                                files: reads only beneath `read`, writes only beneath `write`;
                                no TCP bind or connect (ABI 4); signals and abstract unix sockets
                                only within the process's own domain (ABI 6)
    drop_capabilities()         no capabilities now or after any exec
    seccomp(rules)              the syscall filter below: job_rules(own_pid) its rules
    limit(address_space, cpu_seconds, file_size, open_files, tasks)
                                rlimits

The seccomp filter, what it stops (EPERM unless said), by class:

    processes   fork, vfork, exec; clone but for threads (clone3: ENOSYS, so libc uses clone)
    the kernel  namespaces and mounts (listmount, statmount too), ptrace and process_vm_*,
                pidfd_*, kcmp, bpf, io_uring, perf_event_open, userfaultfd, keyrings, handles,
                syslog
    memory      memfd_create, memfd_secret, SysV shared memory, semaphores and message queues,
                POSIX message queues: what an address-space limit cannot count, refused
    sockets     socket() but AF_UNIX; connect, bind, listen, accept, sendmsg, sendmmsg, sendto to an
                address: a job speaks only over the socket pairs it was given or made
    signals     kill, tgkill, tkill, rt_*sigqueueinfo but to itself (or its own group: pid 0);
                fcntl F_SETOWN / F_SETSIG / F_SETOWN_EX and ioctl FIOSETOWN / SIOCSPGRP (a signal
                on I/O to any pid), TIOCSTI; prlimit64 but its own; setpriority, ioprio_set,
                sched_set*, migrate_pages, move_pages
    files       chmod, chown, utime*, *xattr and truncate, by path and by descriptor: what
                Landlock does not cover
    watches     inotify, fanotify, flock; fcntl's locks, leases and F_NOTIFY: what would show a
                job another's (or the trainer's) use of a file they both can open; the page
                cache's state: mincore, cachestat, and dropping pages (fadvise, madvise
                MADV_COLD / MADV_PAGEOUT). Left: timing a read (a page read since boot or not)

Landlock (from Linux 5.13) needs no namespace and no privilege, which makes it the boundary where
user namespaces are off (isolation.py's fallback); seccomp needs neither either.

To copy it: Linux on x86-64 or aarch64, the stdlib.

Needs: no other file of this project.
"""

import ctypes
import errno
import os
import re
import struct
import sys

_libc = ctypes.CDLL(None, use_errno=True)
MACHINE = os.uname().machine

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_THREAD = 0x00010000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
# the per-mount flags the kernel locks in a user namespace: a remount must repeat them
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
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")
LIBRARY_DIRS = (
    "/lib",
    "/lib64",
    "/lib32",
    "/usr/lib",
    "/usr/lib64",
    "/usr/lib32",
    "/usr/local/lib",
)


def check(ret, what):
    """Raise OSError with errno's text when a libc call failed (returned -1)."""
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return ret


def _c(s):
    return s.encode() if isinstance(s, str) else s


def mount(src, target, fstype, flags, data=None):
    ret = _libc.mount(_c(src), _c(target), _c(fstype), ctypes.c_ulong(flags), _c(data))
    check(ret, f"mount {target}")


def syscall(name, *args):
    """A raw syscall by name (this machine's number), each argument a C long or a pointer."""
    nr = SYSCALLS[MACHINE][name]
    return check(_libc.syscall(ctypes.c_long(nr), *args), name)


# --------------------------------------------------------------------------------------------------
# Mounts: an empty root


def mounts():
    """{mount point: its flags} of this mount namespace (the last mount at a path is the visible
    one), the points' octal escapes decoded (\\040: a space)."""
    found = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point, opts = line.split()[4:6]
            point = re.sub(r"\\([0-7]{3})", _unescape, point)
            found[point] = sum(_MOUNT_FLAGS.get(o, 0) for o in opts.split(","))
    return found


def _unescape(m):
    return chr(int(m[1], 8))


def python_roots():
    """The folders a Python program needs to run and import: the interpreter's prefixes (its
    standard library, a virtual environment's packages), the folders of every shared library this
    process has loaded (libpython, libc, the extension modules' own libraries) and the system's
    library folders (what a later import dlopens). Real paths, none inside another."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    found |= {d for d in LIBRARY_DIRS if os.path.isdir(d)}
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split(maxsplit=5)[5:]
            if path and ".so" in path[0] and os.path.isfile(path[0].strip()):
                found.add(os.path.dirname(path[0].strip()))
    real = sorted({os.path.realpath(p) for p in found if os.path.isdir(p)})
    roots = []
    for p in real:  # sorted: a folder comes before any folder inside it
        if not any(p == r or p.startswith(r + "/") for r in roots):
            roots.append(p)
    return roots


def empty_root(new, readable, job_dir):
    """Make the tmpfs mounted at `new` this mount namespace's root, holding only: each folder of
    `readable`, bound read-only at its own path; the symbolic links that lead there (/lib ->
    usr/lib); DEVICES; a fresh /proc (of this process's PID namespace); an empty `job_dir`, where
    each job mounts its own tmpfs. The host's tree is unmounted, every mount left read-only.
    Needs CAP_SYS_ADMIN in the namespace (a fresh user namespace gives it)."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in readable:
        os.makedirs(new + path, exist_ok=True)
        mount(path, new + path, None, MS_BIND | MS_REC)
    for link in ("/lib", "/lib64", "/lib32", "/bin", "/usr/lib", "/usr/lib64"):
        if os.path.islink(link) and not os.path.lexists(new + link):
            os.makedirs(os.path.dirname(new + link), exist_ok=True)
            os.symlink(os.readlink(link), new + link)
    os.makedirs(new + "/dev", exist_ok=True)
    for dev in DEVICES:
        open(new + dev, "w").close()
        mount(dev, new + dev, None, MS_BIND)
    os.makedirs(new + "/proc", exist_ok=True)
    mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(new + job_dir, exist_ok=True)
    os.makedirs(new + "/.old", exist_ok=True)
    syscall("pivot_root", _c(new), _c(new + "/.old"))
    os.chdir("/")
    check(_libc.umount2(b"/.old", MNT_DETACH), "umount /.old")
    os.rmdir("/.old")
    for point, flags in mounts().items():
        if not flags & MS_RDONLY:
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    writable = [p for p, f in mounts().items() if not f & MS_RDONLY]
    if writable:
        raise OSError(f"could not make these mounts read-only: {writable}")


# --------------------------------------------------------------------------------------------------
# Landlock

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 2, 4, 8
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_DIR, FS_MAKE_REG = 16, 32, 128, 256
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
WRITE = READ | FS_WRITE_FILE | FS_TRUNCATE | FS_REMOVE_FILE | FS_MAKE_REG | FS_REFER
DEVICE = FS_READ_FILE | FS_WRITE_FILE | FS_IOCTL_DEV
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2


def landlock_abi():
    """The Landlock ABI version this kernel offers; 0 when it has none (or it is disabled)."""
    try:
        return syscall("landlock_create_ruleset", None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except OSError:
        return 0


def landlock(abi, read, write, devices=DEVICES):
    """Confine this process (and all it starts) with Landlock: every file right the ABI knows is
    denied but reads beneath each folder of `read` (and of `write`), writes beneath `write`
    ({folder: rights}, e.g. WRITE; with MAKE_DIR it may hold folders), read and write of
    `devices`. From ABI 4 no TCP bind or connect; from ABI 6 signals and abstract unix sockets stay
    inside the domain (this process and what it starts). Cannot be undone."""
    fs = (1 << 13) - 1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    fs |= FS_IOCTL_DEV if abi >= 5 else 0
    net = 3 if abi >= 4 else 0  # BIND_TCP | CONNECT_TCP, and no rule allows either
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    attr = ctypes.create_string_buffer(struct.pack("<QQQ", fs, net, scoped)[:size])
    ruleset = syscall("landlock_create_ruleset", attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    rules = [(p, READ) for p in read] + list(write.items()) + [(d, DEVICE) for d in devices]
    try:
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(path):
                    rights &= FILE_RIGHTS
                rule = ctypes.create_string_buffer(struct.pack("<Qi", rights & fs, fd))
                syscall("landlock_add_rule", ruleset, 1, rule, 0)  # 1: LANDLOCK_RULE_PATH_BENEATH
            finally:
                os.close(fd)
        check(_libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
        syscall("landlock_restrict_self", ruleset, 0)
    finally:
        os.close(ruleset)


# --------------------------------------------------------------------------------------------------
# Capabilities and rlimits


def drop_capabilities():
    """No capabilities now or after any exec (securebits, the bounding set, the ambient set, then
    none at all). Where one cannot be dropped (no CAP_SETPCAP), it was not held."""
    _libc.prctl(28, 0x2F, 0, 0, 0)  # SECBIT_NOROOT etc., locked
    for cap in range(64):
        _libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP
    _libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    header = struct.pack("Ii", 0x20080522, 0)  # v3, this process
    check(_libc.capset(header, bytes(24)), "capset")


def limit(address_space, cpu_seconds, file_size, open_files, tasks=None):
    """rlimits: bytes of address space, CPU seconds (SIGXCPU, then SIGKILL a second later), bytes
    of any one file written, open descriptors, and, unless None, the tasks (processes and threads)
    of this user (it binds no uid 0; since Linux 5.14 counted in each user namespace apart); no
    core files, no locked memory, no message queue bytes. A limit above the hard one keeps the
    hard one."""
    import resource

    limits = [
        (resource.RLIMIT_AS, address_space),
        (resource.RLIMIT_CPU, cpu_seconds),
        (resource.RLIMIT_FSIZE, file_size),
        (resource.RLIMIT_NOFILE, open_files),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_MEMLOCK, 0),
        (resource.RLIMIT_MSGQUEUE, 0),
    ]
    for res, val in limits + ([] if tasks is None else [(resource.RLIMIT_NPROC, tasks)]):
        hard = resource.getrlimit(res)[1]
        val = val if hard == resource.RLIM_INFINITY else min(val, hard)
        resource.setrlimit(res, (val, val))


# --------------------------------------------------------------------------------------------------
# seccomp

# the numbers of the syscalls named here, "name number" pairs: the kernel's ABI
X86_64 = """
ioctl 16 mincore 27 madvise 28 shmget 29 shmat 30 shmctl 31 socket 41 connect 42 accept 43
sendto 44 sendmsg 46 bind 49 listen 50 socketpair 53 clone 56 fork 57 vfork 58 execve 59 kill 62
semget 64 shmdt 67 msgget 68 fcntl 72 flock 73 truncate 76 chmod 90 fchmod 91 chown 92 fchown 93
lchown 94 ptrace 101 syslog 103 rt_sigqueueinfo 129 utime 132 setpriority 141 sched_setparam 142
sched_setscheduler 144 pivot_root 155 chroot 161 mount 165 umount2 166 setxattr 188 lsetxattr 189
fsetxattr 190 removexattr 197 lremovexattr 198 fremovexattr 199 tkill 200 sched_setaffinity 203
fadvise64 221 tgkill 234 utimes 235 mq_open 240 add_key 248 request_key 249 keyctl 250
ioprio_set 251 inotify_init 253 inotify_add_watch 254 migrate_pages 256 fchownat 260 futimesat 261
fchmodat 268 unshare 272 move_pages 279 utimensat 280 accept4 288 inotify_init1 294
rt_tgsigqueueinfo 297 perf_event_open 298 fanotify_init 300 fanotify_mark 301 prlimit64 302
name_to_handle_at 303 open_by_handle_at 304 sendmmsg 307 setns 308 process_vm_readv 310
process_vm_writev 311 kcmp 312 sched_setattr 314 memfd_create 319 bpf 321 execveat 322
userfaultfd 323
"""
AARCH64 = """
setxattr 5 lsetxattr 6 fsetxattr 7 removexattr 14 lremovexattr 15 fremovexattr 16 fcntl 25
inotify_init1 26 inotify_add_watch 27 ioctl 29 ioprio_set 30 flock 32 umount2 39 mount 40
pivot_root 41 truncate 45 chroot 51 fchmod 52 fchmodat 53 fchownat 54 fchown 55 utimensat 88
unshare 97 fanotify_init 262 fanotify_mark 263 syslog 116 ptrace 117 sched_setparam 118
sched_setscheduler 119 sched_setaffinity 122 kill 129 tkill 130 tgkill 131 rt_sigqueueinfo 138
setpriority 140 mq_open 180 msgget 186 semget 190 shmget 194 shmctl 195 shmat 196 shmdt 197
socket 198 socketpair 199 bind 200 listen 201 accept 202 connect 203 sendto 206 sendmsg 211
add_key 217 request_key 218 keyctl 219 clone 220 execve 221 migrate_pages 238 move_pages 239
rt_tgsigqueueinfo 240 perf_event_open 241 fadvise64 223 mincore 232 madvise 233 accept4 242
prlimit64 261 name_to_handle_at 264 open_by_handle_at 265 setns 268 sendmmsg 269
process_vm_readv 270 process_vm_writev 271 kcmp 272 sched_setattr 274 memfd_create 279 bpf 280
execveat 281 userfaultfd 282
"""
UNIFIED = """
pidfd_send_signal 424 io_uring_setup 425 io_uring_enter 426 io_uring_register 427 open_tree 428
move_mount 429 fsopen 430 fsconfig 431 fsmount 432 fspick 433 pidfd_open 434 clone3 435
pidfd_getfd 438 process_madvise 440 mount_setattr 442 landlock_create_ruleset 444
landlock_add_rule 445 landlock_restrict_self 446 memfd_secret 447 cachestat 451 fchmodat2 452
statmount 457 listmount 458 setxattrat 463 removexattrat 466 open_tree_attr 467 file_setattr 469
"""  # the same number on every architecture (Linux 5.1 on)


def _numbers(text):
    words = text.split()
    return {name: int(nr) for name, nr in zip(words[::2], words[1::2])}


SYSCALLS = {
    "x86_64": _numbers(X86_64 + UNIFIED),
    "aarch64": _numbers(AARCH64 + UNIFIED),
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

AF_UNIX = 1
F_SETOWN, F_SETSIG, F_SETOWN_EX = 8, 10, 15
# fcntl's locks (POSIX and open-file), leases and dnotify: what one job could see another do
F_WATCHES = [5, 6, 7, 36, 37, 38, 1024, 1025, 1026]
MADV_COLD, MADV_PAGEOUT = 20, 21  # a file's pages out of the page cache: another's reads slow
FIOSETOWN, SIOCSPGRP, TIOCSTI = 0x8901, 0x8902, 0x5412

DENIED = (  # by class, as the docstring lists them; a name this machine lacks is skipped
    "fork vfork execve execveat",
    "unshare setns mount umount2 pivot_root chroot open_tree move_mount fsopen fsconfig "
    "fsmount fspick mount_setattr open_tree_attr listmount statmount ptrace process_vm_readv "
    "process_vm_writev pidfd_open pidfd_getfd pidfd_send_signal process_madvise kcmp bpf "
    "io_uring_setup io_uring_enter io_uring_register perf_event_open userfaultfd keyctl "
    "add_key request_key name_to_handle_at open_by_handle_at syslog",
    "memfd_create memfd_secret shmget shmat shmctl shmdt semget msgget mq_open",
    "connect bind listen accept accept4 sendmsg sendmmsg",
    "setpriority ioprio_set sched_setparam sched_setscheduler sched_setattr sched_setaffinity "
    "migrate_pages move_pages",
    "chmod fchmodat fchmodat2 chown lchown fchownat utime utimes futimesat utimensat setxattr "
    "lsetxattr removexattr lremovexattr setxattrat removexattrat truncate fchmod fchown fsetxattr "
    "fremovexattr file_setattr",
    "inotify_init inotify_init1 inotify_add_watch fanotify_init fanotify_mark flock fadvise64 "
    "mincore cachestat",
)


def job_rules(own_pid):
    """{syscall name: rule} of a job's filter. A rule: ("deny",), ("enosys",), ("only", arg,
    values): allowed when the argument's low 32 bits are one of `values`, ("never", arg, values):
    denied when they are, ("null", arg): allowed when the whole argument is 0, ("flag", arg, bit):
    allowed when the bit is set."""
    rules = {}
    for group in DENIED:
        rules.update(dict.fromkeys(group.split(), ("deny",)))
    rules["clone3"] = ("enosys",)
    rules["clone"] = ("flag", 0, CLONE_THREAD)
    rules["socket"] = ("only", 0, [AF_UNIX])
    rules["socketpair"] = ("only", 0, [AF_UNIX])
    rules["sendto"] = ("null", 4)  # send() is sendto(..., NULL, 0): no address
    for name in ("kill", "tgkill"):
        rules[name] = ("only", 0, [own_pid, 0])
    for name in ("tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        rules[name] = ("only", 0, [own_pid])
    rules["prlimit64"] = ("only", 0, [0, own_pid])  # setrlimit/getrlimit: prlimit64(0, ...)
    rules["fcntl"] = ("never", 1, [F_SETOWN, F_SETSIG, F_SETOWN_EX, *F_WATCHES])
    rules["ioctl"] = ("never", 1, [FIOSETOWN, SIOCSPGRP, TIOCSTI])
    rules["madvise"] = ("never", 2, [MADV_COLD, MADV_PAGEOUT])
    return rules


_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
ALLOW, KILL, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


def _arg(k, high=False):  # offset of argument k's low (or high) 32 bits in struct seccomp_data
    return 16 + 8 * k + (4 if high else 0)


def _body(rule):
    """The BPF instructions of one syscall's rule (the accumulator holds its number); each path
    ends in a return."""
    kind, deny = rule[0], (_RET, 0, 0, ERRNO | errno.EPERM)
    if kind == "deny":
        return [deny]
    if kind == "enosys":
        return [(_RET, 0, 0, ERRNO | errno.ENOSYS)]
    if kind == "flag":
        return [(_LD, 0, 0, _arg(rule[1])), (_JSET, 0, 1, rule[2]), (_RET, 0, 0, ALLOW), deny]
    if kind == "null":
        hi, lo = (_LD, 0, 0, _arg(rule[1], high=True)), (_LD, 0, 0, _arg(rule[1]))
        return [hi, (_JEQ, 0, 3, 0), lo, (_JEQ, 0, 1, 0), (_RET, 0, 0, ALLOW), deny]
    values = [v & 0xFFFFFFFF for v in rule[2]]
    body = [(_LD, 0, 0, _arg(rule[1]))]
    for k, v in enumerate(values):  # a match jumps over the rest to the last of two returns
        body.append((_JEQ, len(values) - k, 0, v))
    last_two = [deny, (_RET, 0, 0, ALLOW)] if kind == "only" else [(_RET, 0, 0, ALLOW), deny]
    return body + last_two


def filter_program(rules, machine=MACHINE):
    """The BPF program of `rules` ({syscall name: rule}, see job_rules): other architectures'
    calls kill the process, x32 calls are denied, every syscall without a rule is allowed."""
    table = SYSCALLS[machine]
    prog = [(_LD, 0, 0, 4), (_JEQ, 1, 0, _AUDIT_ARCH[machine]), (_RET, 0, 0, KILL)]
    prog += [(_LD, 0, 0, 0), (_JGE, 0, 1, 0x40000000), (_RET, 0, 0, ERRNO | errno.EPERM)]
    for name, rule in rules.items():
        if name in table:
            body = _body(rule)
            prog += [(_JEQ, 0, len(body), table[name]), *body]
    return prog + [(_RET, 0, 0, ALLOW)]


def seccomp(rules):
    """Install the filter of `rules` on this thread (and everything it starts); no_new_privs too.
    Cannot be undone."""
    if MACHINE not in SYSCALLS:
        raise OSError(f"no seccomp table for {MACHINE}")
    prog = filter_program(rules)
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *ins) for ins in prog))
    fprog = struct.pack("HxxxxxxP", len(prog), ctypes.addressof(code))
    check(_libc.prctl(38, 1, 0, 0, 0), "no_new_privs")
    check(_libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0), "seccomp")
