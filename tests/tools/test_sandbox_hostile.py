"""Hostile programs against the python sandbox, at every isolation level this machine offers, as root,
as an unprivileged user and where the kernel refuses `unshare` (a seccomp filter set by the driver).

Each context runs one batch of attacks in a driver process (the "trainer": it holds a secret in its
environment), then the host is inspected from outside: leftover processes and zombies, files written
outside scratch, scratch folders left behind, connections to listeners on 127.0.0.1, signals to a canary
process of the driver's uid, and the secret in any output. The attacks are real: forks, setsid daemons,
raw sockets, shell redirections, ptrace, kill.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNPRIVILEGED = 61_234  # the uid of the unprivileged contexts (no account needed)
PR_SET_CHILD_SUBREAPER = 36
DELAYED_ATTACK_S = 1.5  # the daemon's attack comes this long after the call returned

DRIVER = r"""
import dataclasses, json, os, sys, types
request = json.loads(sys.argv[1])
# Load tools.sandbox without the package's __init__ (which imports numpy and faiss): this driver may run
# on a bare interpreter that an unprivileged user can reach.
package = types.ModuleType("tools")
package.__path__ = [request["tools"]]
sys.modules["tools"] = package
if request["deny_unshare"]:
    from tools.sandbox_child import seccomp_deny
    seccomp_deny(("unshare",))
from tools.sandbox import PythonSandbox, SandboxLimits, SandboxUnavailable
sandbox = PythonSandbox(SandboxLimits(isolation=request["level"], max_processes=32, **request["limits"]))
try:
    sandbox.check()
except SandboxUnavailable as e:
    refused = dataclasses.asdict(sandbox({"code": request["codes"][0]}))
    print(json.dumps({"unavailable": str(e), "call": refused}))
    sys.exit(0)
print(json.dumps({"results": [dataclasses.asdict(sandbox({"code": code})) for code in request["codes"]]}))
"""

CANARY = r"""
import os, signal, sys, time
log = sys.argv[1]
def note(signum, frame):
    with open(log, "a") as f:
        f.write(f"{signum}\n")
for s in signal.valid_signals():
    if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
        try:
            signal.signal(s, note)
        except (OSError, ValueError):
            pass
print(os.getpid(), flush=True)
time.sleep(120)
"""


def _namespaces_work(as_user: bool) -> bool:
    pid = os.fork()
    if pid == 0:
        if as_user:
            os.setgroups([])
            os.setgid(UNPRIVILEGED)
            os.setuid(UNPRIVILEGED)
        flags = 0x40000000 | 0x00020000 | 0x20000000 | (0x10000000 if os.geteuid() else 0)
        os._exit(0 if ctypes.CDLL(None, use_errno=True).unshare(flags) == 0 else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _landlock_works() -> bool:
    return ctypes.CDLL(None, use_errno=True).syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)) >= 1


def _reachable(path: Path) -> bool:
    """Whether a user without privileges can read `path` (every folder on the way traversable)."""
    current = Path("/")
    for part in path.resolve().parts[1:]:
        current = current / part
        if current.is_dir() and not current.stat().st_mode & stat.S_IXOTH:
            return False
    return bool(path.resolve().stat().st_mode & stat.S_IROTH)


def _interpreter() -> str | None:
    """A Python an unprivileged user can run: this one, or the system's."""
    for candidate in (sys.executable, "/usr/bin/python3.11", "/usr/bin/python3"):
        if (
            Path(candidate).exists()
            and _reachable(Path(candidate))
            and _reachable(Path(os.path.realpath(candidate)))
        ):
            return candidate
    return None


@dataclass(frozen=True)
class Context:
    name: str
    level: str
    uid: int | None  # None: the test's own (root where the suite runs as root)
    deny_unshare: bool

    def usable(self) -> str | None:
        """Why this context cannot be tried here, or None."""
        if self.uid is not None and os.geteuid() != 0:
            return "an unprivileged driver needs root to start it"
        if self.uid is not None and (_interpreter() is None or not _reachable(REPO / "tools" / "sandbox.py")):
            return "no interpreter or checkout an unprivileged user can read"
        if self.level == "landlock" and not _landlock_works():
            return "this kernel has no Landlock"
        if (
            self.level == "namespaces"
            and not self.deny_unshare
            and not _namespaces_work(self.uid is not None)
        ):
            return "this machine refuses namespaces"
        return None


