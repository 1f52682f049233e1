"""Demonstration scripts for arith tasks, built from a task's canonical expression.

    script = arith_actions(task, style="steps")  # one calculator call per operation
    ops = arith_ops("(12*34+5)/7")  # [("mul", (12, 34)), ("add", (5,)), ("div", (7,))]

The plan lists the operations with the question's numbers ("1. Multiply 30,662 by 6,330.
2. Add 164."), never a result; the executor makes one calculator call for the whole
expression ("one_call") or one per operation ("steps").
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from meta_agent.demos.script import (
    GENERIC_PLAN,
    GRAMMAR,
    DemoScript,
    Revision,
    Segment,
    answer_text,
    calculate,
    call_text,
    fix_text,
    join_words,
    plan_text,
    reflection_text,
)
from meta_agent.tasks import Task
from roles import Grammar, plan_steps

STYLES = ("one_call", "steps")  # arith: the whole expression in one call, or one call per operation
# arith_distract: the share of demonstrations whose first round goes wrong and is revised ...
REVISE_SHARE = 0.5
# ... and the mistakes they show, drawn evenly: the executor folds the distractor in, or the plan gets an
# add or subtract step backwards ("A donor sends 462 more seeds" planned as "Subtract 462."), the two the
# trained hierarchy made (docs/results/reflection.md).
MISTAKES = ("distractor", "operation")
# With reflections written as one check (sft.source=arith_distract_check) a third: the plan leaves out a
# step, most wrong answers' mistake after SFT on the checks. (As a third mistake of the default reflections,
# whose openings differ by mistake, one more opening made the accepting one the likeliest; the checks all
# open alike: docs/results/reflection.md.)
CHECK_MISTAKES = (*MISTAKES, "missing")
# ... drawn twice as often as each of the others: a step left out is what the trained hierarchy gets wrong
# most, and drawn evenly (problems that end in a division fall back to the distractor) "Left out" was too
# rare in the demonstrations for the trained meta-thinker to write it (docs/results/reflection.md).
CHECK_WEIGHTS = (1, 1, 2)
ARITH_STEPS = (2, 3, 4)  # demonstrations mix problem lengths, so longer problems are seen too

_ARITH = re.compile(r"(\()?(\d+)\*(\d+)((?:[+-]\d+(?:\*\d+)?)*)(\))?(?:/(\d+))?")
_TERM = re.compile(r"([+-])(\d+)(?:\*(\d+))?")

# One plan step per operation, with the question's numbers: the plan carries the decomposition (which
# numbers, which operation, in what order), the executor turns it into calculator calls.
_PLAN_STEPS = {
    "add": "Add {c}.",
    "sub": "Subtract {c}.",
    "add_product": "Add {c} times {d}.",
    "sub_product": "Subtract {c} times {d}.",
    "div": "Divide by {c}.",
}
# An add or subtract step and the one a plan that gets it backwards writes instead
_BACKWARDS = {"add": "sub", "sub": "add", "add_product": "sub_product", "sub_product": "add_product"}
_NAMES = {
    "add": "the addition",
    "sub": "the subtraction",
    "add_product": "the added product",
    "sub_product": "the subtracted product",
    "div": "the division",
}


def arith_ops(expression: str) -> list[tuple[str, tuple[int, ...]]]:
    """The operations of a canonical arith expression, the opening product first.

    "(648049*3185+564245)/155" -> [("mul", (648049, 3185)), ("add", (564245,)), ("div", (155,))]
    """
    m = _ARITH.fullmatch(expression)
    if m is None or bool(m[1]) != bool(m[5]) or bool(m[1]) != bool(m[6]):
        raise ValueError(f"{expression!r} is not a canonical arith expression such as '(12*34+5)/7'")
    ops: list[tuple[str, tuple[int, ...]]] = [("mul", (int(m[2]), int(m[3])))]
    for sign, c, d in _TERM.findall(m[4]):
        kind = ("add" if sign == "+" else "sub") + ("_product" if d else "")
        ops.append((kind, (int(c), int(d)) if d else (int(c),)))
    if m[6]:
        ops.append(("div", (int(m[6]),)))
    return ops


def arith_actions(
    task: Task, style: str | None = None, seed: int = 0, grammar: Grammar = GRAMMAR
) -> DemoScript:
    """The ideal turns for an arith task (meta["expression"]), in `style` "one_call" (the whole
    expression, numbers written as in the question) or "steps" (one call per operation on the
    previous result); None draws the style from `seed` and the task id. The plan lists the
    operations with the question's numbers; nothing in it states a result."""
    if "expression" not in task.meta:
        raise ValueError(f"{task.id}: an arith task needs meta['expression'] to build a demonstration")
    style = style or random.Random(f"demo|{seed}|{task.id}").choice(STYLES)
    if style not in STYLES:
        raise ValueError(f"arith demonstration style must be one of {STYLES}, got {style!r}")
    ops = arith_ops(task.meta["expression"])
    steps = _plan_steps(ops, style)
    if style == "one_call":
        work, answer = _one_call(ops, grammar)
        how = "in one calculator expression"
        lesson = (
            "Write the whole calculation as one calculator expression, then copy the result into the answer."
        )
    else:
        work, answer = _step_calls(ops, grammar)
        how = "one calculator call at a time"
        lesson = "Do one operation per calculator call, carry each result into the next call, and answer with the last result."
    if answer != task.answer:
        raise ValueError(
            f"{task.id}: the calculator gives {answer} for {task.meta['expression']}, not {task.answer}"
        )
    whole = _written(ops)
    names = join_words(list(dict.fromkeys(["the product", *(_NAMES[k] for k, _ in ops[1:])])))
    reflection = reflection_text(
        f"The executor computed {names} {how}, and its answer is the calculator's result, so the result "
        "is consistent.",
        lesson,
        grammar,
    )
    check = (
        Segment(
            f"I check the whole calculation with one calculator call.\n{call_text(whole, grammar)}", answer
        ),
        Segment(answer_text(answer, grammar)),
    )
    return DemoScript(task.id, style, plan_text(steps, task.answer, grammar), work, check, reflection, answer)


