"""Tool registry: the tools one role may call, and the path from a model's call text to a result.

    registry = ToolRegistry([Calculator(), PythonSandbox()])
    system_prompt += registry.describe()
    call = parse_tool_call('{"name": "calculator", "arguments": {"expression": "2+2"}}')
    result = registry.call(*call) if not isinstance(call, ToolResult) else call

Nothing here raises for what the model wrote: an unparseable call, an unknown tool, arguments that
are not an object, or an exception escaping a tool all come back as ToolResult(ok=False).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tools.arguments import bad_call
from tools.types import FAILED, Tool, ToolResult

CALL_SHAPE = '{"name": "<tool>", "arguments": {...}}'


class ToolRegistry:
    """Tools by name, in the order they were registered."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        """Adds a tool; a second tool with the same name, or a non-tool, is a ValueError."""
        if not isinstance(tool, Tool):
            raise ValueError(f"{tool!r} is not a Tool: it needs `name`, `description` and __call__")
        if not isinstance(tool.name, str) or not tool.name.isidentifier():
            raise ValueError(f"tool name {tool.name!r} must be an identifier such as 'calculator'")
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool:
        """The tool called `name`; KeyError naming the registered tools otherwise."""
        if name not in self._tools:
            raise KeyError(f"no tool named {name!r}; registered: {', '.join(self._tools) or 'none'}")
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def describe(self, names: Sequence[str] | None = None) -> str:
        """One line per tool for the system prompt: `- name: description` (all tools, or `names`)."""
        chosen = self._tools if names is None else [n for n in names if n in self._tools]
        return "\n".join(f"- {name}: {self._tools[name].description}" for name in chosen)

    def call(self, name: str, arguments: Any) -> ToolResult:
        """Runs a tool; every mistake or crash becomes a ToolResult the model can read."""
        if not isinstance(name, str) or name not in self._tools:
            available = ", ".join(self._tools) or "none"
            return bad_call(f"unknown tool {name!r}; available tools: {available}")
        if not isinstance(arguments, Mapping):
            kind = type(arguments).__name__
            return bad_call(f"{name}: arguments must be a JSON object, got {kind}; call as {CALL_SHAPE}")
        try:
            result = self._tools[name](arguments)
        except Exception as e:  # a tool's bug must not end the episode: the agent sees it as data
            return ToolResult(ok=False, output=f"{name} failed: {type(e).__name__}: {e}", error=FAILED)
        if not isinstance(result, ToolResult):
            return ToolResult(
                ok=False, output=f"{name} failed: it returned {type(result).__name__}", error=FAILED
            )
        return result

    def call_text(self, text: str) -> ToolResult:
        """parse_tool_call, then call: the body of one <tool_call> straight to its result."""
        parsed = parse_tool_call(text)
        if isinstance(parsed, ToolResult):
            return parsed
        return self.call(*parsed)


def parse_tool_call(text: str) -> tuple[str, dict[str, Any]] | ToolResult:
    """(name, arguments) from a call body such as {"name": "python", "arguments": {"code": "..."}}.

    The grammar's tags are already stripped; surrounding whitespace is ignored. Anything else that
    is wrong returns a BAD_CALL result saying what and how a call should look.
    """
    if not isinstance(text, str) or not text.strip():
        return bad_call(f"empty tool call; write {CALL_SHAPE}")
    try:
        call = json.loads(text.strip())
    except json.JSONDecodeError as e:
        return bad_call(
            f"tool call is not valid JSON ({e.msg}, line {e.lineno} column {e.colno}); write {CALL_SHAPE}"
        )
    if not isinstance(call, dict):
        return bad_call(f"tool call must be a JSON object, got {_json_kind(call)}; write {CALL_SHAPE}")
    unexpected = sorted(set(call) - {"name", "arguments"})
    if unexpected:
        names = ", ".join(repr(key) for key in unexpected)
        return bad_call(f"unexpected key(s) {names} in the tool call; write {CALL_SHAPE}")
    name = call.get("name")
    if not isinstance(name, str) or not name.strip():
        return bad_call(f'tool call needs a "name" string; write {CALL_SHAPE}')
    if "arguments" not in call:
        return bad_call(f'tool call needs "arguments" (a JSON object); write {CALL_SHAPE}')
    arguments = call["arguments"]
    if not isinstance(arguments, dict):
        hint = " (an object, not a string holding JSON)" if isinstance(arguments, str) else ""
        got = _json_kind(arguments)
        return bad_call(f'"arguments" must be a JSON object{hint}, got {got}; write {CALL_SHAPE}')
    return name.strip(), arguments


def _json_kind(value: object) -> str:
    """JSON's name for a decoded value's type, as the model wrote it."""
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")