CONTEXTS = [
    Context("own-uid/namespaces", "namespaces", None, False),
    Context("own-uid/landlock", "landlock", None, False),
    Context("unprivileged/namespaces", "namespaces", UNPRIVILEGED, False),
    Context("unprivileged/landlock", "landlock", UNPRIVILEGED, False),
    Context("unshare-refused/landlock", "landlock", None, True),
]
REFUSED = [
    Context("unshare-refused/namespaces", "namespaces", None, True),
    Context("unprivileged-unshare-refused/namespaces", "namespaces", UNPRIVILEGED, True),
]


@dataclass
class Host:
    """What the attacks aim at, and how to tell afterwards whether they hit."""

    tag: str
    secret: str
    canary: subprocess.Popen[bytes]
    canary_pid: int
    canary_log: Path
    open_folder: Path
    project: Path
    tcp: socket.socket
    udp: socket.socket
    unix: socket.socket


@pytest.fixture
def host(request: pytest.FixtureRequest) -> Iterator[Host]:
    context: Context = request.param
    tag = f"hostile-{uuid.uuid4().hex[:12]}"
    secret = f"secret-{uuid.uuid4().hex}"
    base = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
    base.chmod(0o755)
    open_folder = base / "open"
    open_folder.mkdir(mode=0o777)
    open_folder.chmod(0o777)
    project = base / "project"
    for sub in ("data", "runs", "memory"):
        (project / sub).mkdir(parents=True)
        (project / sub).chmod(0o777)  # writable by anyone: only the sandbox can refuse
    (project / "data" / "test.jsonl").write_text(json.dumps({"question": "2+2", "answer": secret}) + "\n")
    (project / "data" / "test.jsonl").chmod(0o666)
    canary_log = base / "canary.log"
    canary_log.touch()
    canary_log.chmod(0o666)

    def as_uid() -> None:
        if context.uid is not None:
            os.setgroups([])
            os.setgid(context.uid)
            os.setuid(context.uid)

    python = _interpreter() or sys.executable
    canary = subprocess.Popen(
        [python, "-c", CANARY, str(canary_log), tag],
        stdout=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "CANARY_SECRET": secret},
        preexec_fn=as_uid,
    )
    assert canary.stdout is not None
    canary_pid = int(canary.stdout.readline())
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    tcp.setblocking(False)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(f"\0{tag}")
    unix.listen()
    unix.setblocking(False)
    try:
        yield Host(tag, secret, canary, canary_pid, canary_log, open_folder, project, tcp, udp, unix)
    finally:
        canary.kill()
        canary.wait()
        for s in (tcp, udp, unix):
            s.close()
        subprocess.run(["rm", "-rf", str(base)], check=False)