def _plan_steps(ops: list[tuple[str, tuple[int, ...]]], style: str) -> list[str]:
    """The plan's steps: one per operation with the question's numbers, then how to work (`style`)."""
    (a, b) = ops[0][1]
    steps = [f"Multiply {a:,} by {b:,}."]
    steps += [_step(kind, numbers) for kind, numbers in ops[1:]]
    if style == "one_call":
        return [*steps, "Write it as one calculator expression and answer with its result."]
    return [*steps, "Use one calculator call per step and answer with the last result."]


def _step(kind: str, numbers: tuple[int, ...]) -> str:
    return _PLAN_STEPS[kind].format(**dict(zip("cd", (f"{x:,}" for x in numbers), strict=False)))


def _written(ops: list[tuple[str, tuple[int, ...]]]) -> str:
    """The whole calculation with the numbers as the question writes them: "30,662 * 6,330 + 164"."""
    a, b = ops[0][1]
    expr = f"{a:,} * {b:,}"
    for kind, numbers in ops[1:]:
        if kind == "div":
            expr = f"({expr}) / {numbers[0]:,}"
        else:
            expr += f" {'+' if kind.startswith('add') else '-'} " + " * ".join(f"{x:,}" for x in numbers)
    return expr


def _one_call(ops, grammar: Grammar) -> tuple[tuple[Segment, ...], str]:
    whole = _written(ops)
    result = calculate(whole)
    text = f"I write the whole calculation as one expression.\n{call_text(whole, grammar)}"
    return (Segment(text, result), Segment(answer_text(result, grammar))), result


