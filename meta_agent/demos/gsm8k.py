"""Demonstration scripts for GSM8K tasks, built from the worked solution's calculator annotations.

    script = gsm8k_actions(task)  # None when the solution cannot be scripted

Each `<<expr=result>>` annotation becomes a calculator call (checked with the real calculator); the
plan is the annotated lines with their calculations and computed numbers replaced by "?".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from meta_agent.demos.script import (
    GRAMMAR,
    DemoScript,
    Segment,
    answer_text,
    call_text,
    join_words,
    plan_text,
    reflection_text,
)
from meta_agent.episode.protocol import Limits
from meta_agent.tasks import Task
from roles import Grammar
from tools.calculator import evaluate
from tools.calculator_values import CalculatorError, format_value

# "48/2 = <<48/2=24>>24": an annotation with the "=" and "$" before it and the stated result after it.
_ANNOTATION = re.compile(r"\s*(?:=\s*)?\$?\s*<<([^<>]*)>>\s*\$?(?:-?\d+(?:,\d{3})*(?:\.\d+)?|-?\.\d+)?%?")
_NUMBER = re.compile(r"(?<![A-Za-z\d.])(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)(?!\d)")
_UNIT = re.compile(r"\s+[A-Za-z/]+(?![\w])")
_OPERATOR = re.compile(r"\*\*|//|[-+*/^%]")
_VERBS = {
    "+": "add",
    "-": "subtract",
    "*": "multiply",
    "/": "divide",
    "//": "divide",
    "%": "take the remainder",
    "^": "raise to a power",
    "**": "raise to a power",
}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_SLOT = "\x00"  # where a calculation was cut out of a plan step, until it becomes "?"
_CLAUSE_END = re.compile(r"[,.;:!?](?=\s)")
_CONNECTIVE = re.compile(
    r"^(?:so|thus|therefore|hence|then|this means that|that means)\b,?\s*", re.IGNORECASE
)
MAX_PLAN_STEPS = 4  # solution lines shown as plan steps; the answer step comes after them


@dataclass(frozen=True)
class _Annotation:
    match: re.Match[str]
    expression: str  # as the calculator reads it
    value: Fraction
    output: str  # the calculator's text for it


def gsm8k_actions(
    task: Task, max_calls: int = Limits().max_tool_calls, grammar: Grammar = GRAMMAR
) -> DemoScript | None:
    """The ideal turns for a GSM8K task, from its worked solution (meta["solution"]).

    Plan: each annotated line with its calculations and computed numbers replaced by "?", led by
    the operations in words. Executor: per annotation a calculator call (the line's sentence before
    the first one), then the answer. None when the row cannot be scripted: an annotation the real
    calculator does not evaluate to its stated result, one that computes nothing, more calls than
    `max_calls`, or a final answer no call computes.
    """
    if "solution" not in task.meta:
        raise ValueError(f"{task.id}: a GSM8K task needs meta['solution'] to build a demonstration")
    lines = _annotated_lines(task.meta["solution"])
    calls = [a for _, anns in lines or () for a in anns]
    if not calls or len(calls) > max_calls or calls[-1].value != _value(task.answer):
        return None
    given = _values(task.question)

    work, shown, done = [], set(given), 0
    for line, anns in lines:
        operands = {v for a in anns for v in _values(a.expression)}
        upcoming = {a.value for a in calls[done:]}
        # The line may state this line's results before they are computed: those become "?".
        sentence = _tidy(_mask(_work_sentence(line, anns), (upcoming - shown) - operands))
        for j, a in enumerate(anns):
            call = call_text(a.expression, grammar)
            work.append(Segment(f"{sentence}\n{call}" if j == 0 and sentence else call, a.output))
            shown.add(a.value)
        done += len(anns)
    work.append(Segment(answer_text(task.answer, grammar)))

    steps = [_plan_step(line, anns, {a.value for a in calls} - given) for line, anns in lines]
    if len(steps) > MAX_PLAN_STEPS:
        steps = [*steps[: MAX_PLAN_STEPS - 1], "Work out the remaining quantities the same way."]
    steps.append("Give the last result as the answer.")
    reflection = reflection_text(
        "The executor computed each step with the calculator, used the earlier results in the later "
        "calls, and its answer is the result of the last call, so the result is consistent.",
        "Turn each quantity the question asks for into one calculator call, use the earlier results in "
        "the later calls, and answer with the last result.",
        grammar,
    )
    last = calls[-1]
    check = (
        Segment(
            f"I repeat the last calculation to check it.\n{call_text(last.expression, grammar)}", last.output
        ),
        Segment(answer_text(task.answer, grammar)),
    )
    plan = plan_text(steps, task.answer, grammar)
    return DemoScript(task.id, "solution", plan, tuple(work), check, reflection, task.answer)


def _annotated_lines(solution: str) -> list[tuple[str, list[_Annotation]]] | None:
    """The solution's lines that carry annotations, each checked with the real calculator."""
    lines = []
    for line in solution.split("\n"):
        if line.lstrip().startswith("####"):
            continue
        anns = []
        for m in _ANNOTATION.finditer(line):
            expression, _, stated = m[1].rpartition("=")
            expression = expression.strip().replace("×", "*").replace("÷", "/")
            if not _OPERATOR.search(expression.lstrip("-")) or not re.match(r"[-\d(.]", expression):
                return None  # "<<55=55>>" computes nothing, "<<+30+46=76>>" continues a formula
            if line[m.end() : m.end() + 1].isalpha():
                return None  # "2 * 2S = <<2*2=4>>4S": algebra, not a calculation to call
            try:
                value, exact = evaluate(expression)
                stated_value, _ = evaluate(stated)
            except CalculatorError:
                return None
            if not exact or value != stated_value:
                return None
            anns.append(_Annotation(m, expression, value, format_value(value, exact=True)))
        if anns:
            lines.append((line, anns))
    return lines


