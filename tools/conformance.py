"""The conformance suite every Tool passes (tests/tools/test_conformance.py runs it on each one).

    check_tool(Calculator(), {"expression": "1 + 1"})

Checks the protocol and the promise that model mistakes are data: a good call returns ok=True, and
bad arguments (missing, unknown, wrong type, not an object at all) return ok=False with error
BAD_CALL instead of raising. Raises AssertionError naming the first broken promise.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tools.types import BAD_CALL, FAILED, MEMORY_EXCEEDED, TIMEOUT, Tool, ToolResult

ERROR_KINDS = (BAD_CALL, FAILED, TIMEOUT, MEMORY_EXCEEDED)
NOT_OBJECTS: tuple[Any, ...] = (None, [], "text", 42, ["a", "b"])
WRONG_VALUES: tuple[Any, ...] = (None, 12345, ["list"], {"nested": "object"})


def check_tool(tool: Tool, good_arguments: Mapping[str, Any]) -> None:
    """Runs every check on `tool`; `good_arguments` is one call that must succeed."""
    _expect(isinstance(tool, Tool), f"{tool!r} does not satisfy the Tool protocol")
    _expect(
        isinstance(tool.name, str) and tool.name.isidentifier(), f"name {tool.name!r} is not an identifier"
    )
    description = tool.description
    _expect(isinstance(description, str) and description.strip() != "", f"{tool.name}: empty description")
    _expect("\n" not in description, f"{tool.name}: description must be one line")
    for key in good_arguments:
        _expect(key in description, f"{tool.name}: description does not name the argument {key!r}")

    good = _call(tool, dict(good_arguments), "good arguments")
    _expect(good.ok, f"{tool.name}: good arguments {dict(good_arguments)} failed: {good.output!r}")
    read_only = _call(tool, MappingProxyType(dict(good_arguments)), "a read-only mapping")
    _expect(read_only.ok, f"{tool.name}: a Mapping that is not a dict failed: {read_only.output!r}")

    bad_calls: list[tuple[str, Any]] = [("no arguments", {}), ("an unknown argument", {"x": 1})]
    bad_calls += [(f"arguments {value!r}", value) for value in NOT_OBJECTS]
    bad_calls.append(("an extra argument", {**good_arguments, "unexpected_extra": 1}))
    for key in good_arguments:
        bad_calls += [(f"{key}={value!r}", {**good_arguments, key: value}) for value in WRONG_VALUES]
    for what, arguments in bad_calls:
        result = _call(tool, arguments, what)
        _expect(
            not result.ok and result.error == BAD_CALL, f"{tool.name}: {what} gave {result}, not BAD_CALL"
        )
        _expect(result.output.strip() != "", f"{tool.name}: {what} gave BAD_CALL without a message")


def _call(tool: Tool, arguments: Any, what: str) -> ToolResult:
    """Calls the tool, checking that it neither raises nor returns a malformed result."""
    try:
        result = tool(arguments)
    except Exception as e:
        raise AssertionError(f"{tool.name}: {what} raised {type(e).__name__}: {e}") from e
    _expect(isinstance(result, ToolResult), f"{tool.name}: {what} returned {type(result).__name__}")
    _expect(isinstance(result.output, str), f"{tool.name}: {what} gave non-str output")
    _expect(isinstance(result.truncated, bool), f"{tool.name}: {what} gave non-bool truncated")
    _expect(
        result.ok == (result.error is None), f"{tool.name}: {what} gave ok={result.ok}, error={result.error}"
    )
    _expect(
        result.error is None or result.error in ERROR_KINDS, f"{tool.name}: unknown error {result.error!r}"
    )
    return result


def _expect(condition: bool, message: str) -> None:
    # Not `assert`: the suite must still check under `python -O`.
    if not condition:
        raise AssertionError(message)
