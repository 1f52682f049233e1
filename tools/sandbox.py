"""Python sandbox tool: runs the model's program in a fresh, isolated, limited subprocess.

    PythonSandbox()({"code": "print(6 * 7)"})  ->  ToolResult(ok=True, output="42\\n")

`tools.sandbox.isolation` names how (tools/sandbox_child.py has the layers of each level):
`namespaces` (the default) or `landlock` (no namespaces needed; chosen explicitly). The sandbox never
runs weaker than that: `check()` raises SandboxUnavailable at start-up when the level cannot be had,
and a call that cannot isolate refuses to run the code. The child supervises the program (deadline,
every descendant killed and reaped; the call's processes together held to `max_total_memory_mb`, its
files to `max_scratch_mb`, both sampled, and what would hide memory or files from the count refused);
this side adds what the child cannot do for itself: a backstop kill, a cap on the output it reads, a
clean environment, stdin closed, and a scratch folder that is removed afterwards. Every limit the
program meets is said in words at the end of its output (`[memory limit: ...]`, `[disk limit: ...]`,
`[open files limit: ...]`, ...).
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
ISOLATION_LEVELS = ("namespaces", "landlock")
# Output past this is a flood: the program is stopped. Below it a chatty program may finish; the
# agent still sees at most max_output_chars of it.
FLOOD_BYTES = 1 << 20
ISOLATION_FAILED = 125  # sandbox_child's exit status for a step of its own that failed
# How long past the deadline the supervisor may take to stop everything before it is killed itself.
BACKSTOP_S = 5.0
MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
# What a program that ran out of descriptors or processes says last, and what the agent is told.
EXHAUSTION = {
    "Too many open files": "[open files limit: more than {max_open_files} files open at once]",
    "can't start new thread": "[process limit: more than {max_processes} processes and threads at once]",
    "Resource temporarily unavailable": "[process limit: more than {max_processes} processes and threads "
    "at once]",
    # Scratch's tmpfs is full (namespaces level): its bytes, or its files and folders at 4 KB each.
    "No space left on device": "[disk limit: the program's files took more than {max_scratch_mb} MB]",
    "File too large": "[file size limit: a file grew past {max_file_mb} MB]",
}
ADVICE = {
    "namespaces": (
        "allow namespaces (as root, or user namespaces for others: sysctl user.max_user_namespaces > 0; "
        "in a container, a seccomp profile that permits unshare), or choose tools.sandbox.isolation="
        "landlock (no namespaces; see README 'Safety and failure' for what it keeps)"
    ),
    "landlock": (
        "Landlock needs Linux 5.13 or newer with landlock among the enabled LSMs (and a container profile "
        "that permits its syscalls); choose tools.sandbox.isolation=namespaces where namespaces are "
        "allowed, or take `python` out of the roles' tools"
    ),
}


class SandboxUnavailable(RuntimeError):
    """The chosen isolation level cannot be had on this machine; the message says why and what to do."""


@dataclass(frozen=True)
class _Run:
    output: bytes
    status: str  # the supervisor's line: "exit CODE CPU_S", "timeout", "memory BYTES", "written BYTES",
    # "hidden PID", "uncountable CPU_S", "isolation REASON" or ""
    flooded: bool


@dataclass
class SandboxLimits:
    """What one run of the python tool may use (`tools.sandbox`)."""

    isolation: str = "namespaces"  # namespaces | landlock; never weaker than named (see README)
    timeout_s: float = 5.0  # wall clock; the program and every descendant are stopped after it
    cpu_s: int = 5  # CPU seconds per process (RLIMIT_CPU)
    memory_mb: int = 256  # address space per process (RLIMIT_AS)
    # All of a call's processes together (resident, shared pages divided among their sharers), sampled:
    # without it 64 processes x memory_mb could take 16 GB; 512 leaves a 24 GB machine to training.
    max_total_memory_mb: int = 512
    max_output_chars: int = 2000  # what the agent sees of the output; head and tail are kept
    max_file_mb: int = 8  # size of one written file (RLIMIT_FSIZE), and of the private /dev/shm
    # All the files a call writes together, each file or folder 4 KB at least: scratch (a tmpfs of this
    # size at the namespaces level; the host folder, sampled, at the landlock level) and files held
    # without a name, open or mapped (sampled, both).
    max_scratch_mb: int = 64
    max_code_chars: int = 20_000  # longest program accepted (it travels as one argv entry)
    max_processes: int = 64  # processes the program may have at once (RLIMIT_NPROC)
    max_open_files: int = 64  # RLIMIT_NOFILE

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_LEVELS:
            raise ValueError(
                f"tools.sandbox.isolation must be one of {', '.join(ISOLATION_LEVELS)}, got {self.isolation!r}"
            )
        for setting, value in vars(self).items():
            if setting != "isolation" and value <= 0:
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
        )  # unchanged by the per-call totals: prompts, and the adapters trained on them, stay the same
        object.__setattr__(self, "description", description)

    def check(self) -> None:
        """Runs one tiny program at the chosen level; SandboxUnavailable (one line: why, what to do) if
        the level cannot be had here. Meant for start-up, before anything is written."""
        scratch = tempfile.mkdtemp(prefix="sandbox-")
        try:
            run = self._run("print(1)", scratch)
        finally:
            _remove_tree(scratch)
        level = self.limits.isolation
        if run.status.startswith("isolation "):
            reason = run.status.removeprefix("isolation ")
            raise SandboxUnavailable(
                f"tools.sandbox.isolation={level} is not available here ({reason}): {ADVICE[level]}"
            )
        if run.status != "exit 0" and not run.status.startswith("exit 0 ") or run.output != b"1\n":
            raise SandboxUnavailable(
                f"tools.sandbox.isolation={level}: a test program failed ({run.status or 'no status'}: "
                f"{run.output.decode(errors='replace')[-300:]!r})"
            )

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
            "timeout_ms": int(self.limits.timeout_s * 1000),
            "cpu_s": self.limits.cpu_s,
            "memory_bytes": self.limits.memory_mb << 20,
            "total_memory_bytes": self.limits.max_total_memory_mb << 20,
            "file_bytes": self.limits.max_file_mb << 20,
            "scratch_bytes": self.limits.max_scratch_mb << 20,
            "max_files": self.limits.max_open_files,
            "max_processes": self.limits.max_processes,
        }
        limit_text = ",".join(f"{key}={value}" for key, value in limits.items())
        status_read, status_write = os.pipe()
        # -I: no environment variables, no user site, script folder not on sys.path; -S: no
        # site-packages (standard library only, and a faster start); -u: stdout and stderr share one
        # pipe unbuffered, so a traceback lands after the prints that preceded it.
        argv = [sys.executable, "-I", "-S", "-u", "-B", str(CHILD_SCRIPT), self.limits.isolation, scratch,
                limit_text, str(status_write), code]  # fmt: skip
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": scratch, "TMPDIR": scratch}
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=scratch,
                env=env,
                pass_fds=(status_write,),
                start_new_session=True,  # the supervisor's own group, for the backstop kill
            )
        finally:
            os.close(status_write)
        assert proc.stdout is not None
        try:
            output, flooded = _collect(proc, time.monotonic() + self.limits.timeout_s + BACKSTOP_S)
        finally:
            _kill_group(proc.pid)  # only a supervisor past its backstop is still there
            os.waitpid(proc.pid, 0)
            proc.returncode = 0  # reaped here; keeps Popen from waiting again
            proc.stdout.close()
            with os.fdopen(status_read, "rb") as status:
                line = status.readline().decode(errors="replace").strip()
        return _Run(output, line, flooded)

    def _result(self, run: _Run) -> ToolResult:
        text = run.output.decode("utf-8", errors="replace")
        status = run.status
        if run.flooded:
            note = f"[stopped: the program printed more than {FLOOD_BYTES >> 20} MiB]"
            return self._finish(text, note, FAILED, force_truncated=True)
        if status == "timeout":
            note = f"[timed out: still running after {self.limits.timeout_s:g} s, stopped]"
            if any(marker in _last_lines(text) for marker in MEMORY_MARKERS):  # stuck where memory ran out
                note = f"[memory limit: more than {self.limits.memory_mb} MB; then stuck, stopped]"
            return self._finish(text, note, TIMEOUT)
        if status.startswith("memory "):
            note = (
                f"[memory limit: the program's processes together used more than "
                f"{self.limits.max_total_memory_mb} MB; stopped]"
            )
            return self._finish(text, note, MEMORY_EXCEEDED)
        if status.startswith("written "):
            note = (
                f"[disk limit: the program's files took more than {self.limits.max_scratch_mb} MB; stopped]"
            )
            return self._finish(text, note, FAILED)
        if status.startswith("hidden "):
            note = (
                "[sandbox: a process of the program made itself impossible to inspect (not dumpable), so "
                "its memory and files could not be counted; stopped]"
            )
            return self._finish(text, note, FAILED)
        if status.startswith("uncountable "):
            note = (
                "[sandbox: the program's processes and files took too long to count (thousands of memory "
                "mappings or files); stopped]"
            )
            return self._finish(text, note, FAILED)
        if status.startswith("isolation "):
            note = f"[sandbox: cannot isolate at level {self.limits.isolation} ({status[10:]}); not run]"
            return self._finish("", note, FAILED)
        if not status.startswith("exit "):
            return self._finish(text, "[sandbox: the supervisor ended without a result]", FAILED)
        _, code, cpu = status.split()
        rc, cpu_s = int(code), float(cpu)
        if rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and cpu_s >= self.limits.cpu_s):
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
        last = _last_lines(text)
        for marker, note in EXHAUSTION.items():
            if marker in last:
                return self._finish(text, note.format(**vars(self.limits)), FAILED)
        if rc == ISOLATION_FAILED and not text.strip():
            note = (
                f"[exit status {rc}: the program ended before it could say why; it may have used up its "
                f"memory ({self.limits.memory_mb} MB), open files ({self.limits.max_open_files}) or "
                f"processes ({self.limits.max_processes})]"
            )
            return self._finish(text, note, FAILED)
        return self._finish(text, f"[exit status {rc}]", FAILED)

    def _finish(self, text: str, note: str, error: str | None, force_truncated: bool = False) -> ToolResult:
        budget = max(self.limits.max_output_chars - len(note) - 1, 0)
        shown, truncated = _clip(text, budget)
        if note:
            shown = f"{shown}{'' if not shown or shown.endswith(chr(10)) else chr(10)}{note}"
        elif not shown:
            shown = "(no output; print() what you want to see)"
        return ToolResult(ok=error is None, output=shown, error=error, truncated=truncated or force_truncated)


def _collect(proc: subprocess.Popen[bytes], backstop: float) -> tuple[bytes, bool]:
    """Reads the merged output until EOF (the supervisor has ended, and everything it stopped) or the
    backstop: (output, flooded). A flood asks the supervisor to stop the program (SIGTERM)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    output = bytearray()
    flooded = False
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = backstop - time.monotonic()
            if left <= 0:
                return bytes(output), flooded
            if selector.select(min(left, 0.5)):
                data = os.read(fd, 1 << 16)
                if not data:
                    return bytes(output), flooded
                if not flooded:
                    output += data
                    if len(output) > FLOOD_BYTES:
                        flooded = True
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(proc.pid, signal.SIGTERM)


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
