"""The text blocks a turn's prompt is built from: lessons, the work so far, a previous attempt.

Pure functions of what the episode recorded (meta_agent.episode builds each turn's messages from them).
Model text enters these prompts as data: it is cut to its last WORK_CHARS characters, never interpreted.
"""

from __future__ import annotations

from collections.abc import Sequence

from memory.types import MemoryHit
from meta_agent.episode_records import TurnRecord
from roles import Grammar

WORK_CHARS = 1500  # how much of an executor's work the meta-thinker and later executors see


def tail(text: str, n: int = WORK_CHARS) -> str:
    """The last `n` characters of `text`, marked as cut when they are not all of it."""
    return text if len(text) <= n else "..." + text[-n:]


def memory_block(memories: Sequence[MemoryHit]) -> str:
    if not memories:
        return ""
    lines = "\n".join(f"- {hit.entry.text}" for hit in memories)
    return f"Lessons from similar problems:\n{lines}\n\n"


def work_block(turns: Sequence[TurnRecord]) -> str:
    """Executor turns as the meta-thinker and later executors read them: role, then its work's tail."""
    return "\n\n".join(f"[{t.role}]\n{tail(t.text.strip())}" for t in turns)


def previous_block(
    this_round: Sequence[TurnRecord], last_round: Sequence[TurnRecord], reflection: str
) -> str:
    """Earlier executors of this round; or, for the first executor of a later round, the last round's
    attempt and the reflection that asked for this one; empty for the first executor of round one."""
    if this_round:
        return f"Work so far:\n{work_block(this_round)}\n\n"
    if not last_round:
        return ""
    work = "\n\n".join(tail(t.text.strip()) for t in last_round)
    return f"Previous attempt:\n{work}\n\nThe meta-thinker's reflection:\n{tail(reflection)}\n\n"


def without_plans(text: str, grammar: Grammar) -> str:
    """`text` with every tagged plan cut out (an unclosed one to the end): what executors may read when
    plans are kept from them."""
    start, end = grammar.plan
    while start in text:
        head, _, rest = text.partition(start)
        text = head + (rest.split(end, 1)[1] if end in rest else "")
    return text.strip()