def attacks(host: Host) -> dict[str, str]:
    """name -> program. Each prints what it managed; the host checks decide."""
    port, udp_port = host.tcp.getsockname()[1], host.udp.getsockname()[1]
    marker = host.open_folder / "daemon-was-here"
    targets = [host.open_folder / "written", host.project / "runs" / "written", host.project / "memory" / "x",
               Path(f"/tmp/{host.tag}-written"), Path(f"/dev/shm/{host.tag}-written")]  # fmt: skip
    reads = [host.project / "data" / "test.jsonl", REPO / "README.md", REPO / "data" / "gsm8k" / "test.jsonl",
             Path(f"/proc/{host.canary_pid}/environ"), Path(f"/proc/{host.canary_pid}/cmdline"),
             Path("/proc/1/environ"), Path("/etc/shadow"), Path("/etc/gshadow")]  # fmt: skip
    delayed = (
        f"import os, signal, socket, time, _socket\n"
        f"time.sleep({DELAYED_ATTACK_S})\n"
        f"for attempt in (lambda: open({str(marker)!r}, 'w').write('x'),\n"
        f"                lambda: _socket.socket().connect(('127.0.0.1', {port})),\n"
        f"                lambda: os.kill({host.canary_pid}, signal.SIGUSR1)):\n"
        f"    try: attempt()\n"
        f"    except Exception: pass\n"
    )
    return {
        "daemon": f"""
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        try:
            os.execv(sys.executable, [sys.executable, "-c", {delayed!r}, "{host.tag}"])
        except OSError:  # no interpreter to exec (landlock as root, Python under /root): attack from here
            exec({delayed!r})
    os._exit(0)
os.wait()
print("spawned")
""",
        "fork_bomb": f"""
import os, sys, time
count = 0
for i in range(300):
    try:
        if os.fork() == 0:
            try:
                os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", "import time; time.sleep(60)", "{host.tag}"])
            except OSError:  # no interpreter to exec: the child stays, as the sleeper would
                time.sleep(60)
            os._exit(0)
        count += 1
    except OSError:
        break
print("forked", count)
""",
        "signals": f"""
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
for name, attempt in [
    ("kill TERM", lambda: os.kill({host.canary_pid}, signal.SIGTERM)),
    ("kill USR1", lambda: os.kill({host.canary_pid}, signal.SIGUSR1)),
    ("kill KILL", lambda: os.kill({host.canary_pid}, signal.SIGKILL)),
    ("killpg", lambda: os.killpg({host.canary_pid}, signal.SIGUSR1)),
    ("probe all", lambda: os.kill(-1, 0)),
]:
    try:
        attempt()
        print(name, "sent")
    except OSError as e:
        print(name, "refused", e.errno)
print("tgkill", libc.syscall(234 if os.uname().machine == "x86_64" else 131, {host.canary_pid}, {host.canary_pid}, 10))
print("ptrace", libc.ptrace(16, {host.canary_pid}, None, None))
""",
        "network": f"""
import _socket
for name, attempt in [
    ("tcp", lambda: _socket.socket().connect(("127.0.0.1", {port}))),
    ("udp", lambda: _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", {udp_port}))),
    ("unix", lambda: _socket.socket(_socket.AF_UNIX).connect("\\0{host.tag}")),
]:
    try:
        attempt()
        print(name, "CONNECTED")
    except OSError as e:
        print(name, "refused", type(e).__name__)
""",
        "reads": f"""
import os
for path in {[str(p) for p in reads]!r}:
    try:
        data = open(path, "rb").read()
        print("GOT-FILE", path, data[:200])
    except OSError as e:
        print("refused", path, type(e).__name__)
for folder in ("/", "/tmp", "/proc", {str(REPO)!r}, {str(host.project)!r}):
    try:
        print("listed", folder, len(os.listdir(folder)))
    except OSError as e:
        print("refused", folder, type(e).__name__)
print("canary visible:", os.path.exists("/proc/{host.canary_pid}"))
""",
        "writes": f"""
import _io, posix, subprocess
for path in {[str(t) for t in targets]!r}:
    for name, attempt in [
        ("_io", lambda: _io.open(path, "w").write("x")),
        ("posix", lambda: posix.open(path + ".p", posix.O_WRONLY | posix.O_CREAT)),
        ("shell", lambda: subprocess.run(["/bin/sh", "-c", f"echo x > {{path}}.sh"], capture_output=True)),
    ]:
        try:
            attempt()
        except Exception as e:
            print(name, path, "refused", type(e).__name__)
print("tried")
""",
        "environment": """
import os
print(dict(os.environ))
for path in ("/proc/self/environ", "/proc/1/environ", f"/proc/{os.getppid()}/environ"):
    try:
        print(path, open(path, "rb").read())
    except OSError as e:
        print(path, "refused", type(e).__name__)
""",
        "kill_caller": """
import os, signal
print("scratch", os.getcwd(), flush=True)
for target in (os.getppid(), 1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError as e:
        print("refused", target, e.errno, flush=True)
print("still here")
""",
        "escalate": """
import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
for name, attempt in [
    ("nproc", lambda: resource.setrlimit(resource.RLIMIT_NPROC, (-1, -1))),
    ("setuid", lambda: os.setuid(0)),
    ("setresuid", lambda: os.setresuid(0, 0, 0)),
]:
    try:
        attempt()
        print(name, "DONE")
    except (OSError, ValueError) as e:
        print(name, "refused")
print("unshare", libc.unshare(0x10000000 | 0x00020000))
print("uid", os.getuid())
print("euid", os.geteuid(), "saved", os.getresuid()[2])
""",
        "open_files": """
held = []
while True:
    held.append(open("/dev/null"))
""",
        "processes": """
import os, time
while True:
    if os.fork() == 0:
        time.sleep(30)
        os._exit(0)
""",
        "scratch": """
import os
os.mkdir("sub")
with open("sub/big.bin", "wb") as f:
    f.write(os.urandom(1 << 20))
print("scratch ok", os.path.getsize("sub/big.bin") == 1 << 20, os.getcwd())
""",
        "zombies": """
import os
for i in range(20):
    if os.fork() == 0:
        os._exit(0)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os._exit(0)
    os._exit(0)
print("left zombies")
""",
    }


