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
sandbox = PythonSandbox(SandboxLimits(isolation=request["level"], max_processes=32))
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


def _run_driver(context: Context, codes: list[str], secret: str) -> dict:
    python = _interpreter() if context.uid is not None else sys.executable
    request = {"tools": str(REPO / "tools"), "level": context.level, "deny_unshare": context.deny_unshare,
               "codes": codes}  # fmt: skip

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
