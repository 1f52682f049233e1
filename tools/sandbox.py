"""Python sandbox tool: runs the model's program in a fresh, limited subprocess.

    PythonSandbox()({"code": "print(6 * 7)"})  ->  ToolResult(ok=True, output="42\\n")

The child hardens itself before running the program (limits, namespaces, privilege drop, python
guards; see tools/sandbox_child.py). This side does what a child cannot do for itself: a wall-clock
limit, killing the whole process group, a cap on the output it reads, a clean environment, stdin
closed, and a scratch folder that is removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.arguments import bad_call, string_argument
from tools.types import FAILED, MEMORY_EXCEEDED, TIMEOUT, ToolResult

CHILD_SCRIPT = Path(__file__).with_name("sandbox_child.py")
# Output past this is a flood: the program is stopped. Below it a chatty program may finish; the
# agent still sees at most max_output_chars of it.
FLOOD_BYTES = 1 << 20
DRAIN_AFTER_EXIT_S = 0.5  # how long output may still arrive once the program has exited
MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")


@dataclass(frozen=True)
class _Run:
    output: bytes
    returncode: int  # negative: killed by that signal
    cpu_s: float  # user + system time of the program and everything it waited for
    wall_timeout: bool
    flooded: bool


@dataclass
class SandboxLimits:
    """What one run of the python tool may use (`tools.sandbox`)."""

    timeout_s: float = 5.0  # wall clock; the whole process group is killed after it
    cpu_s: int = 5  # CPU seconds per process (RLIMIT_CPU)
    memory_mb: int = 256  # address space per process (RLIMIT_AS)
    max_output_chars: int = 2000  # what the agent sees of the output; head and tail are kept
    max_file_mb: int = 8  # size of one written file (RLIMIT_FSIZE), and of the private /dev/shm
    max_scratch_mb: int = 64  # all files in the scratch folder together (needs the mount namespace)
    max_code_chars: int = 20_000  # longest program accepted (it travels as one argv entry)
    max_processes: int = 64  # RLIMIT_NPROC where root runs the program as `nobody`; shared by all sandboxes
    max_open_files: int = 64  # RLIMIT_NOFILE

    def __post_init__(self) -> None:
        for setting, value in vars(self).items():
            if value <= 0:
                raise ValueError(f"tools.sandbox.{setting} must be positive, got {value}")
        if self.max_code_chars > 30_000:  # the code travels as one argv entry: 128 KiB at most
            raise ValueError(f"tools.sandbox.max_code_chars must be at most 30000, got {self.max_code_chars}")


@dataclass(frozen=True)
class PythonSandbox:
    """Tool `python`, arguments {"code": str}: runs a Python program, returns what it prints."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    name: str = "python"
    description: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not sys.executable:
            raise ValueError("PythonSandbox needs sys.executable to start the child interpreter")
        description = (
            '{"code": str}: runs a Python 3 program (standard library only) and returns what it '
            f"prints; no network, files only in its working folder, limits {self.limits.timeout_s:g} s "
            f"and {self.limits.memory_mb} MB"
        )
        object.__setattr__(self, "description", description)

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        code = string_argument(arguments, "code", tool=self.name, max_chars=self.limits.max_code_chars)
        if isinstance(code, ToolResult):
            return code
        if "\x00" in code:
            return bad_call(f"{self.name}: the code contains a NUL character")
        scratch = tempfile.mkdtemp(prefix="sandbox-")
        try:
            run = self._run(code, scratch)
        finally:
            _remove_tree(scratch)
        return self._result(run)

    def _run(self, code: str, scratch: str) -> _Run:
        limits = {
            "cpu_s": self.limits.cpu_s,
            "memory_bytes": self.limits.memory_mb << 20,
            "file_bytes": self.limits.max_file_mb << 20,
            "scratch_bytes": self.limits.max_scratch_mb << 20,
            "max_files": self.limits.max_open_files,
            "max_processes": self.limits.max_processes,
        }
        limit_text = ",".join(f"{key}={value}" for key, value in limits.items())
        # -I: no environment variables, no user site, script folder not on sys.path; -S: no
        # site-packages (standard library only, and a faster start); -u: stdout and stderr share one
        # pipe unbuffered, so a traceback lands after the prints that preceded it.
        argv = [sys.executable, "-I", "-S", "-u", "-B", str(CHILD_SCRIPT), scratch, limit_text, code]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": scratch, "TMPDIR": scratch}
        deadline = time.monotonic() + self.limits.timeout_s
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=scratch,
            env=env,
            start_new_session=True,  # own process group: one killpg reaches every descendant
        )
        assert proc.stdout is not None
        try:
            output, flooded, wall_timeout = _collect(proc, deadline)
        finally:
            _kill_group(proc.pid)  # before reaping, so the group id cannot belong to anyone else
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            proc.stdout.close()
        return _Run(output, proc.returncode, usage.ru_utime + usage.ru_stime, wall_timeout, flooded)

    def _result(self, run: _Run) -> ToolResult:
        text = run.output.decode("utf-8", errors="replace")
        rc = run.returncode
        if run.flooded:
            note = f"[stopped: the program printed more than {FLOOD_BYTES >> 20} MiB]"
            return self._finish(text, note, FAILED, force_truncated=True)
        if run.wall_timeout:
            note = f"[timed out: still running after {self.limits.timeout_s:g} s, stopped]"
            return self._finish(text, note, TIMEOUT)
        if rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and run.cpu_s >= self.limits.cpu_s):
            return self._finish(
                text, f"[timed out: used {self.limits.cpu_s} s of CPU time, stopped]", TIMEOUT
            )
        if rc != 0 and any(marker in _last_lines(text) for marker in MEMORY_MARKERS):
            return self._finish(
                text, f"[memory limit: more than {self.limits.memory_mb} MB]", MEMORY_EXCEEDED
            )
        if rc == 0:
            return self._finish(text, "", None)
        if rc < 0:
            return self._finish(text, f"[killed by {signal.Signals(-rc).name}]", FAILED)
        return self._finish(text, f"[exit status {rc}]", FAILED)

    def _finish(self, text: str, note: str, error: str | None, force_truncated: bool = False) -> ToolResult:
        budget = max(self.limits.max_output_chars - len(note) - 1, 0)
        shown, truncated = _clip(text, budget)
        if note:
            shown = f"{shown}{'' if not shown or shown.endswith(chr(10)) else chr(10)}{note}"
        elif not shown:
            shown = "(no output; print() what you want to see)"
        return ToolResult(ok=error is None, output=shown, error=error, truncated=truncated or force_truncated)


