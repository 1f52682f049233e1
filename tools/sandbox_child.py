"""The child side of the python sandbox: hardens its own process, then runs the model's program.

Started by tools/sandbox.py, never imported:

    python -I -S -u -B sandbox_child.py SCRATCH LIMITS CODE

LIMITS is `cpu_s=5,memory_bytes=...,file_bytes=...,scratch_bytes=...,max_files=64,max_processes=64`. Only the
standard library is imported, and only cheap modules, because every tool call pays for them.

Layers, outermost first. Each one that cannot be applied here is skipped; the others still hold.
1. Resource limits: CPU seconds, address space, file size, open files, no core dumps, and (when
   root runs it as `nobody`) the number of processes.
2. Namespaces (as root, or inside an unprivileged user namespace): a new network namespace has no
   interface up, so nothing is reachable, 127.0.0.1 included; a new mount namespace where every
   mount is read-only except scratch (a size-limited tmpfs), with a private /dev/shm; a new PID namespace with its own
   /proc, whose init waits for the program, so that when the program ends every descendant is
   killed, even one that left the process group with setsid().
3. Privilege drop: root becomes `nobody`, so the limits cannot be raised again, RLIMIT_NPROC counts
   and file permissions apply. Where `nobody` could not reach the interpreter, root stays root but
   without any capability.
4. Python guards: socket constructors, name lookups and opening a path outside scratch for writing
   raise PermissionError with a message the model can read. They are easy to bypass (`_socket`,
   `ctypes`, a shell) - the layers above are what hold; the guards make the refusal readable.
"""

import builtins
import ctypes
import errno
import io
import os
import resource
import signal
import socket
import stat
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 0x20, 0x400, 0x800, 0x1000, 0x4000
MS_PRIVATE, MS_RELATIME = 0x40000, 0x200000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
NOBODY = 65534
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

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def set_limits(limits: dict[str, int]) -> None:
    """Applies the resource limits; a hard limit never rises above the one already in force."""
    cpu = limits["cpu_s"]
    wanted = [
        (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL a second later
        (resource.RLIMIT_AS, limits["memory_bytes"], limits["memory_bytes"]),
        (resource.RLIMIT_FSIZE, limits["file_bytes"], limits["file_bytes"]),
        (resource.RLIMIT_NOFILE, limits["max_files"], limits["max_files"]),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    if os.geteuid() == 0:
        # Counted per real uid across the machine, so only for root, which becomes `nobody` here
        # (uid 0 itself is exempt). For an ordinary user the count would include their whole session.
        wanted.append((resource.RLIMIT_NPROC, limits["max_processes"], limits["max_processes"]))
    for which, soft, hard in wanted:
        _, current_hard = resource.getrlimit(which)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        try:  # noqa: SIM105 - contextlib.suppress would import contextlib into every run
            resource.setrlimit(which, (soft, hard))
        except (OSError, ValueError):
            pass


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> bool:
    encode = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    return libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) == 0


def blocked_ancestor(path: str) -> str | None:
    """The first folder on the way to `path` that other users cannot traverse, if any."""
    current = "/"
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        mode = os.stat(current).st_mode
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return current
    return None


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


def read_only_world(scratch: str, scratch_bytes: int, file_bytes: int) -> None:
    """In the new mount namespace: everything read-only except scratch, interpreter reachable."""
    # Private first, so that nothing done here propagates back to the host's mounts.
    if not mount(None, "/", None, MS_REC | MS_PRIVATE):
        return
    # A size-limited tmpfs over scratch: RLIMIT_FSIZE bounds one file, this bounds them all, and
    # it vanishes with the namespace. Failing that, a bind of scratch onto itself, so it stays
    # writable when the rest turns read-only.
    if not mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=700,size={scratch_bytes}"):
        mount(scratch, scratch, None, MS_BIND | MS_REC)
    blocked = blocked_ancestor(os.path.dirname(os.__file__))
    if blocked is not None:
        # e.g. a pyenv under /root (0700): hide that folder behind an empty tmpfs and bind back only
        # the interpreter's prefix (and scratch if it lived there), so `nobody` can import the
        # standard library but cannot read the rest.
        keep = [p for p in (sys.base_prefix, scratch) if p.startswith(blocked + "/")]
        handles = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in keep]
        if mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=64k"):
            for path, fd in handles:
                os.makedirs(path, exist_ok=True)
                mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        for _, fd in handles:
            os.close(fd)
    for point, kept in mount_points():
        if point == scratch or point.startswith(scratch + "/"):
            continue
        # MS_BIND makes this a per-mount flag; without it the remount would hit the filesystem itself.
        mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
    if os.path.isdir("/dev/shm"):  # multiprocessing needs it; a private, small one is harmless
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={file_bytes}")
    os.chdir(scratch)  # the old working directory still points at the read-only mount underneath


