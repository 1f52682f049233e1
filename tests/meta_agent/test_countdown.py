"""Countdown: generated problems, the fixed TinyZero test set, the grader and check_attempt's reasons."""

from __future__ import annotations

import hashlib
import json
import re
from fractions import Fraction

import pytest

from meta_agent.errors import BadData, MissingFile
from meta_agent.tasks import GRADERS, KNOWN_TASKS, Task, grade_task, load_tasks
from meta_agent.tasks.countdown import (
    MAX_NUMBER,
    MAX_TARGET,
    MIN_NUMBER,
    MIN_TARGET,
    canonical_key,
    check_attempt,
    countdown_gold,
    draw_problem,
    fixed_test_keys,
    format_expr,
    grade_countdown,
    make_countdown_tasks,
    read_gold,
    solve,
    split_of,
)
from meta_agent.tasks.custom import CustomTask
from meta_agent.tasks.datasets import REPO_DATA_DIR
from tools.calculator import evaluate

NUMBERS, TARGET = [44, 19, 35], 98
GOLD = countdown_gold(NUMBERS, TARGET)

# ---- generated problems ----------------------------------------------------------------------


def test_generated_problems_are_solved_by_their_own_expression() -> None:
    for split in ("train", "test"):
        for task in make_countdown_tasks(split, 300, seed=3):
            numbers, target, expression = task.meta["numbers"], task.meta["target"], task.meta["expression"]
            assert len(numbers) in (3, 4) and all(MIN_NUMBER <= x <= MAX_NUMBER for x in numbers)
            assert MIN_TARGET <= target <= MAX_TARGET
            assert evaluate(expression) == (Fraction(target), True)
            assert check_attempt(expression, numbers, target).solves, task.id
            assert grade_task(expression, task) and task.grader == "countdown" and task.source == "countdown"
            assert task.answer == countdown_gold(numbers, target)
            key = canonical_key(numbers, target)
            assert task.id == f"countdown/{split}/{hashlib.sha256(key.encode()).hexdigest()[:12]}"
            assert task.question == (
                f"Use the numbers {', '.join(map(str, numbers))} once each with + - * / to make {target}. "
                "Answer with the expression."
            )


def test_generated_problems_are_reproducible_and_a_prefix_of_larger_draws() -> None:
    a = make_countdown_tasks("train", 50, seed=7)
    assert a == make_countdown_tasks("train", 50, seed=7)
    assert [t.meta for t in a] == [t.meta for t in make_countdown_tasks("train", 50, seed=7)]
    assert make_countdown_tasks("train", 20, seed=7) == a[:20]
    assert [t.id for t in make_countdown_tasks("train", 50, seed=8)] != [t.id for t in a]
    assert {len(t.meta["numbers"]) for t in make_countdown_tasks("test", 30, size=4)} == {4}
    assert load_tasks("countdown", "train", limit=50, seed=7) == a
    three = load_tasks("countdown3", "test", limit=30, seed=7)
    assert three == make_countdown_tasks("test", 30, seed=7, size=3)
    assert {len(t.meta["numbers"]) for t in three} == {3}


def test_splits_are_disjoint_and_keys_unique_within_a_split() -> None:
    keys = {}
    for split in ("train", "test"):
        tasks = make_countdown_tasks(split, 3000 if split == "train" else 1000, seed=1)
        keys[split] = [canonical_key(t.meta["numbers"], t.meta["target"]) for t in tasks]
        assert len(set(keys[split])) == len(keys[split])
        assert {split_of(k) for k in keys[split]} == {split}
    assert not set(keys["train"]) & set(keys["test"])
    assert not set(keys["train"]) & fixed_test_keys()  # training never sees a problem of the fixed set


def test_the_train_split_needs_the_fixed_file_and_says_so(tmp_path) -> None:
    with pytest.raises(MissingFile, match="countdown's train split leaves out .* countdown_tinyzero/test"):
        make_countdown_tasks("train", 5, data_dir=tmp_path)
    assert len(make_countdown_tasks("test", 5, data_dir=tmp_path)) == 5  # the test split does not read it


def test_canonical_key_ignores_the_order_of_the_numbers() -> None:
    assert canonical_key([44, 19, 35], 98) == canonical_key([35, 44, 19], 98) == "19,35,44|98"
    assert canonical_key([44, 19, 35], 97) != canonical_key([44, 19, 35], 98)


def test_every_step_of_a_generated_expression_is_a_positive_integer() -> None:
    import random

    rng = random.Random(0)
    for _ in range(300):
        _, expr = draw_problem(rng, 4)
        stack = [expr]
        while stack:  # value_of raises on an inexact division; check the sign of every subtree too
            node = stack.pop()
            value, exact = evaluate(format_expr(node))
            assert exact and value.denominator == 1 and value > 0
            if isinstance(node, tuple):
                stack.extend(node[1:])