def _collect(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bool, bool]:
    """Reads the merged output until EOF, a flood or the deadline: (output, flooded, timed out)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    output = bytearray()
    leader_done = False
    drain_until = deadline
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if now >= deadline:
                return bytes(output), False, True
            if not leader_done and _exited(proc.pid):
                # A grandchild may hold the pipe open long after the program ended: end it now
                # rather than wait for EOF.
                leader_done = True
                _kill_group(proc.pid)
                drain_until = now + DRAIN_AFTER_EXIT_S
            if leader_done and now >= drain_until:
                # Still open: a descendant that left the group (possible only without a PID
                # namespace) holds it. The program itself is done, so its result stands.
                return bytes(output), False, False
            if selector.select(min(deadline - now, 0.05)):
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                output += data
                if len(output) > FLOOD_BYTES:
                    return bytes(output), True, False
    while not _exited(proc.pid):  # EOF, but the program may have closed its output and run on
        if time.monotonic() >= deadline:
            return bytes(output), False, True
        time.sleep(0.002)
    return bytes(output), False, False


def _exited(pid: int) -> bool:
    """Whether the process ended, without reaping it (its pid keeps reserving the group id)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # nothing left in the group
        os.killpg(pgid, signal.SIGKILL)


def _last_lines(text: str, count: int = 4) -> str:
    return "\n".join(text.rstrip().splitlines()[-count:])


def _clip(text: str, budget: int) -> tuple[str, bool]:
    """At most `budget` characters: the head and the tail (where a traceback ends), marked between."""
    if len(text) <= budget:
        return text, False
    marker = f"\n... [{len(text) - budget} characters cut] ...\n"
    keep = max(budget - len(marker), 0)
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head) :], True


def _remove_tree(path: str) -> None:
    """Removes the scratch folder, even where the program took its own permissions away."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.exists(path):
        return
    os.chmod(path, 0o700)
    for folder, subfolders, _ in os.walk(path):
        for name in subfolders:
            child = os.path.join(folder, name)
            if not os.path.islink(child):  # chmod follows links: never touch what lies outside
                os.chmod(child, 0o700)
    shutil.rmtree(path, ignore_errors=True)
