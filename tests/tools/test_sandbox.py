"""Python sandbox: each case runs a real subprocess and checks a limit from the outside.

Timing asserts are loose on purpose (the test machines are slow and busy): they only tell a call
that returned from one that hung.
"""

from __future__ import annotations

import ctypes
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tools.sandbox import PythonSandbox, SandboxLimits
from tools.types import FAILED, MEMORY_EXCEEDED, TIMEOUT, ToolResult


def _namespaces_work() -> bool:
    """Whether a child may enter new network, mount and PID namespaces here (root, or user ns)."""
    flags = 0x40000000 | 0x00020000 | 0x20000000 | (0x10000000 if os.geteuid() != 0 else 0)
    pid = os.fork()
    if pid == 0:
        os._exit(0 if ctypes.CDLL(None, use_errno=True).unshare(flags) == 0 else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


NAMESPACES = _namespaces_work()
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="cannot create namespaces on this machine")


def run(code: str, **settings: float) -> ToolResult:
    return PythonSandbox(SandboxLimits(**settings))({"code": code})  # type: ignore[arg-type]


def _processes_with(tag: str) -> list[int]:
    """Pids of live processes whose command line contains `tag`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if tag.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass  # ended while we looked
    return found


def _eventually(check: Callable[[], bool], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A world-writable folder outside any sandbox scratch: only the sandbox itself can refuse writes."""
    folder = Path(tempfile.mkdtemp(prefix="sandbox-test-"))
    folder.chmod(0o777)
    yield folder
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()


def test_print() -> None:
    result = run("print(6 * 7)")
    assert result == ToolResult(ok=True, output="42\n")


def test_no_output_says_so() -> None:
    result = run("x = 1")
    assert result.ok and "no output" in result.output


def test_exception_gives_traceback_without_sandbox_frames() -> None:
    result = run("print('before')\nimport socket\nsocket.create_connection(('example.com', 80))")
    assert (result.ok, result.error) == (False, FAILED)
    assert result.output.startswith("before\nTraceback")
    assert 'File "<sandbox>", line 3' in result.output
    assert "sandbox_child" not in result.output
    assert result.output.rstrip().endswith("[exit status 1]")


def test_exit_status_is_reported() -> None:
    assert run("import sys; sys.exit(3)") == ToolResult(ok=False, output="[exit status 3]", error=FAILED)


def test_infinite_loop_times_out() -> None:
    start = time.monotonic()
    result = run("while True: pass", timeout_s=1.5, cpu_s=60)
    assert result.error == TIMEOUT and "timed out" in result.output
    assert time.monotonic() - start < 30


def test_cpu_limit_is_a_timeout() -> None:
    result = run("while True: pass", timeout_s=10, cpu_s=1)
    assert result.error == TIMEOUT
    assert "CPU" in result.output or "still running" in result.output  # the wall may win on a busy box


def test_memory_bomb_is_stopped_and_the_machine_survives() -> None:
    result = run("block = bytearray(2 * 1024**3)\nprint('allocated')")
    assert (result.ok, result.error) == (False, MEMORY_EXCEEDED)
    assert "MemoryError" in result.output and "allocated" not in result.output
    growing = run("chunks = []\nwhile True: chunks.append(bytearray(10**7))", timeout_s=20)
    assert growing.error == MEMORY_EXCEEDED
    assert run("print('still here')").output == "still here\n"


def test_output_flood_is_truncated_and_stopped() -> None:
    start = time.monotonic()
    result = run("while True: print('flood ' * 10)", max_output_chars=500, timeout_s=20)
    assert not result.ok and result.truncated
    assert len(result.output) <= 500
    assert result.output.startswith("flood flood")
    assert "printed more than" in result.output
    assert time.monotonic() - start < 30


def test_long_output_of_a_finished_program_keeps_head_and_tail() -> None:
    result = run("for i in range(1000): print(i)", max_output_chars=300)
    assert result.ok and result.truncated
    assert len(result.output) <= 300
    assert result.output.startswith("0\n1\n2\n") and result.output.endswith("998\n999\n")
    assert "characters cut" in result.output


def test_grandchild_that_outlives_its_parent_is_killed(open_folder: Path) -> None:
    tag = f"sandbox-grandchild-{uuid.uuid4().hex}"
    marker = open_folder / "marker"
    # The grandchild execs a fresh interpreter: no python guards, only the sandbox's kill stops it.
    code = f"""
import os, sys
if os.fork() == 0:
    grandchild = "import sys, time; time.sleep(2); open(sys.argv[1], 'w').write('alive')"
    os.execv(sys.executable, [sys.executable, "-c", grandchild, "{marker}", "{tag}"])
print("parent exits")
"""
    result = run(code)
    assert result.ok and result.output == "parent exits\n"
    assert _eventually(lambda: not _processes_with(tag)), "the grandchild survived the call"
    time.sleep(3)  # past the grandchild's sleep: had it lived, the marker would be there now
    assert not marker.exists()


