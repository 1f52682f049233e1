"""Python sandbox: each case runs a real subprocess and checks a limit from the outside.

Timing asserts are loose on purpose (the test machines are slow and busy): they only tell a call
that returned from one that hung.
"""

from __future__ import annotations

import ast
import ctypes
import errno
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tools.sandbox import PythonSandbox, SandboxLimits
from tools.sandbox_child import (
    BLOCK,
    Hidden,
    Totals,
    Uncountable,
    entry_bytes,
    folder_bytes,
    hidden,
    inodes,
    live_task,
    nameless_files,
    over_limit,
    process_memory,
    pss_bytes,
    seccomp_deny,
)
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
LANDLOCK = ctypes.CDLL(None, use_errno=True).syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)) >= 1
LEVELS = [
    pytest.param("namespaces", marks=needs_namespaces),
    pytest.param("landlock", marks=pytest.mark.skipif(not LANDLOCK, reason="this kernel has no Landlock")),
]


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
    assert result.output.endswith("[file size limit: a file grew past 1 MB]")


@pytest.mark.parametrize("level", LEVELS)
def test_scratch_space_is_limited_in_total(level: str) -> None:
    code = "for i in range(10):\n    open(f'part{i}', 'wb').write(b'x' * (1 << 20))"
    result = run(code, isolation=level, max_file_mb=2, max_scratch_mb=4)
    assert result.error == FAILED, result
    last = result.output.splitlines()[-1]
    if level == "namespaces":  # the tmpfs refuses the fifth MiB, and the program's traceback says so
        assert "No space left on device" in result.output
        assert last == "[disk limit: the program's files took more than 4 MB]"
    else:  # the supervisor's sample sees the total and stops the program
        assert last == "[disk limit: the program's files took more than 4 MB; stopped]"
    assert "part9" not in result.output


@needs_namespaces
def test_scratch_at_the_namespaces_level_holds_as_many_entries_as_4_kb_each_fill() -> None:
    code = "for i in range(2000):\n    open(str(i), 'w').close()\nprint('all made')"
    result = run(code, max_scratch_mb=4)  # 1024 inodes, the root folder's included
    assert result.error == FAILED and "all made" not in result.output, result
    assert result.output.endswith("[disk limit: the program's files took more than 4 MB]")
    assert "No space left on device" in result.output


def test_a_tmpfs_holds_an_entry_per_block_of_its_size() -> None:
    assert inodes(64 << 20) == 16_384 == (64 << 20) // BLOCK
    assert inodes(4096) == 16  # a few at least: /dev/shm of a tiny max_file_mb still holds a semaphore


def test_pss_and_its_swapped_part_are_read_from_smaps_rollup_in_bytes() -> None:
    text = (
        b"5583f0000000-7ffd2a5fe000 ---p 00000000 00:00 0                          [rollup]\n"
        b"Rss:               10240 kB\nPss:                1536 kB\nPss_Anon:            512 kB\n"
    )
    assert pss_bytes(text) == 1536 * 1024  # Pss, not Rss nor Pss_Anon
    assert pss_bytes(text + b"Swap:               4096 kB\nSwapPss:            2048 kB\n") == 3584 * 1024
    assert pss_bytes(b"Rss:  10240 kB\n") is None


def test_an_entry_costs_its_blocks_and_at_least_one() -> None:
    assert entry_bytes(0) == 4096  # an empty file still takes an inode: one block
    assert entry_bytes(8) == 4096  # 8 x 512
    assert entry_bytes(16_384) == 8 << 20  # an 8 MiB file: 16384 blocks of 512 bytes


def test_a_total_past_its_limit_names_itself() -> None:
    limits = {"total_memory_bytes": 100 << 20, "scratch_bytes": 16 << 20}
    assert over_limit(100 << 20, 16 << 20, limits) is None  # at the limit is within it
    assert over_limit((100 << 20) + 1, 0, limits) == f"memory {(100 << 20) + 1}"
    assert over_limit(0, (16 << 20) + 4096, limits) == f"written {(16 << 20) + 4096}"
    assert over_limit(200 << 20, 32 << 20, limits) == f"memory {200 << 20}"  # memory is named first


