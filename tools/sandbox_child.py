"""The child side of the python sandbox: a supervisor that isolates, runs and ends the model's program.

Started by tools/sandbox.py, never imported by the product (a test borrows `seccomp_deny`):

    python -I -S -u -B sandbox_child.py LEVEL SCRATCH LIMITS STATUS_FD CODE

LIMITS is `timeout_ms=5000,cpu_s=5,memory_bytes=...,file_bytes=...,scratch_bytes=...,max_files=64,
max_processes=64`. Only the standard library is imported, and only cheap modules, because every call
pays for them. The supervisor owns the wall-clock deadline and reports one line on STATUS_FD:

    exit CODE CPU_S      the program ended (CODE < 0: killed by that signal); CPU_S its CPU time
    timeout              still running at the deadline: stopped, every descendant with it
    isolation REASON     a layer of the chosen level could not be set up: the program never ran

The program closes STATUS_FD before its first line runs, so it cannot write that line itself. On
SIGTERM (the caller saw an output flood) the supervisor stops the program as at the deadline.

Levels (`tools.sandbox.isolation`). Nothing is skipped: a step that fails is `isolation REASON`.

namespaces (default): new user (unless root), mount, network, PID, IPC and UTS namespaces. The program
  sees a new root holding only the system folders (/usr, /bin, /lib*, /sbin, /etc) and the
  interpreter's prefix, read-only; a few /dev nodes; a /proc of its own PID namespace; and scratch, a
  size-limited tmpfs. No project file, no host process, no network interface. The namespace's init
  waits for the program; when init ends, the kernel kills and reaps everything left in the namespace.
landlock: for machines that refuse namespaces (a container's default seccomp profile, user namespaces
  off). The supervisor becomes a child subreaper, so every descendant, `setsid` or not, ends up its
  child and is killed and reaped after the program. Landlock limits files to reading the system
  folders and the prefix and writing scratch (no /proc, no project files) and, from Landlock ABI 6,
  stops signals leaving the sandbox; a seccomp filter refuses socket(), ptrace, namespaces and mounts
  (and every signal below ABI 6).

At both levels: resource limits (CPU seconds, address space, file size, open files, process count, no
core dumps); root runs the program as a uid of its own for this call, real, effective and saved (so the
process count is the call's alone, and no root-only file can be read; at the landlock level a prefix
that only root may enter, an interpreter under /root, is reached through a descriptor opened before),
and a non-root user keeps its uid without capabilities; no new privileges; and python guards that turn
a socket or a write outside scratch into a readable PermissionError (easy to bypass, the layers above
are what hold). Not bounded per call yet: the processes' memory together (each has `memory_bytes`), and
at the landlock level the bytes written to scratch (each file has `file_bytes`).
"""

import builtins
import ctypes
import errno
import io
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 0x20, 0x400, 0x800, 0x1000, 0x4000
MS_PRIVATE, MS_RELATIME = 0x40000, 0x200000
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 36, 38, 22
SECCOMP_MODE_FILTER = 2
# A uid of its own for each call where root runs the program: far above any real account.
UID_BASE = 1_900_000_000
ISOLATION_FAILED = 125
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
# Per-mount flags that must be kept when a mount is made read-only (some are locked by the kernel).
KEPT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}
NETWORK_OFF = "network is disabled in the sandbox"
WRITE_OFF = "writing outside the scratch folder is not allowed in the sandbox"

# Syscall numbers of what the landlock level refuses (and pivot_root), per architecture: (audit arch, table).
SYSCALLS = {
    "x86_64": (0xC000003E, {
        "socket": 41, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "unshare": 272,
        "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "keyctl": 250, "add_key": 248,
        "request_key": 249, "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129,
        "rt_tgsigqueueinfo": 297, "pidfd_send_signal": 424, "setuid": 105, "setgid": 106, "setreuid": 113,
        "setregid": 114, "setresuid": 117, "setresgid": 119, "setfsuid": 122, "setfsgid": 123,
        "setgroups": 116, "capset": 126,
    }),
    "aarch64": (0xC00000B7, {
        "socket": 198, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "unshare": 97,
        "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "keyctl": 219, "add_key": 217,
        "request_key": 218, "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138,
        "rt_tgsigqueueinfo": 240, "pidfd_send_signal": 424, "setuid": 146, "setgid": 144, "setreuid": 145,
        "setregid": 143, "setresuid": 147, "setresgid": 149, "setfsuid": 151, "setfsgid": 152,
        "setgroups": 159, "capset": 91,
    }),
}  # fmt: skip
ALWAYS_REFUSED = ("socket", "ptrace", "process_vm_readv", "process_vm_writev", "unshare", "setns", "mount",
                  "umount2", "pivot_root", "chroot", "bpf", "perf_event_open", "userfaultfd",
                  "io_uring_setup", "keyctl", "add_key", "request_key")  # fmt: skip
