"""Checks a tool's arguments and turns every mistake into a BAD_CALL the model can act on.

All built-in tools take exactly one string argument; `string_argument` is that check.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tools.types import BAD_CALL, ToolResult


def bad_call(message: str) -> ToolResult:
    return ToolResult(ok=False, output=message, error=BAD_CALL)


def usage(tool: str, key: str) -> str:
    """How a correct call looks, e.g. `{"name": "python", "arguments": {"code": "..."}}`."""
    return json.dumps({"name": tool, "arguments": {key: "..."}})


def string_argument(arguments: Any, key: str, *, tool: str, max_chars: int) -> str | ToolResult:
    """`arguments[key]` when `arguments` is exactly {key: non-empty string}, else a BAD_CALL result."""
    expected = f"expected {usage(tool, key)}"
    if not isinstance(arguments, Mapping):
        return bad_call(
            f"{tool}: arguments must be a JSON object, got {type(arguments).__name__}; {expected}"
        )
    unexpected = sorted(str(name) for name in arguments if name != key)
    if unexpected:
        names = ", ".join(repr(name) for name in unexpected)
        return bad_call(f"{tool}: unexpected argument(s) {names}; {expected}")
    if key not in arguments:
        return bad_call(f"{tool}: missing argument {key!r}; {expected}")
    value = arguments[key]
    if not isinstance(value, str):
        return bad_call(f"{tool}: argument {key!r} must be a string, got {type(value).__name__}; {expected}")
    if not value.strip():
        return bad_call(f"{tool}: argument {key!r} is empty; {expected}")
    if len(value) > max_chars:
        return bad_call(f"{tool}: argument {key!r} has {len(value)} characters, the limit is {max_chars}")
    return value
