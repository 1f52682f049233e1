"""Task loaders (stored JSONL files) and the generated arithmetic family."""

from __future__ import annotations

import ast
import operator
import pickle
import re
from fractions import Fraction
from pathlib import Path

import pytest

from meta_agent.errors import BadData
from meta_agent.tasks import KNOWN_TASKS, Task, grade, load_tasks, make_arith_tasks
from meta_agent.tasks.arith import canonical_key, op_patterns, split_of
from meta_agent.tasks.datasets import DATA_ENV, REPO_DATA_DIR

# ---- stored task files ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "split", "rows"),
    [
        ("gsm8k", "train", 7473),
        ("gsm8k", "test", 1319),
        ("math500", "test", 500),
        ("aime24", "test", 30),
        ("amc23", "test", 40),
    ],
)
def test_full_files_have_expected_rows(name: str, split: str, rows: int) -> None:
    tasks = load_tasks(name, split)
    assert len(tasks) == rows
    assert [t.id for t in tasks] == [f"{name}/{split}/{i}" for i in range(rows)]
    assert all(t.source == name and t.question.strip() and t.answer.strip() for t in tasks)


def test_known_rows() -> None:
    gsm = load_tasks("gsm8k", "test")
    assert gsm[0].question.startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert gsm[0].answer == "18"
    assert gsm[0].meta["solution"].endswith("#### 18")
    assert gsm[146].answer == "2125"  # stored as "#### 2,125"
    assert load_tasks("gsm8k", "train", limit=1)[0].answer == "72"

    math = load_tasks("math500", "test", limit=5)
    assert math[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert math[0].meta["unique_id"] == "test/precalculus/807.json"
    assert math[2].answer == "\\frac{14}{3}"
    assert math[4].answer == "\\text{Evelyn}"

    aime = load_tasks("aime24", "test")
    assert aime[0].answer == "204" and aime[7].answer == "025"
    assert aime[0].question.startswith("Every morning Aya goes for a $9$-kilometer-long walk")
    amc = load_tasks("amc23", "test")
    assert amc[0].answer == "27"  # stored as the float 27.0
    assert amc[15].answer == "-1"


@pytest.mark.parametrize("name", ["gsm8k", "math500", "aime24", "amc23"])
def test_gold_answers_grade_as_correct(name: str) -> None:
    for task in load_tasks(name, "test", limit=30):
        assert grade(f"The final answer is $\\boxed{{{task.answer}}}$.", task.answer), task.id


def test_limit_takes_the_first_rows() -> None:
    full = load_tasks("math500", "test")
    assert load_tasks("math500", "test", limit=7) == full[:7]
    assert load_tasks("math500", "test", limit=0) == []
    assert len(load_tasks("aime24", "test", limit=1000)) == 30
    with pytest.raises(ValueError, match="limit"):
        load_tasks("aime24", "test", limit=-1)


def test_unknown_name_or_split_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="gsm8k, math500, aime24, amc23, arith"):
        load_tasks("gsm9k", "test")
    with pytest.raises(ValueError, match=r"\('test',\)"):
        load_tasks("math500", "train")


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "gsm8k" / "test.jsonl"))):
        load_tasks("gsm8k", "test", data_dir=tmp_path)


def test_data_dir_argument_and_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "amc23").mkdir()
    row = '{"id": 0, "problem": "What is 2+2?", "answer": 4.0, "url": "", "question": "What is 2+2?"}\n'
    (tmp_path / "amc23" / "test.jsonl").write_text(row + "\n" + row, encoding="utf-8")
    assert [t.answer for t in load_tasks("amc23", "test", data_dir=tmp_path)] == ["4", "4"]
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    assert len(load_tasks("amc23", "test")) == 2
    assert len(load_tasks("amc23", "test", data_dir=REPO_DATA_DIR)) == 40  # the argument wins


def test_broken_line_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "aime24").mkdir()
    (tmp_path / "aime24" / "test.jsonl").write_text(
        '{"problem": "p", "answer": "1"}\n{"problem": ', encoding="utf-8"
    )
    with pytest.raises(ValueError, match=r"test\.jsonl:2: not valid JSON"):
        load_tasks("aime24", "test", data_dir=tmp_path)


def test_tasks_are_hashable_and_pickle() -> None:
    tasks = load_tasks("gsm8k", "test", limit=3) + make_arith_tasks("test", 3)
    assert len(set(tasks)) == 6
    assert pickle.loads(pickle.dumps(tasks)) == tasks
    assert Task(id="cli/0", question="q", answer="", source="cli").meta == {}