def _plan_step(line: str, anns: list[_Annotation], computed: set[Fraction]) -> str:
    """ "Natalia sold 48/2 = <<48/2=24>>24 clips in May." -> "Divide: Natalia sold ? clips in May."

    Only the line's sentences that hold a calculation are kept, so a step stays one sentence or two.
    """
    text = line
    for a in reversed(anns):
        start = _expression_start(text, a.match.start(), a.expression)
        text = f"{text[:start]} {_SLOT} {text[a.match.end() :]}"
    text = " ".join(s for s in _SENTENCE_END.split(text) if _SLOT in s).replace(_SLOT, "?")
    text = _CONNECTIVE.sub("", _tidy(_mask(text, computed)))
    verbs = list(
        dict.fromkeys(_VERBS[op] for a in anns for op in _OPERATOR.findall(a.expression.lstrip("-+")))
    )
    return f"{join_words(verbs).capitalize()}: {text[:1].upper()}{text[1:]}"


def _work_sentence(line: str, anns: list[_Annotation]) -> str:
    """The line with its results cut: "Natalia sold 48/2 = <<48/2=24>>24 clips in May." -> "Natalia
    sold 48/2 clips in May."; a unit after the result goes too when the written calculation names
    it already ("10 objects + 3 objects = <<10+3=13>>13 objects" -> "10 objects + 3 objects")."""
    text = line
    for a in reversed(anns):
        end = a.match.end()
        start = _expression_start(text, a.match.start(), a.expression)
        unit = _UNIT.match(text, end)
        written = text[start : a.match.start()]
        if unit and any(part.rstrip("s") in written for part in unit[0].strip().split("/") if part):
            end = unit.end()
        text = text[: a.match.start()] + text[end:]
    return text


def _expression_start(text: str, end: int, expression: str) -> int:
    """Where the written calculation that ends at `end` starts: walking back over numbers that are
    operands of `expression`, in order ("for 20 weeks so 20/4 = " -> at the second "20"); `end` if
    the number before it is none of them."""
    clause = max((m.end() for m in _CLAUSE_END.finditer(text, 0, end)), default=0)
    remaining = [_value(n) for n in _NUMBER.findall(expression)]
    start = end
    for m in reversed(list(_NUMBER.finditer(text, clause, end))):
        value = _value(m[0])
        if value not in remaining:
            break
        remaining = remaining[: len(remaining) - 1 - remaining[::-1].index(value)]
        start = m.start()
        while start > clause and text[start - 1] in "$(":
            start -= 1
        if not remaining:
            break
    return start


def _value(number: str) -> Fraction | None:
    try:
        return Fraction(number.replace(",", "").strip())
    except ValueError:
        return None


def _values(text: str) -> set[Fraction]:
    return {_value(m) for m in _NUMBER.findall(text)}


def _mask(text: str, hidden: set[Fraction]) -> str:
    return _NUMBER.sub(lambda m: "?" if _value(m[0]) in hidden else m[0], text)


def _tidy(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"\s+([.,;:!])(?=\s|$)", r"\1", text)
    text = re.sub(r"\?\s*\?", "?", text)
    text = text.rstrip(",;:")
    if text and text[-1] not in ".!?":
        text += "."
    return text
