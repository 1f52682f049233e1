"""Demonstration scripts for pyfunc tasks (meta_agent.tasks.pyfunc), built from each problem's reference
solution.

    script = pyfunc_actions(task)               # plan, write + run on the examples, answer, accept
    script = pyfunc_actions(task, revise=True)  # a first round with a wrong constant, caught and fixed

The plan says what the function returns and asks for a run on the examples; the executor writes the
function, runs it on the question's two examples with the python tool, and answers with the function;
the reflection reads the run's output against the examples. In a revising demonstration the first
round's function uses a wrong constant (a divisor, threshold or offset one off, the next letter), its
run prints what the examples contradict, the executor answers anyway (as a small executor does), and
the reflection quotes the run against the examples and adds a plan step that names the constant.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import replace

from meta_agent.demos.script import (
    GRAMMAR,
    DemoScript,
    Revision,
    Segment,
    answer_text,
    fix_text,
    plan_text,
    reflection_text,
)
from meta_agent.tasks import Task
from meta_agent.tasks.code import grade_code
from meta_agent.tasks.pyfunc import BY_KIND
from roles import Grammar

REVISE_SHARE = 0.5  # pyfunc demonstrations whose first round goes wrong and is revised, where one can be


def pyfunc_actions(
    task: Task, seed: int = 0, grammar: Grammar = GRAMMAR, revise: bool | None = None
) -> DemoScript:
    """The demonstration of a pyfunc task (meta: template, function, params, solution, examples); with
    `revise` (None: drawn from `seed` and the task id, REVISE_SHARE of them) a first round with a wrong
    constant before it, where the template has a constant to get wrong."""
    if "solution" not in task.meta:
        raise ValueError(f"{task.id}: a pyfunc task needs meta['solution'] to build a demonstration")
    name, solution = task.meta["function"], task.meta["solution"]
    template = BY_KIND[task.meta["template"]]
    signature = f"{name}({template.arg})"
    steps = [
        f"Write {signature} so that it returns {template.text.format(**task.meta['params'])}.",
        "Run it on the two examples with the python tool.",
        "If the run matches the examples, answer with the whole function.",
    ]
    work, printed = _write_and_run(task, solution, grammar)
    expected = [y for _, y in task.meta["examples"]]
    reflection = reflection_text(
        f"The executor ran {name} on both examples; it printed {printed[0]} and {printed[1]}, and the "
        f"examples say {expected[0]!r} and {expected[1]!r}, so the function is right on them.",
        "Run the function on the examples and compare each result before answering.",
        grammar,
    )
    answer = answer_text(f"\n{solution}\n", grammar)
    script = DemoScript(
        task.id,
        "code",
        plan_text(steps, task.answer, grammar),
        (*work, Segment(answer)),
        (),
        reflection,
        solution,
    )
    if revise is None:
        revise = random.Random(f"revise|{seed}|{task.id}").random() < REVISE_SHARE
    revision = _wrong_constant(task, len(steps), grammar) if revise else None
    return replace(script, revision=revision) if revision else script


def _write_and_run(task: Task, solution: str, grammar: Grammar) -> tuple[tuple[Segment, ...], list]:
    """The executor's call that defines `solution` and prints it on each example; its expected output."""
    name = task.meta["function"]
    examples = [x for x, _ in task.meta["examples"]]
    code = solution + "\n" + "".join(f"print({name}({x!r}))\n" for x in examples)
    scope: dict = {}
    exec(solution, scope)  # noqa: S102 - the template's solution or its one-constant variant: our code
    printed = [scope[name](x) for x in examples]
    call = json.dumps({"name": "python", "arguments": {"code": code}})
    text = f"I write the function and run it on the examples.\n{grammar.tool_call[0]}{call}{grammar.tool_call[1]}"
    output = "".join(f"{y}\n" for y in printed)
    return (Segment(text, output),), printed


def _wrong_constant(task: Task, steps: int, grammar: Grammar) -> Revision | None:
    """A first round whose function has one parameter off (a number +1, a letter the next one); None
    when no such change shows on the examples and fails the hidden tests."""
    template = BY_KIND[task.meta["template"]]
    params = dict(task.meta["params"])
    name = task.meta["function"]
    expected = [y for _, y in task.meta["examples"]]
    for key in sorted(params):
        right = params[key]
        wrong = _next_letter(right) if isinstance(right, str) else right + 1
        solution = template.solution(name, {**params, key: wrong})
        work, printed = _write_and_run(task, solution, grammar)
        if printed == expected or grade_code(solution, task.answer):  # the run or the tests would not tell
            continue
        answer = answer_text(f"\n{solution}\n", grammar)
        mismatch = next(i for i in range(2) if printed[i] != expected[i])
        reflection = fix_text(
            f"The run printed {printed[mismatch]} for example {mismatch + 1}, but the example says "
            f"{expected[mismatch]!r}: the function uses {wrong!r} where the question says {right!r}.",
            "Compare the run with every example, and copy the question's constants exactly.",
            steps + 1,
            f"Use {right!r}, not {wrong!r}, as the question says.",
            grammar,
        )
        return Revision((*work, Segment(answer)), reflection)
    return None


def _next_letter(c: str) -> str:
    return string.ascii_lowercase[(string.ascii_lowercase.index(c) + 1) % 26]
