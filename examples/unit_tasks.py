"""A task class: a loader that `custom_tasks` names, generating its problems from a seed.

    PYTHONPATH=. meta-agent eval '+custom_tasks.minutes={loader:examples.unit_tasks:load}' eval.tasks=[minutes] eval.limit=8

`load(split, limit, seed)` returns meta_agent.tasks.Task records: "How many minutes are in 7 hours and
13 minutes?", graded as numbers. A problem's split is fixed by a hash of its numbers, so the train and
test splits never share one, whatever the seed draws.
"""

from __future__ import annotations

import hashlib
import random

from meta_agent.tasks import Task


def split_of(hours: int, minutes: int) -> str:
    """One problem in five is a test problem, by a hash of its numbers."""
    digest = hashlib.sha256(f"{hours}:{minutes}".encode()).digest()
    return "test" if digest[0] % 5 == 0 else "train"


def load(split: str, limit: int | None, seed: int) -> list[Task]:
    rng = random.Random(seed)
    problems = [(h, m) for h in range(1, 24) for m in range(1, 60) if split_of(h, m) == split]
    rng.shuffle(problems)
    return [
        Task(
            id=f"minutes/{split}/{h}h{m}m",
            question=f"How many minutes are in {h} hours and {m} minutes?",
            answer=str(60 * h + m),
            source="minutes",
            grader="numeric",
        )
        for h, m in problems[:limit]
    ]