@needs_namespaces
def test_grandchild_that_left_the_process_group_is_killed() -> None:
    tag = f"sandbox-setsid-{uuid.uuid4().hex}"
    code = f"""
import os, sys
if os.fork() == 0:
    os.setsid()
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{tag}"])
print("parent exits")
"""
    assert run(code).ok
    assert _eventually(lambda: not _processes_with(tag)), "the setsid grandchild survived the call"


def test_timeout_kills_the_children_too() -> None:
    tag = f"sandbox-timeout-{uuid.uuid4().hex}"
    code = f"""
import os, sys, time
if os.fork() == 0:
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{tag}"])
time.sleep(60)
"""
    assert run(code, timeout_s=1.5).error == TIMEOUT
    assert _eventually(lambda: not _processes_with(tag)), "a child survived the timeout"


def test_write_outside_scratch_is_refused(open_folder: Path) -> None:
    target = open_folder / "escaped.txt"
    result = run(f"open({str(target)!r}, 'w').write('x')")
    assert (result.ok, result.error) == (False, FAILED)
    assert "writing outside the scratch folder is not allowed" in result.output
    assert not target.exists()
    assert run("open('inside.txt', 'w').write('x'); print(open('inside.txt').read())").output == "x\n"


@needs_namespaces
def test_write_outside_scratch_is_refused_below_python_too(open_folder: Path) -> None:
    target = open_folder / "escaped-by-shell.txt"
    code = f"import subprocess\nsubprocess.run(['/bin/sh', '-c', 'echo x > {target}'])\nprint('done')"
    result = run(code)
    assert "done" in result.output
    assert not target.exists()


def test_network_connection_is_refused() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        result = run(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('connected')"
        )
        assert not result.ok and "network is disabled in the sandbox" in result.output
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody knocked


@needs_namespaces
def test_network_is_unreachable_below_python_too() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        # _socket is the C module under the guarded `socket`: only the network namespace stops it.
        result = run(
            f"import _socket\ns = _socket.socket()\ns.settimeout(3)\ns.connect(('127.0.0.1', {port}))"
        )
        assert not result.ok and "OSError" in result.output
        with pytest.raises(BlockingIOError):
            server.accept()


def test_scratch_folder_is_the_cwd_and_is_removed() -> None:
    result = run("import os\nopen('notes.txt', 'w').write('x')\nprint(os.getcwd())")
    scratch = Path(result.output.strip())
    assert scratch.name.startswith("sandbox-")
    assert not scratch.exists()


def test_environment_is_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_TEST_SECRET", "hunter2")
    result = run("import os\nprint(sorted(os.environ))\nprint(os.environ['HOME'] == os.getcwd())")
    assert result.output == "['HOME', 'LANG', 'PATH', 'TMPDIR']\nTrue\n"


def test_stdin_is_closed() -> None:
    assert run("import sys\nprint(repr(sys.stdin.read()))").output == "''\n"
    assert "EOFError" in run("input()").output


def test_file_size_is_limited() -> None:
    result = run("open('big', 'wb').write(b'x' * (4 << 20))", max_file_mb=1)
    assert result.error == FAILED and "File too large" in result.output


@needs_namespaces
def test_scratch_space_is_limited_in_total() -> None:
    code = "for i in range(10):\n    open(f'part{i}', 'wb').write(b'x' * (1 << 20))"
    result = run(code, max_file_mb=2, max_scratch_mb=4)
    assert result.error == FAILED and "No space left on device" in result.output


def test_limits_cannot_be_raised_from_inside() -> None:
    result = run("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))")
    assert result.error == FAILED and "ValueError" in result.output


@pytest.mark.skipif(
    os.geteuid() != 0 or not NAMESPACES, reason="the process limit holds once root becomes nobody"
)
def test_process_count_is_limited() -> None:
    code = """
import os, time
for i in range(200):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
    except OSError as e:
        print("refused after", i)
        break
"""
    result = run(code, max_processes=16)
    assert result.ok and "refused after" in result.output


def test_argument_errors_are_bad_calls() -> None:
    sandbox = PythonSandbox(SandboxLimits(max_code_chars=100))
    assert sandbox({"code": "x" * 101}).error == "bad_call"
    assert sandbox({"code": "   "}).error == "bad_call"
    assert sandbox({"code": "print(1)\x00"}).error == "bad_call"
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