def _step_calls(ops, grammar: Grammar) -> tuple[tuple[Segment, ...], str]:
    a, b = ops[0][1]
    expression, sentence = f"{a:,} * {b:,}", f"First I multiply {a:,} by {b:,}."
    segments = []
    for i in range(len(ops)):
        result = calculate(expression)
        segments.append(Segment(f"{sentence}\n{call_text(expression, grammar)}", result))
        if i + 1 == len(ops):
            break
        kind, numbers = ops[i + 1]
        c = f"{numbers[0]:,}"
        d = f"{numbers[1]:,}" if len(numbers) > 1 else ""
        expression, sentence = {
            "add": (f"{result} + {c}", f"Then I add {c}."),
            "sub": (f"{result} - {c}", f"Then I subtract {c}."),
            "add_product": (f"{result} + {c} * {d}", f"Then I add {c} times {d}."),
            "sub_product": (f"{result} - {c} * {d}", f"Then I subtract {c} times {d}."),
            "div": (f"{result} / {c}", f"Then I divide by {c}."),
        }[kind]
    return (*segments, Segment(answer_text(result, grammar))), result


def distract_actions(
    task: Task,
    style: str | None = None,
    seed: int = 0,
    grammar: Grammar = GRAMMAR,
    revise: bool | None = None,
    mistake: str | None = None,
    check: bool = False,
) -> DemoScript:
    """The demonstration of an arith_distract task (meta["distractors"]): the arith demonstration,
    and with `revise` (None: drawn from `seed` and the task id, REVISE_SHARE of them) a first round
    before it that goes wrong with `mistake` (None: drawn the same way, one of MISTAKES):
    - "distractor": the executor adds the first distractor, as a small executor does; the reflection
      quotes the sentence the number comes from and says the asked quantity does not depend on it;
    - "operation": the plan gets one add or subtract step backwards and the executor follows it; the
      reflection quotes that step and the sentence of its number, and says what the sentence means.
    The reflection then revises the plan; the second round is the arith demonstration's work, accepted.
    That first round's mistaken turns are never learned. An operation mistake whose sentence cannot be
    told apart (its number in two sentences) is shown as a distractor mistake instead.

    `check` (sft.source=arith_distract_check) writes every reflection, accepting or revising, as the
    same check (check_lines): each operation of the plan against the question's sentence with its
    number, then the numbers the executor took from the question against the plan's; the verdict follows
    from the line that found something. The default reflections open differently by verdict, so the
    choice between accepting and revising is made in their first words, before any checking."""
    script = arith_actions(task, style, seed, grammar)
    if check:
        ops = arith_ops(task.meta["expression"])
        used = [n for _, numbers in ops for n in numbers]
        body = check_lines(task.question, ops, ops, used, tuple(task.meta["distractors"]))
        lesson = "Check each step against its sentence, and each number of the work against the plan."
        script = replace(
            script, reflection=reflection_text(f"{body}\nSo the answer stands.", lesson, grammar)
        )
    if revise is None:
        revise = random.Random(f"revise|{seed}|{task.id}").random() < REVISE_SHARE
    if not revise:
        return script
    kinds = CHECK_MISTAKES if check else MISTAKES
    if mistake is None:
        rng = random.Random(f"mistake|{seed}|{task.id}")
        mistake = rng.choices(kinds, CHECK_WEIGHTS)[0] if check else rng.choice(kinds)
    if mistake not in kinds:
        raise ValueError(f"a demonstration's mistake must be one of {kinds}, got {mistake!r}")
    revision = None
    if mistake == "operation":
        revision = _operation_revision(task, script, seed, grammar, check)
    elif mistake == "missing":
        revision = _missing_revision(task, script, seed, grammar)
    return replace(script, revision=revision or _distractor_revision(task, script, grammar, check))


