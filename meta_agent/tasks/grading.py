"""Answer checking: is a model's final answer mathematically equal to the gold answer?

`grade(prediction, answer)` is the verifier every task family shares. It parses both sides with
math-verify (LaTeX or plain text, "\\boxed{18}", "$18", "18 dollars", "1,000", "\\frac{1}{2}") into
SymPy and compares them. A prediction is model output, so it never raises: anything it cannot read
is simply wrong.

    >>> grade("The answer is \\boxed{\\frac{2}{4}}", "\\frac{1}{2}")
    True
"""

from __future__ import annotations

import functools
import math
import re
import threading
from decimal import Decimal

import sympy
from math_verify import parse, verify
from math_verify.errors import TimeoutException

from meta_agent.tasks.countdown import grade_countdown

# math-verify interrupts slow parses and comparisons with signal.alarm, which only the main thread
# may set: elsewhere it would raise. Off the main thread we run without it and rely on the
# size guard below, which stops the inputs that are known to hang SymPy.
MAIN_THREAD_TIMEOUT_S = 5

# Final answers sit at the end of a completion; parsing only the tail bounds the regex work a
# runaway generation can cause.
MAX_PREDICTION_CHARS = 4096

# log10 bound on any number a prediction may denote. A "9^9^9^9" makes SymPy build a
# 370-million-digit integer inside one C call that no signal can interrupt; real answers are tiny.
MAX_DIGITS = 10_000.0

# Up to this length a prediction may be a bare answer rather than a completion (see _parse_prediction).
SHORT_ANSWER_CHARS = 100

_PERCENT = sympy.UnevaluatedExpr(sympy.Rational(1, 100))
_FACTORIALS = (sympy.factorial, sympy.factorial2, sympy.gamma, sympy.subfactorial)


def grade(prediction: str, answer: str) -> bool:
    """True when `prediction` states a value equal to the gold `answer`; never raises.

    The gold answer is read as the content of a \\boxed{} ("18", "27.0", "025", "\\frac{1}{2}",
    "x=5", "1,-2", "\\text{Evelyn}"). The prediction may be a whole completion: math-verify takes
    its last boxed value or final-answer phrase, else the last expression it can parse. A short
    prediction with no box is also read as a box's content, the way the gold answer is.

    When the gold answer is an integer, the prediction must state a number: an unevaluated formula
    such as "48213*739-1275840" or "2^{10}" counts as wrong, so a tool-use task cannot be solved by
    restating the question's arithmetic instead of computing it.
    """
    if not isinstance(prediction, str) or not isinstance(answer, str):
        return False
    if not prediction.strip() or not answer.strip():
        return False
    timeout = _timeout_seconds()
    try:
        gold = _parse_gold(plain_decimals(answer.strip()), timeout)
        if not gold:
            return False
        return any(
            _matches(gold, pred, timeout)
            for pred in _parse_prediction(plain_decimals(prediction[-MAX_PREDICTION_CHARS:]), timeout)
        )
    # TimeoutException derives from BaseException, so it needs naming; anything else a broken
    # prediction can trigger inside SymPy (RecursionError, ValueError, ...) is an Exception.
    except (Exception, TimeoutException):
        return False


# A number in an answer: digits with optional thousands commas, a decimal part and an exponent; a sign
# only where no letter or digit comes just before it ("2023-10-05" holds no -10 or -5)
_NUMBER = re.compile(
    r"(?:(?<![\w.])[-+])?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
)
# A number in E notation ("1e3", "2.5E-4"), which math-verify reads as its mantissa alone
_E_NOTATION = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?|\.\d+)[eE]([-+]?\d{1,4})(?![\w.])")
NUMERIC_REL_TOL = 1e-6  # grader "numeric": how far from the gold number an answer may be, relatively


def grade_exact(prediction: str, answer: str) -> bool:
    """Grader "exact": the prediction is the gold text, once both have their runs of whitespace made
    one space and their ends stripped; case counts. grade_exact(" New  York", "New York") -> True."""
    if not isinstance(prediction, str) or not isinstance(answer, str):
        return False
    return bool(answer.strip()) and " ".join(prediction.split()) == " ".join(answer.split())


def grade_numeric(prediction: str, answer: str) -> bool:
    """Grader "numeric": the last number the prediction states equals the gold number within a relative
    NUMERIC_REL_TOL (exactly, for a gold 0). Thousands commas and signs are read; units and currency
    around the number are not. grade_numeric("about $1,234.50", "1234.5") -> True; ("3.1416",
    "3.14159") -> False (a relative difference of 3e-6)."""
    gold, said = last_number(answer), last_number(prediction)
    if gold is None or said is None:
        return False
    return math.isclose(said, gold, rel_tol=NUMERIC_REL_TOL, abs_tol=0.0)


def last_number(text: str) -> float | None:
    """The last number written in `text` ("1,234.5" -> 1234.5), or None when there is none or it does
    not fit a float."""
    if not isinstance(text, str):
        return None
    found = _NUMBER.findall(text[-MAX_PREDICTION_CHARS:])
    if not found:
        return None
    value = float(found[-1].replace(",", ""))
    return value if math.isfinite(value) else None


def plain_decimals(text: str) -> str:
    """`text` with each number in E notation written out: "#### 1e3" -> "#### 1000", "2.5E-4" ->
    "0.00025". Exponents beyond MAX_DIGITS stay as written (and so grade wrong)."""

    def written_out(match: re.Match) -> str:
        if abs(int(match[2])) > MAX_DIGITS:
            return match[0]
        return format(Decimal(match[0]).normalize(), "f")

    return _E_NOTATION.sub(written_out, text)


