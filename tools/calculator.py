"""Calculator tool: exact arithmetic on fractions, with a hand-written tokenizer and parser.

    Calculator()({"expression": "7/4"})            ->  ToolResult(ok=True, output="7/4 = 1.75")
    Calculator()({"expression": "2^10 - 3*(4+5)"})  ->  ToolResult(ok=True, output="997")

Nothing is ever passed to eval, exec or ast. Grammar, loosest binding first:

    sum      := product (("+" | "-") product)*
    product  := unary (("*" | "/" | "//" | "%") unary)*
    unary    := ("-" | "+") unary | power
    power    := postfix (("^" | "**") unary)?      right-associative: -2^2 = -4, 2^-1 = 1/2
    postfix  := atom "!"*
    atom     := number | name "(" sum ("," sum)* ")" | "(" sum ")"

Numbers: 12, 1_000, 1,000,000 (groups of three, outside function calls), 3.25, .5, 1e-3.
Functions: abs, sqrt, round(x[, digits]), floor, ceil, min, max, factorial. Results stay exact
fractions; only sqrt of a non-square and non-integer powers without an exact root are approximate,
and such results are shown as "≈ decimal".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from tools.arguments import string_argument
from tools.calculator_values import (
    FUNCTION_ARITY,
    MAX_EXPONENT,
    CalculatorError,
    apply_function,
    checked,
    factorial,
    format_value,
    power,
)
from tools.types import BAD_CALL, FAILED, ToolResult

MAX_DEPTH = 100  # nesting of parentheses and unary signs; keeps the recursion far from Python's limit
ALIASES = {"×": "*", "÷": "/", "−": "-", "–": "-"}
OPERATORS = ("**", "//", "+", "-", "*", "/", "%", "^", "(", ")", ",", "!")  # longest first


@dataclass(frozen=True)
class Token:
    kind: str  # "number", "name", "op" or "end"
    text: str
    position: int  # index of the first character in the expression
    value: Fraction | None = None


def tokenize(text: str) -> list[Token]:
    """Splits an expression into tokens; commas group thousands only outside function calls."""
    tokens: list[Token] = []
    calls: list[bool] = []  # one entry per open parenthesis: does it belong to a function call?
    i = 0
    while i < len(text):
        char = ALIASES.get(text[i], text[i])
        if char.isspace():
            i += 1
        elif _digits(char) or (char == "." and _digits(text[i + 1 : i + 2])):
            value, end = _scan_number(text, i, commas_group=not any(calls[-1:]))
            tokens.append(Token("number", text[i:end], i, value))
            i = end
        elif char.isalpha() or char == "_":
            end = i
            while end < len(text) and (text[end].isalnum() or text[end] == "_"):
                end += 1
            tokens.append(Token("name", text[i:end], i))
            i = end
        else:
            if text[i] in ALIASES:
                op, width = ALIASES[text[i]], 1
            else:
                op = next((op for op in OPERATORS if text.startswith(op, i)), None)
                width = len(op or "")
            if op is None:
                raise CalculatorError(BAD_CALL, f"unexpected character {text[i]!r}", i)
            if op == "(":
                calls.append(bool(tokens) and tokens[-1].kind == "name")
            elif op == ")" and calls:
                calls.pop()
            tokens.append(Token("op", op, i))
            i += width
    tokens.append(Token("end", "", len(text)))
    return tokens


def _digits(text: str) -> bool:
    """Only ASCII digits: str.isdigit() also accepts "²" and "٣", which int() then refuses."""
    return text.isascii() and text.isdigit()


def _scan_number(text: str, start: int, *, commas_group: bool) -> tuple[Fraction, int]:
    """Reads one number at `start`: (its exact value, the index after it)."""
    i = start
    whole = ""
    while i < len(text) and (_digits(text[i]) or (text[i] == "_" and whole and _digits(text[i + 1 : i + 2]))):
        whole += text[i] if text[i] != "_" else ""
        i += 1
    # "1,234,567": a comma followed by exactly three digits continues the number.
    if commas_group and 1 <= i - start <= 3 and whole == text[start:i]:
        while (
            text[i : i + 1] == ","
            and _digits(text[i + 1 : i + 4])
            and len(text[i + 1 : i + 4]) == 3
            and not _digits(text[i + 4 : i + 5])
        ):
            whole += text[i + 1 : i + 4]
            i += 4
    fraction = ""
    if text[i : i + 1] == ".":
        i += 1
        while i < len(text) and _digits(text[i]):
            fraction += text[i]
            i += 1
    exponent = 0
    if text[i : i + 1] in ("e", "E"):
        j = i + 1 + (text[i + 1 : i + 2] in ("+", "-"))
        if _digits(text[j : j + 1]):
            end = j
            while end < len(text) and _digits(text[end]):
                end += 1
            exponent = int(text[i + 1 : end])
            if abs(exponent) > MAX_EXPONENT:
                raise CalculatorError(FAILED, f"exponent {exponent} is too large", i)
            i = end
    value = Fraction(int(whole + fraction or "0"), 10 ** len(fraction)) * Fraction(10) ** exponent
    return value, i


class Parser:
    """Recursive descent over the tokens, evaluating as it goes."""

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.index = 0
        self.depth = 0
        self.approximate = False  # set once any step could not stay exact

    @property
    def token(self) -> Token:
        return self.tokens[self.index]

    def take(self, *ops: str) -> Token | None:
        token = self.token
        if token.kind == "op" and token.text in ops:
            self.index += 1
            return token
        return None

    def expect(self, op: str, what: str) -> None:
        if self.take(op) is None:
            raise CalculatorError(
                BAD_CALL, f"expected {what} but found {_describe(self.token)}", self.token.position
            )

    def parse(self) -> Fraction:
        value = self.sum()
        if self.token.kind != "end":
            found = _describe(self.token)
            raise CalculatorError(
                BAD_CALL, f"expected an operator or the end but found {found}", self.token.position
            )
        return value

    def sum(self) -> Fraction:
        value = self.product()
        while (op := self.take("+", "-")) is not None:
            right = self.product()
            value = checked(value + right if op.text == "+" else value - right, op.position)
        return value

    def product(self) -> Fraction:
        value = self.unary()
        while (op := self.take("*", "/", "//", "%")) is not None:
            right = self.unary()
            if op.text != "*" and right == 0:
                raise CalculatorError(FAILED, "division by zero", op.position)
            if op.text == "*":
                value = value * right
            elif op.text == "/":
                value = value / right
            elif op.text == "//":
                value = Fraction(value // right)
            else:
                value = value % right
            value = checked(value, op.position)
        return value

    def unary(self) -> Fraction:
        with _Nested(self):
            if (op := self.take("-", "+")) is not None:
                value = self.unary()
                return -value if op.text == "-" else value
            return self.power()

    def power(self) -> Fraction:
        base = self.postfix()
        if (op := self.take("^", "**")) is None:
            return base
        exponent = self.unary()
        result, exact = power(base, exponent, op.position)
        self.approximate |= not exact
        return result

    def postfix(self) -> Fraction:
        value = self.atom()
        while (op := self.take("!")) is not None:
            value = factorial(value, op.position)
        return value

    def atom(self) -> Fraction:
        token = self.token
        if token.kind == "number":
            self.index += 1
            assert token.value is not None
            return token.value
        if token.kind == "name":
            self.index += 1
            return self.call(token)
        if self.take("(") is not None:
            with _Nested(self):
                value = self.sum()
            self.expect(")", "')'")
            return value
        found = _describe(token)
        raise CalculatorError(
            BAD_CALL, f"expected a number, a function or '(' but found {found}", token.position
        )

    def call(self, name: Token) -> Fraction:
        if name.text not in FUNCTION_ARITY:
            known = ", ".join(FUNCTION_ARITY)
            raise CalculatorError(BAD_CALL, f"unknown function {name.text!r}; known: {known}", name.position)
        self.expect("(", f"'(' after {name.text}")
        args = [self.sum()]
        while self.take(",") is not None:
            args.append(self.sum())
        self.expect(")", "',' or ')'")
        low, high = FUNCTION_ARITY[name.text]
        if not low <= len(args) <= high:
            count = f"{low}" if low == high else f"{low} to {high}"
            message = f"{name.text} takes {count} argument(s), got {len(args)}"
            raise CalculatorError(BAD_CALL, message, name.position)
        result, exact = apply_function(name.text, args, name.position)
        self.approximate |= not exact
        return result


class _Nested:
    """Counts nesting depth so that deeply nested input fails cleanly instead of overflowing."""

    def __init__(self, parser: Parser) -> None:
        self.parser = parser

    def __enter__(self) -> None:
        self.parser.depth += 1
        if self.parser.depth > MAX_DEPTH:
            raise CalculatorError(BAD_CALL, f"expression nested more than {MAX_DEPTH} levels deep")

    def __exit__(self, *exc: object) -> None:
        self.parser.depth -= 1


def _describe(token: Token) -> str:
    return "the end of the expression" if token.kind == "end" else repr(token.text)


def evaluate(expression: str) -> tuple[Fraction, bool]:
    """The value of `expression` and whether it is exact; raises CalculatorError."""
    parser = Parser(tokenize(expression))
    value = parser.parse()
    return value, not parser.approximate


@dataclass(frozen=True)
class Calculator:
    """Tool `calculator`, arguments {"expression": str}: exact arithmetic, result as text."""

    max_chars: int = 1000
    name: str = "calculator"
    description: str = (
        '{"expression": str}: exact arithmetic with + - * / // % ^ ! and parentheses; abs sqrt round '
        "floor ceil min max factorial; fractions stay exact (7/4 -> 7/4 = 1.75)"
    )

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        expression = string_argument(arguments, "expression", tool=self.name, max_chars=self.max_chars)
        if isinstance(expression, ToolResult):
            return expression
        try:
            value, exact = evaluate(expression)
        except CalculatorError as e:
            return ToolResult(ok=False, output=_explain(expression, e), error=e.kind)
        return ToolResult(ok=True, output=format_value(value, exact=exact))


def _explain(expression: str, error: CalculatorError) -> str:
    """The message, and for a position a caret under the offending character."""
    if error.position is None:
        return error.message
    prefix = "syntax error" if error.kind == BAD_CALL else "error"
    # One line of context: the caret must stay under the right character.
    line = expression.replace("\n", " ").replace("\t", " ")
    return f"{prefix} at column {error.position + 1}: {error.message}\n  {line}\n  {' ' * error.position}^"
