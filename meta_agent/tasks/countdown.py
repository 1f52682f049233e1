"""Countdown: reach a target from given numbers, each used once, with + - * / and parentheses.

    make_countdown_tasks("test", 1)[0].question ->
    "Use the numbers 27, 12, 42 once each with + - * / to make 81. Answer with the expression."
    answer "27 12 42 -> 81" (the grader's key, see countdown_gold), grader "countdown",
    meta {"numbers": [27, 12, 42], "target": 81, "expression": "42+(27+12)"}

Why this family: finding an expression is a search, checking one is a single calculator call. The
calculator's result shows whether an attempt hits the target, and the attempt itself shows which
numbers it used, so a reader of the work can tell a miss from a hit cheaply (issue 54, item 1).

Two task names (meta_agent.tasks.datasets.KNOWN_TASKS):
- `countdown`, train and test, generated here. A problem is 3 or 4 numbers from 1 to 99 and a target
  from 10 to 100, the ranges of TinyZero's Countdown set, so the generated test split and the fixed
  one below measure the same kind of problem. Every problem is solvable by construction: its target is
  the value of a random expression over its numbers, each used once, whose every step is a positive
  integer (a division only where it is exact). That expression is kept in `meta["expression"]`
  (minimal parentheses, no spaces: "(71-63)*9+5"), the numbers as shown and the target in
  `meta["numbers"]` and `meta["target"]`. The splits are disjoint by construction: a problem's split
  is a hash of its canonical key (the sorted numbers and the target), as in arith.py, so no problem
  can be drawn for both, whatever the seeds. Within a split, keys are unique.
- `countdown_tinyzero`, test only: the 2,001 rows of TinyZero's Countdown test file, stored in
  data/countdown_tinyzero/test.jsonl (fields `target` and `nums`; source, licence and the share of
  rows that has a solution: data/README.md), read by datasets.py like any stored family. Its own
  name rather than a source of `countdown`'s test split, so `countdown` keeps generated splits that
  are disjoint by construction, and the fixed set stays one fixed set of rows with line-index ids.

The grader ("countdown" in grading.GRADERS): an answer is right when it is an arithmetic expression
that the calculator's own parser reads (tools.calculator, no eval), made only of plain whole numbers,
+ - * / and parentheses, that uses exactly the given numbers (as a multiset: each once, no other) and
whose exact value (fractions allowed on the way) is the target. Decided details: the calculator's
aliases count as the signs they stand for ("×" "÷" "−", as the calculator tool reads them); a
trailing "= <target>" is allowed ("44+19+35 = 98"); a sign in front of a number ("-3+..."), other
operators (^ % // !), functions and decimals are not. `check_attempt` says why an attempt misses.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from itertools import combinations
from pathlib import Path

from meta_agent.errors import MissingFile
from meta_agent.tasks.types import Task
from tools.calculator import Token, evaluate, tokenize
from tools.calculator_values import CalculatorError

NAME = "countdown"
FIXED_NAME = "countdown_tinyzero"  # the fixed test set (datasets.py reads data/<FIXED_NAME>/test.jsonl)
GRADER = "countdown"
SPLITS = ("train", "test")
SIZES = (3, 4)  # how many numbers a problem gives
MIN_NUMBER, MAX_NUMBER = 1, 99
MIN_TARGET, MAX_TARGET = 10, 100
TEST_BUCKETS = 5  # 1 in 5 of all problems belongs to the test split
OPERATORS = ("+", "-", "*", "/")
MAX_ANSWER_CHARS = 1000  # as the calculator tool's own limit; real answers are ~20 characters

# An expression is a given number or (operator, left, right).
Expr = int | tuple[str, "Expr", "Expr"]


def make_countdown_tasks(
    split: str, n: int, seed: int = 0, size: int | None = None, data_dir: Path | str | None = None
) -> list[Task]:
    """`n` distinct Countdown problems of `split` ("train" or "test"), each with `size` numbers (3 or 4;
    None: either, at even odds).

    Deterministic given (split, n, seed, size), and a smaller `n` gives a prefix of a larger one.
    Ids are "countdown/<split>/<hash>", the hash of the problem's canonical key. The train split also
    leaves out every problem of the fixed test set (countdown_tinyzero, read from the data folder as
    load_tasks finds it, `data_dir` first), so training never sees one of its problems.
    """
    if split not in SPLITS:
        raise ValueError(f"countdown has splits {SPLITS}, not {split!r}")
    if size is not None and size not in SIZES:
        raise ValueError(f"countdown problems give {' or '.join(map(str, SIZES))} numbers, not {size}")
    if n < 0:
        raise ValueError(f"countdown needs n >= 0 tasks, got {n}")
    # A string seed: random.Random hashes it with SHA-512, stable across processes and platforms.
    rng = random.Random(f"countdown|{split}|{seed}|{size}")
    tasks: list[Task] = []
    seen: set[str] = set(fixed_test_keys(data_dir)) if split == "train" and n else set()
    while len(tasks) < n:
        numbers, expr = draw_problem(rng, size or rng.choice(SIZES))
        target = value_of(expr)
        key = canonical_key(numbers, target)
        if key in seen or split_of(key) != split:
            continue
        seen.add(key)
        task_id = f"{NAME}/{split}/{hashlib.sha256(key.encode()).hexdigest()[:12]}"
        tasks.append(countdown_task(task_id, numbers, target, NAME, expression=format_expr(expr)))
    return tasks


def fixed_test_keys(data_dir: Path | str | None = None) -> frozenset[str]:
    """The canonical keys of the fixed test set's problems (countdown_tinyzero/test.jsonl)."""
    from meta_agent.tasks.datasets import resolve_data_dir  # datasets imports this module

    return _keys_of(str(resolve_data_dir(data_dir).resolve()))


