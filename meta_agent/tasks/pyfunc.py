"""A generated, seeded family of small function-writing problems with hidden unit tests: `pyfunc`.

    make_pyfunc_tasks("test", 1)[0].question ->
    "Write a Python function `sum_multiples(xs)` that returns the sum of the numbers in the list `xs`
     that are divisible by 3.
     Examples:
     sum_multiples([3, 4, 9]) == 12
     sum_multiples([]) == 0"
    answer: "assert sum_multiples([6, -3, 5]) == 3\\n..." (hidden tests, grader "code")

Why it is shaped so. Code is where a reflection has the most to read: the executor can run its function
on the question's examples with the python tool, and a wrong function prints a result the examples
contradict, in the work the meta-thinker reads. The problems are small (one loop or comprehension), so a
135M backbone can write some of them, and parametrised (a divisor, a threshold, an offset, a letter), so
that a first attempt that copies the wrong constant or comparison fails visibly. Each template carries
its reference solution, which computes the hidden tests' expected values and is the demonstrations'
code. HumanEval (`humaneval`) is the evaluation beside it.

A problem is its template and constants; the split is a hash of that key (not of the function's name,
which the seed draws), so the splits are disjoint by construction, whatever the seeds: about 1,400 train
and 350 test problems. Hidden tests are drawn from the key and the name: the same problem always has the
same tests. Examples differ from each other and the hidden tests expect more than one value, so no
constant answer passes.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meta_agent.tasks.code import code_gold
from meta_agent.tasks.types import Task

NAME = "pyfunc"
SPLITS = ("train", "test")
TEST_BUCKETS = 5  # one problem in 5 is a test problem
HIDDEN_TESTS = 6  # asserts per problem, beside the two examples in the question
_WORDS = ("sun", "river", "a", "stone", "bright", "tree", "ox", "window", "to", "garden", "sky", "mountains")


@dataclass(frozen=True)
class Template:
    """One kind of problem: `text` (what the function returns, with {params}), the argument name and
    kind, parameter ranges, function names to draw from, and the reference solution's body."""

    kind: str
    arg: str  # the one argument's name: xs (a list of ints), s (a string) or n (an int >= 0)
    text: str
    params: dict[str, tuple[Any, ...]]
    names: tuple[str, ...]
    body: str  # the reference solution's body, indented 4 spaces, with {params}

    def solution(self, name: str, values: dict[str, Any]) -> str:
        return f"def {name}({self.arg}):\n{self.body.format(**values)}"


