"""The scripted text of a demonstration: the `DemoScript` record and the tagged text of its turns.

    plan = plan_text(["Multiply the crates by the bolts.", "Add the bolts that come in."], "42")
    work = (Segment(call_text("12 * 3", GRAMMAR), "36"), Segment(answer_text("36", GRAMMAR)))

Shared by the arith (demos.arith) and GSM8K (demos.gsm8k) script builders; meta_agent.demos.build plays them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from roles import Grammar, states_answer
from tools.calculator import evaluate
from tools.calculator_values import CalculatorError, format_value

MAX_PLAN_CHARS = 560  # about 135 tokens: a longer plan would not fit the meta-thinker's 160-token turn
GRAMMAR = Grammar()  # the default output grammar, as every configs/role uses


@dataclass(frozen=True)
class Segment:
    """One executor generation: text ending with a tool call (then `result` is the calculator output
    the call must get back) or with the answer (`result` None, the turn ends)."""

    text: str
    result: str | None = None


@dataclass(frozen=True)
class Revision:
    """A first round gone wrong as a small hierarchy's often goes, and the reflection that catches it.

    `work` is that round's first executor turn: played, so the reflection reads it, but never learned
    (its loss mask is 0: SFT must not teach the mistake). `plan`, when the mistake is the plan's, is
    that round's plan, played and never learned the same way (None: the script's plan). `reflection`
    names the mistake and fixes the one step of the plan that caused it (a step the executor must not
    skip, or the step as it should be), which starts the second round."""

    work: tuple[Segment, ...]
    reflection: str  # reflection, lesson and a fix of one plan step (tags included): a revise verdict
    plan: str | None = None  # a wrong first plan (tags included), or None: the mistake is the executor's


@dataclass(frozen=True)
class DemoScript:
    """The ideal text of every role turn of one task."""

    task_id: str
    style: str  # one_call | steps (arith) | solution (gsm8k)
    plan: str  # the meta-thinker's plan turn, tags included
    work: tuple[Segment, ...]  # the first executor (solver): tool calls, then the answer
    check: tuple[Segment, ...]  # any later executor (checker): one check call, then the answer
    reflection: str  # reflection, lesson and an accepting verdict
    answer: str
    # A first round that goes wrong and is revised; then `work` and `reflection` are the second round's.
    revision: Revision | None = None


GENERIC_PLAN = (
    "- Work out each quantity the question asks for, one calculator call per step.\n"
    "- Use the earlier results in the later calculations.\n"
    "- Give the last result as the answer."
)


def plan_text(steps: Sequence[str], answer: str, grammar: Grammar = GRAMMAR) -> str:
    """A tagged plan: numbered steps; bullets when a step number would equal the answer
    (states_answer reads "2." as the number 2); GENERIC_PLAN when a step itself gives the answer
    away or the plan would be longer than MAX_PLAN_CHARS."""
    bodies = [
        "\n".join(f"{i}. {s}" for i, s in enumerate(steps, start=1)),
        "\n".join(f"- {s}" for s in steps),
    ]
    for body in [*bodies, GENERIC_PLAN]:
        text = f"{grammar.plan[0]}{body}{grammar.plan[1]}"
        if body and len(text) <= MAX_PLAN_CHARS and not states_answer(text, answer, grammar):
            return text
    raise ValueError(f"even the generic plan states the answer {answer!r}")


def calculate(expression: str) -> str:
    """The calculator's output for an expression; ValueError when it fails."""
    try:
        value, exact = evaluate(expression)
    except CalculatorError as e:
        raise ValueError(f"the calculator cannot evaluate {expression!r}: {e.message}") from e
    return format_value(value, exact=exact)


def call_text(expression: str, grammar: Grammar) -> str:
    """A tagged calculator tool call for `expression`."""
    body = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"{grammar.tool_call[0]}{body}{grammar.tool_call[1]}"


def reflection_text(reflection: str, lesson: str, grammar: Grammar) -> str:
    """A tagged reflection and lesson, then the verdict "accept"."""
    (r_open, r_close), (l_open, l_close), (v_open, v_close) = (
        grammar.reflection,
        grammar.lesson,
        grammar.verdict,
    )
    return f"{r_open}{reflection}{r_close}{l_open}{lesson}{l_close}{v_open}accept{v_close}"


def fix_text(reflection: str, lesson: str, step: int, text: str, grammar: Grammar) -> str:
    """A tagged reflection and lesson, then a fix of one plan step (roles.apply_fix): the verdict
    "revise". `step` one past the plan's last adds `text` as a new step."""
    (r_open, r_close), (l_open, l_close), (f_open, f_close) = grammar.reflection, grammar.lesson, grammar.fix
    return f'{r_open}{reflection}{r_close}{l_open}{lesson}{l_close}{f_open} step="{step}">{text}{f_close}'


def answer_text(value: str, grammar: Grammar) -> str:
    """A tagged final answer."""
    return f"{grammar.answer[0]}{value}{grammar.answer[1]}"


def join_words(words: Sequence[str]) -> str:
    """["a", "b", "c"] -> "a, b and c"."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