SIGNAL_CALLS = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_send_signal")
# Landlock: filesystem rights by ABI version (1: 13 rights, 2: +REFER, 3: +TRUNCATE, 5: +IOCTL_DEV).
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1, 2, 4, 8
LL_READ = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR
LL_SCOPE_ABSTRACT_UNIX, LL_SCOPE_SIGNAL = 1, 2
LL_NET_ALL = 3  # bind and connect TCP, from ABI 4

INTERPRETER = os.path.realpath(sys.executable)
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.syscall.restype = ctypes.c_long


class IsolationError(Exception):
    """A layer of the chosen level cannot be had here; the message says which and why."""


def fail(what: str) -> IsolationError:
    code = ctypes.get_errno()
    return IsolationError(f"{what}: {os.strerror(code) if code else 'refused'}")


def set_limits(limits: dict[str, int], max_processes: int | None) -> None:
    """Applies the resource limits; a hard limit never rises above the one already in force."""
    cpu = limits["cpu_s"]
    wanted = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL a second later
        (resource.RLIMIT_AS, limits["memory_bytes"], limits["memory_bytes"]),
        (resource.RLIMIT_FSIZE, limits["file_bytes"], limits["file_bytes"]),
        (resource.RLIMIT_NOFILE, limits["max_files"], limits["max_files"]),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    if max_processes is not None:
        wanted.append((resource.RLIMIT_NPROC, max_processes, max_processes))
    for which, soft, hard in wanted:
        _, current_hard = resource.getrlimit(which)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        try:
            resource.setrlimit(which, (soft, hard))
        except (OSError, ValueError) as e:
            raise IsolationError(f"setrlimit({which}): {e}") from None


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        raise fail(f"mount {fstype or source} on {target}")


def readable_by_others(path: str) -> bool:
    """Whether a user without privileges can reach `path` (every folder on the way is traversable)."""
    current = "/"
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        mode = os.stat(current).st_mode
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return False
    return True


def mount_points() -> list[tuple[str, int]]:
    """(mount point, flags to keep) for every mount this process sees, parents before children."""
    found = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split()
            # Mount points escape spaces and the like as octal (\040).
            point = fields[4].decode("unicode_escape").encode("latin-1").decode(errors="surrogateescape")
            kept = 0
            for option in fields[5].decode().split(","):
                kept |= KEPT_FLAGS.get(option, 0)
            found.append((point, kept))
    return found


