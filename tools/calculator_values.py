"""The calculator's values: exact maths on fractions with size bounds, and how results are shown.

    power(Fraction(8), Fraction(1, 3), 0)      ->  (Fraction(2), True)
    format_value(Fraction(7, 4), exact=True)   ->  "7/4 = 1.75"
    format_value(Fraction(1, 3), exact=True)   ->  "1/3 ≈ 0.33333333333333333333"

Every function returns exact fractions where the maths allows; the ones that cannot (sqrt of a
non-square, a power without an exact root) say so with a False `exact` flag.
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

from tools.types import FAILED

MAX_BITS = 100_000  # about 30,000 digits: bounds every intermediate value, so no call runs long
MAX_EXPONENT = 10_000
MAX_FACTORIAL = 1_000
FUNCTION_ARITY = {  # name: (fewest, most) arguments
    "abs": (1, 1),
    "sqrt": (1, 1),
    "round": (1, 2),
    "floor": (1, 1),
    "ceil": (1, 1),
    "min": (1, 64),
    "max": (1, 64),
    "factorial": (1, 1),
}
MAX_SHOWN_DIGITS = 1000  # longer integers are shown rounded, with their digit count
FRACTION_DIGITS = 20  # significant digits of the decimal shown next to a fraction
APPROXIMATE_DIGITS = 16  # an approximate result has no more than double precision anyway


class CalculatorError(Exception):
    """A mistake in the expression (kind BAD_CALL) or in its maths (kind FAILED), at a position."""

    def __init__(self, kind: str, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.position = position


def checked(value: Fraction, position: int) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_BITS:
        raise CalculatorError(FAILED, f"result too large (over {MAX_BITS} bits)", position)
    return value


def power(base: Fraction, exponent: Fraction, position: int) -> tuple[Fraction, bool]:
    """base ** exponent: (value, exact). Whole exponents are exact; others use an exact root if any."""
    if base == 0 and exponent < 0:
        raise CalculatorError(FAILED, "division by zero (0 raised to a negative power)", position)
    if base in (0, 1) or exponent == 0:
        return base**exponent.numerator if exponent.denominator == 1 else base, True
    if exponent.denominator == 1:
        n = exponent.numerator
        size = max(base.numerator.bit_length(), base.denominator.bit_length())
        if abs(n) > MAX_EXPONENT or size * abs(n) > MAX_BITS:
            raise CalculatorError(FAILED, f"result too large (over {MAX_BITS} bits)", position)
        return base**n, True
    q = exponent.denominator
    root = _exact_root(abs(base), q) if q <= 64 else None
    if base < 0:
        if root is None or q % 2 == 0:
            raise CalculatorError(
                FAILED, "a negative number to a fractional power is not a real number", position
            )
        root = -root
    if root is not None:
        return power(root, Fraction(exponent.numerator), position)
    try:
        approximation = float(base) ** float(exponent)
    except OverflowError:
        raise CalculatorError(FAILED, "result too large", position) from None
    if not math.isfinite(approximation):
        raise CalculatorError(FAILED, "result too large", position)
    return Fraction(approximation), False


def _exact_root(value: Fraction, q: int) -> Fraction | None:
    """The exact q-th root of a non-negative fraction, if it is rational."""
    parts = [_integer_root(n, q) for n in (value.numerator, value.denominator)]
    if parts[0] ** q != value.numerator or parts[1] ** q != value.denominator:
        return None
    return Fraction(parts[0], parts[1])


def _integer_root(n: int, q: int) -> int:
    """floor(n ** (1/q)) for n >= 0, by Newton's method on integers (floats lose big roots)."""
    if n < 2:
        return n
    x = 1 << -(-n.bit_length() // q)  # a power of two at or above the root
    while True:
        y = ((q - 1) * x + n // x ** (q - 1)) // q
        if y >= x:
            return x
        x = y


def factorial(value: Fraction, position: int) -> Fraction:
    if value.denominator != 1 or value < 0:
        raise CalculatorError(FAILED, "factorial needs a whole number >= 0", position)
    if value > MAX_FACTORIAL:
        raise CalculatorError(FAILED, f"factorial is limited to n <= {MAX_FACTORIAL}", position)
    return Fraction(math.factorial(value.numerator))


def apply_function(name: str, args: list[Fraction], position: int) -> tuple[Fraction, bool]:
    """Calls one of FUNCTION_ARITY's functions: (value, exact)."""
    x = args[0]
    if name == "sqrt":
        if x < 0:
            raise CalculatorError(FAILED, "sqrt of a negative number is not a real number", position)
        root = _exact_root(x, 2)
        if root is not None:
            return root, True
        # sqrt(p/q) = sqrt(p*q)/q, to 40 decimals, in integers only.
        scale = 10**40
        return Fraction(math.isqrt(x.numerator * x.denominator * scale**2), x.denominator * scale), False
    if name == "round":
        digits = args[1] if len(args) == 2 else Fraction(0)
        if digits.denominator != 1 or abs(digits) > 100:
            raise CalculatorError(
                FAILED, "round's digits must be a whole number between -100 and 100", position
            )
        scale = Fraction(10) ** digits.numerator
        # Half away from zero, as people round by hand (Python's round() rounds half to even).
        magnitude = math.floor(abs(x) * scale + Fraction(1, 2)) / scale
        return (magnitude if x >= 0 else -magnitude), True
    if name == "factorial":
        return factorial(x, position), True
    functions = {"abs": abs, "floor": math.floor, "ceil": math.ceil}
    if name in functions:
        return Fraction(functions[name](x)), True
    return (min(args) if name == "min" else max(args)), True


def format_value(value: Fraction, *, exact: bool) -> str:
    """The text the agent sees for a result."""
    if not exact:
        return f"≈ {decimal_text(value, APPROXIMATE_DIGITS)[0]}"
    numerator, denominator = value.numerator, value.denominator
    if denominator == 1:
        digits = digit_count(numerator)
        if digits <= MAX_SHOWN_DIGITS:
            return str(numerator)
        return f"≈ {decimal_text(value, APPROXIMATE_DIGITS)[0]} (an integer with {digits} digits)"
    if max(digit_count(numerator), digit_count(denominator)) > MAX_SHOWN_DIGITS:
        return f"≈ {decimal_text(value, FRACTION_DIGITS)[0]} (a fraction too long to show exactly)"
    text, text_exact = decimal_text(value, FRACTION_DIGITS)
    return f"{numerator}/{denominator} {'=' if text_exact else '≈'} {text}"


def digit_count(n: int) -> int:
    """Decimal digits of |n| (str() refuses ints over 4300 digits; Decimal does not)."""
    return decimal.Decimal(abs(n)).adjusted() + 1 if n else 1


def decimal_text(value: Fraction, significant: int) -> tuple[str, bool]:
    """`value` rounded half up to `significant` digits: (text, whether it is exact)."""
    with decimal.localcontext() as context:
        context.prec = significant
        context.rounding = decimal.ROUND_HALF_UP
        context.Emax, context.Emin = decimal.MAX_EMAX, decimal.MIN_EMIN
        context.traps[decimal.Inexact] = False
        context.clear_flags()
        number = decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator)
        exact = not context.flags[decimal.Inexact]
    if number == 0:
        return "0", exact
    if -7 < number.adjusted() < 21:
        text = format(number, "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text, exact
    mantissa, exponent = format(number, "e").split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{exponent}", exact