def check_lines(
    question: str,
    plan_ops: list[tuple[str, tuple[int, ...]]],
    true_ops: list[tuple[str, tuple[int, ...]]],
    used: list[int],
    distractors: tuple[int, ...] = (),
) -> str:
    """A reflection's check of one round. A line per operation of the plan (`plan_ops`, as arith_ops gives
    them) read against the first sentence of the question with its number: "Agrees.", or, where the
    question's own operation on that number (`true_ops`) is the other way, "Backwards: the question adds
    it." ("takes it away"). Then a line per number of the question the plan lacks, in the question's
    order: a `distractors` number "does not matter", one the question's operations need "Left out". Then
    the numbers of the question the executor used (`used`, in order) against the plan's, with the
    sentence of any the plan lacks.

    check_lines("It has 5 boxes of 3. It gets 2 more. It had 9 visits.", [("mul", (5, 3)),
    ("sub", (2,))], [("mul", (5, 3)), ("add", (2,))], [5, 3, 2, 9], distractors=(9,)) ->
    'Step 1, "Multiply 5 by 3.": "It has 5 boxes of 3." Agrees.\n'
    'Step 2, "Subtract 2.": "It gets 2 more." Backwards: the question adds it.\n'
    'Not in the plan: 9, "It had 9 visits." The asked quantity does not depend on it.\n'
    'The numbers of the question in the work: 5, 3, 2 and 9; 9 is in no step: "It had 9 visits."'
    """
    truth = {numbers[0]: kind for kind, numbers in true_ops}
    lines = []
    for k, (kind, numbers) in enumerate(plan_ops, start=1):
        step = f"Multiply {numbers[0]:,} by {numbers[1]:,}." if kind == "mul" else _step(kind, numbers)
        sentence = _sentences_with(question, f"{numbers[0]:,}")[0]
        real = truth.get(numbers[0], kind)
        verdict = "Agrees."
        if real != kind:
            verdict = f"Backwards: the question {'adds it' if real.startswith('add') else 'takes it away'}."
        lines.append(f'Step {k}, "{step}": "{sentence}" {verdict}')
    planned = {n for _, numbers in plan_ops for n in numbers}
    unplanned = [numbers[0] for _, numbers in true_ops if numbers[0] not in planned]
    unplanned += [d for d in distractors if d not in planned]
    for n in sorted(unplanned, key=lambda x: question.find(f"{x:,}")):
        sentence = _sentences_with(question, f"{n:,}")[0]
        if n in distractors:
            lines.append(f'Not in the plan: {n:,}, "{sentence}" The asked quantity does not depend on it.')
        else:
            how = "adds it" if truth[n].startswith("add") else "takes it away"
            lines.append(f'Not in the plan: {n:,}, "{sentence}" Left out: the question {how}.')
    order = list(dict.fromkeys(used))
    shown = join_words([f"{n:,}" for n in order])
    extra = [n for n in order if n not in planned]
    if not extra:
        lines.append(f"The numbers of the question in the work: {shown}, all in the plan.")
    else:
        missing = "; ".join(f'{n:,} is in no step: "{_sentences_with(question, f"{n:,}")[0]}"' for n in extra)
        lines.append(f"The numbers of the question in the work: {shown}; {missing}")
    return "\n".join(lines)


def _missing_revision(task: Task, script: DemoScript, seed: int, grammar: Grammar) -> Revision | None:
    """A first round whose plan leaves out one add or subtract step (the executor follows it), and the
    check that finds the question's number the plan lacks; the fix appends the step. None where the
    problem ends with a division (an appended step would come after it) or the plan cannot be written."""
    ops = arith_ops(task.meta["expression"])
    choices = [i for i, (kind, _) in enumerate(ops) if kind in _BACKWARDS]
    if any(kind == "div" for kind, _ in ops) or not choices:
        return None
    k = random.Random(f"missing|{seed}|{task.id}").choice(choices)
    kind, numbers = ops[k]
    if len(_sentences_with(task.question, f"{numbers[0]:,}")) != 1:
        return None
    wrong_ops = [*ops[:k], *ops[k + 1 :]]
    steps = _plan_steps(wrong_ops, script.style)
    plan = plan_text(steps, task.answer, grammar)
    if GENERIC_PLAN in plan:
        return None
    work, wrong = (_one_call if script.style == "one_call" else _step_calls)(wrong_ops, grammar)
    if wrong == script.answer:
        raise ValueError(f"{task.id}: leaving out step {k + 1} leaves the answer as it was")
    used = [n for _, xs in wrong_ops for n in xs]
    body = check_lines(task.question, wrong_ops, ops, used, tuple(task.meta["distractors"]))
    reflection = fix_text(
        f"{body}\nSo a step is missing.",
        "Check that every number the asked quantity depends on has its step in the plan.",
        len(steps) + 1,
        _step(kind, numbers),
        grammar,
    )
    return Revision(work, reflection, plan=plan)