def interpreter_folders() -> list[str]:
    """What the program needs besides the system folders: the interpreter's prefix (and binary)."""
    needed = []
    for path in (sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        real = os.path.realpath(path)
        if not any(real == f or real.startswith(f + "/") for f in (*SYSTEM_FOLDERS, *needed)):
            needed.append(real)
    return needed


# ---------------------------------------------------------------- the namespaces level


def enter_namespaces(uid: int, gid: int) -> None:
    """The supervisor's step: new namespaces (the PID one applies to its next child, init)."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if uid != 0:
        flags |= CLONE_NEWUSER  # an unprivileged user namespace grants the rights for the others
    if libc.unshare(flags) != 0:
        raise fail("unshare (new namespaces)")
    if uid != 0:
        # The same ids inside as outside: files the program makes belong to it (no EOVERFLOW).
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            try:
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
            except OSError as e:
                raise IsolationError(f"writing /proc/self/{name}: {e.strerror}") from None


def build_root(scratch: str, limits: dict[str, int], owner: int | None) -> None:
    """Init's step: a new root with only what the program may see, then pivot into it."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates back to the host
    new_root = scratch  # the host's (empty) scratch folder serves as the mount point
    mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
    for folder in SYSTEM_FOLDERS:
        if os.path.islink(folder):  # /bin -> usr/bin on merged-/usr systems
            os.symlink(os.readlink(folder), new_root + folder)
        elif os.path.isdir(folder):
            bind(folder, new_root + folder)
    for folder in interpreter_folders():
        bind(folder, new_root + folder)
    dev = new_root + "/dev"
    os.mkdir(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            os.close(os.open(f"{dev}/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
            mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm")  # multiprocessing needs it; a private, small one is harmless
    mount("tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={limits['file_bytes']}")
    os.mkdir(new_root + "/proc")
    # This namespace's processes only. Mounted before the pivot: a user namespace may mount proc only
    # while a full proc is visible in its mount namespace.
    mount("proc", new_root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(new_root + "/tmp", mode=0o755)
    inner = new_root + scratch
    os.makedirs(inner, mode=0o700)
    options = f"mode=700,size={limits['scratch_bytes']}" + (f",uid={owner},gid={owner}" if owner else "")
    # RLIMIT_FSIZE bounds one file, this bounds them all; it vanishes with the namespace.
    mount("tmpfs", inner, "tmpfs", MS_NOSUID | MS_NODEV, options)
    writable = (inner, f"{dev}/shm", new_root + "/proc", *(f"{dev}/{n}" for n in DEVICES))
    for point, kept in mount_points():
        if (point == new_root or point.startswith(new_root + "/")) and point not in writable:
            # MS_BIND makes this a per-mount flag; without it the remount would hit the filesystem.
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
    os.chdir(new_root)
    if libc.syscall(SYSCALLS[os.uname().machine][1]["pivot_root"], b".", b".") != 0:
        raise fail("pivot_root")
    if libc.umount2(b".", MNT_DETACH) != 0:  # the host's tree is gone from this namespace
        raise fail("detaching the host's root")
    os.chdir(scratch)


def bind(source: str, target: str) -> None:
    os.makedirs(target, exist_ok=True)
    mount(source, target, None, MS_BIND | MS_REC)


def run_init(scratch: str, limits: dict[str, int], code: str, status_fd: int, owner: int | None) -> None:
    """Pid 1 of the new PID namespace: builds the root, starts the program, reaps, reports, ends.

    The program is not init itself because init ignores every signal it has no handler for, the CPU
    limit's SIGXCPU included. When init exits, the kernel kills and reaps whatever is left.
    """
    libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
    try:
        build_root(scratch, limits, owner)
    except (IsolationError, OSError) as e:
        report(status_fd, f"isolation {e}")
        os._exit(ISOLATION_FAILED)
    # The per-call uid is the call's own: the count is the program's. In a user namespace the
    # supervisor and init are counted too.
    max_processes = limits["max_processes"] + (0 if owner else 2)
    program = os.fork()
    if program == 0:
        in_child(start_program, scratch, limits, code, status_fd, owner, max_processes, None)
    while True:
        pid, status, usage = os.wait4(-1, 0)  # orphans of the namespace are reaped here too
        if pid == program:
            break
    report(status_fd, f"exit {os.waitstatus_to_exitcode(status)} {usage.ru_utime + usage.ru_stime:.3f}")
    os._exit(0)


# ---------------------------------------------------------------- the landlock level


def landlock_abi() -> int:
    abi = libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        raise fail("Landlock (Linux 5.13 or newer, with landlock among the enabled LSMs)")
    return abi


def restrict_files(scratch: str, abi: int) -> None:
    """Landlock: read the system folders and the prefix, read and write scratch, nothing else."""
    every_right = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)
    every_right |= 1 << 15 if abi >= 5 else 0
    attr = struct.pack("QQQ", every_right, LL_NET_ALL if abi >= 4 else 0,
                       LL_SCOPE_ABSTRACT_UNIX | LL_SCOPE_SIGNAL if abi >= 6 else 0)  # fmt: skip
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(444, attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise fail("landlock_create_ruleset")
    rules = [(f, LL_READ) for f in (*SYSTEM_FOLDERS, *interpreter_folders()) if os.path.exists(f)]
    rules += [(f"/dev/{n}", LL_READ_FILE | LL_WRITE_FILE) for n in DEVICES if os.path.exists(f"/dev/{n}")]
    rules.append((scratch, every_right))
    for path, rights in rules:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | (1 << 14 if abi >= 3 else 0)
        rule = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr is packed
        added = libc.syscall(445, ruleset, 1, rule, 0)
        os.close(fd)
        if added != 0:
            raise fail(f"landlock_add_rule {path}")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0) != 0:  # what an unprivileged user needs
        raise fail("no_new_privs")
    if libc.syscall(446, ruleset, 0) != 0:
        raise fail("landlock_restrict_self")
    os.close(ruleset)


def seccomp_deny(names: tuple[str, ...]) -> None:
    """Installs a seccomp filter: the named syscalls fail with EPERM; foreign ABIs kill the process.

    Needs no privilege once no_new_privs is set (done here too). Used by the landlock level, and by
    the tests to make a machine that refuses `unshare`.
    """
    arch, table = SYSCALLS[os.uname().machine]
    load = lambda offset: (0x20, 0, 0, offset)  # noqa: E731 - BPF_LD|BPF_W|BPF_ABS
    deny, allow, kill = 0x00050000 | errno.EPERM, 0x7FFF0000, 0x80000000
    numbers = [table[name] for name in names]
    program = [load(4), (0x15, 1, 0, arch), (0x06, 0, 0, kill), load(0)]
    if arch == 0xC000003E:  # x86_64's x32 ABI: the same calls with bit 30 set
        program.append((0x35, len(numbers) + 1, 0, 0x40000000))  # BPF_JGE: to the deny
    for i, number in enumerate(numbers):
        program.append((0x15, len(numbers) - i, 0, number))  # BPF_JEQ: to the deny
    program += [(0x06, 0, 0, allow), (0x06, 0, 0, deny)]
    filters = b"".join(struct.pack("HBBI", *instruction) for instruction in program)
    buffer = ctypes.create_string_buffer(filters)
    fprog = struct.pack("HxxxxxxP", len(program), ctypes.addressof(buffer))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0) != 0:
        raise fail("no_new_privs")
    if libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.c_char_p(fprog), 0, 0) != 0:
        raise fail("seccomp filter")


def processes_of(uid: int) -> int:
    """How many processes `uid` runs now (RLIMIT_NPROC counts them all for a non-root user)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"Uid:"):
                            count += int(line.split()[1]) == uid
                            break
            except OSError:
                pass  # ended while we looked
    return count


def children() -> list[int]:
    """This process's children right now, zombies included."""
    found = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
        return found
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: read every process's parent
        me = os.getpid()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        if int(f.read().rsplit(b")", 1)[1].split()[1]) == me:
                            found.append(int(entry))
                except OSError:
                    pass
        return found


def sweep() -> None:
    """Kills and reaps every descendant: as each dies, its children become this subreaper's."""
    while True:
        for pid in children():
            try:  # noqa: SIM105 - contextlib would cost every call an import
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            return  # no child left, not even a zombie
        os.sched_yield()


# ---------------------------------------------------------------- both levels


def wait_until(pid: int, deadline_s: float, stop_fd: int) -> bool:
    """Waits for `pid` to end, at most until the deadline (monotonic) or a byte on `stop_fd` (the
    caller's SIGTERM); whether it ended."""
    import time

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        while True:
            left = deadline_s - time.monotonic()
            if left <= 0:
                return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            ready = select.select(
                [stop_fd] if fd is None else [fd, stop_fd], [], [], min(left, 0.005) if fd is None else left
            )[0]
            if stop_fd in ready:
                return False
            if fd in ready or os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
    finally:
        if fd is not None:
            os.close(fd)


def in_child(start, *args) -> None:
    """Runs a forked child's part; it ends the process itself, and a bug there ends it too."""
    try:
        start(*args)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(ISOLATION_FAILED)


def report(status_fd: int, line: str) -> None:
    try:  # noqa: SIM105 - contextlib would cost every call an import
        os.write(status_fd, (line.replace("\n", " ") + "\n").encode(errors="replace"))
    except OSError:
        pass  # the caller is gone


def drop_capabilities() -> None:
    """Leaves this process (and what it execs) without any capability, whatever its uid."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]

    for cap in range(64):  # the bounding set, so that exec cannot give them back
        libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0)
    if libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()) != 0:  # _LINUX_CAPABILITY_VERSION_3
        raise fail("dropping capabilities")


def become(owner: int | None) -> None:
    """Root becomes the call's own uid (real, effective and saved: no way back, no capability left);
    others lose their capabilities."""
    if owner is not None:
        os.setgroups([])
        os.setresgid(owner, owner, owner)
        os.setresuid(owner, owner, owner)  # clears every capability, and no way back
        # The uid change made /proc/self root-owned; the program may read its own entries (and reach
        # the descriptors of reach_hidden).
        libc.prctl(PR_SET_DUMPABLE, ctypes.c_ulong(1), 0, 0, 0)
    drop_capabilities()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0) != 0:  # setuid binaries stay harmless
        raise fail("no_new_privs")


def start_program(
    scratch: str,
    limits: dict[str, int],
    code: str,
    status_fd: int,
    owner: int | None,
    max_processes: int,
    landlock_abi: int | None,
) -> None:
    """In the forked program: the last layers, then the model's code. Never returns."""
    try:
        os.setpgid(0, 0)
        set_limits(limits, max_processes)
        hidden: dict[str, int] = {}
        if landlock_abi is None:
            become(owner)
        else:
            if owner is not None:
                # The call's uid cannot enter a folder that only root may (an interpreter under /root):
                # opened now, its part of the prefix is reached through the descriptor (see reach_hidden).
                hidden = {f: os.open(f, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                          for f in interpreter_folders() if not readable_by_others(f)}  # fmt: skip
                os.chown(scratch, owner, owner)
            restrict_files(scratch, landlock_abi)  # before the uid changes: every rule's folder is found
            become(owner)
            seccomp_deny(ALWAYS_REFUSED + (SIGNAL_CALLS if landlock_abi < 6 else ()))
        os.chdir(scratch)
    except (IsolationError, OSError) as e:
        report(status_fd, f"isolation {e}")
        os._exit(ISOLATION_FAILED)
    os.close(status_fd)
    # A venv's python is a link the program may not see (and its pyvenv.cfg lies outside): the
    # interpreter itself is what a subprocess of the program can run.
    sys.executable = sys._base_executable = INTERPRETER
    reach_hidden(hidden)
    install_guards(scratch)
    run_program(code)


def reach_hidden(hidden: dict[str, int]) -> None:
    """Imports from a folder the program's uid cannot enter go through its open descriptor: the
    kernel follows /proc/self/fd/N to the folder without checking the folders above it, and Landlock
    checks the folder itself, which it allows to be read."""
    if not hidden:
        return
    for i, entry in enumerate(sys.path):
        for folder, fd in hidden.items():
            if entry == folder or entry.startswith(folder + "/"):
                sys.path[i] = f"/proc/self/fd/{fd}" + entry[len(folder) :]
    sys.path_importer_cache.clear()


def supervise(level: str, scratch: str, limits: dict[str, int], code: str, status_fd: int) -> None:
    import time

    deadline = time.monotonic() + limits["timeout_ms"] / 1000
    # SIGTERM (the caller saw a flood) wakes the wait below through this pipe instead of ending the
    # supervisor, which must still stop the program and its descendants.
    stop_read, stop_write = os.pipe()
    os.set_blocking(stop_write, False)
    signal.set_wakeup_fd(stop_write)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    uid, gid = os.getuid(), os.getgid()
    owner = UID_BASE + os.getpid() % 100_000_000 if uid == 0 else None

    def forked(start, *args) -> int:
        child = os.fork()
        if child == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.close(stop_read)
            os.close(stop_write)
            in_child(start, *args)
        return child

    if level == "namespaces":
        enter_namespaces(uid, gid)
        child = forked(run_init, scratch, limits, code, status_fd, owner)
    else:
        abi = landlock_abi()
        if libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0) != 0:
            raise fail("becoming a child subreaper")
        max_processes = limits["max_processes"] + (processes_of(uid) if owner is None else 0)
        child = forked(start_program, scratch, limits, code, status_fd, owner, max_processes, abi)
    ended = wait_until(child, deadline, stop_read)
    if level == "namespaces":
        # Init reports the program's status itself; killing init ends the namespace and all in it.
        if not ended:
            report(status_fd, "timeout")
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        return
    if ended:
        _, status, usage = os.wait4(child, 0)
        # After an `isolation` line from the program itself: the caller reads the first line only.
        report(status_fd, f"exit {os.waitstatus_to_exitcode(status)} {usage.ru_utime + usage.ru_stime:.3f}")
    else:
        report(status_fd, "timeout")
    try:  # noqa: SIM105 - contextlib would cost every call an import
        os.killpg(child, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    sweep()


def install_guards(scratch: str) -> None:
    """Readable refusals for the network and for writes outside scratch (see the module docstring)."""
    root = os.path.realpath(scratch)

    def refuse_outside(*paths: object) -> None:
        for path in paths:
            if isinstance(path, str | bytes | os.PathLike):
                real = os.path.realpath(os.fsdecode(path))
                if real != root and not real.startswith(root + os.sep) and real != os.devnull:
                    raise PermissionError(errno.EACCES, WRITE_OFF, os.fsdecode(path))

    real_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            refuse_outside(file)
        return real_open(file, mode, *args, **kwargs)

    builtins.open = io.open = guarded_open
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    real_os_open = os.open

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & write_flags:
            refuse_outside(path)
        return real_os_open(path, flags, *args, **kwargs)

    os.open = guarded_os_open

    def guarded(real):
        def call(*args, **kwargs):
            refuse_outside(*args[:2], *(kwargs.get(k) for k in ("path", "src", "dst")))
            return real(*args, **kwargs)

        return call

    for name in ("mkdir", "rmdir", "remove", "unlink", "rename", "replace", "symlink", "link", "chmod",
                 "truncate", "utime", "mkfifo"):  # fmt: skip
        setattr(os, name, guarded(getattr(os, name)))

    def no_network(*args, **kwargs):
        raise PermissionError(errno.EACCES, NETWORK_OFF)

    class GuardedSocket(socket.socket):
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            if fileno is None:  # wrapping an existing descriptor (socketpair, fromfd) stays allowed
                no_network()
            super().__init__(family, type, proto, fileno)

    socket.socket = GuardedSocket
    for name in ("create_connection", "create_server", "getaddrinfo", "gethostbyname",
                 "gethostbyname_ex", "gethostbyaddr"):  # fmt: skip
        setattr(socket, name, no_network)


def run_program(code: str) -> None:
    """Runs `code` as __main__ and ends the process as the interpreter would (threads joined, exit
    status kept); an uncaught exception prints a traceback without this file's frames."""
    main = type(sys)("__main__")
    sys.modules["__main__"] = main
    status = 0
    try:
        exec(compile(code, "<sandbox>", "exec"), main.__dict__)
        if "threading" in sys.modules:  # the interpreter waits for non-daemon threads at exit
            sys.modules["threading"]._shutdown()
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
            status = 1
        else:
            status = e.code or 0
    except BaseException as e:
        report_error(e, code, main)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib would cost every call an import
            stream.flush()
        except (OSError, ValueError):
            pass  # the program closed it
    os._exit(status & 0xFF)


def report_error(error: BaseException, code: str, main: object) -> None:
    """Prints the program's traceback without this file's frames. A program that exhausted what its
    limits allow (memory, open files) may leave too little to import and format one: what it holds is
    let go and it is tried again, and at worst the exception's one line is written as it is."""
    for attempt in range(2):
        try:
            import linecache  # only on failure: both pull in modules a passing program does not need
            import traceback

            linecache.cache["<sandbox>"] = (len(code), None, code.splitlines(True), "<sandbox>")
            summary = traceback.TracebackException(type(error), error, error.__traceback__)
            # The model should see its own frames, not this file's (run_program, the guards).
            summary.stack = traceback.StackSummary.from_list(
                [frame for frame in summary.stack if frame.filename != __file__]
            )
            print("".join(summary.format()), end="", file=sys.stderr)
            return
        except BaseException:
            if attempt == 0:
                vars(main).clear()  # the program's files and memory, held by its globals
    try:
        line = f"{type(error).__name__}: {error}"
    except BaseException:
        line = type(error).__name__
    try:  # noqa: SIM105 - contextlib would cost every call an import
        os.write(2, (line + "\n").encode(errors="replace"))
    except OSError:
        pass


def main() -> None:
    level, scratch, limit_text, status_text, code = sys.argv[1:6]
    status_fd = int(status_text)
    limits = {k: int(v) for k, v in (item.split("=") for item in limit_text.split(","))}
    del sys.argv[1:]
    try:
        if os.uname().machine not in SYSCALLS:
            raise IsolationError(f"no syscall table for {os.uname().machine} (x86_64 and aarch64 are known)")
        supervise(level, scratch, limits, code, status_fd)
    except IsolationError as e:
        report(status_fd, f"isolation {e}")
        os._exit(ISOLATION_FAILED)
    os._exit(0)


if __name__ == "__main__":
    main()