def _processes() -> list[tuple[int, int, int, str, bytes]]:
    """(pid, ppid, uid, state, cmdline) of every process."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        state = fields["State"].split()[0]
        found.append((int(entry.name), int(fields["PPid"]), int(fields["Uid"].split()[0]), state, cmdline))
    return found


@contextmanager
def _adopting_orphans() -> Iterator[None]:
    """Makes this test process a child subreaper while the driver runs: anything the sandbox leaves behind,
    daemon or zombie, becomes this process's child rather than pid 1's, so a leak is told apart from the
    orphans of other tests running beside this one (pid 1 in a container may never reap them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(0), 0, 0, 0)


def _reap(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ChildProcessError, ProcessLookupError):
            pass


def _run_driver(context: Context, codes: list[str], secret: str, limits: dict | None = None) -> dict:
    python = _interpreter() if context.uid is not None else sys.executable
    request = {"tools": str(REPO / "tools"), "level": context.level, "deny_unshare": context.deny_unshare,
               "codes": codes, "limits": limits or {}}  # fmt: skip

    def as_uid() -> None:
        if context.uid is not None:
            os.setgroups([])
            os.setgid(context.uid)
            os.setuid(context.uid)

    done = subprocess.run(
        [python, "-c", DRIVER, json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "TRAINER_SECRET": secret, "HOME": "/"},
        preexec_fn=as_uid,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}  # fmt: skip


@pytest.mark.parametrize("host", CONTEXTS, ids=[c.name for c in CONTEXTS], indirect=True)
def test_hostile_programs_leave_the_host_untouched(host: Host, request: pytest.FixtureRequest) -> None:
    context: Context = request.node.callspec.params["host"]
    why_not = context.usable()
    if why_not:
        pytest.skip(why_not)
    programs = attacks(host)
    project_before = _digest(host.project)
    me = os.getpid()
    children_before = {p[0] for p in _processes() if p[1] == me}
    with _adopting_orphans():
        report = _run_driver(context, list(programs.values()), host.secret)
        time.sleep(DELAYED_ATTACK_S + 1.5)  # past the daemon's delayed attack, had it survived
        adopted = {p[0]: p for p in _processes() if p[1] == me and p[0] not in children_before}
    _reap(set(adopted))
    assert "results" in report, report
    out = {name: result["output"] for name, result in zip(programs, report["results"], strict=True)}

    everything = "\n".join(out.values())
    assert host.secret not in everything, "a secret reached the program"
    assert "spawned" in out["daemon"]
    assert "forked" in out["fork_bomb"], out["fork_bomb"]
    forked = int(out["fork_bomb"].split("forked")[1].split()[0])
    assert forked < 32, f"the process limit did not hold: {forked} processes"
    assert "sent" not in out["signals"].replace("probe all sent", ""), out["signals"]
    assert "CONNECTED" not in out["network"], out["network"]
    assert "GOT-FILE" not in out["reads"], out["reads"]
    assert "listed /proc" not in out["reads"] or context.level == "namespaces"  # its own /proc there
    if context.level == "namespaces":
        assert "canary visible: False" in out["reads"]  # Landlock leaves stat(): a pid's existence shows
    assert f"listed {REPO}" not in out["reads"] and f"listed {host.project}" not in out["reads"]
    assert "DONE" not in out["escalate"] and "uid 0" not in out["escalate"], out["escalate"]
    if os.geteuid() == 0 and context.uid is None:  # root runs the program as a uid of its own, wholly
        assert "euid 0" not in out["escalate"] and "saved 0" not in out["escalate"], out["escalate"]
    # Exhausting a limit is said in words, never a bare exit status.
    assert out["open_files"].endswith("[open files limit: more than 64 files open at once]"), out[
        "open_files"
    ]
    assert out["processes"].endswith("[process limit: more than 32 processes and threads at once]"), out[
        "processes"
    ]
    assert "scratch ok True" in out["scratch"], out["scratch"]
    assert "still here" in out["kill_caller"] or "killed" in out["kill_caller"], out["kill_caller"]

    # The host, from outside.
    assert not (host.open_folder / "daemon-was-here").exists(), "the daemon outlived the call"
    assert list(host.open_folder.iterdir()) == [], "a file was written outside scratch"
    assert _digest(host.project) == project_before, "the project folder changed"
    assert not list(Path("/tmp").glob(f"{host.tag}-written*")), "a file was written to /tmp"
    assert not list(Path("/dev/shm").glob(f"{host.tag}*")), "a file was written to /dev/shm"
    # The calls' own scratch folders (other tests may run sandboxes beside this one).
    scratches = [line.split()[-1] for line in out["scratch"].splitlines() + out["kill_caller"].splitlines()
                 if line.startswith(("scratch ok", "scratch /"))]  # fmt: skip
    assert len(scratches) == 2 and not any(Path(s).exists() for s in scratches), "a scratch folder was left"
    with pytest.raises(BlockingIOError):
        host.tcp.accept()  # nobody connected
    with pytest.raises(BlockingIOError):
        host.udp.recv(16)
    with pytest.raises(BlockingIOError):
        host.unix.accept()
    assert host.canary.poll() is None, "the canary was killed"
    assert host.canary_log.read_text() == "", f"the canary got signals {host.canary_log.read_text()!r}"
    processes = _processes()
    left = [p for p in processes if host.tag.encode() in p[4] and p[0] != host.canary_pid]
    assert not left, f"processes outlived the call: {left}"
    # Whatever the driver's sandbox left, running or a zombie, was adopted by this process.
    assert not adopted, f"processes or zombies outlived the call: {list(adopted.values())}"


