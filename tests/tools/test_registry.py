"""Registry and call parsing: every mistake the model can make comes back as a readable result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from tools import (
    Calculator,
    SandboxLimits,
    ToolRegistry,
    ToolSettings,
    build_registry,
    default_registry,
    parse_tool_call,
)
from tools.types import BAD_CALL, FAILED, ToolResult


@dataclass(frozen=True)
class Crashing:
    name: str = "crashing"
    description: str = '{"x": str}: always raises'

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        raise RuntimeError("boom")


@dataclass(frozen=True)
class WrongReturn:
    name: str = "wrong_return"
    description: str = '{"x": str}: returns a string instead of a ToolResult'

    def __call__(self, arguments: Mapping[str, Any]) -> Any:
        return "not a result"


def test_parse_a_good_call_ignoring_surrounding_whitespace() -> None:
    text = '\n  {"name": "calculator", "arguments": {"expression": "2+2"}}  \n'
    assert parse_tool_call(text) == ("calculator", {"expression": "2+2"})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty tool call"),
        ("   ", "empty tool call"),
        ('{"name": "calculator", "arguments": {"expression": "2+2"}', "not valid JSON"),
        ("calculator(2+2)", "not valid JSON"),
        ('["calculator", {}]', "must be a JSON object, got an array"),
        ('{"arguments": {}}', 'needs a "name" string'),
        ('{"name": 3, "arguments": {}}', 'needs a "name" string'),
        ('{"name": "calculator"}', 'needs "arguments"'),
        ('{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}', "not a string holding JSON"),
        ('{"name": "calculator", "arguments": [1]}', "got an array"),
        ('{"name": "calculator", "arguments": {}, "id": 1}', "unexpected key(s) 'id'"),
    ],
)
def test_malformed_calls_are_bad_calls_that_show_the_shape(text: str, fragment: str) -> None:
    result = parse_tool_call(text)
    assert isinstance(result, ToolResult)
    assert (result.ok, result.error) == (False, BAD_CALL)
    assert fragment in result.output
    assert '{"name": "<tool>", "arguments": {...}}' in result.output


def test_call_runs_the_tool() -> None:
    registry = ToolRegistry([Calculator()])
    assert registry.call("calculator", {"expression": "6*7"}) == ToolResult(ok=True, output="42")
    assert (
        registry.call_text('{"name": "calculator", "arguments": {"expression": "1/2"}}').output == "1/2 = 0.5"
    )


def test_unknown_tool_and_bad_arguments_are_bad_calls() -> None:
    registry = ToolRegistry([Calculator()])
    unknown = registry.call("web_search", {"query": "x"})
    assert unknown.error == BAD_CALL
    assert "unknown tool 'web_search'; available tools: calculator" in unknown.output
    for arguments in (None, [], "2+2", 7):
        result = registry.call("calculator", arguments)
        assert result.error == BAD_CALL
        assert "must be a JSON object" in result.output
    assert registry.call(None, {}).error == BAD_CALL  # type: ignore[arg-type]


def test_exceptions_and_wrong_returns_become_failures() -> None:
    registry = ToolRegistry([Crashing(), WrongReturn()])
    crashed = registry.call("crashing", {"x": "1"})
    assert (crashed.ok, crashed.error) == (False, FAILED)
    assert crashed.output == "crashing failed: RuntimeError: boom"
    wrong = registry.call("wrong_return", {"x": "1"})
    assert (wrong.ok, wrong.error) == (False, FAILED)
    assert "returned str" in wrong.output


def test_register_get_names_and_describe() -> None:
    registry = ToolRegistry()
    registry.register(Calculator())
    registry.register(Crashing())
    assert registry.names() == ["calculator", "crashing"]
    assert len(registry) == 2 and "calculator" in registry
    assert isinstance(registry.get("calculator"), Calculator)
    with pytest.raises(KeyError, match="registered: calculator, crashing"):
        registry.get("python")
    assert registry.describe() == (
        f"- calculator: {Calculator().description}\n- crashing: {Crashing().description}"
    )


def test_register_rejects_duplicates_and_non_tools() -> None:
    registry = ToolRegistry([Calculator()])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Calculator())
    with pytest.raises(ValueError, match="not a Tool"):
        registry.register(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be an identifier"):
        registry.register(Crashing(name="two words"))


def test_build_registry_from_names() -> None:
    registry = build_registry(["python", "calculator"], settings=ToolSettings(SandboxLimits(timeout_s=2.0)))
    assert registry.names() == ["python", "calculator"]
    assert registry.get("python").limits.timeout_s == 2.0  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown tool 'search'"):
        build_registry(["search"])
    with pytest.raises(ValueError, match="needs a memory"):
        build_registry(["memory_search"])
    assert default_registry().names() == ["calculator", "python"]
