"""Plan adherence: the share of a plan's steps the executors carried out with their tools.

    episode_adherence(episode)   # None where the task defines no adherence, or the plan has no step to check

A task family defines how its plans are checked (`ADHERENCE`, keyed by `Task.source`). For the arithmetic
families (the generated `arith` task and GSM8K) a step is the plan's numbered or bulleted line; it names
numbers and operations ("2. Add 575,028 times 12.", "Divide: 48/2 = ? clips"). It counts as carried out
when each of its numbers appears in some tool call of the round, and each of its operations appears in a
tool call that holds one of its numbers. A step without a number cannot be checked and is left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from meta_agent.episode.protocol import Episode
from meta_agent.episode.records import EXECUTE
from roles import step_texts

_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
_OPERATOR = re.compile(r"(?<=[\d\s)])([+\-*/])(?=[\s\d(])")
# The words of the plans the arithmetic demonstrations teach, and their common synonyms.
_WORDS = {
    "+": ("add", "plus", "sum", "total", "increase"),
    "-": ("subtract", "minus", "take away", "remove", "decrease", "difference"),
    "*": ("multiply", "times", "product"),
    "/": ("divide", "split", "quotient", "share"),
}


@dataclass(frozen=True)
class Step:
    numbers: frozenset[str]  # canonical decimal strings: "575028", "2.5"
    operations: frozenset[str]  # "+", "-", "*", "/"


def canonical(number: str) -> str | None:
    """A number as written ("575,028", "2.50") in one canonical form ("575028", "2.5")."""
    try:
        value = Decimal(number.replace(",", "").rstrip("."))
    except InvalidOperation:
        return None
    text = format(value.normalize(), "f")
    return text


def numbers_in(text: str) -> set[str]:
    return {c for c in (canonical(m) for m in _NUMBER.findall(text)) if c is not None}


def plan_steps(plan: str) -> list[Step]:
    """The checkable steps of a plan: its numbered or bulleted lines (or the whole plan if it has none),
    each with its numbers and operations; steps without a number are left out."""
    marked = step_texts(plan)
    steps = []
    for body in marked or [plan]:
        lower = body.lower()
        ops = {op for op, words in _WORDS.items() if any(re.search(rf"\b{w}", lower) for w in words)}
        ops |= set(_OPERATOR.findall(body))
        numbers = numbers_in(body)
        if numbers:
            steps.append(Step(frozenset(numbers), frozenset(ops)))
    return steps


def call_texts(bodies: Sequence[str]) -> list[str]:
    """What each tool call computes: the string arguments of its JSON body (the calculator's expression,
    the python code), or the raw body when it is not JSON."""
    texts = []
    for body in bodies:
        try:
            call = json.loads(body)
            arguments = call.get("arguments", {}) if isinstance(call, dict) else {}
            values = (
                [v for v in arguments.values() if isinstance(v, str)] if isinstance(arguments, dict) else []
            )
            texts.append(" ".join(values) or body)
        except (json.JSONDecodeError, TypeError):
            texts.append(body)
    return texts


def step_done(step: Step, calls: Sequence[str]) -> bool:
    found = [numbers_in(text) for text in calls]
    if not all(any(n in nums for nums in found) for n in step.numbers):
        return False
    holding = [text for text, nums in zip(calls, found, strict=True) if nums & step.numbers]
    return all(any(op in text for text in holding) for op in step.operations)


def arithmetic_adherence(plan: str, calls: Sequence[str]) -> float | None:
    """The share of the plan's checkable steps carried out by `calls` (what the tool calls computed)."""
    steps = plan_steps(plan)
    if not steps:
        return None
    return sum(step_done(s, calls) for s in steps) / len(steps)


# Task family -> how its plans are checked against the round's tool calls.
ADHERENCE: dict[str, Callable[[str, Sequence[str]], float | None]] = {
    "arith": arithmetic_adherence,
    "arith_distract": arithmetic_adherence,
    "gsm8k": arithmetic_adherence,
}


def episode_adherence(episode: Episode) -> float | None:
    """The mean adherence over the rounds whose executors were shown a plan, or None when the task
    defines none or no round has a checkable plan."""
    check = ADHERENCE.get(episode.task.source)
    if check is None:
        return None
    values = []
    for r in episode.rounds:
        if not r.plan:
            continue
        bodies = [
            c.arguments
            for t in episode.turns
            if t.kind == EXECUTE and t.round == r.index
            for c in t.tool_calls
        ]
        value = check(r.plan, call_texts(bodies))
        if value is not None:
            values.append(value)
    return sum(values) / len(values) if values else None