def isolate(scratch: str, scratch_bytes: int, file_bytes: int) -> bool:
    """Enters new network, mount and PID namespaces if allowed; True when the PID namespace exists."""
    flags = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID
    if os.geteuid() != 0:
        flags |= CLONE_NEWUSER  # an unprivileged user namespace grants the rights for the others
    if libc.unshare(flags) != 0:
        return False
    read_only_world(scratch, scratch_bytes, file_bytes)
    return True


def drop_capabilities() -> None:
    """Leaves this process (and what it execs) without any capability, whatever its uid."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]

    for cap in range(64):  # the bounding set, so that exec cannot give them back
        libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0)
    libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)())  # _LINUX_CAPABILITY_VERSION_3


def drop_privileges(scratch: str) -> None:
    """Root becomes nobody where nobody can still run the interpreter, else loses its capabilities."""
    if os.geteuid() == 0 and blocked_ancestor(os.path.dirname(os.__file__)) is None:
        os.chown(scratch, NOBODY, NOBODY)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)  # clears every capability, and no way back
        # The uid change made /proc/self root-owned; the program may read its own entries.
        libc.prctl(PR_SET_DUMPABLE, ctypes.c_ulong(1), 0, 0, 0)
    else:
        drop_capabilities()
    libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0)  # setuid binaries stay harmless


def enter_pid_namespace() -> bool:
    """Forks init (pid 1) and the program (pid 2) of the new PID namespace; returns in the program.

    The program is not init itself because init ignores every signal it has no handler for, the
    CPU limit's SIGXCPU included. Init waits for the program and sends its wait status back here;
    when init exits, the kernel kills whatever is left in the namespace. This process leaves with
    the program's status, so the parent sees it as its own child's. False (nothing forked) when
    the first fork fails: the program then runs here, outside the namespace.
    """
    read_end, write_end = os.pipe()
    try:
        init = os.fork()
    except OSError:
        return False
    if init == 0:
        os.close(read_end)
        libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
        try:
            program = os.fork()
        except OSError as e:
            os.write(2, f"sandbox: cannot start the program: {e}\n".encode())
            os._exit(1)
        if program == 0:
            os.close(write_end)
            return True
        _, status = os.waitpid(program, 0)
        os.write(write_end, status.to_bytes(4, "little"))
        os._exit(0)
    os.close(write_end)
    _, init_status = os.waitpid(init, 0)
    status = os.read(read_end, 4)
    code = os.waitstatus_to_exitcode(int.from_bytes(status, "little") if len(status) == 4 else init_status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


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
    """Runs `code` as __main__; an uncaught exception prints a traceback without this file's frames."""
    main = type(sys)("__main__")
    sys.modules["__main__"] = main
    try:
        exec(compile(code, "<sandbox>", "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        import linecache  # only on failure: both pull in modules a passing program does not need
        import traceback

        linecache.cache["<sandbox>"] = (len(code), None, code.splitlines(True), "<sandbox>")
        report = traceback.TracebackException(type(e), e, e.__traceback__)
        # The model should see its own frames, not this file's (run_program, the guards).
        report.stack = traceback.StackSummary.from_list(
            [frame for frame in report.stack if frame.filename != __file__]
        )
        print("".join(report.format()), end="", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def main() -> None:
    scratch, limit_text, code = sys.argv[1], sys.argv[2], sys.argv[3]
    limits = {k: int(v) for k, v in (item.split("=") for item in limit_text.split(","))}
    set_limits(limits)
    if isolate(scratch, limits["scratch_bytes"], limits["file_bytes"]) and enter_pid_namespace():
        # A /proc of this namespace only: the program cannot list (or read the command lines of)
        # processes outside it.
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    drop_privileges(scratch)
    del sys.argv[1:]
    install_guards(scratch)
    run_program(code)


if __name__ == "__main__":
    main()