TOTALS = {"max_total_memory_mb": 100, "max_scratch_mb": 16}  # small: the suite runs beside training
WITHIN = "[limit not reached]"
REFUSED_LINE = "[refused]"
# What a program needs to hold memory or files where /proc shows nothing; each refused at every level.
MMAP = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
"""


def totals_attacks(tag: str) -> dict[str, str]:
    """name -> program that exceeds a per-call total (TOTALS), each within every per-process and
    per-file limit; each prints its scratch folder first, WITHIN if it got to the end, REFUSED_LINE if
    the kernel refused the way it tried."""
    start = f"import os, sys, time\nprint('scratch', os.getcwd(), {tag!r}, flush=True)\n"
    return {
        # Six processes (in sessions of their own) with 40 MB each: 240 MB, each far below memory_mb.
        "memory": start
        + f"""
kids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        held = bytearray(40 << 20)
        for j in range(0, len(held), 4096):
            held[j] = 1
        time.sleep(1.5)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print({WITHIN!r})
""",
        # 200 MB held by a thread after the main thread has exited (pthread_exit), which leaves the
        # process's own /proc entries empty.
        "main_thread_gone": start
        + f"""
import ctypes, threading
def hold():
    time.sleep(0.3)  # the main thread is gone by then
    held = [bytearray(50 << 20) for _ in range(4)]
    time.sleep(1.5)
    print({WITHIN!r}, flush=True)
    os._exit(0)
threading.Thread(target=hold).start()
ctypes.CDLL(None).pthread_exit(None)
""",
        # 30 files of 8 MB (max_file_mb each) as fast as they go: 240 MB.
        "files": start
        + f"""
for i in range(30):
    with open(f"part{{i}}", "wb") as f:
        f.write(b"x" * (8 << 20))
    print("file", i, flush=True)
print({WITHIN!r})
""",
        # Space no walk of scratch sees: memfds, files deleted while open, deleted files only mapped.
        "memfds": start
        + f"""
held = []
for i in range(30):
    fd = os.memfd_create(f"m{{i}}")
    os.write(fd, b"x" * (4 << 20))
    held.append(fd)
time.sleep(0.5)
print({WITHIN!r})
""",
        "deleted": start
        + f"""
held = []
for i in range(30):
    f = open(f"d{{i}}", "wb")
    f.write(b"x" * (4 << 20))
    f.flush()
    os.unlink(f"d{{i}}")
    held.append(f)
time.sleep(0.5)
print({WITHIN!r})
""",
        "mapped": start
        + MMAP
        + f"""
for i in range(10):
    fd = os.open(f"m{{i}}", os.O_CREAT | os.O_RDWR)
    os.write(fd, b"x" * (4 << 20))
    libc.mmap(None, 4096, 1, 1, fd, 0)  # one page keeps all 4 MB of the file
    os.close(fd)
    os.unlink(f"m{{i}}")
    time.sleep(0.05)  # never more than 4 MB with a name at once