def test_expressions_keep_their_tree_in_text() -> None:
    assert format_expr(("*", ("-", 71, 63), 9)) == "(71-63)*9"
    assert format_expr(("-", 9, ("+", 4, 2))) == "9-(4+2)"
    assert format_expr(("+", 9, ("-", 4, 2))) == "9+(4-2)"
    assert format_expr(("/", 72, ("*", 4, 2))) == "72/(4*2)"
    assert format_expr(("+", ("*", 8, 5), 58)) == "8*5+58"


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="splits"):
        make_countdown_tasks("validation", 5)
    with pytest.raises(ValueError, match="3 or 4"):
        make_countdown_tasks("train", 5, size=5)
    assert make_countdown_tasks("train", 0) == []
    assert KNOWN_TASKS["countdown"] == ("train", "test") and KNOWN_TASKS["countdown_tinyzero"] == ("test",)
    with pytest.raises(ValueError, match="has splits"):
        load_tasks("countdown_tinyzero", "train")


# ---- the fixed test set ------------------------------------------------------------------------


def test_the_fixed_file_loads_with_its_rows_and_ids() -> None:
    path = REPO_DATA_DIR / "countdown_tinyzero" / "test.jsonl"
    assert hashlib.sha256(path.read_bytes()).hexdigest()[:16] == "cfbc3ea158ccec03"  # data/README.md
    tasks = load_tasks("countdown_tinyzero", "test")
    assert len(tasks) == 2001
    assert [t.id for t in tasks] == [f"countdown_tinyzero/test/{i}" for i in range(2001)]
    first = tasks[0]
    assert first.meta == {"numbers": [96, 7, 37, 74], "target": 55} and first.answer == "96 7 37 74 -> 55"
    assert first.question.startswith("Use the numbers 96, 7, 37, 74 once each")
    assert {t.grader for t in tasks} == {"countdown"} and {t.source for t in tasks} == {"countdown_tinyzero"}
    assert {len(t.meta["numbers"]) for t in tasks} == {3, 4}
    assert len(load_tasks("countdown_tinyzero", "test", limit=5)) == 5


def test_a_sample_of_the_fixed_file_is_solvable() -> None:
    # The whole file is (2001 of 2001, data/README.md); a strided sample keeps this test fast.
    for task in load_tasks("countdown_tinyzero", "test")[::40]:
        found = solve(task.meta["numbers"], task.meta["target"])
        assert found is not None and grade_task(found, task), task.id


def test_a_malformed_fixed_file_row_is_named(tmp_path) -> None:
    (tmp_path / "countdown_tinyzero").mkdir()
    path = tmp_path / "countdown_tinyzero" / "test.jsonl"
    path.write_text(json.dumps({"target": 5, "nums": [1, "2", 3]}) + "\n", encoding="utf-8")
    with pytest.raises(BadData, match=re.escape("test.jsonl:1: countdown_tinyzero/test/0: 'target' must")):
        load_tasks("countdown_tinyzero", "test", data_dir=tmp_path)
    path.write_text(json.dumps({"target": 5}) + "\n", encoding="utf-8")
    with pytest.raises(BadData, match="no 'nums' field"):
        load_tasks("countdown_tinyzero", "test", data_dir=tmp_path)


def test_solve_finds_fraction_steps_and_says_when_there_is_none() -> None:
    found = solve([3, 3, 8, 8], 24)  # only 8/(3-8/3)
    assert found is not None and check_attempt(found, [3, 3, 8, 8], 24).solves
    assert solve([1, 1, 1], 50) is None


# ---- the grader ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        "44+19+35",
        "(44 + 19) + 35",
        "35+19+44",
        " 44+19+35 ",
        "44+19+35 = 98",  # restating the target after "=" is allowed
        "(44)+((19))+35",
        "19+35+44",
    ],
)
def test_right_answers(answer: str) -> None:
    assert grade_countdown(answer, GOLD)


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("44+19-35", "wrong value"),
        ("44+44+35", "44 used twice, 19 missing"),
        ("44+19+35+0", "0 is not given"),
        ("44+54", "a number not given, two missing"),
        ("44+19", "35 missing"),
        ("98", "a bare number"),
        ("44/(19-19)+35", "division by zero"),
        ("garbage", "text"),
        ("", "nothing"),
        ("44+19+35 = 97", "a wrong restated target"),
        ("98 = 44+19+35", "the target on the left"),
        ("44+19+35.0", "a decimal"),
        ("+44+19+35", "a plus sign in front"),
        ("44*(-19)+35", "a sign after an opening parenthesis"),
        ("44+19+35^1", "another operator"),
        ("abs(44)+19+35", "a function"),
        ("44+19+35 98", "two expressions"),
        ("4 4+19+35", "digits split"),
    ],
)
def test_wrong_answers(answer: str, why: str) -> None:
    assert not grade_countdown(answer, GOLD), why


def test_a_sign_in_front_of_a_number_is_not_allowed_even_when_the_value_hits() -> None:
    gold = countdown_gold([10, 30, 78], 98)
    assert grade_countdown("30+78-10", gold) and not grade_countdown("-10+30+78", gold)
    assert check_attempt("-10+30+78", [10, 30, 78], 98).hits