@functools.lru_cache(maxsize=4)
def _keys_of(data_dir: str) -> frozenset[str]:
    from meta_agent.tasks.datasets import load_tasks

    try:
        tasks = load_tasks(FIXED_NAME, "test", data_dir=data_dir)
    except MissingFile as e:
        raise MissingFile(f"countdown's train split leaves out the fixed test set's problems: {e}") from None
    return frozenset(canonical_key(t.meta["numbers"], t.meta["target"]) for t in tasks)


def draw_problem(rng: random.Random, size: int) -> tuple[list[int], Expr]:
    """`size` numbers in the order the question shows them, and an expression over them whose value is
    the target: every step a positive integer, the value within MIN_TARGET..MAX_TARGET (draws that
    miss are drawn again)."""
    while True:
        numbers = [rng.randint(MIN_NUMBER, MAX_NUMBER) for _ in range(size)]
        leaves = rng.sample(numbers, size)  # the expression's order, independent of the shown order
        expr = _draw_expr(rng, leaves)
        if MIN_TARGET <= value_of(expr) <= MAX_TARGET:
            return numbers, expr


def _draw_expr(rng: random.Random, leaves: list[int]) -> Expr:
    """A random expression tree over `leaves` in order; each node's operator is drawn from those that
    keep its value a positive integer (+ and * always do)."""
    if len(leaves) == 1:
        return leaves[0]
    cut = rng.randint(1, len(leaves) - 1)
    left, right = _draw_expr(rng, leaves[:cut]), _draw_expr(rng, leaves[cut:])
    a, b = value_of(left), value_of(right)
    allowed = ["+", "*"] + (["-"] if a > b else []) + (["/"] if a % b == 0 else [])
    return (rng.choice(allowed), left, right)


def value_of(expr: Expr) -> int:
    """The value of a generated expression (integer at every step by construction)."""
    if isinstance(expr, int):
        return expr
    op, left, right = expr
    a, b = value_of(left), value_of(right)
    if op == "/":
        if b == 0 or a % b:
            raise AssertionError(f"inexact division {a} / {b}")  # _draw_expr's job
        return a // b
    return {"+": a + b, "-": a - b, "*": a * b}[op]


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def format_expr(expr: Expr) -> str:
    """An expression as text, no spaces, with the parentheses that keep its tree: "(71-63)*9+5".

    A child is bracketed when it binds looser than its parent, or binds as tightly and is the right
    child ("a-(b+c)", "a/(b*c)", and also "a+(b-c)"), so the text's tree, and so each step a calculator
    call would make, is the expression's tree."""
    if isinstance(expr, int):
        return str(expr)
    op, left, right = expr
    return f"{_operand(left, op, right=False)}{op}{_operand(right, op, right=True)}"


def _operand(child: Expr, parent: str, right: bool) -> str:
    text = format_expr(child)
    if isinstance(child, int):
        return text
    looser = _PRECEDENCE[child[0]] < _PRECEDENCE[parent]
    same = _PRECEDENCE[child[0]] == _PRECEDENCE[parent]
    return f"({text})" if looser or (right and same) else text


def canonical_key(numbers: list[int], target: int) -> str:
    """What makes a problem itself: its numbers as a multiset and its target, "19,35,44|98"."""
    return f"{','.join(map(str, sorted(numbers)))}|{target}"


def split_of(key: str) -> str:
    """The one split a problem can belong to, read off a hash of its canonical key."""
    bucket = int(hashlib.sha256(key.encode()).hexdigest()[:16], 16) % TEST_BUCKETS
    return "test" if bucket == 0 else "train"


