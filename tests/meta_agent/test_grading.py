"""grade(): math-verify based answer checking; never raises, works off the main thread."""

from __future__ import annotations

import threading
import time

import pytest

from meta_agent.tasks import extract_gsm8k_answer, grade
from meta_agent.tasks.grading import normalize_gold

CORRECT = [
    # (prediction, gold)
    ("18", "18"),
    ("$18", "18"),
    ("18 dollars", "18"),
    ("\\boxed{18}", "18"),
    ("She makes 9 * 2 = 18 dollars.\nThe answer is \\boxed{18}.", "18"),
    ("The answer is 18", "18"),
    ("18.0", "18"),
    ("18%", "18"),
    ("x = 18", "18"),
    ("1,000", "1000"),
    ("1000", "1,000"),
    ("The answer is 34,354,567.", "34354567"),
    ("\\frac{2}{4}", "\\frac{1}{2}"),
    ("\\dfrac12", "\\frac{1}{2}"),
    ("0.5", "\\frac{1}{2}"),
    ("1/2", "\\frac{1}{2}"),
    ("27", "27.0"),  # AMC stores answers as floats
    ("25", "025"),  # AIME answers are zero-padded
    ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\sqrt{117}", "3\\sqrt{13}"),
    ("Evelyn", "\\text{Evelyn}"),
    ("-2, 1", "1,-2"),
    ("5", "x=5"),
    ("$32,348", "\\$32,\\!348"),
    ("6 - 5i", "6 - 5i"),
]

WRONG = [
    ("17", "18"),
    ("\\boxed{19}", "18"),
    ("18.5", "18"),
    ("\\frac{1}{3}", "\\frac{1}{2}"),
    ("1,001", "1000"),
    ("3\\sqrt{12}", "3\\sqrt{13}"),
    ("Bob", "\\text{Evelyn}"),
    ("1, 2", "1,-2"),
    # An integer gold answer needs a number, not the arithmetic that leads to it.
    ("48213*739-1275840", str(48213 * 739 - 1275840)),
    ("\\boxed{2^{10}}", "1024"),
    ("9*2", "18"),
]

GARBAGE = [
    "",
    "   ",
    "garbage",
    "\\boxed{",
    "}}}{{{\\frac",
    "$$$$",
    "\\boxed{\\frac{1}{0}}",
    "9^9^9^9",  # would make SymPy build a 370-million-digit integer
    "\\boxed{10^{10^{10}}}",
    "\\boxed{1000000!}",
    "1" * 6000,  # longer than Python's int-to-str limit
    "(" * 500 + "1" + ")" * 500,
    "\u0000\ufffd\U0001f600",
    "x" * 20_000,
]


@pytest.mark.parametrize(("prediction", "gold"), CORRECT)
def test_correct_answers_pass(prediction: str, gold: str) -> None:
    assert grade(prediction, gold)


@pytest.mark.parametrize(("prediction", "gold"), WRONG)
def test_wrong_answers_fail(prediction: str, gold: str) -> None:
    assert not grade(prediction, gold)


@pytest.mark.parametrize("prediction", GARBAGE)
def test_garbage_is_wrong_and_never_raises(prediction: str) -> None:
    assert grade(prediction, "18") is False


def test_empty_or_missing_gold_is_wrong() -> None:
    assert not grade("18", "")
    assert not grade("18", "   ")
    assert not grade(None, "18")  # type: ignore[arg-type]
    assert not grade("18", None)  # type: ignore[arg-type]


def test_grades_off_the_main_thread() -> None:
    """Rollout workers grade in threads, where math-verify's signal timeout cannot be used."""
    cases = CORRECT[:6] + WRONG[:3] + [(g, "18") for g in GARBAGE[7:10]]
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.extend(grade(p, g) for p, g in cases), daemon=True)
    started = time.perf_counter()
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "grade() hung in a worker thread"
    assert results == [True] * 6 + [False] * 6
    assert time.perf_counter() - started < 30


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        ("She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18", "18"),
        ("#### 1,080", "1080"),
        ("#### -5", "-5"),
        ("so 3.5 hours\n#### 3.5", "3.5"),
        ("first #### 1\nthen\n#### 2", "2"),
        ("no marker here", None),
        ("####   ", None),
    ],
)
def test_extract_gsm8k_answer(solution: str, expected: str | None) -> None:
    assert extract_gsm8k_answer(solution) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(27.0, "27"), (-1.0, "-1"), (2.5, "2.5"), ("025", "025"), (" \\frac{1}{2} ", "\\frac{1}{2}"), (7, "7")],
)
def test_normalize_gold(raw: str | float, expected: str) -> None:
    assert normalize_gold(raw) == expected
