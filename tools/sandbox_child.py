"""The child side of the python sandbox: a supervisor that isolates, runs and ends the model's program.

Started by tools/sandbox.py, never imported by the product (a test borrows `seccomp_deny`):

    python -I -S -u -B sandbox_child.py LEVEL SCRATCH LIMITS STATUS_FD CODE

LIMITS is `timeout_ms=5000,cpu_s=5,memory_bytes=...,total_memory_bytes=...,file_bytes=...,
scratch_bytes=...,max_files=64,max_processes=64`. Only the standard library is imported, and only cheap
modules, because every call pays for them. The supervisor owns the wall-clock deadline and the call's
totals, and reports one line on STATUS_FD:

    exit CODE CPU_S      the program ended (CODE < 0: killed by that signal); CPU_S its CPU time
    timeout              still running at the deadline: stopped, every descendant with it
    memory BYTES         its processes together held more than total_memory_bytes: stopped, all of them
    written BYTES        its files together took more than scratch_bytes: stopped, all its processes
    hidden PID           a process of the call may not be inspected, so its totals cannot be: stopped
    uncountable CPU_S    one count of the totals took more than CPU_S of CPU time: stopped
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
are what hold).

Per call, at both levels, the supervisor counts two totals every SAMPLE_S (through the host's /proc,
opened before any pivot and never left to the program) and stops the program past either:
- memory: the proportional memory, resident or swapped out, of every process below the supervisor (a
  page shared by n processes counts 1/n in each), against total_memory_bytes;
- files, against scratch_bytes: at the namespaces level the two tmpfs, scratch (size scratch_bytes,
  one inode per BLOCK of it) and /dev/shm (file_bytes), which the kernel bounds exactly and whose use
  statvfs reads, deleted files included; at the landlock level a walk of scratch (the host's folder,
  the only one Landlock lets it write), each inode once and at least BLOCK, so empty files count; at
  both, the files its processes hold without a name elsewhere (memfds; deleted files at the landlock
  level), open (their blocks) or mapped with the descriptor closed (their blocks where root may read
  /proc/PID/map_files, else file_bytes each). At the landlock level the files are counted once more
  when the program ends.
So that nothing escapes /proc, seccomp refuses at both levels new namespaces (unshare, setns, clone
with a namespace flag; clone3 says ENOSYS, so glibc uses clone), a thread without its process's fd
table, descriptors sent over a unix socket (sendmsg), io_uring, System V IPC, POSIX message queues and
BPF; a process whose main thread has exited is read through a live thread; a process the supervisor
may not read (not dumpable) stops the call (`hidden`), and so does a count that costs more than
SAMPLE_CPU_S (`uncountable`: thousands of mappings make /proc slow to read).
Being sampled, a total is overshot by what the processes allocate or write between two samples
(SAMPLE_S apart, or twice as long as the last sample took, whose CPU time is at most SAMPLE_CPU_S,
plus however long a busy machine keeps the supervisor waiting for a CPU): on a busy 2-core machine, 6
processes allocating 200 MB each were stopped at 525-846 MB against 512 MB, 30 files of 8 MB at 66-72
MB against 64 MB (the namespaces level's tmpfs stops them at 64 MB exactly). The kernel's own hard
bounds stay: memory_bytes per process (RLIMIT_AS) for max_processes processes (RLIMIT_NPROC), and
file_bytes per file. Not counted: the kernel's own memory for the program (pipe buffers, within the
per-user pipe-user-pages-soft; unix socket buffers, up to net.core.wmem_max each; page tables); and a
child made by vfork shares its parent's pages until it execs, which counts them twice.
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
PF_EXITING = 0x4  # a task's flag in /proc/PID/stat
SECCOMP_MODE_FILTER = 2
# A uid of its own for each call where root runs the program: far above any real account.
UID_BASE = 1_900_000_000
ISOLATION_FAILED = 125
# How often the supervisor totals the call's memory and files (or twice as long as the last total took):
# a program overshoots a total by what its processes allocate or write in between.
SAMPLE_S = 0.01
# The most CPU time one total may take before the call is stopped. Measured: under 1 ms for a usual
# program; 0.05 s for 30 processes with 55 open files each beside 16,000 files in scratch; 0.03-0.05 s
# for one process with 60,000 memory mappings.
SAMPLE_CPU_S = 0.25
BLOCK = 4096  # the least an entry of scratch is counted as (see entry_bytes)
PAGE = os.sysconf("SC_PAGE_SIZE")
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
        "setgroups": 116, "capset": 126, "clone": 56, "clone3": 435, "sendmsg": 46, "sendmmsg": 307,
        "mq_open": 240, "shmget": 29, "shmat": 30, "shmctl": 31, "msgget": 68, "msgsnd": 69, "msgrcv": 70,
        "msgctl": 71, "semget": 64, "semop": 65, "semctl": 66, "semtimedop": 220,
    }),
    "aarch64": (0xC00000B7, {
        "socket": 198, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "unshare": 97,
        "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "keyctl": 219, "add_key": 217,
        "request_key": 218, "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138,
        "rt_tgsigqueueinfo": 240, "pidfd_send_signal": 424, "setuid": 146, "setgid": 144, "setreuid": 145,
        "setregid": 143, "setresuid": 147, "setresgid": 149, "setfsuid": 151, "setfsgid": 152,
        "setgroups": 159, "capset": 91, "clone": 220, "clone3": 435, "sendmsg": 211, "sendmmsg": 269,
        "mq_open": 180, "shmget": 194, "shmat": 196, "shmctl": 195, "msgget": 186, "msgsnd": 189,
        "msgrcv": 188, "msgctl": 187, "semget": 190, "semop": 193, "semctl": 191, "semtimedop": 192,
    }),
}  # fmt: skip
# Refused at both levels: what would hold memory or files where no total sees them. Nested namespaces
# (a tmpfs of the program's own), file descriptors in flight in a unix socket, io_uring's registered
# files, System V and POSIX message queue memory (in the host's IPC namespace at the landlock level, it
# outlives the call), BPF maps; unshare also gives a thread an fd table of its own (see seccomp_deny's
# clone rule).
TOTALS_REFUSED = ("unshare", "setns", "sendmsg", "sendmmsg", "io_uring_setup", "mq_open", "shmget", "shmat",
                  "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semctl",
                  "semtimedop", "bpf")  # fmt: skip
ALWAYS_REFUSED = ("socket", "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2",
                  "pivot_root", "chroot", "perf_event_open", "userfaultfd", "keyctl", "add_key",
                  "request_key", *TOTALS_REFUSED)  # fmt: skip
# clone() flags seccomp_deny's clone rule refuses: every new namespace (CLONE_NEWNS ... CLONE_NEWNET).
CLONE_NAMESPACES = 0x7E020000
CLONE_THREAD, CLONE_FILES = 0x00010000, 0x00000400
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
    shm = f"mode=1777,size={limits['file_bytes']},nr_inodes={inodes(limits['file_bytes'])}"
    mount("tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV, shm)
    os.mkdir(new_root + "/proc")
    # This namespace's processes only. Mounted before the pivot: a user namespace may mount proc only
    # while a full proc is visible in its mount namespace.
    mount("proc", new_root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(new_root + "/tmp", mode=0o755)
    inner = new_root + scratch
    os.makedirs(inner, mode=0o700)
    options = f"mode=700,size={limits['scratch_bytes']},nr_inodes={inodes(limits['scratch_bytes'])}"
    options += f",uid={owner},gid={owner}" if owner else ""
    # RLIMIT_FSIZE bounds one file, this bounds them all (bytes, and entries as the landlock level counts
    # them, BLOCK each at least); it vanishes with the namespace.
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


def inodes(size: int) -> int:
    """A tmpfs's most files and folders: as many as `size` holds at BLOCK each (see entry_bytes)."""
    return max(size // BLOCK, 16)


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


def seccomp_deny(names: tuple[str, ...], guard_clone: bool = False) -> None:
    """Installs a seccomp filter: the named syscalls fail with EPERM; foreign ABIs kill the process.
    With `guard_clone`, clone() fails with EPERM for a new namespace or for a thread without the fd
    table of its process (so /proc/PID/fd shows every descriptor), and clone3 with ENOSYS (its flags lie
    in memory a filter cannot read; ENOSYS makes glibc fall back to clone).

    Needs no privilege once no_new_privs is set (done here too). Used by both levels, and by the tests
    to make a machine that refuses `unshare`.
    """
    arch, table = SYSCALLS[os.uname().machine]
    deny, enosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    allow, kill = 0x7FFF0000, 0x80000000
    # (code, jump if true, jump if false, k); a jump is a label, resolved below (BPF jumps forward only).
    program: list[tuple[int, object, object, int]] = [
        (0x20, 0, 0, 4),  # BPF_LD | BPF_W | BPF_ABS: the architecture
        (0x15, 1, 0, arch),
        (0x06, 0, 0, kill),  # BPF_RET
        (0x20, 0, 0, 0),  # the syscall's number
    ]
    if arch == 0xC000003E:  # x86_64's x32 ABI: the same calls with bit 30 set
        program.append((0x35, "deny", 0, 0x40000000))  # BPF_JGE
    program += [(0x15, "deny", 0, table[name]) for name in names]  # BPF_JEQ
    if guard_clone:
        program += [(0x15, "enosys", 0, table["clone3"]), (0x15, "clone", 0, table["clone"])]
    program.append((0x06, 0, 0, allow))
    if guard_clone:
        program += [
            ("clone", None, None, None),
            (0x20, 0, 0, 16),  # clone's flags: the low word of args[0]
            (0x45, "deny", 0, CLONE_NAMESPACES),  # BPF_JSET
            (0x54, 0, 0, CLONE_THREAD | CLONE_FILES),  # BPF_ALU | BPF_AND
            (0x15, "deny", 0, CLONE_THREAD),
            (0x06, 0, 0, allow),
        ]
    program += [
        ("deny", None, None, None),
        (0x06, 0, 0, deny),
        ("enosys", None, None, None),
        (0x06, 0, 0, enosys),
    ]
    labels, code = {}, []
    for instruction in program:
        if isinstance(instruction[0], str):
            labels[instruction[0]] = len(code)
        else:
            code.append(instruction)
    jump = lambda target, at: labels[target] - at - 1 if isinstance(target, str) else target  # noqa: E731
    filters = b"".join(
        struct.pack("HBBI", op, jump(jt, i), jump(jf, i), k) for i, (op, jt, jf, k) in enumerate(code)
    )
    buffer = ctypes.create_string_buffer(filters)
    fprog = struct.pack("HxxxxxxP", len(code), ctypes.addressof(buffer))
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
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return children_of(proc, os.getpid())
    finally:
        os.close(proc)


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


def read_at(proc: int, path: str) -> bytes:
    """The whole of a /proc file, `path` relative to the /proc folder open as `proc`."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    try:
        parts = []
        while part := os.read(fd, 1 << 16):
            parts.append(part)
        return b"".join(parts)
    finally:
        os.close(fd)


def listdir_at(at: int, path: str) -> list[str]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=at)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def children_of(proc: int, pid: int) -> list[int]:
    """`pid`'s children right now (its threads' too), zombies included, read through the /proc folder
    open as `proc` (the host's, whatever root this process has since seen pivoted)."""
    found = []
    try:
        for task in listdir_at(proc, f"{pid}/task"):
            found += [int(p) for p in read_at(proc, f"{pid}/task/{task}/children").split()]
        return found
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN (or a thread gone): every process's parent
        found = []
        for entry in os.listdir(proc):
            if entry.isdigit():
                try:
                    if int(read_at(proc, f"{entry}/stat").rsplit(b")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
                except (OSError, IndexError, ValueError):
                    pass  # ended while we looked
        return found


def descendants(proc: int, pid: int) -> list[int]:
    """Every process below `pid` right now (a process forked or reparented while this walks may be
    missed until the next walk)."""
    found, waiting = [], [pid]
    while waiting:
        for child in children_of(proc, waiting.pop()):
            if child not in found:
                found.append(child)
                waiting.append(child)
    return found


def pss_bytes(smaps_rollup: bytes) -> int | None:
    """The proportional memory in the text of /proc/PID/smaps_rollup, in bytes: resident and swapped
    out (a page shared by n processes counts 1/n in each: forked children are not counted n times; a
    page pushed to swap still counts); None if absent."""
    total = None
    for line in smaps_rollup.splitlines():
        if line.startswith((b"Pss:", b"SwapPss:")):
            total = (total or 0) + int(line.split()[1]) * 1024  # the kernel writes kB
    return total


def entry_bytes(blocks: int) -> int:
    """What one file or folder costs the disk: its 512-byte blocks, and at least BLOCK (so that empty
    files count, and a walk of scratch stops after limit / BLOCK entries)."""
    return max(blocks * 512, BLOCK)


def over_limit(memory: int, written: int, limits: dict[str, int]) -> str | None:
    """The status line for a call's total past its limit, or None."""
    if memory > limits["total_memory_bytes"]:
        return f"memory {memory}"
    if written > limits["scratch_bytes"]:
        return f"written {written}"
    return None


class Hidden(Exception):
    """A process of the call that the supervisor may not inspect (it made itself not dumpable, or runs
    a binary it may not read): what it holds cannot be counted, so the call is stopped."""


def hidden(proc: int, where: str) -> Hidden | None:
    """After /proc refused to show `where` (a process, or a thread: see live_task): Hidden, or None
    where it is ending (the kernel makes an exiting task's /proc entries root's once its memory is gone;
    its files go next)."""
    try:
        fields = read_at(proc, f"{where}/stat").rsplit(b")", 1)[1].split()
        if fields[0] in (b"Z", b"X") or int(fields[6]) & PF_EXITING:
            return None
    except (OSError, IndexError, ValueError):
        return None  # gone
    return Hidden(where)


def live_task(proc: int, pid: int) -> str:
    """Where /proc shows `pid`'s memory and files: its own entry, or a live thread's once its main
    thread has exited while others run on (pthread_exit): the memory and fd table are all its threads',
    and an exited main thread's entries show nothing."""
    try:
        if read_at(proc, f"{pid}/stat").rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
            return str(pid)
        for task in listdir_at(proc, f"{pid}/task"):
            if task != str(pid):
                return f"{pid}/task/{task}"
    except (OSError, IndexError):
        pass  # gone
    return str(pid)


def process_memory(proc: int, where: str) -> int:
    """The proportional resident memory of the process /proc shows at `where` (see live_task); its
    resident memory where smaps_rollup is missing; 0 for a process that has ended."""
    try:
        pss = pss_bytes(read_at(proc, f"{where}/smaps_rollup"))
        if pss is not None:
            return pss
    except PermissionError:
        error = hidden(proc, where)
        if error is not None:
            raise error from None
    except OSError:
        pass
    try:  # Linux before 4.14: every resident page, shared or not (stricter)
        return int(read_at(proc, f"{where}/statm").split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def nameless_files(proc: int, where: str, found: dict[tuple[int, int], int], file_bytes: int) -> None:
    """Adds to `found` ((device, inode) -> bytes) the files that the process /proc shows at `where` (see
    live_task) holds without a name: deleted files
    and memfds still take space, and no walk of scratch sees them. Held open: their own blocks. Mapped
    and closed: their blocks where /proc/PID/map_files may be read (root), else `file_bytes`, the most
    RLIMIT_FSIZE lets one file hold. (No other hold escapes /proc: seccomp refuses fds in flight in a
    unix socket, io_uring, and threads with an fd table of their own.)"""
    try:
        fds = listdir_at(proc, f"{where}/fd")
        maps = read_at(proc, f"{where}/maps")
    except PermissionError:
        error = hidden(proc, where)
        if error is not None:
            raise error from None
        return
    except OSError:
        return  # ended
    for fd in fds:
        try:
            info = os.stat(f"{where}/fd/{fd}", dir_fd=proc)  # follows the link to the open file itself
        except OSError:
            continue  # closed meanwhile
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 0:
            found[(info.st_dev, info.st_ino)] = entry_bytes(info.st_blocks)
    for line in maps.splitlines():
        # "START-END PERMS OFFSET MAJOR:MINOR INODE PATH (deleted)"; shared anonymous memory is shown as
        # a deleted /dev/zero, and its pages are in the process's memory already.
        if not line.endswith(b" (deleted)") or line.endswith(b" /dev/zero (deleted)"):
            continue
        fields = line.split(maxsplit=5)
        try:
            major, minor = (int(part, 16) for part in fields[3].split(b":"))
            key = (os.makedev(major, minor), int(fields[4]))
        except (IndexError, ValueError):
            continue
        if key not in found:
            try:
                pid = where.split("/")[0]  # map_files is the process's alone; a thread has none
                info = os.stat(f"{pid}/map_files/{fields[0].decode()}", dir_fd=proc)
                found[key] = entry_bytes(info.st_blocks)
            except OSError:
                found[key] = file_bytes  # the caps map_files needs are missing, or unmapped meanwhile


def folder_bytes(proc: int, path: str, budget: int, until: float = float("inf")) -> int:
    """What the files and folders under `path` (relative to the /proc folder open as `proc`) take, on
    its own file system only, each inode once; the walk stops once past `budget` (so it looks at no
    more than budget / BLOCK entries). Uncountable past `until` (thread_time)."""
    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
    except OSError:
        return 0  # not there yet (the namespace's root is being built)
    device = os.fstat(top).st_dev
    total, seen, folders = 0, set(), [top]
    try:
        while folders and total <= budget:
            folder = folders.pop()
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        if info.st_dev != device or (info.st_dev, info.st_ino) in seen:
                            continue  # a mount point, or a hard link already counted
                        seen.add((info.st_dev, info.st_ino))
                        if len(seen) % 256 == 0 and thread_time() > until:
                            raise Uncountable
                        total += entry_bytes(info.st_blocks)
                        if stat.S_ISDIR(info.st_mode):
                            opened = open_folder(proc, folder, entry.name)
                            if opened is not None:
                                folders.append(opened)
                        if total > budget:
                            break
            except OSError:
                pass  # removed meanwhile
            finally:
                os.close(folder)
    finally:
        for folder in folders:
            os.close(folder)
    return total


def open_folder(proc: int, parent: int, name: str) -> int | None:
    """Opens a folder of scratch for the walk; one the program closed to its own uid is opened again
    (the supervisor runs as that uid, or as root) rather than left uncounted."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent)
    except PermissionError:
        pass
    except OSError:
        return None  # removed or replaced meanwhile
    try:
        # Through a descriptor that cannot be a link: a folder swapped for a link to outside is not
        # followed.
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return None
    try:
        os.chmod(f"{os.getpid()}/fd/{handle}", 0o700, dir_fd=proc)
        return os.open(f"{os.getpid()}/fd/{handle}", flags, dir_fd=proc)
    except OSError:
        return None
    finally:
        os.close(handle)


class Uncountable(Exception):
    """One sample took more than SAMPLE_CPU_S of CPU time."""


def thread_time() -> float:
    import time

    return time.thread_time()


def tmpfs_bytes(proc: int, init: int, scratch: str, host_root: tuple[int, int]) -> tuple[int, set[int]]:
    """At the namespaces level: (bytes, devices) of the call's two tmpfs, scratch and /dev/shm, as the
    kernel counts them (files deleted but still held included); (0, set()) while init's root is still
    the host's, `host_root` (device, inode), where those paths name the host's folders."""
    try:
        root = os.open(f"{init}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=proc)
    except OSError:
        return 0, set()  # init has ended
    try:
        info = os.fstat(root)
        if (info.st_dev, info.st_ino) == host_root:
            return 0, set()
        used, devices = 0, set()
        for path in (scratch.lstrip("/"), "dev/shm"):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
            except OSError:
                continue  # not mounted yet
            try:
                space = os.fstatvfs(fd)
                used += (space.f_blocks - space.f_bfree) * space.f_frsize
                devices.add(os.fstat(fd).st_dev)
            finally:
                os.close(fd)
        return used, devices
    finally:
        os.close(root)


class Totals:
    """Counts a call's totals for the supervisor, through the host's /proc (`proc`, opened before any
    pivot and never left to the program). `seen_from` is the process whose root holds scratch: init at
    the namespaces level, the supervisor at the landlock level; `host_root` is (device, inode) of the
    host's root."""

    def __init__(
        self, proc: int, level: str, seen_from: int, scratch: str, limits: dict[str, int], host_root: tuple
    ) -> None:
        self.proc, self.supervisor, self.level, self.seen_from = proc, os.getpid(), level, seen_from
        self.scratch, self.limits, self.host_root = scratch, limits, host_root

    def now(self, until: float) -> tuple[int, int]:
        """(memory, written) now: the proportional resident memory of every process below the
        supervisor; the bytes of its files (at the namespaces level its two tmpfs as the kernel counts
        them, at the landlock level a walk of scratch), and the files those processes hold without a
        name elsewhere (memfds, and deleted files at the landlock level). Hidden if a process may not be
        inspected, Uncountable past `until` (thread_time)."""
        if self.level == "namespaces":
            written, counted = tmpfs_bytes(self.proc, self.seen_from, self.scratch, self.host_root)
        else:
            folder = f"{self.seen_from}/root{self.scratch}"
            written, counted = folder_bytes(self.proc, folder, self.limits["scratch_bytes"], until), set()
        memory, nameless = 0, {}
        for pid in descendants(self.proc, self.supervisor):
            if thread_time() > until:
                raise Uncountable
            where = live_task(self.proc, pid)
            memory += process_memory(self.proc, where)
            nameless_files(self.proc, where, nameless, self.limits["file_bytes"])
        return memory, written + sum(size for (device, _), size in nameless.items() if device not in counted)

    def check(self) -> str | None:
        """The status line that stops the call now, or None: a total past its limit, a process hidden
        from the count, or a count that took more than SAMPLE_CPU_S (thousands of mappings make /proc
        slow to read: unchecked, a program could stretch the time between samples at will)."""
        try:
            return over_limit(*self.now(thread_time() + SAMPLE_CPU_S), self.limits)
        except Hidden as e:
            return f"hidden {e}"
        except Uncountable:
            return f"uncountable {SAMPLE_CPU_S}"


def wait_until(pid: int, deadline_s: float, stop_fd: int, check) -> str | None:
    """Waits for `pid` to end: None if it did, else what stopped the wait, the line to report:
    `timeout` at the deadline (monotonic) or on a byte on `stop_fd` (the caller's SIGTERM), or the
    line `check()` returns (a total past its limit; called every SAMPLE_S at least)."""
    import time

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    ended = lambda: os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None  # noqa: E731
    next_check = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            if now >= next_check:
                if ended():
                    return None
                line = check()
                if line is not None:
                    return line
                done = time.monotonic()
                next_check = done + max(SAMPLE_S, 2 * (done - now))  # the supervisor stays mostly idle
            left = deadline_s - time.monotonic()
            if left <= 0:
                return None if ended() else "timeout"
            wait = min(left, max(next_check - time.monotonic(), 0), 0.005 if fd is None else left)
            ready = select.select([stop_fd] if fd is None else [fd, stop_fd], [], [], wait)[0]
            if stop_fd in ready:
                return "timeout"
            if fd in ready or ended():
                return None
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
            seccomp_deny(TOTALS_REFUSED, guard_clone=True)
        else:
            if owner is not None:
                # The call's uid cannot enter a folder that only root may (an interpreter under /root):
                # opened now, its part of the prefix is reached through the descriptor (see reach_hidden).
                hidden = {f: os.open(f, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                          for f in interpreter_folders() if not readable_by_others(f)}  # fmt: skip
                os.chown(scratch, owner, owner)
            restrict_files(scratch, landlock_abi)  # before the uid changes: every rule's folder is found
            become(owner)
            seccomp_deny(ALWAYS_REFUSED + (SIGNAL_CALLS if landlock_abi < 6 else ()), guard_clone=True)
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
    # The host's /proc, for the totals: it stays reachable past init's pivot. Never the program's.
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    host_root = (os.stat("/").st_dev, os.stat("/").st_ino)  # init's pivot moves this process's root too

    def forked(start, *args) -> int:
        child = os.fork()
        if child == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            for fd in (stop_read, stop_write, proc):
                os.close(fd)
            in_child(start, *args)
        return child

    if level == "namespaces":
        enter_namespaces(uid, gid)
        child = forked(run_init, scratch, limits, code, status_fd, owner)
        seen_from = child  # scratch is the tmpfs that init mounts in its new root
    else:
        abi = landlock_abi()
        if libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0) != 0:
            raise fail("becoming a child subreaper")
        max_processes = limits["max_processes"] + (processes_of(uid) if owner is None else 0)
        child = forked(start_program, scratch, limits, code, status_fd, owner, max_processes, abi)
        seen_from = os.getpid()
    counter = Totals(proc, level, seen_from, scratch, limits, host_root)
    stopped = wait_until(child, deadline, stop_read, counter.check)
    if level == "namespaces":
        # Init reports the program's status itself; killing init ends the namespace and all in it.
        if stopped is not None:
            report(status_fd, stopped)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        return
    if stopped is None:
        # Files written in the program's last moments, since the last sample (the namespaces level's
        # tmpfs refuses them instead): a total past its limit is reported all the same.
        stopped = counter.check()
    if stopped is None:
        _, status, usage = os.wait4(child, 0)
        # After an `isolation` line from the program itself: the caller reads the first line only.
        report(status_fd, f"exit {os.waitstatus_to_exitcode(status)} {usage.ru_utime + usage.ru_stime:.3f}")
    else:
        report(status_fd, stopped)
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