def test_a_walk_of_scratch_counts_each_inode_once_and_stays_on_its_file_system(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a").write_bytes(b"x" * 10_000)  # 3 blocks of 4 KiB on common file systems
    os.link(tmp_path / "sub" / "a", tmp_path / "b")  # a second name: counted once
    (tmp_path / "c").symlink_to("/usr")  # a link is an entry, never followed
    (tmp_path / "empty").touch()
    blocks = {p: os.lstat(tmp_path / p).st_blocks for p in ("sub", "sub/a", "c", "empty")}
    expected = sum(entry_bytes(b) for b in blocks.values())
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert folder_bytes(proc, f"{os.getpid()}/root{tmp_path}", 1 << 30) == expected
        # Past the budget the walk stops: after its first entry here.
        assert folder_bytes(proc, f"{os.getpid()}/root{tmp_path}", 0) in {
            entry_bytes(b) for b in blocks.values()
        }
    finally:
        os.close(proc)


def test_a_walk_that_costs_too_much_cpu_time_is_uncountable(tmp_path: Path) -> None:
    for i in range(300):
        (tmp_path / str(i)).touch()
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert (
            folder_bytes(proc, f"{os.getpid()}/root{tmp_path}", 1 << 30, until=time.thread_time() + 60)
            == 300 * BLOCK
        )
        with pytest.raises(Uncountable):
            folder_bytes(proc, f"{os.getpid()}/root{tmp_path}", 1 << 30, until=0.0)
    finally:
        os.close(proc)


def _in_child(body: Callable[[], object]) -> object:
    """Runs `body` in a forked child (a seccomp filter or a mapping stays there) and returns its result."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            result = repr(body())
        except BaseException as e:  # noqa: BLE001 - the parent reports it
            result = repr(f"{type(e).__name__}: {e}")
        os.write(write, result.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        text = f.read().decode()
    os.waitpid(pid, 0)
    return ast.literal_eval(text)


def test_the_clone_rule_refuses_namespaces_and_threads_with_an_fd_table_of_their_own() -> None:
    """The filter both levels install: clone for a new namespace, or a thread without its process's fd
    table, and unshare fail with EPERM (the kernel alone would say EINVAL to these flags: the filter
    answers first); clone3 says ENOSYS; threads, forks and subprocesses still work."""

    def body() -> dict[str, object]:
        import subprocess
        import sys
        import threading

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        seccomp_deny(("unshare",), guard_clone=True)

        def errno_of(*args: int) -> int:
            ctypes.set_errno(0)
            libc.syscall(*(ctypes.c_long(a) for a in args))
            return ctypes.get_errno()

        clone, clone3 = (56, 435) if os.uname().machine == "x86_64" else (220, 435)
        ran = []
        thread = threading.Thread(target=lambda: ran.append(1))
        thread.start()
        thread.join()
        child = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True)
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        return {
            "unshare files": errno_of(272 if clone == 56 else 97, 0x400),
            "thread alone": errno_of(clone, 0x00010000),  # CLONE_THREAD without CLONE_FILES
            "new user ns": errno_of(clone, 0x10000000 | 0x200),  # CLONE_NEWUSER | CLONE_FS
            "clone3": errno_of(clone3, 0, 0),
            "thread": len(ran),
            "subprocess": child.stdout,
            "fork": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]),
        }

    assert _in_child(body) == {
        "unshare files": errno.EPERM,
        "thread alone": errno.EPERM,
        "new user ns": errno.EPERM,
        "clone3": errno.ENOSYS,
        "thread": 1,
        "subprocess": "42\n",
        "fork": 7,
    }


def _holder() -> tuple[int, Callable[[], None]]:
    """A child process holding, without a name: a memfd of 2 MiB open; a memfd of 1 MiB mapped with
    its descriptor closed; 1 MiB of shared anonymous memory. Returns its pid and how to end it."""
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        import mmap

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        held = os.memfd_create("held")
        os.write(held, b"x" * (2 << 20))
        mapped = os.memfd_create("mapped")
        os.write(mapped, b"x" * (1 << 20))
        assert libc.mmap(None, 4096, 1, 1, mapped, 0) not in (None, ctypes.c_void_p(-1).value)
        os.close(mapped)
        shared = mmap.mmap(-1, 1 << 20)
        shared.write(b"x" * (1 << 20))
        os.write(ready_write, b"1")
        time.sleep(60)
        os._exit(0)
    os.close(ready_write)
    os.read(ready_read, 1)
    os.close(ready_read)

    def end() -> None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)

    return pid, end


def test_files_without_a_name_are_counted_held_or_mapped_and_shared_memory_is_not() -> None:
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    inherited: dict[tuple[int, int], int] = {}  # what the test process itself holds (its libraries')
    nameless_files(proc, str(os.getpid()), inherited, 8 << 20)
    pid, end = _holder()
    try:
        found: dict[tuple[int, int], int] = {}
        nameless_files(proc, str(pid), found, 8 << 20)
        found = {key: size for key, size in found.items() if key not in inherited}
        # A mapped file's size needs the caps /proc/PID/map_files asks for (root); without them the
        # most a file of the program can hold, max_file_mb.
        mapped = (1 << 20) if os.geteuid() == 0 else (8 << 20)
        assert sorted(found.values()) == sorted([2 << 20, mapped])
    finally:
        os.close(proc)
        end()


def test_a_process_refused_to_the_supervisor_is_hidden_unless_it_is_ending() -> None:
    pid, _ = _holder()
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert isinstance(hidden(proc, str(pid)), Hidden)  # alive: the refusal was not its exit
        os.kill(pid, 9)
        assert _eventually(lambda: hidden(proc, str(pid)) is None)  # a zombie holds nothing
        os.waitpid(pid, 0)
        assert hidden(proc, str(pid)) is None  # gone
    finally:
        os.close(proc)


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


def test_a_process_whose_main_thread_exited_is_read_through_a_live_thread() -> None:
    """pthread_exit in the main thread leaves its /proc entries empty while other threads hold the
    memory and files: the count reads a live thread's."""
    code = """
import ctypes, os, threading, time
def hold():
    held = bytearray(32 << 20)  # written: resident
    time.sleep(0.2)  # the main thread is gone by then
    print("ready", flush=True)
    time.sleep(60)
threading.Thread(target=hold).start()
ctypes.CDLL(None).pthread_exit(None)
"""
    # A fresh interpreter, not a fork of this one: whatever the test process has loaded stays out of it.
    holder = subprocess.Popen([sys.executable, "-I", "-c", code], stdout=subprocess.PIPE, text=True)
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        where = live_task(proc, holder.pid)
        assert where.startswith(f"{holder.pid}/task/")  # the main thread is a zombie
        assert process_memory(proc, where) >= 32 << 20
        assert process_memory(proc, str(holder.pid)) < 32 << 20  # what a count of the pid alone would see
    finally:
        os.close(proc)
        holder.kill()
        holder.wait()


def test_a_count_past_its_cpu_time_is_uncountable(tmp_path: Path) -> None:
    """The supervisor's count of a call (here: this process's children and a scratch folder) stops the
    call when it would take more than SAMPLE_CPU_S; within it, it says nothing for a call within its
    totals and names the total a call is past."""
    pid, end = _holder()  # 3 MiB of memfds, 1 MiB of shared memory
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    try:
        limits = {"total_memory_bytes": 1 << 40, "scratch_bytes": 1 << 30, "file_bytes": 8 << 20}
        root = os.stat("/")
        totals = Totals(proc, "landlock", os.getpid(), str(tmp_path), limits, (root.st_dev, root.st_ino))
        with pytest.raises(Uncountable):
            totals.now(until=0.0)
        assert totals.check() is None
        totals.limits = {**limits, "scratch_bytes": 1 << 20}
        assert (totals.check() or "").startswith("written ")  # the holder's memfds are past 1 MiB
    finally:
        os.close(proc)
        end()