def test_unicode_signs_read_as_the_calculator_reads_them() -> None:
    # The calculator tool reads × ÷ − as * / -, so the grader does: one reading for the tool and the grade.
    assert grade_countdown("(44 − 35) × 19 − 73", countdown_gold([44, 35, 19, 73], 98))
    assert grade_countdown("44 ÷ 4 + 87", countdown_gold([44, 4, 87], 98))
    assert not grade_countdown("44 x 2 + 10", countdown_gold([44, 2, 10], 98))  # "x" is not a sign


def test_the_grader_never_raises() -> None:
    for prediction in [None, 42, "9" * 2000, "(" * 500 + "1" + ")" * 500, "9^9^9^9", "1/0", "\x00"]:
        assert grade_countdown(prediction, GOLD) is False  # type: ignore[arg-type]
    assert grade_countdown("44+19+35", "not a key") is False
    assert grade_countdown("44+19+35", GOLD + "1") is False  # another target: 981


def test_a_task_is_graded_by_the_countdown_grader() -> None:
    assert GRADERS["countdown"] is grade_countdown
    task = Task("cd/test/0", "Use the numbers 44, 19, 35 ...", GOLD, "cd", grader="countdown")
    assert grade_task("(44+19)+35", task) and not grade_task("98", task)


def test_gold_keys_read_back() -> None:
    assert read_gold("44 19 35 -> 98") == ([44, 19, 35], 98)
    assert read_gold(" 7  8->15 ") == ([7, 8], 15)
    for bad in ["44,19,35 -> 98", "-> 98", "44 19 35", "44 19 35 -> -98", "a -> 1"]:
        with pytest.raises(ValueError, match="numbers -> target"):
            read_gold(bad)


def test_a_custom_task_may_grade_by_countdown_and_its_keys_are_checked(tmp_path) -> None:
    path = tmp_path / "cd.jsonl"
    path.write_text(json.dumps({"question": "44 19 35 to 98?", "answer": "44 19 35 -> 98"}) + "\n")
    [task] = load_tasks("cd", "test", custom={"cd": CustomTask(path=str(path), grader="countdown")})
    assert grade_task("44+19+35", task)
    path.write_text(json.dumps({"question": "q", "answer": "98"}) + "\n")
    with pytest.raises(BadData, match=re.escape("cd.jsonl:1: field 'answer': a countdown answer key")):
        load_tasks("cd", "test", custom={"cd": CustomTask(path=str(path), grader="countdown")})


# ---- check_attempt: why an attempt misses --------------------------------------------------------


def test_check_attempt_on_a_hit() -> None:
    right = check_attempt("(44+19)+35", NUMBERS, TARGET)
    assert (right.value, right.numbers_used, right.missing, right.extra_or_repeated) == (
        98,
        (44, 19, 35),
        (),
        (),
    )
    assert right.hits and right.error is None and right.solves


def test_check_attempt_reasons_by_hand() -> None:
    wrong_value = check_attempt("44+35-19", NUMBERS, TARGET)
    assert wrong_value.value == 60 and not wrong_value.hits and not wrong_value.missing
    assert wrong_value.error is None and not wrong_value.solves

    twice = check_attempt("44+44+10", NUMBERS, TARGET)  # hits, but with 44 twice and a 10 not given
    assert twice.hits and twice.numbers_used == (44, 44, 10)
    assert twice.missing == (19, 35) and twice.extra_or_repeated == (10, 44) and not twice.solves

    bare = check_attempt("98", NUMBERS, TARGET)
    assert bare.hits and bare.missing == (19, 35, 44) and bare.extra_or_repeated == (98,) and not bare.solves

    fraction = check_attempt("44/35+19", NUMBERS, TARGET)
    assert fraction.value == Fraction(44, 35) + 19 and fraction.error is None and not fraction.hits

    zero = check_attempt("44/(19-19)", NUMBERS, TARGET)
    assert zero.value is None and zero.error == "division by zero" and zero.missing == (35,)
    assert zero.extra_or_repeated == (19,)

    sign = check_attempt("-44+19+35", NUMBERS, TARGET)
    assert sign.value == 10 and sign.error == "a sign in front of a number ('-' at column 1) is not allowed"

    power = check_attempt("44+19+35^1", NUMBERS, TARGET)
    assert power.hits and power.error == "'^' is not allowed: use only + - * / and parentheses"
    assert power.extra_or_repeated == (1,) and not power.solves

    garbage = check_attempt("the answer", NUMBERS, TARGET)
    assert garbage.value is None and garbage.numbers_used == () and garbage.missing == (19, 35, 44)
    assert garbage.error == "'the' is not allowed: use only + - * / and parentheses"

    equals = check_attempt("44+19+35=97", NUMBERS, TARGET)
    assert equals.value is None and equals.error == "unexpected character '='"

    decimal = check_attempt("44.0+19+35", NUMBERS, TARGET)
    assert decimal.error == "'44.0' is not a given number: write the numbers as plain digits"
    assert decimal.numbers_used == (19, 35) and decimal.missing == (44,)

    assert check_attempt(None, NUMBERS, TARGET).error == "the answer is not text"  # type: ignore[arg-type]
