"""The text blocks a turn's prompt is built from: lessons, the work so far, a previous attempt.

Pure functions of what the episode recorded (meta_agent.episode.protocol builds each turn's messages from them).
Model text enters these prompts as data: it is cut to its last WORK_CHARS characters, never interpreted,
and what in it imitates the environment (a tool result, a lesson block, another role's header, a chat
special token) is quoted by `neutralise` before anyone reads it.
"""

from __future__ import annotations

import functools
import re
import string
import unicodedata
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
PLAN_HEADER = "Plan from the meta-thinker:"  # before the plan in an executor's prompt
_QUOTED = str.maketrans("<>[]", "\u2039\u203a\u2039\u203a")  # < > [ ] -> single guillemets
# a marker without brackets (some tokenizers' special tokens) is quoted in full-width letters instead
_FULL_WIDTH = str.maketrans({chr(c): chr(c + 0xFEE0) for c in range(0x21, 0x7F)})
# How text is compared with the markers (`matching_view`): line breaks of every kind end a line...
_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
# ...and these default-ignorable characters, like every format character (category Cf: zero-width
# spaces and joiners, directional marks, the soft hyphen, the byte-order mark), are not there at all.
_IGNORED = frozenset("\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0") | frozenset(
    map(chr, range(0xFE00, 0xFE10))
)
_ASCII_VIEW = str.maketrans({c: "\n" if c in _LINE_BREAKS else " " for c in "\t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"})


@dataclass(frozen=True)
class Markers:
    """What only the environment writes into a prompt: `anywhere` (tool-result tags, chat special
    tokens) and `line_start` (block headers, `[role]` headers of the work block)."""

    anywhere: tuple[str, ...]
    line_start: tuple[str, ...]

    @functools.cached_property
    def anywhere_pattern(self) -> re.Pattern[str] | None:
        """The `anywhere` markers as one pattern over a `matching_view`, compiled once per episode."""
        return _alternatives(self.anywhere, "")

    @functools.cached_property
    def line_pattern(self) -> re.Pattern[str] | None:
        """The `line_start` headers as one pattern over a `matching_view`: after spaces at a line's start."""
        return _alternatives(self.line_start, r"(?m)^ *")


def _alternatives(markers: Sequence[str], before: str) -> re.Pattern[str] | None:
    """One pattern for `markers` (longest first), its group 1 the marker, as `loose_pattern` reads each."""
    if not markers:
        return None
    loose = sorted({loose_pattern(m) for m in markers if matching_view(m)[0].strip()}, key=len, reverse=True)
    return re.compile(before + "(" + "|".join(loose) + ")") if loose else None


def loose_pattern(marker: str) -> str:
    """A regex matching `marker`'s `matching_view` as a reader would still take it for the marker: with
    spaces around its punctuation and where it has spaces. loose_pattern("</tool_result>") ->
    "< */ *tool_result *>"; loose_pattern("Its final answer:") -> "its +final +answer *:"."""
    view = matching_view(marker)[0].strip()
    parts: list[str] = []
    for i, char in enumerate(view):
        if char == " ":
            if parts[-1] != " +":
                parts.append(" +")
            continue
        if i and view[i - 1] != " " and not (_word(char) and _word(view[i - 1])):
            parts.append(" *")  # beside punctuation: "< tool_result >" is still read as the tag
        parts.append(re.escape(char))
    return "".join(parts)


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


def matching_view(text: str) -> tuple[str, list[int] | None]:
    """`text` as markers are matched against it, and where each of its characters comes from in `text`
    (None: the same place). Case is folded; every line break (a carriage return, a form feed, U+2028) is
    "\\n" and every other white space (a tab, a no-break space, an ideographic space) is " "; format
    characters (zero-width spaces and joiners, directional marks, the soft hyphen) are dropped.
    matching_view("A\\u200bB\\u00a0c") -> ("ab c", [0, 2, 3, 4])."""
    if text.isascii():
        return text.lower().translate(_ASCII_VIEW), None
    view: list[str] = []
    where: list[int] = []
    for i, char in enumerate(text):
        if char in _LINE_BREAKS:
            folded = "\n"
        elif char.isspace():
            folded = " "
        elif char in _IGNORED or unicodedata.category(char) == "Cf":
            continue
        else:
            folded = char.casefold()
        view.append(folded)
        where += [i] * len(folded)
    return "".join(view), where


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
    headers = [LESSONS_HEADER, WORK_HEADER, PREVIOUS_HEADER, REFLECTION_HEADER, PLAN_HEADER, *extra_headers]
    headers += [f"[{r}]" for r in roles]
    return Markers(tuple(anywhere), tuple(sorted(set(headers), key=len, reverse=True)))


def template_headers(templates: Iterable[str]) -> tuple[str, ...]:
    """The framing lines a prompt template writes: each line's text before a placeholder or the line's
    end that ends in ":". template_headers(["{plan}Question: {question}", "Its final answer: {answer}\\n
    Check it."]) -> ("Question:", "Its final answer:")."""
    found: dict[str, None] = {}
    for template in templates:
        for literal, *_ in string.Formatter().parse(template):
            for piece in literal.split("\n"):
                piece = piece.strip()
                if piece.endswith(":") and len(piece) > 1:
                    found[piece] = None
    return tuple(found)


def valid_text(text: str) -> str:
    """`text` as valid UTF-8: a lone surrogate (JSON's "\\ud800" decodes to one) becomes "?", so no
    writer of traces, Markdown or TensorBoard text fails on what a model wrote."""
    return text.encode("utf-8", "replace").decode("utf-8")


def neutralise(text: str, markers: Markers) -> tuple[str, int]:
    """`text` (a model's), valid UTF-8, with every environment marker quoted, and how many there were.
    Markers are found in the text's `matching_view`, so another case, spaces inside a tag, a zero-width
    character, a no-break space or a carriage return before a header hide none. A tag or special token
    gets its brackets turned into guillemets (`<tool_result>` -> `\u2039tool_result\u203a`; one without
    brackets is written in full-width letters); a header at the start of a line gets "> " before it.
    Text with no marker comes back unchanged, and the result holds no marker, so a second pass finds none."""
    text, count = valid_text(text), 0
    if markers.anywhere_pattern is not None:
        view, where = matching_view(text)
        spans = [_original(m.span(1), where) for m in markers.anywhere_pattern.finditer(view)]
        if spans:
            chars = list(text)
            for start, end in spans:  # same length: the positions of the later spans still hold
                marker = text[start:end]
                quoted = marker.translate(_QUOTED)
                chars[start:end] = quoted if quoted != marker else marker.translate(_FULL_WIDTH)
            text, count = "".join(chars), len(spans)
    if markers.line_pattern is not None:
        view, where = matching_view(text)
        starts = [_original(m.span(1), where)[0] for m in markers.line_pattern.finditer(view)]
        for start in reversed(starts):
            text = f"{text[:start]}> {text[start:]}"
        count += len(starts)
    return text, count


def _original(span: tuple[int, int], where: list[int] | None) -> tuple[int, int]:
    """A (non-empty) span of a `matching_view` as the span of the text it was made from."""
    if where is None:
        return span
    return where[span[0]], where[span[1] - 1] + 1


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
