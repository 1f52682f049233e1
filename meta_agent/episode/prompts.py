"""The text blocks a turn's prompt is built from: lessons, the work so far, a previous attempt.

Pure functions of what the episode recorded (meta_agent.episode.protocol builds each turn's messages from them).
Model text enters these prompts as data: it is cut to its last WORK_CHARS characters, never interpreted,
and what in it imitates the environment (a tool result, a lesson block, another role's header, a chat
special token) is quoted by `neutralise` before anyone reads it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memory.types import MemoryHit
from meta_agent.episode.records import TurnRecord
from roles import Grammar, without_step_numbers

WORK_CHARS = 1500  # how much of an executor's work the meta-thinker and later executors see
# The headers of the blocks below: only the environment writes them at the start of a line.
LESSONS_HEADER = "Lessons from similar problems:"
WORK_HEADER = "Work so far:"
PREVIOUS_HEADER = "Previous attempt:"
REFLECTION_HEADER = "The meta-thinker's reflection:"
NOTES_HEADER = (
    "Your notes from earlier rounds:"  # memory.internal=summary (meta_agent.episode.internal_memory)
)
CHECK_HEADER = "The question's numbers, against the plan and the work:"  # protocol.number_check
ATTEMPT_HEADER = "The calculator's check of the answer:"  # protocol.attempt_check
_QUOTED = str.maketrans("<>[]", "\u2039\u203a\u2039\u203a")  # < > [ ] -> single guillemets


@dataclass(frozen=True)
class Markers:
    """What only the environment writes into a prompt: `anywhere` (tool-result tags, chat special
    tokens) and `line_start` (block headers, `[role]` headers of the work block)."""

    anywhere: tuple[str, ...]
    line_start: tuple[str, ...]

    @functools.cached_property
    def line_pattern(self) -> re.Pattern[str] | None:
        """The `line_start` headers as one pattern, compiled once per episode rather than per segment."""
        if not self.line_start:
            return None
        return re.compile(r"(?m)^([ \t]*)(" + "|".join(map(re.escape, self.line_start)) + ")")


def environment_markers(
    grammars: Iterable[Grammar],
    roles: Iterable[str],
    special_tokens: Iterable[str],
    extra_headers: Iterable[str] = (),
) -> Markers:
    """The markers of an episode's prompts; `extra_headers`: the headers of blocks only some episodes show
    (NOTES_HEADER, where the internal memory carries notes; CHECK_HEADER, with protocol.number_check), so
    the others quote exactly what they did."""
    tags = {tag for g in grammars for tag in g.tool_result}
    anywhere = sorted(tags | {t for t in special_tokens if t}, key=len, reverse=True)
    headers = [LESSONS_HEADER, WORK_HEADER, PREVIOUS_HEADER, REFLECTION_HEADER, *extra_headers]
    headers += [f"[{r}]" for r in roles]
    return Markers(tuple(anywhere), tuple(sorted(headers, key=len, reverse=True)))


def valid_text(text: str) -> str:
    """`text` as valid UTF-8: a lone surrogate (JSON's "\\ud800" decodes to one) becomes "?", so no
    writer of traces, Markdown or TensorBoard text fails on what a model wrote."""
    return text.encode("utf-8", "replace").decode("utf-8")


def neutralise(text: str, markers: Markers) -> tuple[str, int]:
    """`text` (a model's), valid UTF-8, with every environment marker quoted, and how many there were. A tag or
    special token gets its brackets turned into guillemets (`<tool_result>` -> `\u2039tool_result\u203a`);
    a header at the start of a line gets "> " before it. The result holds no marker, so a second pass
    finds none."""
    text, count = valid_text(text), 0
    for marker in markers.anywhere:
        found = text.count(marker)
        if found:
            text = text.replace(marker, marker.translate(_QUOTED))
            count += found
    if markers.line_pattern is not None:
        text, found = markers.line_pattern.subn(r"\1> \2", text)
        count += found
    return text, count


# a whole number, with or without thousands commas, not part of a longer number or a decimal
_WHOLE_NUMBER = re.compile(r"(?<![\d,.])(?:\d{1,3}(?:,\d{3})+|\d+)(?![\d,]*\d|\.\d)")


# number_check's line for a number, by (in the plan, in the work); in both: no line
_WHERE = {
    (True, False): "in the plan, not in the work",
    (False, True): "in the work, not in the plan",
    (False, False): "in neither the plan nor the work",
}


def whole_numbers(text: str) -> list[str]:
    """The whole numbers written in `text`, in order, without thousands commas: "7,293 and 12" ->
    ["7293", "12"]."""
    return [n.replace(",", "") for n in _WHOLE_NUMBER.findall(text)]


def number_check(question: str, plan: str | None, calls: Sequence[str]) -> str:
    """protocol.number_check: a line for each number of the question that the plan or the work (the
    executors' tool calls) lacks, with the question's sentence that gives it; nothing is judged, only
    found. number_check("It has 5 boxes. It had 9 visits.", "1. Add 5.", ["5 + 9"]) ->
    '9 (in the work, not in the plan): "It had 9 visits."'. Every number in both: one line saying so.
    Whole numbers only (a decimal is not checked), each once, with the first sentence that gives it; the
    plan's step numbers ("2. ") are not numbers it uses."""
    planned = set(whole_numbers(without_step_numbers(plan or "")))
    used = set(whole_numbers(" ".join(calls)))
    sentences = [s.strip() for s in re.split(r"(?<=[.?!])\s+", question) if s.strip()]
    lines = []
    for number in dict.fromkeys(whole_numbers(question)):
        where = _WHERE.get((number in planned, number in used))
        if where is None:
            continue
        said = next(s for s in sentences if number in whole_numbers(s))
        lines.append(f'{int(number):,} ({where}): "{said}"')
    return "\n".join(lines) or "Every number of the question is in the plan and in the work."


def tail(text: str, n: int = WORK_CHARS) -> str:
    """The last `n` characters of `text`, marked as cut when they are not all of it."""
    return text if len(text) <= n else "..." + text[-n:]


def memory_block(memories: Sequence[MemoryHit]) -> str:
    if not memories:
        return ""
    lines = "\n".join(f"- {hit.entry.text}" for hit in memories)
    return f"{LESSONS_HEADER}\n{lines}\n\n"


def notes_block(state: str) -> str:
    """What the internal memory carries to a reflection (meta_agent.episode.internal_memory), quoted already."""
    return f"{NOTES_HEADER}\n{state}\n\n" if state else ""


def work_block(turns: Sequence[TurnRecord]) -> str:
    """Executor turns as the meta-thinker and later executors read them: role, then its work's tail."""
    return "\n\n".join(f"[{t.role}]\n{tail(t.text.strip())}" for t in turns)


def previous_block(
    this_round: Sequence[TurnRecord],
    last_round: Sequence[TurnRecord],
    reflection: str,
    header: str = REFLECTION_HEADER,
) -> str:
    """Earlier executors of this round; or, for the first executor of a later round, the last round's
    attempt and the reflection that asked for this one (under `header`: a lone executor's retry shows
    the calculator's check of its attempt instead); empty for the first executor of round one."""
    if this_round:
        return f"{WORK_HEADER}\n{work_block(this_round)}\n\n"
    if not last_round:
        return ""
    work = "\n\n".join(tail(t.text.strip()) for t in last_round)
    return f"{PREVIOUS_HEADER}\n{work}\n\n{header}\n{tail(reflection)}\n\n"


def without_notes(text: str, grammar: Grammar) -> str:
    """`text` with every notes block cut out (an unclosed one to the end): a reflection as the executors
    read it and the leak check scans it, where the notes are the meta-thinker's own (memory.internal)."""
    return _cut(text, grammar.notes)


def without_plans(text: str, grammar: Grammar) -> str:
    """`text` with every tagged plan cut out (an unclosed one to the end): what executors may read when
    plans are kept from them."""
    return _cut(text, grammar.plan)


def _cut(text: str, tags: tuple[str, str]) -> str:
    start, end = tags
    while start in text:
        head, _, rest = text.partition(start)
        text = head + (rest.split(end, 1)[1] if end in rest else "")
    return text.strip()
