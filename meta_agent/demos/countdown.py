"""Demonstration scripts for Countdown (tasks.countdown), with both verdicts.

    script = countdown_actions(task, seed=0)           # accepts, or (REVISE_SHARE of them) revises first
    script = countdown_actions(task, revise=True, mistake="repeat")

The plan names a first operation of a known solution and asks for the rest; the executor writes one
expression, checks it with one calculator call and answers with it. The reflection reads the
calculator's check of the answer (protocol.attempt_check, tasks.countdown.describe_attempt): it accepts a
hit that uses each number once; on a miss it says what the check shows (the value against the target, a
number used twice or left out) and fixes the plan's first step to another start, and the second round
carries it out. The first round's mistaken plan and work are played for the reflection to read and never
learned (demos.script.Revision).
"""

from __future__ import annotations

import random
from dataclasses import replace

from meta_agent.demos.script import GRAMMAR, DemoScript, Revision, Segment, answer_text, calculate, call_text
from meta_agent.tasks import Task
from meta_agent.tasks.countdown import (
    Expr,
    check_attempt,
    format_expr,
    format_fraction,
    read_gold,
    solve_tree,
    value_of_exact,
)
from roles import Grammar

# The share of demonstrations whose first round misses and is revised: about the share of first attempts
# the SFT'd executor gets wrong is far higher, and at half the meta-thinker sees both verdicts as often.
REVISE_SHARE = 0.5
# The misses a first round shows, drawn evenly: a valid expression with another value, one number used
# twice in place of another, one number left out.
MISTAKES = ("value", "repeat", "missing")


def countdown_actions(
    task: Task,
    seed: int = 0,
    grammar: Grammar = GRAMMAR,
    revise: bool | None = None,
    mistake: str | None = None,
) -> DemoScript:
    """The demonstration of a Countdown task: a known solution (tasks.countdown.solve_tree, every step a
    positive whole number where such a solution exists), and with `revise` (None: drawn from `seed` and the task id,
    REVISE_SHARE of them) a first round before it that misses with `mistake` (None: drawn the same way)."""
    numbers, target = read_gold(task.answer)
    tree = solve_tree(numbers, target, whole=True) or solve_tree(numbers, target)
    if tree is None:
        raise ValueError(f"{task.id}: {numbers} cannot make {target}: no demonstration")
    solution = format_expr(tree)
    plan = _plan(first_operation(tree), target, grammar)
    work = _work(solution, grammar)
    accept = _reflection(solution, numbers, target, grammar)
    script = DemoScript(task.id, "countdown", plan, work, (), accept, solution)
    if revise is None:
        revise = random.Random(f"revise|{seed}|{task.id}").random() < REVISE_SHARE
    if not revise:
        return script
    rng = random.Random(f"mistake|{seed}|{task.id}")
    mistake = mistake or rng.choice(MISTAKES)
    if mistake not in MISTAKES:
        raise ValueError(f"a Countdown demonstration's mistake must be one of {MISTAKES}, got {mistake!r}")
    wrong = mistaken_tree(numbers, target, mistake, rng, avoid=first_operation(tree))
    text = format_expr(wrong)
    revision = Revision(
        work=_work(text, grammar),
        reflection=_reflection(text, numbers, target, grammar, fix=first_operation(tree)),
        plan=_plan(first_operation(wrong), target, grammar),
    )
    return replace(script, revision=revision)


def first_operation(tree: Expr) -> tuple[str, int, int]:
    """The leftmost operation of `tree` on two given numbers: where a solution starts."""
    if isinstance(tree, int):
        raise ValueError("a single number has no operation")
    op, left, right = tree
    if isinstance(left, int) and isinstance(right, int):
        return op, left, right
    return first_operation(left if not isinstance(left, int) else right)


def mistaken_tree(
    numbers: list[int],
    target: int,
    mistake: str,
    rng: random.Random,
    avoid: tuple[str, int, int] | None = None,
) -> Expr:
    """A first attempt that misses, as `mistake` says: "value", every number once and another value;
    "repeat", one number written twice in place of another; "missing", one number left out (a problem of
    three numbers then combines two). Drawn from `rng`; its value is never the target, and it never
    starts with `avoid` (the fix's start, so the second attempt visibly tries something else)."""
    for _ in range(1000):
        leaves = list(numbers)
        rng.shuffle(leaves)
        if mistake == "repeat":
            i, j = rng.sample(range(len(leaves)), 2)
            if leaves[i] == leaves[j]:
                continue
            leaves[j] = leaves[i]
        elif mistake == "missing":
            leaves.pop()
        tree = random_tree(leaves, rng)
        value = value_of_exact(tree)
        fresh = isinstance(tree, int) or first_operation(tree) != avoid
        if value is not None and value != target and value.denominator == 1 and value > 0 and fresh:
            return tree
    raise ValueError(f"no {mistake} mistake found for {numbers} -> {target}")


def random_tree(leaves: list[int], rng: random.Random) -> Expr:
    """A random expression over `leaves` in order, each operation drawn from + - * /."""
    if len(leaves) == 1:
        return leaves[0]
    cut = rng.randint(1, len(leaves) - 1)
    return (rng.choice("+-*/"), random_tree(leaves[:cut], rng), random_tree(leaves[cut:], rng))


def _plan(start: tuple[str, int, int], target: int, grammar: Grammar) -> str:
    op, a, b = start
    steps = [
        f"Start with {a} {op} {b}.",
        f"Combine that with the other numbers to make {target}, each number once.",
        "Check the whole expression with the calculator and answer with it.",
    ]
    body = "\n".join(f"{i}. {s}" for i, s in enumerate(steps, start=1))
    return f"{grammar.plan[0]}{body}{grammar.plan[1]}"


def _work(expression: str, grammar: Grammar) -> tuple[Segment, ...]:
    text = f"I write one expression and check it.\n{call_text(expression, grammar)}"
    return Segment(text, calculate(expression)), Segment(answer_text(expression, grammar))


def _reflection(
    expression: str,
    numbers: list[int],
    target: int,
    grammar: Grammar,
    fix: tuple[str, int, int] | None = None,
) -> str:
    """An accepting reflection of a hit; with `fix` (the start to try instead) a revising one."""
    r_open, r_close = grammar.reflection
    if fix is None:
        said = f"{expression} makes {target}, the target, and uses each number once."
        return f"{r_open}{said}{r_close}{grammar.verdict[0]}accept{grammar.verdict[1]}"
    attempt = check_attempt(expression, numbers, target)
    assert attempt.value is not None and not attempt.solves
    said = [f"{expression} makes {format_fraction(attempt.value)}, not {target}."]
    said += [f"{n} is used twice." for n in dict.fromkeys(attempt.extra_or_repeated)]
    said += [f"{n} is not used." for n in dict.fromkeys(attempt.missing)]
    op, a, b = fix
    f_open, f_close = grammar.fix
    return f'{r_open}{" ".join(said)}{r_close}{f_open} step="1">Start with {a} {op} {b}.{f_close}'


__all__ = ["MISTAKES", "REVISE_SHARE", "countdown_actions", "first_operation", "mistaken_tree"]
