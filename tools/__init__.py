"""Tools the agents call: protocol, registry, calculator, python sandbox, memory search."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from memory.types import Memory
from tools.calculator import Calculator
from tools.conformance import check_tool
from tools.memory_search import MEMORY_SEARCH_K, MemorySearch
from tools.registry import ToolRegistry, parse_tool_call
from tools.sandbox import PythonSandbox, SandboxLimits, SandboxUnavailable
from tools.types import BAD_CALL, FAILED, MEMORY_EXCEEDED, TIMEOUT, Tool, ToolResult

TOOL_NAMES = ("calculator", "python", "memory_search")


@dataclass
class ToolSettings:
    """The `tools:` settings."""

    sandbox: SandboxLimits = field(default_factory=SandboxLimits)  # the python tool's limits
    memory_search_k: int = MEMORY_SEARCH_K  # hits returned by the memory_search tool


def build_registry(
    names: Sequence[str], *, memory: Memory | None = None, settings: ToolSettings | None = None
) -> ToolRegistry:
    """A registry with the named tools, in that order (e.g. a role's `tools:` list from config).

    An unknown name, or memory_search without a memory, is a ValueError naming the problem.
    """
    settings = settings or ToolSettings()
    registry = ToolRegistry()
    for name in names:
        if name == "calculator":
            registry.register(Calculator())
        elif name == "python":
            registry.register(PythonSandbox(settings.sandbox))
        elif name == "memory_search":
            if memory is None:
                raise ValueError("tool 'memory_search' needs a memory: pass memory=... to build_registry")
            registry.register(MemorySearch(memory, k=settings.memory_search_k))
        else:
            raise ValueError(f"unknown tool {name!r} in the tool list; known tools: {', '.join(TOOL_NAMES)}")
    return registry


def default_registry(memory: Memory | None = None, settings: ToolSettings | None = None) -> ToolRegistry:
    """Calculator, python sandbox, and memory search when a memory is given."""
    names = [name for name in TOOL_NAMES if name != "memory_search" or memory is not None]
    return build_registry(names, memory=memory, settings=settings)


__all__ = [
    "BAD_CALL",
    "FAILED",
    "MEMORY_EXCEEDED",
    "TIMEOUT",
    "TOOL_NAMES",
    "Calculator",
    "MemorySearch",
    "PythonSandbox",
    "SandboxLimits",
    "SandboxUnavailable",
    "Tool",
    "ToolRegistry",
    "ToolResult",
    "ToolSettings",
    "build_registry",
    "check_tool",
    "default_registry",
    "parse_tool_call",
]
