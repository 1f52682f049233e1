"""The tool protocol. Every Tool passes tests/tools/test_conformance.py.

A tool never raises for anything the model did: bad arguments, a failing program or a timeout come
back as a ToolResult with ok=False and an `error` kind that TensorBoard counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

# Error kinds, counted per kind in TensorBoard (rollout/tool_errors/<kind>).
BAD_CALL = "bad_call"  # unparseable call, unknown tool, wrong or missing arguments
FAILED = "failed"  # the tool ran and failed (division by zero, python exception, non-zero exit)
TIMEOUT = "timeout"
MEMORY_EXCEEDED = "memory_exceeded"


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    output: str  # what the agent sees inside <tool_result>...</tool_result>
    error: str | None = None  # one of the kinds above when ok is False
    truncated: bool = False


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str  # one line shown to the agent in its system prompt, with the argument names

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult: ...