def question_text(numbers: list[int], target: int) -> str:
    """The one line the agents read."""
    shown = ", ".join(map(str, numbers))
    return f"Use the numbers {shown} once each with + - * / to make {target}. Answer with the expression."


def countdown_gold(numbers: list[int], target: int) -> str:
    """A Countdown task's `answer`: what the grader checks against, "44 19 35 -> 98" (the numbers as
    shown, then the target). Not an answer to copy: any expression that hits the target is right."""
    return f"{' '.join(map(str, numbers))} -> {target}"


_GOLD = re.compile(r"\s*(\d+(?:\s+\d+)*)\s*->\s*(\d+)\s*")


def read_gold(gold: str) -> tuple[list[int], int]:
    """(numbers, target) of a countdown_gold text; ValueError when `gold` is not one."""
    match = _GOLD.fullmatch(gold) if isinstance(gold, str) else None
    if match is None:
        raise ValueError(
            f"a countdown answer key is 'numbers -> target', e.g. '44 19 35 -> 98', not {gold!r:.60}"
        )
    return [int(x) for x in match[1].split()], int(match[2])


def countdown_task(task_id: str, numbers: list[int], target: int, source: str, expression: str = "") -> Task:
    """The Task of one problem; `expression` (a known solution) goes into meta when given."""
    meta: dict = {"numbers": list(numbers), "target": target}
    if expression:
        meta["expression"] = expression
    return Task(
        task_id, question_text(numbers, target), countdown_gold(numbers, target), source, meta, GRADER
    )


@dataclass(frozen=True)
class Attempt:
    """What one attempt shows, against the problem's numbers and target (check_attempt).

    Attributes:
        value: the attempt's exact value, or None when it has none (it does not parse, divides by zero,
            or uses an operation with no exact result).
        numbers_used: the numbers it writes as plain digits, in order (a "2.5" is an error instead).
        missing: given numbers it does not use (each as often as it is missing), ascending.
        extra_or_repeated: numbers it uses that were not given, or more often than given, ascending.
        hits: its value is the target.
        error: why it is not a valid Countdown expression at all (calculator's syntax error, division by
            zero, an operator or function other than + - * /, a sign in front of a number, a number
            that is not plain digits), or None.
    """

    value: Fraction | None
    numbers_used: tuple[int, ...]
    missing: tuple[int, ...]
    extra_or_repeated: tuple[int, ...]
    hits: bool
    error: str | None = None

    @property
    def solves(self) -> bool:
        """Right: a valid expression that uses exactly the given numbers and hits the target."""
        return self.hits and self.error is None and not self.missing and not self.extra_or_repeated


def check_attempt(expression: str, numbers: list[int], target: int) -> Attempt:
    """Why an attempt at the problem (`numbers`, `target`) hits or misses; pure, never raises.

    check_attempt("44+19+35", [44, 19, 35], 98)   -> hits, nothing missing or extra: solves
    check_attempt("44+44+35", [44, 19, 35], 98)   -> value 123, missing (19,), extra_or_repeated (44,)
    """
    if not isinstance(expression, str):
        return Attempt(None, (), tuple(sorted(numbers)), (), False, "the answer is not text")
    if len(expression) > MAX_ANSWER_CHARS:
        return Attempt(
            None, (), tuple(sorted(numbers)), (), False, f"longer than {MAX_ANSWER_CHARS} characters"
        )
    text = _without_restated_target(expression, target)
    try:
        tokens = tokenize(text)
    except CalculatorError as e:
        return Attempt(None, (), tuple(sorted(numbers)), (), False, e.message)
    used = tuple(int(t.text) for t in tokens if t.kind == "number" and _plain(t.text))
    error = _form_error(tokens)
    value: Fraction | None = None
    try:
        result, exact = evaluate(text)
        value = result if exact else None
    except CalculatorError as e:
        error = error or e.message
    given, written = Counter(numbers), Counter(used)
    return Attempt(
        value=value,
        numbers_used=used,
        missing=tuple(sorted((given - written).elements())),
        extra_or_repeated=tuple(sorted((written - given).elements())),
        hits=value is not None and value == target,
        error=error,
    )


