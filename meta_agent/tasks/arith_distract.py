"""A generated task family where reflection can matter: arith word problems with distractor quantities.

    make_distract_tasks("test", 1)[0].question ->
    "A depot holds 728 crates with 734 bolts in each crate. The depot employs 4,512 workers. A delivery
     brings 21,139 more bolts. How many bolts does the depot hold now?"
    answer "555491", meta["expression"] "728*734+21139", meta["distractors"] [4512]

Why it is shaped so. A reflection can only fix what it can see. Here a first attempt often goes wrong
in a way the work itself shows. The question carries one or two sentences with a number of the same
size as the real operands that has nothing to do with the asked quantity (workers, kilometres,
species). A small executor tends to fold every number it sees into its calculator calls. Its tool
calls then show the distractor plainly ("728*734+21139+4512"). A meta-thinker that reads the work
against the question can catch that and ask for a revision, which a second round can carry out. The
arithmetic itself stays the calculator's job.

What a trained hierarchy did with it: the planner folded the distractor in more often than the
executor, and the other wrong answers were wrong operations ("sends 462 more" planned as a subtraction),
which demonstrations of distractor catches do not teach a reflection to see (docs/results/reflection.md).

Problems are the arith family's problems (meta_agent.tasks.arith: same themes, operations and
numbers) with distractors added. The distractors' sentence, number and place are part of the
canonical key, and the split is a hash of that key. So the splits are disjoint by construction,
whatever the seeds. The arith task itself is unchanged.
"""

from __future__ import annotations

import hashlib
import random

from meta_agent.tasks.arith import (
    SPLITS,
    _build_task,
    _draw_operand,
    canonical_key,
    draw_problem,
    op_patterns,
    split_of,
)
from meta_agent.tasks.types import Task

NAME = "arith_distract"
DEFAULT_STEPS = 3  # operations of the underlying arith problem
MAX_DISTRACTORS = 2

# Per theme: sentences with a number {x} that the asked quantity does not depend on.
DISTRACTORS = {
    "depot": ("The depot employs {x} workers.", "Its loading yard covers {x} square metres.",
              "The depot's trucks drove {x} kilometres last year."),
    "seeds": ("The seed bank's catalogue lists {x} plant species.", "It had {x} visitors last year.",
              "Its freezers use {x} kilowatt-hours a month."),
    "tour": ("The tour bus drives {x} kilometres.", "The band rehearsed for {x} minutes.",
             "The tour's website had {x} visits."),
    "print": ("The shop has {x} customers on its mailing list.", "Its presses use {x} millilitres of ink a week.",
              "The shop opened {x} days ago."),
    "reservoir": ("The dam is {x} centimetres tall.", "{x} fish live in the reservoir.",
                  "The district around it has {x} residents."),
}  # fmt: skip


def make_distract_tasks(
    split: str, n: int, seed: int = 0, steps: int = DEFAULT_STEPS, distractors: int = 1
) -> list[Task]:
    """`n` distinct problems from `split`, each an arith problem of `steps` operations with
    `distractors` (1 or 2) distractor sentences. Deterministic given the arguments; ids are
    "arith_distract/<split>/<hash of the problem>"."""
    if split not in SPLITS:
        raise ValueError(f"{NAME} has splits {SPLITS}, not {split!r}")
    if not 1 <= distractors <= MAX_DISTRACTORS:
        raise ValueError(f"{NAME} distractors must be 1..{MAX_DISTRACTORS}, got {distractors}")
    if n < 0:
        raise ValueError(f"{NAME} needs n >= 0 tasks, got {n}")
    rng = random.Random(f"{NAME}|{split}|{seed}|{steps}|{distractors}")
    patterns = op_patterns(steps)
    tasks: list[Task] = []
    seen: set[str] = set()
    while len(tasks) < n:
        theme, pattern, numbers = draw_problem(rng, patterns)
        sentences = rng.sample(range(len(DISTRACTORS[theme.name])), distractors)
        values = [_draw_operand(rng) for _ in sentences]
        operands = {x for group in numbers for x in group}
        if any(v in operands for v in values) or len(set(values)) < len(values):
            continue  # a distractor must not equal a number the answer uses
        # Where each goes: after sentence 1..(number of operation sentences), never before the start.
        places = sorted(rng.randint(1, len(pattern) + 1) for _ in sentences)
        base = canonical_key(theme.name, pattern, numbers)
        extra = ";".join(f"{s}@{p}={v}" for s, p, v in zip(sentences, places, values, strict=True))
        key = f"{base}|{extra}"
        if key in seen or split_of(key) != split:
            continue
        seen.add(key)
        tasks.append(_with_distractors(_build_task(split, theme, pattern, numbers, base), theme.name, sentences,
                                       places, values, key))  # fmt: skip
    return tasks


def _with_distractors(
    task: Task, theme: str, sentences: list[int], places: list[int], values: list[int], key: str
) -> Task:
    """`task` with the distractor sentences inserted (each after the sentence numbered by its place)."""
    parts = task.question.split(". ")
    body = [p if p.endswith((".", "?")) else p + "." for p in parts]
    for offset, (s, place, value) in enumerate(zip(sentences, places, values, strict=True)):
        body.insert(place + offset, DISTRACTORS[theme][s].format(x=f"{value:,}"))
    meta = {**task.meta, "distractors": values, "template": f"{NAME}.{task.meta['template']}"}
    return Task(
        id=f"{NAME}/{task.id.split('/')[1]}/{hashlib.sha256(key.encode()).hexdigest()[:12]}",
        question=" ".join(body),
        answer=task.answer,
        source=NAME,
        meta=meta,
    )