time.sleep(0.5)
print({WITHIN!r})
""",
        # A process the supervisor may not inspect (not dumpable) holds deleted files: root's supervisor
        # still reads it; another user's stops the call, since it cannot count what it holds.
        "undumpable": start
        + f"""
import ctypes
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
held = []
for i in range(30):
    f = open(f"u{{i}}", "wb")
    f.write(b"x" * (4 << 20))
    f.flush()
    os.unlink(f"u{{i}}")
    held.append(f)
    time.sleep(0.02)
time.sleep(0.5)
print({WITHIN!r})
""",
        # Files in a folder that its owner cannot list (write and search only): still counted.
        "unlisted": start
        + f"""
os.mkdir("closed", 0o300)
for i in range(4):
    open(f"closed/{{i}}", "wb").write(b"x" * (8 << 20))
time.sleep(0.5)
print({WITHIN!r})
""",
        # Empty files and folders in a deep tree: no bytes, but inodes, and work for every walk.
        "empty": start
        + f"""
for i in range(200):
    os.makedirs(f"t{{i}}/a/b/c", exist_ok=True)
    for j in range(50):
        open(f"t{{i}}/a/b/c/{{j}}", "w").close()
time.sleep(0.5)
print({WITHIN!r})
""",
        # A tmpfs of its own in nested user and mount namespaces (unshare, or clone), through posix
        # calls the python guards do not see.
        "nested": start
        + f"""
import ctypes, posix
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
clone = 56 if os.uname().machine == "x86_64" else 220
uid, gid = os.getuid(), os.getgid()
if libc.unshare(0x10000000 | 0x00020000) != 0:
    print("unshare", os.strerror(ctypes.get_errno()))
    pid = libc.syscall(clone, 0x10000000 | 0x00020000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | NEWNS | SIGCHLD
    if pid < 0:
        print("clone", os.strerror(ctypes.get_errno()))
        print({REFUSED_LINE!r})
        sys.exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
        sys.exit(0)
for name, text in (("setgroups", "deny"), ("uid_map", f"0 {{uid}} 1"), ("gid_map", f"0 {{gid}} 1")):
    fd = posix.open(f"/proc/self/{{name}}", posix.O_WRONLY)
    posix.write(fd, text.encode())
    posix.close(fd)
posix.mkdir("mnt")
assert libc.mount(b"tmpfs", b"mnt", b"tmpfs", 0, None) == 0, os.strerror(ctypes.get_errno())
for i in range(30):
    fd = posix.open(f"mnt/{{i}}", posix.O_WRONLY | posix.O_CREAT, 0o600)
    posix.write(fd, b"x" * (8 << 20))
    posix.close(fd)
time.sleep(0.5)
print({WITHIN!r})
""",
        # Memory in System V shared memory, attached, filled and detached (it would outlive the call in
        # the host's IPC namespace at the landlock level).
        "sysv": start
        + f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for i in range(4):
    segment = libc.shmget(0, 64 << 20, 0o1600)
    if segment < 0:
        print("shmget", os.strerror(ctypes.get_errno()))
        print({REFUSED_LINE!r})
        sys.exit(0)
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 64 << 20)
    libc.shmdt(ctypes.c_void_p(address))
time.sleep(0.5)
print({WITHIN!r})
""",
        # memfds sent into a unix socket and closed: in flight, in no process's fd table.
        "in_flight": start
        + f"""
import socket
a, b = socket.socketpair()
for i in range(30):
    fd = os.memfd_create(f"f{{i}}")
    os.write(fd, b"x" * (4 << 20))
    try:
        socket.send_fds(a, [b"x"], [fd])
    except OSError as e:
        print("send_fds", e.strerror)
        print({REFUSED_LINE!r})
        sys.exit(0)
    os.close(fd)
time.sleep(0.5)
print({WITHIN!r})
""",
        # A thread with an fd table of its own (unshare(CLONE_FILES)), which /proc/PID/fd does not show.
        "private_fds": start
        + f"""
import ctypes, threading
libc = ctypes.CDLL(None, use_errno=True)
def hold():
    if libc.unshare(0x400) != 0:
        print("unshare", os.strerror(ctypes.get_errno()))
        print({REFUSED_LINE!r})
        return
    for i in range(30):
        os.write(os.memfd_create(f"t{{i}}"), b"x" * (4 << 20))
    time.sleep(0.5)
    print({WITHIN!r})
thread = threading.Thread(target=hold)
thread.start()
thread.join()
""",
        # Within every total: two processes of 20 MB, 8 MB of shared anonymous memory, an 8 MB file, and
        # a 1 MB memfd mapped with its descriptor closed.
        "within": start
        + MMAP
        + f"""
import mmap
if os.fork() == 0:
    held = bytearray(20 << 20)
    time.sleep(0.3)
    os._exit(0)
held = bytearray(20 << 20)
shared = mmap.mmap(-1, 8 << 20)
shared.write(b"x" * (8 << 20))
open("data.bin", "wb").write(b"x" * (8 << 20))
fd = os.memfd_create("small")
os.write(fd, b"x" * (1 << 20))
libc.mmap(None, 4096, 1, 1, fd, 0)
os.close(fd)
os.wait()
print({WITHIN!r})
""",
    }