# ---- generated arithmetic -------------------------------------------------------------------

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _evaluate(expression: str) -> Fraction:
    """Exact value of a canonical expression (ints, + - * /, parentheses)."""

    def walk(node: ast.expr) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise AssertionError(f"unexpected syntax in {expression!r}")

    return walk(ast.parse(expression, mode="eval").body)


def test_arith_is_deterministic_and_prefix_stable() -> None:
    a = make_arith_tasks("train", 200, seed=3)
    assert a == make_arith_tasks("train", 200, seed=3)
    assert make_arith_tasks("train", 50, seed=3) == a[:50]
    assert make_arith_tasks("train", 200, seed=4) != a
    assert load_tasks("arith", "test", limit=20, seed=3) == make_arith_tasks("test", 20, seed=3)
    assert len(load_tasks("arith", "test")) == 500


def test_arith_splits_are_disjoint() -> None:
    train = make_arith_tasks("train", 2000) + make_arith_tasks("train", 2000, seed=1)
    test = make_arith_tasks("test", 2000) + make_arith_tasks("test", 2000, seed=1)
    train_keys = {(t.meta["template"], t.meta["expression"]) for t in train}
    test_keys = {(t.meta["template"], t.meta["expression"]) for t in test}
    assert not train_keys & test_keys
    assert not {t.question for t in train} & {t.question for t in test}
    assert not {t.id for t in train} & {t.id for t in test}
    # Within a split, one problem appears once.
    assert len({t.id for t in make_arith_tasks("test", 2000)}) == 2000


@pytest.mark.parametrize("steps", [2, 3, 4])
def test_arith_answers_match_their_expression(steps: int) -> None:
    tasks = make_arith_tasks("train", 300, seed=7, steps=steps) + make_arith_tasks("test", 300, steps=steps)
    templates = set()
    for task in tasks:
        expression = task.meta["expression"]
        value = _evaluate(expression)
        assert value.denominator == 1, f"{task.id}: inexact division in {expression}"
        assert task.answer == str(value.numerator) and value >= 100
        assert task.meta["steps"] == steps == expression.count("*") + len(re.findall(r"[-+/]", expression))
        # Every operand is stated in the question, with thousands separators.
        for number in re.findall(r"\d+", expression):
            assert f"{int(number):,}" in task.question, (number, task.question)
        assert all(3 <= len(n) <= 6 for n in re.findall(r"\d+", expression.split(")/")[0]))
        assert task.id.startswith(f"arith/{task.id.split('/')[1]}/") and task.source == "arith"
        templates.add(task.meta["template"])
    assert len(templates) >= 10


def test_arith_split_follows_the_problem_hash() -> None:
    for split in ("train", "test"):
        for task in make_arith_tasks(split, 100, seed=11, steps=3):
            theme, ops = task.meta["template"].split(".")
            # "(a*b+c-d*e)/f" -> [(a, b), (c,), (d, e), (f,)]
            terms = [t for t in re.split(r"[-+/()]", task.meta["expression"]) if t]
            numbers = [tuple(int(x) for x in term.split("*")) for term in terms]
            assert split_of(canonical_key(theme, tuple(ops.split("-")[1:]), numbers)) == split


def test_arith_is_graded_on_the_computed_number() -> None:
    task = make_arith_tasks("test", 1)[0]
    assert grade(f"So the total is \\boxed{{{int(task.answer):,}}}.", task.answer)
    assert not grade(task.meta["expression"], task.answer)
    assert not grade(str(int(task.answer) + 1), task.answer)


def test_arith_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="splits"):
        make_arith_tasks("validation", 5)
    with pytest.raises(ValueError, match="steps"):
        make_arith_tasks("train", 5, steps=5)
    assert make_arith_tasks("train", 0) == []
    assert {len(p) for p in op_patterns(2)} == {1}
    assert KNOWN_TASKS["arith"] == ("train", "test")


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("7\n", "test.jsonl:1: a row must be a JSON object"),
        ('{"question": null, "answer": "#### 3"}\n', "test.jsonl:1: gsm8k/test/0: field 'question' is empty"),
        ('{"question": "q", "answer": "#### 3"}\n{"question": 4, "answer": "#### 3"}\n', "test.jsonl:2:"),
        ('{"question": "q", "answer": 5}\n', "field 'answer' must be text, not int 5"),
        ('{"question": "q"}\n', "row has no 'answer' field"),
        ('{"question": "q", "answer": "#### 3"\n', "test.jsonl:1: not valid JSON"),
        ("\n\n", "holds no rows: gsm8k/test has nothing to evaluate or train on"),
    ],
)
def test_a_malformed_task_file_is_one_clear_error_naming_file_and_line(tmp_path, rows, message) -> None:
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(rows, encoding="utf-8")
    with pytest.raises(BadData, match=re.escape(message)):
        load_tasks("gsm8k", "test", data_dir=tmp_path)