def describe_attempt(answer: str | None, numbers: list[int], target: int) -> str:
    """What the calculator's check of an answer shows, in one or two sentences (protocol.attempt_check):
    found by code, judged by the meta-thinker.

    describe_attempt("44+19+35", [44, 19, 35], 98) -> "44+19+35 makes 98, the target 98: a hit. It uses
        each given number once."
    describe_attempt("44+44+35", [44, 19, 35], 98) -> "44+44+35 makes 123, the target 98: a miss. 44 is
        used more often than given; 19 is not used."
    """
    if not answer:
        return "There is no answer to check."
    attempt = check_attempt(answer, numbers, target)
    shown = answer.strip()[:80]
    if attempt.value is None:
        return f"{shown} has no value: {attempt.error or 'it cannot be computed'}."
    verdict = "a hit" if attempt.hits else "a miss"
    first = f"{shown} makes {format_fraction(attempt.value)}, the target {target}: {verdict}."
    problems = []
    if attempt.error is not None:
        problems.append(attempt.error)
    problems += [f"{n} is used more often than given" for n in dict.fromkeys(attempt.extra_or_repeated)]
    problems += [f"{n} is not used" for n in dict.fromkeys(attempt.missing)]
    second = "; ".join(problems) + "." if problems else "It uses each given number once."
    return f"{first} {second[0].upper()}{second[1:]}"


def format_fraction(value: Fraction) -> str:
    """A checked value as the check writes it: "81", "-3", "27/4"."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def grade_countdown(prediction: str, gold: str) -> bool:
    """Grader "countdown": `prediction` is an expression that solves the problem of `gold` (a
    countdown_gold text); never raises, and an unreadable gold answer grades everything wrong."""
    try:
        numbers, target = read_gold(gold)
        return check_attempt(prediction, numbers, target).solves
    except Exception:  # a prediction is model output: nothing it holds may raise
        return False


def _without_restated_target(text: str, target: int) -> str:
    """`text` without a trailing "= <target>" ("44+19+35 = 98" -> "44+19+35"); else unchanged, and then
    the calculator refuses any "=" in it."""
    left, sep, right = text.rpartition("=")
    if sep and _plain(right.strip()) and int(right.strip()) == target:
        return left
    return text


def _plain(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _form_error(tokens: list[Token]) -> str | None:
    """The first thing in `tokens` that Countdown's rules do not allow, or None."""
    previous: Token | None = None
    for token in tokens:
        if token.kind == "name":
            return f"{token.text!r} is not allowed: use only + - * / and parentheses"
        if token.kind == "number" and not _plain(token.text):
            return f"{token.text!r} is not a given number: write the numbers as plain digits"
        if token.kind == "op":
            if token.text not in (*OPERATORS, "(", ")"):
                return f"{token.text!r} is not allowed: use only + - * / and parentheses"
            unary = previous is None or (previous.kind == "op" and previous.text != ")")
            if token.text in ("+", "-") and unary:
                return f"a sign in front of a number ({token.text!r} at column {token.position + 1}) is not allowed"
        previous = token
    return None


def solve(numbers: list[int], target: int) -> str | None:
    """An expression that uses each of `numbers` once and equals `target` (fractions allowed on the
    way, as the grader allows), or None when there is none (solve_tree's, as text)."""
    found = solve_tree(numbers, target)
    return None if found is None else format_expr(found)


def solve_tree(numbers: list[int], target: int, whole: bool = False) -> Expr | None:
    """The expression tree of a solution, or None. Brute force over every way to combine two values;
    fine for the 3-4 numbers of a Countdown problem. `whole`: only solutions whose every step is a
    positive whole number (what a demonstration shows)."""
    goal = Fraction(target)
    failed: set[tuple[Fraction, ...]] = set()

    def search(items: list[tuple[Fraction, Expr]]) -> Expr | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == goal else None
        state = tuple(sorted(v for v, _ in items))
        if state in failed:
            return None
        for i, j in combinations(range(len(items)), 2):
            rest = [items[k] for k in range(len(items)) if k not in (i, j)]
            (a, x), (b, y) = items[i], items[j]
            for value, expr in _combinations(a, x, b, y):
                if whole and (value <= 0 or value.denominator != 1):
                    continue
                found = search([*rest, (value, expr)])
                if found is not None:
                    return found
        failed.add(state)
        return None

    return search([(Fraction(n), n) for n in numbers])


def value_of_exact(expr: Expr) -> Fraction | None:
    """The exact value of any expression tree, fractions allowed; None where it divides by zero."""
    if isinstance(expr, int):
        return Fraction(expr)
    op, left, right = expr
    a, b = value_of_exact(left), value_of_exact(right)
    if a is None or b is None or (op == "/" and b == 0):
        return None
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op]


def _combinations(a: Fraction, x: Expr, b: Fraction, y: Expr):
    yield a + b, ("+", x, y)
    yield a * b, ("*", x, y)
    yield a - b, ("-", x, y)
    yield b - a, ("-", y, x)
    if b:
        yield a / b, ("/", x, y)
    if a:
        yield b / a, ("/", y, x)