def _sysv_segments() -> set[str]:
    """The ids of System V shared memory segments in this IPC namespace."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return {line.split()[1] for line in lines}


def _run_and_inspect(context: Context, host: Host, programs: dict[str, str], limits: dict) -> dict:
    """Runs `programs` in one driver at `context`, then checks the host: no scratch folder, process,
    zombie or System V segment is left. Returns name -> ToolResult as a dict."""
    me = os.getpid()
    children_before = {p[0] for p in _processes() if p[1] == me}
    segments_before = _sysv_segments()
    with _adopting_orphans():
        report = _run_driver(context, list(programs.values()), host.secret, limits)
        adopted = {p[0]: p for p in _processes() if p[1] == me and p[0] not in children_before}
    _reap(set(adopted))
    assert "results" in report, report
    results = dict(zip(programs, report["results"], strict=True))
    scratches = [line.split()[1] for result in results.values() for line in result["output"].splitlines()
                 if line.startswith("scratch ")]  # fmt: skip
    assert len(scratches) == len(programs) and not any(Path(s).exists() for s in scratches)
    assert not [p for p in _processes() if host.tag.encode() in p[4] and p[0] != host.canary_pid]
    assert not adopted, f"processes or zombies outlived the call: {list(adopted.values())}"
    assert _sysv_segments() <= segments_before, "a System V segment outlived the call"
    return results


@pytest.mark.parametrize("host", CONTEXTS, ids=[c.name for c in CONTEXTS], indirect=True)
def test_per_call_totals_are_bounded(host: Host, request: pytest.FixtureRequest) -> None:
    """Memory of all a call's processes together, and all the bytes its files take, stop the program
    past the call's total, in words, at every level; every way to hold memory or files that the count
    cannot see is refused; nothing is left in /tmp, running, or in System V memory."""
    context: Context = request.node.callspec.params["host"]
    why_not = context.usable()
    if why_not:
        pytest.skip(why_not)
    results = _run_and_inspect(context, host, totals_attacks(host.tag), TOTALS)
    out = {name: result["output"] for name, result in results.items()}

    assert results["within"]["ok"] and out["within"].endswith(WITHIN + "\n"), out["within"]
    for name in ("memory", "main_thread_gone"):
        last = out[name].splitlines()[-1]
        assert last == "[memory limit: the program's processes together used more than 100 MB; stopped]", out[
            name
        ]
        assert results[name]["error"] == "memory_exceeded"
    disk = "[disk limit: the program's files took more than 16 MB"
    for name in ("files", "memfds", "deleted", "mapped", "unlisted", "empty"):
        assert WITHIN not in out[name], (name, out[name])
        # The supervisor's sample stops it ("; stopped]"), or the namespaces level's tmpfs refuses ("]").
        assert out[name].splitlines()[-1].startswith(disk), (name, out[name])
        assert results[name]["ok"] is False
    written = [line for line in out["files"].splitlines() if line.startswith("file ")]
    assert len(written) < 10, f"{len(written)} files of 8 MB were written before the program was stopped"
    # Root's supervisor reads a process that is not dumpable; another user's stops it unread.
    undumpable = out["undumpable"].splitlines()[-1]
    if os.geteuid() == 0 and context.uid is None:
        assert undumpable.startswith(disk), out["undumpable"]
    else:
        assert undumpable.startswith("[sandbox: a process of the program made itself impossible to inspect")
    assert WITHIN not in out["undumpable"] and results["undumpable"]["ok"] is False
    for name in ("nested", "sysv", "in_flight", "private_fds"):
        assert REFUSED_LINE in out[name] and WITHIN not in out[name], (name, out[name])
        assert "Operation not permitted" in out[name], (name, out[name])


@pytest.mark.parametrize("host", CONTEXTS, ids=[c.name for c in CONTEXTS], indirect=True)
def test_the_totals_of_issue_56_are_bounded_at_the_default_limits(
    host: Host, request: pytest.FixtureRequest
) -> None:
    """Six children of 200 MB each (1.2 GB against max_total_memory_mb=512) and 30 files of 8 MB
    written as fast as they go (240 MB against max_scratch_mb=64), at every level."""
    context: Context = request.node.callspec.params["host"]
    why_not = context.usable()
    if why_not:
        pytest.skip(why_not)
    start = f"import os, time\nprint('scratch', os.getcwd(), {host.tag!r}, flush=True)\n"
    programs = {
        "memory": start
        + f"""
