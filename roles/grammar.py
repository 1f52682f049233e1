"""The output grammar of each role and its parser.

Parsers are lenient on purpose: a small model writes half-formed output, and every shape of it must
turn into a value the episode can act on (a tool call, an answer, a plan) plus a flag that says
whether the format was kept, which the reward functions penalise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACCEPT, REVISE = "accept", "revise"  # a reflection's verdicts


@dataclass(frozen=True)
class Grammar:
    tool_call: tuple[str, str] = ("<tool_call>", "</tool_call>")
    tool_result: tuple[str, str] = ("<tool_result>", "</tool_result>")
    answer: tuple[str, str] = ("<answer>", "</answer>")
    plan: tuple[str, str] = ("<plan>", "</plan>")
    reflection: tuple[str, str] = ("<reflection>", "</reflection>")
    lesson: tuple[str, str] = ("<lesson>", "</lesson>")
    verdict: tuple[str, str] = ("<verdict>", "</verdict>")
    # A revision of one step of the plan: <fix step="2">Subtract 1,660.</fix> (apply_fix)
    fix: tuple[str, str] = ("<fix", "</fix>")
    # memory.internal=summary: the running state a reflection rewrites for the next (meta_agent.episode.internal_memory)
    notes: tuple[str, str] = ("<notes>", "</notes>")

    def executor_stops(self) -> tuple[str, ...]:
        """Generation pauses after a tool call (the env runs it) and ends after an answer."""
        return (self.tool_call[1], self.answer[1])

    def plan_stops(self) -> tuple[str, ...]:
        return (self.plan[1],)

    def reflect_stops(self) -> tuple[str, ...]:
        # A reflection ends with a verdict, a revised plan or a fixed step.
        return (self.verdict[1], self.plan[1], self.fix[1])

    def wrap_tool_result(self, output: str) -> str:
        return f"\n{self.tool_result[0]}\n{output}\n{self.tool_result[1]}\n"


@dataclass(frozen=True)
class ExecutorStep:
    """What one executor generation segment asks for."""

    tool_call: str | None  # body between the tool-call tags, when the segment ends with a call
    answer: str | None  # the final answer, tagged or recovered from the text
    answer_tagged: bool  # True when the answer came inside the answer tags (format kept)


@dataclass(frozen=True)
class MetaOutput:
    plan: str | None
    reflection: str | None
    lesson: str | None
    verdict: str  # "accept" or "revise"
    fix: tuple[int, str] | None = None  # (step number, its new text): a revision of one step of the plan


_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_FIX_HEAD = re.compile(r"\s+step\s*=\s*[\"']?\s*(\d+)\s*[\"']?\s*>")  # after "<fix": ' step="2">'
# A plan step's number or bullet ("2. ", "2) ", "- ", "* ", "• ") and its space, at a line's start
_STEP_MARK = re.compile(r"\s*(?:\d+[.)]|[-*•])\s+")


def _between(text: str, tags: tuple[str, str], *, last: bool = True) -> str | None:
    open_tag, close_tag = tags
    start = text.rfind(open_tag) if last else text.find(open_tag)
    if start < 0:
        return None
    start += len(open_tag)
    end = text.find(close_tag, start)
    body = text[start:] if end < 0 else text[start:end]
    return body.strip()


def recover_answer(text: str) -> str | None:
    """An untagged answer: the last \\boxed{...}, else the last number in the text."""
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1].rstrip(".,") if numbers else None


def parse_executor(segment: str, grammar: Grammar, *, final: bool) -> ExecutorStep:
    """Parse one generated executor segment.

    `segment` is the text generated since the last tool result. A segment that ends with the close
    of a tool call is a call. `final` says the episode can give the executor no more turns (budget
    spent, or EOS): then an untagged answer is recovered from the text.
    """
    stripped = segment.rstrip()
    open_tag, close_tag = grammar.tool_call
    if stripped.endswith(close_tag):
        # Without an opening tag the whole segment is the call body: it fails to parse and the
        # agent is told why, which teaches more than silently ending its turn.
        body = _between(stripped, grammar.tool_call) if open_tag in stripped else stripped[: -len(close_tag)]
        return ExecutorStep(body or "", None, answer_tagged=False)
    answer = _between(stripped, grammar.answer)
    if answer is not None and (grammar.answer[1] in stripped or final):
        return ExecutorStep(None, answer, answer_tagged=grammar.answer[1] in stripped)
    if final:
        return ExecutorStep(None, recover_answer(stripped), answer_tagged=False)
    return ExecutorStep(None, None, answer_tagged=False)


def parse_plan(text: str, grammar: Grammar) -> tuple[str | None, bool]:
    """The plan of a meta-thinker's first turn and whether it kept its tags.

    An untagged or unclosed plan (one that ran out of tokens) is still passed on to the executor,
    and penalised as broken format.
    """
    plan = _between(text, grammar.plan, last=False)
    if plan is not None:
        return plan or None, grammar.plan[1] in text
    return text.strip() or None, False


def parse_reflection(text: str, grammar: Grammar) -> MetaOutput:
    """Parse a reflection turn: reflection, lesson, and a verdict.

    A reflection that carries a new plan, or a closed fix of one step, is a revision whatever its verdict
    says (a whole plan wins over a fix); with neither a verdict nor a plan nor a fix it accepts, so a
    rambling reflection cannot loop the episode. An unclosed lesson is dropped.
    """
    plan = _between(text, grammar.plan)
    fix = None if plan else parse_fix(text, grammar)
    reflection = _between(text, grammar.reflection, last=False)
    if reflection is None:
        reflection = text.split(grammar.lesson[0])[0].strip() or None
    # A lesson cut off mid-sentence (out of tokens) is not stored: memory keeps only finished ones.
    lesson = _between(text, grammar.lesson) if grammar.lesson[1] in text else None
    verdict_text = (_between(text, grammar.verdict) or "").lower()
    verdict = REVISE if plan or fix or REVISE in verdict_text else ACCEPT
    return MetaOutput(
        plan=plan or None, reflection=reflection, lesson=lesson or None, verdict=verdict, fix=fix
    )


def parse_notes(text: str, grammar: Grammar) -> str | None:
    """The last closed notes block of a reflection, stripped; None without one, or when it is empty or cut
    off (a reflection that ran out of tokens mid-note carries nothing forward)."""
    open_tag, close_tag = grammar.notes
    end = text.rfind(close_tag)
    start = text.rfind(open_tag, 0, end) if end >= 0 else -1
    if start < 0:
        return None
    return text[start + len(open_tag) : end].strip() or None


def parse_fix(text: str, grammar: Grammar) -> tuple[int, str] | None:
    """The last closed `<fix step="N">text</fix>` of a reflection as (N, text); None without one, or
    when it is cut off, names no step or leaves the step empty."""
    open_tag, close_tag = grammar.fix
    start = text.rfind(open_tag)
    end = text.find(close_tag, start) if start >= 0 else -1
    if end < 0:
        return None
    found = _FIX_HEAD.match(text, start + len(open_tag), end)
    if found is None:
        return None
    body = text[found.end() : end].strip()
    mark = _STEP_MARK.match(body)  # the step's own number, when the fix repeats it
    body = body[mark.end() :].strip() if mark else body
    return (int(found[1]), body) if body else None


def plan_steps(plan: str | None) -> int:
    """How many numbered or bulleted steps a plan (its text inside the tags) has: a fix of the next step
    adds one (apply_fix). A plan with none counts 0, and apply_fix takes it whole as step 1."""
    return len(_step_lines((plan or "").split("\n")))


def step_texts(plan: str | None) -> list[str]:
    """The text of each numbered or bulleted step of a plan, its number or bullet left out."""
    lines = (plan or "").split("\n")
    return [lines[i][_STEP_MARK.match(lines[i]).end() :] for i in _step_lines(lines)]


def _step_lines(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if _STEP_MARK.match(line)]


def apply_fix(plan: str | None, step: int, text: str) -> str | None:
    """`plan` with step `step` rewritten as `text`, or with `text` added as its next step (step = the
    plan's steps + 1), numbered or bulleted as its steps are; None when the plan has no such step.

    A plan's steps are its lines that start with a number ("2. ", "2) ") or a bullet ("- ", "* ", "• "); a
    plan with none of them is one step, which a fix of step 1 replaces.
    """
    lines = (plan or "").split("\n")
    steps = _step_lines(lines)
    if not steps:
        return text if step == 1 else None
    if 1 <= step <= len(steps):
        line = lines[steps[step - 1]]
        lines[steps[step - 1]] = line[: _STEP_MARK.match(line).end()] + text
        return "\n".join(lines)
    if step == len(steps) + 1:
        last = _STEP_MARK.match(lines[steps[-1]])
        number = re.match(r"\s*(\d+)", last[0])
        mark = f"{int(number[1]) + 1}. " if number else last[0]
        return "\n".join([*lines, f"{mark}{text}"])
    return None


def states_answer(text: str, answer: str | None, grammar: Grammar, question: str = "") -> bool:
    """Whether a meta-thinker's text gives the answer away (answer tags, or the answer itself).

    Step numbers ("1. ...") and numbers the question already states are not leaks: a plan may
    repeat the question's numbers, and a small answer may coincide with a step number.
    """
    if grammar.answer[0] in text or "\\boxed" in text:
        return True
    if not answer:
        return False
    norm = answer.replace(",", "").strip()
    if not norm:
        return False
    if _NUMBER.fullmatch(norm):
        if norm in _numbers(question):
            return False
        return norm in _numbers(without_step_numbers(text))
    return len(norm) >= 3 and norm in text and norm not in question


_STEP_NUMBER = re.compile(r"(?m)^\s*\d+[.)]\s")


def without_step_numbers(text: str) -> str:
    """`text` with the number of each numbered step ("2. ", "2) " at a line's start) taken out, so that
    what is left holds only the numbers the steps use."""
    return _STEP_NUMBER.sub("", text)


def _numbers(text: str) -> set[str]:
    return {n.replace(",", "").rstrip(".") for n in _NUMBER.findall(text)}
