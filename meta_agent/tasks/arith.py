"""A generated task family that needs a calculator: word problems over 3-6 digit numbers.

    make_arith_tasks("test", 3, steps=3)[1].question ->
    "A print shop prints 30,662 books with 6,330 pages each. It also prints 164 loose pages.
     350,185 pages are misprinted and thrown away. How many pages does the shop have now?"
    answer "193740439", meta["expression"] "30662*6330+164-350185"

Every problem starts with a product (a * b) and then applies `steps - 1` more operations: add or
subtract a number, add or subtract another product (two operations), and at most one exact division
at the end. A 135M-parameter model cannot multiply 48,213 by 739 in its head; with a calculator tool
the task is easy, so accuracy measures tool use rather than arithmetic.

Each task keeps its canonical expression in `meta["expression"]` ("(648049*3185+564245)/155"), from
which a supervised warm start can write correct tool-call demonstrations.

Splits are disjoint by construction: a problem's split is a hash of its canonical key (template and
numbers), so the same problem can never be generated for both train and test, whatever the seeds.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from dataclasses import dataclass

from meta_agent.tasks.types import Task

SPLITS = ("train", "test")
MIN_STEPS, MAX_STEPS = 2, 4

# Share of all possible problems that belongs to the test split.
TEST_BUCKETS = 5

# Operand range: 3 to 6 digits; every running total (the answer included) stays >= MIN_OPERAND.
# Divisors are 2-3 digits ("shared among 37 farms"), so the quotient keeps enough digits to need
# the calculator too.
MIN_OPERAND, MAX_OPERAND = 100, 999_999
MIN_DIVISOR, MAX_DIVISOR = 12, 999

# Operations after the opening product, with the number of arithmetic steps each one costs.
COST = {"add": 1, "sub": 1, "add_product": 2, "sub_product": 2, "div": 1}


@dataclass(frozen=True)
class Theme:
    """One story: a sentence per operation; repeated add/sub steps use the next variant."""

    name: str
    start: str
    add: tuple[str, ...]
    sub: tuple[str, ...]
    add_product: str
    sub_product: str
    div: str
    ask: str
    ask_div: str


THEMES = (
    Theme(
        name="depot",
        start="A depot holds {a} crates with {b} bolts in each crate.",
        add=(
            "A delivery brings {c} more bolts.",
            "A second delivery brings {c} bolts.",
            "A supplier returns {c} bolts.",
        ),
        sub=(
            "The depot ships out {c} bolts.",
            "Then another {c} bolts are shipped out.",
            "{c} bolts are found rusted and scrapped.",
        ),
        add_product="It also receives {c} boxes holding {d} bolts each.",
        sub_product="It sends {c} sacks of {d} bolts each to a customer.",
        div="All the bolts are then split equally among {d} workshops.",
        ask="How many bolts does the depot hold now?",
        ask_div="How many bolts does each workshop get?",
    ),
    Theme(
        name="seeds",
        start="A seed bank stores {a} packets with {b} seeds in each packet.",
        add=(
            "A donor sends {c} more seeds.",
            "A second donor sends {c} seeds.",
            "A school collects another {c} seeds for it.",
        ),
        sub=(
            "{c} seeds are planted in a field.",
            "Another {c} seeds are planted in a second field.",
            "Mice eat {c} seeds.",
        ),
        add_product="It buys {c} sacks holding {d} seeds each.",
        sub_product="It ships {c} trays of {d} seeds each to farms.",
        div="The seeds are then shared equally among {d} farms.",
        ask="How many seeds does the seed bank have now?",
        ask_div="How many seeds does each farm get?",
    ),
    Theme(
        name="tour",
        start="A concert tour sells {a} tickets at {b} dollars each.",
        add=(
            "It earns {c} more dollars from merchandise.",
            "A sponsor pays it {c} dollars.",
            "Streaming brings in another {c} dollars.",
        ),
        sub=(
            "It pays {c} dollars to rent the venues.",
            "Transport costs {c} dollars.",
            "Insurance costs another {c} dollars.",
        ),
        add_product="It also sells {c} posters at {d} dollars each.",
        sub_product="It pays {c} crew members {d} dollars each.",
        div="The money is then split equally among {d} charities.",
        ask="How many dollars does the tour end up with?",
        ask_div="How many dollars does each charity receive?",
    ),
    Theme(
        name="print",
        start="A print shop prints {a} books with {b} pages each.",
        add=(
            "It also prints {c} loose pages.",
            "A late order adds {c} pages.",
            "It prints {c} more pages for posters.",
        ),
        sub=(
            "{c} pages are misprinted and thrown away.",
            "Another {c} pages are lost in shipping.",
            "A client returns {c} pages for pulping.",
        ),
        add_product="It prints {c} booklets of {d} pages each.",
        sub_product="{c} boxes holding {d} pages each are damaged and recycled.",
        div="The pages are then packed equally into {d} cartons.",
        ask="How many pages does the shop have now?",
        ask_div="How many pages go into each carton?",
    ),
    Theme(
        name="reservoir",
        start="An empty reservoir fills at {a} litres per hour for {b} hours.",
        add=("Rain adds {c} litres.", "A river adds another {c} litres.", "A spring adds {c} litres."),
        sub=("A town draws {c} litres.", "Evaporation removes {c} litres.", "A farm pumps out {c} litres."),
        add_product="{c} tankers pour in {d} litres each.",
        sub_product="{c} fire trucks take {d} litres each.",
        div="The water is then shared equally among {d} districts.",
        ask="How many litres are in the reservoir now?",
        ask_div="How many litres does each district get?",
    ),
)


def make_arith_tasks(split: str, n: int, seed: int = 0, steps: int = 2) -> list[Task]:
    """`n` distinct word problems of `steps` operations (2-4) from `split` ("train" or "test").

    Deterministic given (split, n, seed, steps), and a smaller `n` gives a prefix of a larger one.
    Ids are "arith/<split>/<hash>", the hash of the problem itself, so one problem has one id.
    """
    if split not in SPLITS:
        raise ValueError(f"arith has splits {SPLITS}, not {split!r}")
    if not MIN_STEPS <= steps <= MAX_STEPS:
        raise ValueError(f"arith steps must be {MIN_STEPS}..{MAX_STEPS}, got {steps}")
    if n < 0:
        raise ValueError(f"arith needs n >= 0 tasks, got {n}")
    # A string seed: random.Random hashes it with SHA-512, stable across processes and platforms.
    rng = random.Random(f"arith|{split}|{seed}|{steps}")
    patterns = op_patterns(steps)
    tasks: list[Task] = []
    seen: set[str] = set()
    while len(tasks) < n:
        theme, pattern, numbers = draw_problem(rng, patterns)
        key = canonical_key(theme.name, pattern, numbers)
        if key in seen or split_of(key) != split:
            continue
        seen.add(key)
        tasks.append(_build_task(split, theme, pattern, numbers, key))
    return tasks


def draw_problem(
    rng: random.Random, patterns: list[tuple[str, ...]]
) -> tuple[Theme, tuple[str, ...], list[tuple[int, ...]]]:
    """One valid draw: a theme, one of `patterns` and its numbers (draws that break a rule are drawn
    again). Families built on arith (arith_distract) draw their problems here too."""
    while True:
        theme, pattern = rng.choice(THEMES), rng.choice(patterns)
        numbers = _draw_numbers(rng, pattern)
        if numbers is not None:
            return theme, pattern, numbers


def op_patterns(steps: int) -> list[tuple[str, ...]]:
    """The operation sequences after the opening product that make `steps` operations in all.

    A division only comes last and only straight after the product or an add/sub, whose number
    can be nudged to make it exact.
    """
    middles = ("add", "sub", "add_product", "sub_product")
    patterns = []
    for length in range(steps):
        for ops in itertools.product(middles, repeat=length):
            cost = 1 + sum(COST[o] for o in ops)
            if cost == steps:
                patterns.append(ops)
            if cost == steps - 1 and (not ops or ops[-1] in ("add", "sub")):
                patterns.append((*ops, "div"))
    return patterns


def canonical_key(theme: str, pattern: tuple[str, ...], numbers: list[tuple[int, ...]]) -> str:
    """What makes a problem itself: template (theme and operations) and numbers, not the seed."""
    template = f"{theme}.{'-'.join(('mul', *pattern))}"
    return f"{template}|{' '.join(','.join(map(str, group)) for group in numbers)}"


def split_of(key: str) -> str:
    """The one split a problem can belong to, read off a hash of its canonical key."""
    bucket = int(hashlib.sha256(key.encode()).hexdigest()[:16], 16) % TEST_BUCKETS
    return "test" if bucket == 0 else "train"


def _draw_operand(rng: random.Random) -> int:
    # Digit count first, so 3-digit numbers are as common as 6-digit ones.
    digits = rng.randint(3, 6)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _draw_numbers(rng: random.Random, pattern: tuple[str, ...]) -> list[tuple[int, ...]] | None:
    """Numbers for each operation (the product first), or None when a draw breaks a rule (a running
    total under 100, an operand out of range), in which case the caller draws again."""
    numbers: list[tuple[int, ...]] = [(_draw_operand(rng), _draw_operand(rng))]
    for op in pattern:
        if op in ("add", "sub"):
            numbers.append((_draw_operand(rng),))
        elif op in ("add_product", "sub_product"):
            numbers.append((_draw_operand(rng), _draw_operand(rng)))
        else:
            numbers.append((rng.randint(MIN_DIVISOR, MAX_DIVISOR),))
    if pattern and pattern[-1] == "div":
        numbers = _make_divisible(numbers, pattern)
    totals = _running_totals(pattern, numbers)
    operands = [x for op, group in zip(("mul", *pattern), numbers, strict=True) if op != "div" for x in group]
    if any(t < MIN_OPERAND for t in totals) or not all(MIN_OPERAND <= x <= MAX_OPERAND for x in operands):
        return None
    return numbers


def _make_divisible(numbers: list[tuple[int, ...]], pattern: tuple[str, ...]) -> list[tuple[int, ...]]:
    """Nudge the number just before the final division so the division is exact."""
    divisor = numbers[-1][0]
    numbers = list(numbers)
    if len(pattern) == 1:  # the product itself: make `a` a multiple of what `b` lacks
        a, b = numbers[0]
        step = divisor // math.gcd(b, divisor)
        a -= a % step
        numbers[0] = (a if a >= MIN_OPERAND else a + step, b)
        return numbers
    before = _running_totals(pattern[:-2], numbers[:-2])[-1]
    (c,) = numbers[-2]
    if pattern[-2] == "add":
        c -= (before + c) % divisor
        c = c if c >= MIN_OPERAND else c + divisor
    else:
        c += (before - c) % divisor
        c = c if c <= MAX_OPERAND else c - divisor
    numbers[-2] = (c,)
    return numbers


def _running_totals(pattern: tuple[str, ...], numbers: list[tuple[int, ...]]) -> list[int]:
    """The quantity after each operation, the opening product first."""
    a, b = numbers[0]
    totals = [a * b]
    for op, group in zip(pattern, numbers[1:], strict=True):
        q = totals[-1]
        if op == "add":
            q += group[0]
        elif op == "sub":
            q -= group[0]
        elif op == "add_product":
            q += group[0] * group[1]
        elif op == "sub_product":
            q -= group[0] * group[1]
        else:
            if q % group[0]:
                raise AssertionError(f"inexact division {q} / {group[0]}")  # _make_divisible's job
            q //= group[0]
        totals.append(q)
    return totals


def _expression(pattern: tuple[str, ...], numbers: list[tuple[int, ...]]) -> str:
    """The canonical expression, e.g. "(648049*3185+564245)/155": plain ints, * + - /, no spaces."""
    a, b = numbers[0]
    expr = f"{a}*{b}"
    for op, group in zip(pattern, numbers[1:], strict=True):
        if op == "div":
            expr = f"({expr})/{group[0]}"
        else:
            sign = "+" if op.startswith("add") else "-"
            expr += sign + "*".join(map(str, group))
    return expr


def _build_task(
    split: str, theme: Theme, pattern: tuple[str, ...], numbers: list[tuple[int, ...]], key: str
) -> Task:
    a, b = numbers[0]
    sentences = [theme.start.format(a=f"{a:,}", b=f"{b:,}")]
    seen_ops = {"add": 0, "sub": 0}
    for op, group in zip(pattern, numbers[1:], strict=True):
        c = f"{group[0]:,}"
        if op in seen_ops:
            variants = getattr(theme, op)
            sentence = variants[seen_ops[op] % len(variants)].format(c=c)
            seen_ops[op] += 1
        elif op == "div":
            sentence = theme.div.format(d=c)
        else:
            sentence = getattr(theme, op).format(c=c, d=f"{group[1]:,}")
        sentences.append(sentence[0].upper() + sentence[1:])
    sentences.append(theme.ask_div if pattern and pattern[-1] == "div" else theme.ask)
    template = key.split("|", 1)[0]
    return Task(
        id=f"arith/{split}/{hashlib.sha256(key.encode()).hexdigest()[:12]}",
        question=" ".join(sentences),
        answer=str(_running_totals(pattern, numbers)[-1]),
        source="arith",
        meta={
            "expression": _expression(pattern, numbers),
            "template": template,
            "steps": 1 + sum(COST[o] for o in pattern),
        },
    )