def _ints(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(range(lo, hi + 1))


TEMPLATES = (
    Template("sum_divisible", "xs", "the sum of the numbers in the list `xs` that are divisible by {k}",
             {"k": _ints(2, 12)}, ("sum_multiples", "total_divisible", "add_multiples"),
             "    return sum(x for x in xs if x % {k} == 0)"),
    Template("count_longer", "s", "how many words of the string `s` (split on spaces) have more than {k} letters",
             {"k": _ints(1, 6)}, ("count_long_words", "long_words", "count_longer"),
             "    return sum(1 for word in s.split() if len(word) > {k})"),
    Template("scale_shift", "xs", "a new list with each number of `xs` multiplied by {k} and then increased by {m}",
             {"k": _ints(2, 9), "m": _ints(-9, 20)}, ("scale_and_shift", "transform", "stretch"),
             "    return [x * {k} + {m} for x in xs]"),
    Template("count_letter", "s", "how many times the letter '{c}' appears in the string `s`, as upper or lower case",
             {"c": tuple(sorted(set("".join(_WORDS))))}, ("count_letter", "letter_count", "how_many"),
             "    return s.lower().count('{c}')"),
    Template("running_total", "xs", "the running totals of `xs` starting from {m}: element i is {m} plus the sum of the "
             "first i + 1 numbers", {"m": _ints(-10, 30)}, ("running_totals", "cumulative", "prefix_sums"),
             "    total = {m}\n    out = []\n    for x in xs:\n        total += x\n        out.append(total)\n"
             "    return out"),
    Template("every_kth", "xs", "every {k}th element of the list `xs`, starting with the first",
             {"k": _ints(2, 6)}, ("every_kth", "take_every", "stride"), "    return xs[::{k}]"),
    Template("digit_sum", "n", "True when the sum of the digits of the non-negative integer `n` is divisible by {k}, "
             "else False", {"k": _ints(2, 11)}, ("digits_divisible", "check_digits", "digit_test"),
             "    return sum(int(d) for d in str(n)) % {k} == 0"),
    Template("first_above", "xs", "the first number in the list `xs` that is greater than {t}, or -1 if there is none",
             {"t": _ints(-5, 40)}, ("first_above", "first_greater", "find_above"),
             "    for x in xs:\n        if x > {t}:\n            return x\n    return -1"),
    Template("clip", "xs", "`xs` with every number below {lo} replaced by {lo} and every number above {hi} replaced "
             "by {hi}", {"lo": _ints(-10, 5), "hi": _ints(10, 40)}, ("clip", "clamp_all", "bound"),
             "    return [min(max(x, {lo}), {hi}) for x in xs]"),
    Template("repeat_chars", "s", "the string `s` with each of its characters repeated {k} times",
             {"k": _ints(2, 5)}, ("repeat_chars", "stutter", "echo_letters"),
             "    return ''.join(c * {k} for c in s)"),
    Template("product_above", "xs", "the product of the numbers in `xs` that are greater than {t} (1 if there are "
             "none)", {"t": _ints(-3, 9)}, ("product_above", "multiply_big", "product_over"),
             "    product = 1\n    for x in xs:\n        if x > {t}:\n            product *= x\n    return product"),
    Template("count_range", "xs", "how many numbers in `xs` are at least {lo} and at most {hi}",
             {"lo": _ints(-10, 10), "hi": _ints(11, 50)}, ("count_between", "in_range", "count_range"),
             "    return sum(1 for x in xs if {lo} <= x <= {hi})"),
)  # fmt: skip
BY_KIND = {t.kind: t for t in TEMPLATES}


def make_pyfunc_tasks(split: str, n: int, seed: int = 0) -> list[Task]:
    """The first `n` problems of `split` ("train" or "test"; fewer when the split holds fewer), in an
    order drawn from `seed` that takes the templates in turn, so a prefix mixes them evenly until the
    small ones run out. Deterministic given (split, seed), and a smaller `n` gives a prefix of a larger
    one. The function's name is drawn per problem from `seed`."""
    if split not in SPLITS:
        raise ValueError(f"pyfunc has splits {SPLITS}, not {split!r}")
    if n < 0:
        raise ValueError(f"pyfunc needs n >= 0 tasks, got {n}")
    rng = random.Random(f"pyfunc|{split}|{seed}")
    pools = []
    for template in TEMPLATES:
        combos = [
            dict(zip(template.params, values, strict=True))
            for values in itertools.product(*template.params.values())
        ]
        combos = [v for v in combos if split_of(problem_key(template.kind, v)) == split]
        rng.shuffle(combos)
        pools.append([(template, v) for v in combos])
    order = [p for group in itertools.zip_longest(*pools) for p in group if p is not None]
    tasks = []
    for template, values in order[:n]:
        name = random.Random(f"name|{seed}|{problem_key(template.kind, values)}").choice(template.names)
        tasks.append(build_task(split, template, name, values))
    return tasks


def problem_key(kind: str, values: dict[str, Any]) -> str:
    """What makes a problem itself: its template and constants (not the function's name, so one problem
    under two names is one problem, in one split)."""
    return f"{kind}|{','.join(f'{p}={v}' for p, v in sorted(values.items()))}"


def split_of(key: str) -> str:
    bucket = int(hashlib.sha256(key.encode()).hexdigest()[:16], 16) % TEST_BUCKETS
    return "test" if bucket == 0 else "train"


def reference(template: Template, name: str, values: dict[str, Any]) -> Callable[[Any], Any]:
    """The template's reference solution as a function (our own code, run in this process)."""
    scope: dict[str, Any] = {}
    exec(template.solution(name, values), scope)  # noqa: S102 - the templates' own solutions, not model text
    return scope[name]


def build_task(split: str, template: Template, name: str, values: dict[str, Any]) -> Task:
    key = f"{problem_key(template.kind, values)}|{name}"
    rng = random.Random(f"tests|{key}")
    solve = reference(template, name, values)
    for _ in range(1000):  # informative cases: examples that differ, tests with more than one answer
        inputs = _draw_inputs(template.arg, rng, 2 + HIDDEN_TESTS)
        examples = [(x, solve(x)) for x in inputs[:2]]
        hidden = [(x, solve(x)) for x in inputs[2:]]
        if examples[0][1] != examples[1][1] and len({repr(y) for _, y in hidden}) >= 2:
            break
    signature = f"{name}({template.arg})"
    shown = "\n".join(f"{name}({x!r}) == {y!r}" for x, y in examples)
    question = (
        f"Write a Python function `{signature}` that returns {template.text.format(**values)}.\n"
        f"Examples:\n{shown}"
    )
    tests = code_gold("\n".join(f"assert {name}({x!r}) == {y!r}" for x, y in hidden), functions=[name])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    meta = {
        "template": template.kind,
        "function": name,
        "params": values,
        "solution": template.solution(name, values),
        "examples": [[x, y] for x, y in examples],
    }
    return Task(f"{NAME}/{split}/{digest}", question, tests, NAME, meta, "code")


def _draw_inputs(arg: str, rng: random.Random, n: int) -> list[Any]:
    """`n` distinct arguments: lists of small ints (one empty), strings of words, or ints."""
    found: list[Any] = []
    while len(found) < n:
        if arg == "xs":
            x: Any = [rng.randint(-20, 60) for _ in range(rng.randint(0 if found else 3, 7))]
        elif arg == "s":
            x = " ".join(rng.choice(_WORDS).capitalize() if rng.random() < 0.2 else rng.choice(_WORDS)
                         for _ in range(rng.randint(1, 6)))  # fmt: skip
        else:
            x = rng.randint(0, 10 ** rng.randint(1, 6))
        if x not in found:
            found.append(x)
    return found
