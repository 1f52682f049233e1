"""Internal memory (`memory.internal`): what the meta-thinker carries from one reflection to the next.

- `truncate` (the default, and the protocol before this setting existed): nothing is carried. A reflection
  reads the plan in force and this round's work cut to its last WORK_CHARS characters; what earlier rounds
  tried survives only as far as a revision wrote it into the plan.
- `summary`: each reflection also rewrites a running state inside <notes>...</notes> (what was tried,
  what failed, what to check), and the next reflection reads the latest notes above the new work. The
  notes are part of the reflection's completion, so they are trained with it: the demonstrations write
  them (`demonstrate`), and GRPO credits them with the reflection's reward.

An internal memory is three pure functions of text (the InternalMemory protocol): a researcher's own (a
structured state, a fixed-format log) plugs in through Episode(internal=...) or the EpisodeFactory and
must pass `check_internal_memory`. The episode hands it reflections as recorded (what in them imitates the
environment already quoted), and quotes what it carries once more before showing it: a note whose own
header lands at the start of a line once the tags are stripped is still quoted (meta_agent.episode.prompts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from memory.settings import INTERNAL_KINDS
from meta_agent.episode.prompts import tail
from roles import Grammar, parse_notes, parse_reflection

NOTES_CHARS = 600  # the carried notes are cut to their last this many characters: a runaway note stays small
CARRIED_LIMIT = 2000  # what check_internal_memory lets any memory carry into one prompt, in characters


@runtime_checkable
class InternalMemory(Protocol):
    name: str
    # whether it ever carries anything: the episode then quotes a forged NOTES_HEADER in model text and keeps
    # the notes out of what executors read; a memory that carries nothing leaves the prompts as they were
    carries: bool

    def instruction(self, grammar: Grammar) -> str:
        """What the reflect message asks the meta-thinker to write besides its reflection, appended to the
        role's reflect message; "" for nothing."""

    def carried(self, reflections: Sequence[str], grammar: Grammar) -> str:
        """The state the next reflection reads, from this episode's earlier reflections (their texts,
        oldest first); "" for none. At most CARRIED_LIMIT characters. It is model text: the episode quotes
        what in it imitates the environment and shows it above the reflect message under NOTES_HEADER."""

    def demonstrate(
        self, reflection: str, earlier: Sequence[str], answers: Sequence[str | None], grammar: Grammar
    ) -> str:
        """A scripted reflection (a demonstration's) as this memory asks reflections to be written, its
        verdict, fix or plan unchanged. `earlier`: the episode's reflections before it; `answers`: each
        round's answer so far, this round's last."""


class Truncate:
    """Nothing carried: each reflection reads this round's work and the plan in force."""

    name = "truncate"
    carries = False

    def instruction(self, grammar: Grammar) -> str:
        return ""

    def carried(self, reflections: Sequence[str], grammar: Grammar) -> str:
        return ""

    def demonstrate(
        self, reflection: str, earlier: Sequence[str], answers: Sequence[str | None], grammar: Grammar
    ) -> str:
        return reflection


class Summary:
    """A running state each reflection rewrites in its notes; the next reflection reads the latest."""

    name = "summary"
    carries = True

    def instruction(self, grammar: Grammar) -> str:
        open_, close = grammar.notes
        return (
            f"Before your verdict, rewrite your notes for the next round inside {open_}...{close}: what was "
            "tried, what failed, what to check."
        )

    def carried(self, reflections: Sequence[str], grammar: Grammar) -> str:
        notes = latest_notes(reflections, grammar)
        return tail(notes, NOTES_CHARS) if notes else ""

    def demonstrate(
        self, reflection: str, earlier: Sequence[str], answers: Sequence[str | None], grammar: Grammar
    ) -> str:
        kept = latest_notes(earlier, grammar)
        line = round_note(len(answers), answers[-1] if answers else None, reflection, grammar)
        notes = f"{kept}\n{line}" if kept else line
        return with_notes(reflection, notes, grammar)


INTERNAL_MEMORIES: dict[str, type] = {"truncate": Truncate, "summary": Summary}
assert tuple(INTERNAL_MEMORIES) == INTERNAL_KINDS, "memory.settings.INTERNAL_KINDS and this table differ"


def internal_memory(name: str) -> InternalMemory:
    """The internal memory `memory.internal` names (MemorySettings checked the name at start-up)."""
    return INTERNAL_MEMORIES[name]()