def extract_gsm8k_answer(solution_text: str) -> str | None:
    """The number after the last "####" of a GSM8K solution, without thousands commas.

    "... so she makes $18.\\n#### 18" -> "18"; "#### 1,080" -> "1080"; no "####" -> None.
    """
    if "####" not in solution_text:
        return None
    value = solution_text.rsplit("####", 1)[1].strip()
    value = value.replace(",", "").rstrip(".").strip()
    return value or None


def normalize_gold(answer: str | int | float) -> str:
    """Gold answer as text: floats with an integral value lose their ".0" (AMC stores 27.0).

    Leading zeros of AIME answers ("025") stay: they grade as the integer 25 either way.
    """
    if isinstance(answer, bool):
        raise TypeError(f"gold answer must be text or a number, got {answer!r}")
    if isinstance(answer, float):
        return str(int(answer)) if answer.is_integer() else repr(answer)
    return str(answer).strip()


def _timeout_seconds() -> int | None:
    """math-verify's timeout for this thread: the signal alarm only works in the main thread."""
    return MAIN_THREAD_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parse_gold_cached(answer: str, timeout: int | None) -> tuple:
    # Cached because every GRPO group grades G completions against the same gold answer; a tuple
    # so no caller can mutate the cached value.
    text = answer.strip("$ ").strip()
    return tuple(parse(f"\\boxed{{{text}}}", parsing_timeout=timeout))


def _parse_gold(answer: str, timeout: int | None) -> list:
    return list(_parse_gold_cached(answer, timeout))


def _parse_prediction(prediction: str, timeout: int | None) -> list[list]:
    """The readings of a prediction to try, in order; each is one math-verify parse."""
    readings = [parse(prediction, parsing_timeout=timeout)]
    text = prediction.strip()
    if len(text) <= SHORT_ANSWER_CHARS and "\n" not in text and "\\boxed" not in text:
        # A bare answer ("-2, 1", "\dfrac12", "Evelyn") is read like the gold answer: as the content
        # of a box. Plain parsing would keep only the last number or miss LaTeX with no delimiter.
        readings.append(parse(f"\\boxed{{{text.strip('$ ')}}}", parsing_timeout=timeout))
    return [r for r in readings if r]


def _matches(gold: list, pred: list, timeout: int | None) -> bool:
    if any(_log10_bound(p) > MAX_DIGITS for p in pred if isinstance(p, sympy.Basic)):
        return False
    if isinstance(gold[0], sympy.Integer) and not _states_a_number(pred[0]):
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def _states_a_number(value: object) -> bool:
    """A number, a percentage ("18%") or an assignment of a number ("x = 18"), as opposed to a
    formula still to evaluate ("9*2")."""
    if isinstance(value, sympy.Number):
        return True
    if isinstance(value, sympy.Eq):
        return _states_a_number(value.rhs)
    # math-verify reads "18%" as 18 times an unevaluated 1/100.
    return (
        isinstance(value, sympy.Mul)
        and len(value.args) == 2
        and isinstance(value.args[0], sympy.Number)
        and value.args[1] == _PERCENT
    )


def _log10_bound(expr: sympy.Basic) -> float:
    """An upper bound on log10(1 + |value|) over the numbers in `expr`, found without evaluating it.

    Symbols and constants count as small; inf means "too large to even bound".
    """
    if isinstance(expr, sympy.Integer):
        return math.log10(abs(int(expr)) + 1)
    if isinstance(expr, sympy.Rational):
        return math.log10(abs(int(expr.p)) + 1) + math.log10(int(expr.q) + 1)
    if isinstance(expr, sympy.Float):
        return math.log10(abs(float(expr)) + 1)
    if isinstance(expr, sympy.Pow):
        exponent = _log10_bound(expr.exp)
        # |b^x| <= (|b| + 1)^(|x| + 1), and 10**exponent >= |x| + 1.
        return math.inf if exponent > 7 else _log10_bound(expr.base) * 10**exponent + 1
    if isinstance(expr, _FACTORIALS):
        n = _log10_bound(expr.args[0])
        return math.inf if n > 6 else 10**n * (n + 1)
    if not expr.args:
        return 1.0
    return sum(_log10_bound(a) for a in expr.args if isinstance(a, sympy.Basic))


def _grade_code(prediction: str, tests: str) -> bool:
    from meta_agent.tasks.code import grade_code  # the sandbox, imported only where code is graded

    return grade_code(prediction, tests)


# Graders by name (a task's `grader`; custom_tasks.<name>.grader): prediction and gold answer -> right?
# "code": the gold answer is a test program run after the prediction's code (tasks.code.grade_code).
# "countdown": the gold answer is "numbers -> target" ("44 19 35 -> 98"); the prediction an expression that
# uses each number once and equals the target (tasks.countdown.grade_countdown).
GRADERS = {
    "math": grade,
    "exact": grade_exact,
    "numeric": grade_numeric,
    "code": _grade_code,
    "countdown": grade_countdown,
}


def grade_task(prediction: str, task) -> bool:
    """`prediction` graded against `task.answer` by the task's own grader (GRADERS[task.grader]); never
    raises for a prediction."""
    return GRADERS[task.grader](prediction, task.answer)
