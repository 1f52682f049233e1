"""Every tool passes the shared conformance suite; and the suite catches a tool that breaks it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from memory.embedders import HashingEmbedder
from memory.store import FaissMemory
from tools import Calculator, MemorySearch, PythonSandbox, check_tool
from tools.types import ToolResult


def test_calculator_conforms() -> None:
    check_tool(Calculator(), {"expression": "1 + 1"})


def test_python_sandbox_conforms() -> None:
    check_tool(PythonSandbox(), {"code": "print(1)"})


def test_memory_search_conforms() -> None:
    memory = FaissMemory(None, HashingEmbedder(64))
    memory.add("a lesson about units")
    try:
        check_tool(MemorySearch(memory), {"query": "units"})
    finally:
        memory.close()


@dataclass(frozen=True)
class RaisesOnBadArguments:
    name: str = "fragile"
    description: str = '{"text": str}: echoes text'

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        return ToolResult(ok=True, output=arguments["text"])  # KeyError on {}


def test_suite_catches_a_tool_that_raises() -> None:
    with pytest.raises(AssertionError, match="no arguments raised KeyError"):
        check_tool(RaisesOnBadArguments(), {"text": "hi"})


def test_suite_catches_a_description_without_the_argument() -> None:
    with pytest.raises(AssertionError, match="does not name the argument 'query'"):
        check_tool(Calculator(), {"query": "1 + 1"})