def latest_notes(reflections: Sequence[str], grammar: Grammar) -> str | None:
    """The notes of the latest reflection that wrote closed ones: a reflection that forgot them (or ran
    out of tokens inside them) leaves the state it was given."""
    for text in reversed(reflections):
        notes = parse_notes(text, grammar)
        if notes:
            return notes
    return None


def round_note(number: int, answer: str | None, reflection: str, grammar: Grammar) -> str:
    """One line of a demonstration's notes: the round, its answer, and what the reflection decided."""
    out = parse_reflection(reflection, grammar)
    answered = f"answered {answer}" if answer else "gave no answer"
    if out.fix is not None:
        step = out.fix[0]
        decided = f"step {step} was wrong and is fixed; check step {step} against the question"
    elif out.plan is not None:
        decided = "the plan was rewritten; check each step against the question"
    elif out.verdict == "revise":
        decided = "asked for another try; check each step against the question"
    else:
        decided = "accepted"
    return f"Round {number}: {answered}; {decided}."


def with_notes(reflection: str, notes: str, grammar: Grammar) -> str:
    """`reflection` with `notes` in their tags after its lesson (or its reflection, or at its start),
    before the verdict, fix or plan that ends it."""
    open_, close = grammar.notes
    block = f"{open_}{notes}{close}"
    for tag in (grammar.lesson[1], grammar.reflection[1]):
        at = reflection.find(tag)
        if at >= 0:
            at += len(tag)
            return reflection[:at] + block + reflection[at:]
    return block + reflection


def check_internal_memory(memory: InternalMemory, grammar: Grammar | None = None) -> None:
    """Raises AssertionError naming what `memory` gets wrong as the episode and the demonstrations use it.

    Checks: it is an InternalMemory; the first reflection is carried nothing; what it carries is a pure
    function of the reflections, bounded by CARRIED_LIMIT however long they ran (the episode cuts it there
    too); a demonstrated reflection keeps its decision (verdict, fix, plan) and the episode's stops; a
    memory whose instruction asks for something carries something from a reflection written as it
    demonstrates; and one that carries something says so (`carries`).
    """
    grammar = grammar or Grammar()
    assert isinstance(memory, InternalMemory), f"{memory!r} lacks a method of InternalMemory"
    assert memory.carried((), grammar) == "", "the first reflection must be carried nothing"
    r_open, r_close = grammar.reflection
    v_open, v_close = grammar.verdict
    f_open, f_close = grammar.fix
    accept = f"{r_open}Step 2 adds 5, as the question says.{r_close}{v_open}accept{v_close}"
    fix = f'{r_open}Step 2 should subtract.{r_close}{f_open} step="2">Subtract 5.{f_close}'
    for text, answers in ((fix, ["12"]), (accept, ["12", "2"])):
        earlier = [] if text is fix else [memory.demonstrate(fix, [], ["12"], grammar)]
        shown = memory.demonstrate(text, earlier, answers, grammar)
        assert isinstance(shown, str), "demonstrate must return the reflection's text"
        before, after = parse_reflection(text, grammar), parse_reflection(shown, grammar)
        assert (after.verdict, after.fix, after.plan) == (before.verdict, before.fix, before.plan), (
            f"demonstrate changed the reflection's decision: {text!r} -> {shown!r}"
        )
        stops = grammar.reflect_stops()
        ends = [shown.find(s) + len(s) for s in stops if s in shown]
        assert ends and min(ends) == len(shown.rstrip()), (
            f"a stop ends the demonstrated reflection early: {shown!r}"
        )
    reflections = [memory.demonstrate(fix, [], ["12"], grammar)]
    first = memory.carried(reflections, grammar)
    assert first == memory.carried(list(reflections), grammar), "carried must be a pure function of its input"
    if memory.instruction(grammar):
        assert first, "the instruction asks for something that the next reflection is never shown"
    if first:
        assert memory.carries, "it carried something but says it carries nothing (carries = False)"
    runaway = [f"{r_open}{'x' * 50_000}{r_close}{grammar.notes[0]}{'y' * 50_000}{grammar.notes[1]}"]
    long = memory.carried(runaway, grammar)
    assert len(long) <= CARRIED_LIMIT, f"carried {len(long)} characters of a runaway reflection"
