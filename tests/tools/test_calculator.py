"""Calculator: results worked out by hand, precedence, exact fractions, and errors as data."""

from __future__ import annotations

import random
import time

import pytest

from tools.calculator import Calculator, tokenize
from tools.types import BAD_CALL, FAILED


def calc(expression: str) -> str:
    result = Calculator()({"expression": expression})
    assert result.ok, result.output
    return result.output


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("2 + 3 * 4", "14"),  # * before +
        ("(2 + 3) * 4", "20"),
        ("2^10 - 3*(4+5)", "997"),
        ("10 - 4 - 3", "3"),  # left-associative
        ("2^3^2", "512"),  # right-associative: 2^9
        ("2**3", "8"),
        ("-2^2", "-4"),  # unary minus binds looser than power
        ("(-2)^2", "4"),
        ("2^-2", "1/4 = 0.25"),
        ("--3", "3"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),  # floor division rounds down
        ("-7 % 3", "2"),
        ("5!", "120"),
        ("3!!", "720"),
        ("factorial(0)", "1"),
    ],
)
def test_precedence_and_operators(expression: str, expected: str) -> None:
    assert calc(expression) == expected


def test_big_numbers_stay_exact() -> None:
    assert calc("123456789*987654321") == "121932631112635269"
    assert calc("2^100") == "1267650600228229401496703205376"
    assert calc("99999999999999999999 + 1") == "100000000000000000000"
    assert calc("20!") == "2432902008176640000"


def test_fractions_are_exact_and_shown_with_their_decimal() -> None:
    assert calc("7/4") == "7/4 = 1.75"
    assert calc("0.1 + 0.2") == "3/10 = 0.3"  # no binary floating point anywhere
    assert calc("1/3") == "1/3 ≈ 0.33333333333333333333"
    assert calc("1/3 * 3") == "1"
    assert calc("-3/4") == "-3/4 = -0.75"
    assert calc("1/8 + 1/8") == "1/4 = 0.25"


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1,234,567 + 1", "1234568"),
        ("1_000_000 * 3", "3000000"),
        ("3.25 * 4", "13"),
        (".5 + .5", "1"),
        ("1.5e3", "1500"),
        ("1e-3", "1/1000 = 0.001"),
        ("3 × 4 − 1 ÷ 2", "23/2 = 11.5"),
        ("max(1,234)", "234"),  # inside a call, commas separate arguments
        ("min(3, 1/2, 2)", "1/2 = 0.5"),
    ],
)
def test_number_formats(expression: str, expected: str) -> None:
    assert calc(expression) == expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("sqrt(16/9)", "4/3 ≈ 1.3333333333333333333"),
        ("sqrt(144)", "12"),
        ("8^(1/3)", "2"),
        ("(-8)^(1/3)", "-2"),
        ("4^(3/2)", "8"),
        ("abs(-3/4)", "3/4 = 0.75"),
        ("round(2.5)", "3"),  # half away from zero, not Python's half to even
        ("round(-2.5)", "-3"),
        ("round(3.14159, 2)", "157/50 = 3.14"),
        ("floor(-7/2)", "-4"),
        ("ceil(7/2)", "4"),
    ],
)
def test_functions(expression: str, expected: str) -> None:
    assert calc(expression) == expected


def test_irrational_results_are_marked_approximate() -> None:
    assert calc("sqrt(2)") == "≈ 1.414213562373095"
    assert calc("2^(1/2)") == "≈ 1.414213562373095"


def test_huge_results_are_bounded_and_summarised() -> None:
    assert calc("1000!") == "≈ 4.023872600770938e+2567 (an integer with 2568 digits)"
    result = Calculator()({"expression": "2^100000"})
    assert (result.ok, result.error) == (False, FAILED)
    assert "too large" in result.output
    assert Calculator()({"expression": "(10^10000)^10000"}).error == FAILED
    assert Calculator()({"expression": "factorial(1001)"}).error == FAILED


@pytest.mark.parametrize("expression", ["1/0", "5 % 0", "7 // 0", "0^-1", "1/(2-2)"])
def test_division_by_zero_is_a_failure(expression: str) -> None:
    result = Calculator()({"expression": expression})
    assert (result.ok, result.error) == (False, FAILED)
    assert "division by zero" in result.output


@pytest.mark.parametrize("expression", ["sqrt(-1)", "(-4)^(1/2)", "(-1)!", "2.5!"])
def test_maths_errors_are_failures(expression: str) -> None:
    assert Calculator()({"expression": expression}).error == FAILED


def test_syntax_errors_point_at_the_position() -> None:
    result = Calculator()({"expression": "2 + * 3"})
    assert (result.ok, result.error) == (False, BAD_CALL)
    assert result.output == (
        "syntax error at column 5: expected a number, a function or '(' but found '*'\n  2 + * 3\n      ^"
    )


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("2 +", "the end of the expression"),
        ("(1+2", "expected ')'"),
        ("2 3", "expected an operator"),
        ("7 # 3", "unexpected character '#'"),
        ("foo(3)", "unknown function 'foo'"),
        ("sqrt(1, 2)", "sqrt takes 1 argument(s), got 2"),
        ("min()", "found ')'"),
        ("import os", "unknown function 'import'"),
        ("2²", "unexpected character '²'"),
        ("٣ + 1", "unexpected character"),
        ("(" * 200 + "1" + ")" * 200, "nested more than"),
        ("-" * 500 + "1", "nested more than"),
    ],
)
def test_bad_expressions_are_bad_calls(expression: str, fragment: str) -> None:
    result = Calculator()({"expression": expression})
    assert (result.ok, result.error) == (False, BAD_CALL)
    assert fragment in result.output


def test_expression_length_is_limited() -> None:
    result = Calculator(max_chars=50)({"expression": "1+" * 30 + "1"})
    assert result.error == BAD_CALL
    assert "limit is 50" in result.output


def test_tokenizer_keeps_positions() -> None:
    tokens = tokenize("12 ** (3)")
    assert [(t.kind, t.text, t.position) for t in tokens] == [
        ("number", "12", 0),
        ("op", "**", 3),
        ("op", "(", 6),
        ("number", "3", 7),
        ("op", ")", 8),
        ("end", "", 9),
    ]


def test_random_input_never_raises_and_stays_fast() -> None:
    rng = random.Random(0)
    pieces = [*"0123456789", ".", ",", "_", "e", "+", "-", "*", "/", "%", "^", "!", "(", ")", " ", "**", "//"]
    pieces += ["sqrt(", "round(", "max(", "factorial(", "9^9", "99!"]
    start = time.monotonic()
    for _ in range(3000):
        expression = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 30)))
        result = Calculator()({"expression": expression})
        assert result.ok or result.error in (BAD_CALL, FAILED), expression
    assert time.monotonic() - start < 30
