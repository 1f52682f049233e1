"""The task record every layer above shares: one question with its gold answer.

A task is plain data. Loaders (`datasets.py`) read them from `data/*.jsonl`, the arithmetic family
(`arith.py`) generates them, and the episode shows `question` to the agents and hands `answer` to
`grading.grade` at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One question and the gold answer its final answer is checked against.

    Attributes:
        id: stable and unique within its source, "<source>/<split>/<key>" (e.g. "gsm8k/test/17",
            the row's line index; "arith/test/3f9a0c2b71de", a hash of the generated problem).
        question: the text shown to the agents.
        answer: the gold final answer as text ("18", "\\frac{1}{2}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
            ready for `grade(prediction, answer)`.
        source: the task family ("gsm8k", "math500", "aime24", "amc23", "arith", "arith_distract",
            "countdown", "countdown_tinyzero", "cli", or the name of a task from a file or loader, see
            tasks.custom).
        meta: extra per-task facts, JSON-compatible values: the reference solution, MATH subject and
            level, or the canonical expression of a generated problem. Read-only by convention.
        grader: how an answer is checked against `answer` (grading.GRADERS): "math" (math-verify,
            most built-in families), "exact" or "numeric" (tasks from a file may choose), "code" (the
            answer is a test program run on the prediction's code in the sandbox: humaneval), or
            "countdown" (the answer is "numbers -> target"; the prediction an expression, tasks.countdown).
    """

    id: str
    question: str
    answer: str
    source: str
    # Excluded from the hash because a dict is unhashable; tasks stay usable as dict keys and set
    # members, and two tasks with equal ids and texts but different meta still compare unequal.
    # A plain dict (not MappingProxyType) so tasks pickle into worker processes.
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)
    grader: str = "math"