def _distractor_revision(task: Task, script: DemoScript, grammar: Grammar, check: bool = False) -> Revision:
    """A first round whose executor adds the first distractor, and the reflection that catches it
    (with `check`, written as check_lines)."""
    distractor = f"{task.meta['distractors'][0]:,}"
    sentence = _sentences_with(task.question, distractor)[0]
    if script.style == "one_call":
        whole = f"{_written(arith_ops(task.meta['expression']))} + {distractor}"
        wrong = calculate(whole)
        text = f"I write the whole calculation as one expression.\n{call_text(whole, grammar)}"
        work: tuple[Segment, ...] = (Segment(text, wrong),)
    else:
        last = script.work[-2].result  # the result of the last operation, before the answer segment
        wrong = calculate(f"{last} + {distractor}")
        text = f"Then I add {distractor}.\n{call_text(f'{last} + {distractor}', grammar)}"
        work = (*script.work[:-1], Segment(text, wrong))
    if wrong == script.answer:
        raise ValueError(f"{task.id}: adding the distractor {distractor} leaves the answer as it was")
    steps = plan_steps(script.plan.removeprefix(grammar.plan[0]).removesuffix(grammar.plan[1]))
    ops = arith_ops(task.meta["expression"])
    said = f'The executor added {distractor}, which the question gives only in "{sentence}" The asked quantity does not depend on it.'
    if check:
        used = [*(n for _, numbers in ops for n in numbers), task.meta["distractors"][0]]
        said = (
            f"{check_lines(task.question, ops, ops, used, tuple(task.meta['distractors']))}\n"
            "So the executor used a number the plan does not."
        )
    reflection = fix_text(
        said,
        "Use only the numbers the asked quantity depends on.",
        steps + 1,
        f"Leave out {distractor}: the question does not ask about it.",
        grammar,
    )
    return Revision((*work, Segment(answer_text(wrong, grammar))), reflection)


def _operation_revision(
    task: Task, script: DemoScript, seed: int, grammar: Grammar, check: bool = False
) -> Revision | None:
    """A first round whose plan has one add or subtract step backwards (the executor carries it out),
    and the reflection that reads the step against the question (with `check`, written as
    check_lines); None where the step's sentence is not the only one with its number, or the backwards
    plan could not be written out."""
    ops = arith_ops(task.meta["expression"])
    rng = random.Random(f"operation|{seed}|{task.id}")
    k = rng.choice([i for i, (kind, _) in enumerate(ops) if kind in _BACKWARDS])
    kind, numbers = ops[k]
    found = _sentences_with(task.question, f"{numbers[0]:,}")
    wrong_ops = [*ops[:k], (_BACKWARDS[kind], numbers), *ops[k + 1 :]]
    plan = plan_text(_plan_steps(wrong_ops, script.style), task.answer, grammar)
    if len(found) != 1 or GENERIC_PLAN in plan:
        return None
    work, wrong = (_one_call if script.style == "one_call" else _step_calls)(wrong_ops, grammar)
    if wrong == script.answer:
        raise ValueError(f"{task.id}: step {k + 1} backwards leaves the answer as it was")
    said = (
        f'Step {k + 1} of the plan says "{_step(_BACKWARDS[kind], numbers)}", but the question says '
        f'"{found[0]}" That means "{_step(kind, numbers)}"'
    )
    if check:
        used = [n for _, xs in ops for n in xs]
        body = check_lines(task.question, wrong_ops, ops, used, tuple(task.meta["distractors"]))
        said = f"{body}\nSo step {k + 1} is backwards."
    reflection = fix_text(
        said,
        "Check each step against its sentence: add what the question adds, subtract what it takes away.",
        k + 1,
        _step(kind, numbers),
        grammar,
    )
    return Revision(work, reflection, plan=plan)


def _sentences_with(question: str, number: str) -> list[str]:
    """The question's sentences that give `number` (as a whole number: "293" is not the one inside
    "7,293"), each ending with its full stop."""
    whole = re.compile(rf"(?<![\d,]){re.escape(number)}(?![\d,]*\d)")
    return [s.strip().rstrip(".") + "." for s in question.split(". ") if whole.search(s)]