kids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        held = b"x" * (200 << 20)
        time.sleep(2)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print({WITHIN!r})
""",
        "files": start
        + f"""
for i in range(30):
    with open(f"part{{i}}", "wb") as f:
        f.write(b"x" * (8 << 20))
    print("file", i, flush=True)
print({WITHIN!r})
""",
    }
    results = _run_and_inspect(context, host, programs, {})
    memory, files = results["memory"]["output"], results["files"]["output"]
    assert memory.endswith("[memory limit: the program's processes together used more than 512 MB; stopped]")
    assert files.splitlines()[-1].startswith("[disk limit: the program's files took more than 64 MB"), files
    assert WITHIN not in memory + files
    # 8 full files is the limit; the sample may let a few more through before it stops the program.
    assert len([line for line in files.splitlines() if line.startswith("file ")]) < 16, files


@pytest.mark.parametrize("context", REFUSED, ids=[c.name for c in REFUSED])
def test_a_refused_level_stops_at_start_up_and_runs_nothing(context: Context, tmp_path: Path) -> None:
    if context.uid is not None and (os.geteuid() != 0 or _interpreter() is None):
        pytest.skip("an unprivileged driver needs root to start it and a reachable interpreter")
    folder = tmp_path / "open"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    tmp_path.chmod(0o755)
    marker = folder / "ran"
    report = _run_driver(context, [f"open({str(marker)!r}, 'w').write('x')"], "s")
    message = report["unavailable"]
    assert message.startswith("tools.sandbox.isolation=namespaces is not available here (unshare")
    assert "tools.sandbox.isolation=landlock" in message and "\n" not in message
    assert report["call"]["ok"] is False and "cannot isolate at level namespaces" in report["call"]["output"]
    assert not marker.exists(), "the code ran although the sandbox could not isolate it"


def test_an_unknown_level_names_the_choices() -> None:
    from tools.sandbox import SandboxLimits

    with pytest.raises(ValueError, match="tools.sandbox.isolation must be one of namespaces, landlock"):
        SandboxLimits(isolation="none")


def test_the_supervisor_is_not_the_programs_to_signal() -> None:
    """At both levels the program's SIGTERM to its parent, then its own exit, still gives one result."""
    from tools.sandbox import PythonSandbox, SandboxLimits

    for level in ("namespaces", "landlock"):
        if (level == "landlock" and not _landlock_works()) or (
            level == "namespaces" and not _namespaces_work(False)
        ):
            continue
        result = PythonSandbox(SandboxLimits(isolation=level))(
            {
                "code": "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGTERM)\nexcept OSError:\n    pass\nprint('done')"
            }
        )
        assert result.ok and result.output == "done\n", (level, result)


NO_UNSHARE = """
import os, sys, types
package = types.ModuleType("tools")
package.__path__ = [sys.argv[1]]
sys.modules["tools"] = package
from tools.sandbox_child import seccomp_deny
seccomp_deny(("unshare",))
os.execv(sys.argv[2], sys.argv[2:])
"""


def test_a_command_stops_at_start_up_where_namespaces_are_refused(tmp_path: Path) -> None:
    """`meta-agent eval` under a seccomp filter that refuses unshare: one line, exit 2, no run folder."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-c", NO_UNSHARE, str(REPO / "tools"), sys.executable, "-m", "meta_agent", "eval",
               f"run_dir={run_dir}", "roles.executor.tools=[calculator,python]"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "error: tools.sandbox.isolation=namespaces is not available"
    )
    assert not run_dir.exists()
