"""Demonstration episodes for the SFT warm start: the real Episode driven by scripted ideal actions.

    roles = role_specs(load_config(["roles=hierarchy"]))
    episodes = make_demos("arith", 256, roles, ChatFormat(tokenizer), default_registry())
    write_demos(episodes, "runs/demos/arith.jsonl")
    turns = read_demos("runs/demos/arith.jsonl")  # the same Turns as ep.training_turns(i)

A `DemoScript` holds the text of every role turn. `play_demo` feeds it through `Episode.advance_text`,
so prompts, tool results (mask 0) and rewards are exactly what a rollout produces, and raises
`DemoError` when the protocol did not go as scripted. Arith scripts come from a task's canonical
expression (one calculator call, or one call per operation); GSM8K scripts from the worked solution's
`<<expr=result>>` calculator annotations.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from meta_agent.chat import ChatFormat
from meta_agent.episode import PLAN, REFLECT, Episode, Limits
from meta_agent.runner import EpisodeFactory
from meta_agent.tasks import Task, grade, load_tasks, make_arith_tasks
from roles import Grammar, RoleSpec, states_answer
from tools.calculator import evaluate
from tools.calculator_values import CalculatorError, format_value
from tools.registry import ToolRegistry
from training.types import Turn

log = logging.getLogger(__name__)

SOURCES = ("arith", "gsm8k")
STYLES = ("one_call", "steps")  # arith: the whole expression in one call, or one call per operation
ARITH_STEPS = (2, 3, 4)  # demonstrations mix problem lengths, so longer problems are seen too
MAX_PLAN_CHARS = 560  # about 135 tokens: a longer plan would not fit the meta-thinker's 160-token turn
GRAMMAR = Grammar()  # the default output grammar, as every configs/role uses
TURN_FIELDS = ("role", "group", "prompt_ids", "completion_ids", "loss_mask", "logprobs", "reward", "episode")


class DemoError(RuntimeError):
    """A demonstration did not play as scripted: the message names the task and the step."""


@dataclass(frozen=True)
class Segment:
    """One executor generation: text ending with a tool call (then `result` is the calculator output
    the call must get back) or with the answer (`result` None, the turn ends)."""

    text: str
    result: str | None = None


@dataclass(frozen=True)
class DemoScript:
    """The ideal text of every role turn of one task."""

    task_id: str
    style: str  # one_call | steps (arith) | solution (gsm8k)
    plan: str  # the meta-thinker's plan turn, tags included
    work: tuple[Segment, ...]  # the first executor (solver): tool calls, then the answer
    check: tuple[Segment, ...]  # any later executor (checker): one check call, then the answer
    reflection: str  # reflection, lesson and an accepting verdict
    answer: str


# ---- arith ------------------------------------------------------------------------------------

_ARITH = re.compile(r"(\()?(\d+)\*(\d+)((?:[+-]\d+(?:\*\d+)?)*)(\))?(?:/(\d+))?")
_TERM = re.compile(r"([+-])(\d+)(?:\*(\d+))?")

# Theme of a generated problem -> (what its opening product multiplies, the unit it counts).
_THEMES = {
    "depot": ("the crates by the bolts in each crate", "bolts"),
    "seeds": ("the packets by the seeds in each packet", "seeds"),
    "tour": ("the tickets sold by the price of one ticket", "dollars"),
    "print": ("the books by the pages in each book", "pages"),
    "reservoir": ("the litres per hour by the hours", "litres"),
}
_PLAN_STEPS = {
    "add": "Add the {again}{unit} that come in.",
    "sub": "Subtract the {again}{unit} that go out.",
    "add_product": "Multiply the next pair of numbers and add that many {unit}.",
    "sub_product": "Multiply the next pair of numbers and subtract that many {unit}.",
    "div": "Divide the {unit} equally among the shares.",
}
_NAMES = {
    "add": "the addition",
    "sub": "the subtraction",
    "add_product": "the added product",
    "sub_product": "the subtracted product",
    "div": "the division",
}


def arith_ops(expression: str) -> list[tuple[str, tuple[int, ...]]]:
    """The operations of a canonical arith expression, the opening product first.

    "(648049*3185+564245)/155" -> [("mul", (648049, 3185)), ("add", (564245,)), ("div", (155,))]
    """
    m = _ARITH.fullmatch(expression)
    if m is None or bool(m[1]) != bool(m[5]) or bool(m[1]) != bool(m[6]):
        raise ValueError(f"{expression!r} is not a canonical arith expression such as '(12*34+5)/7'")
    ops: list[tuple[str, tuple[int, ...]]] = [("mul", (int(m[2]), int(m[3])))]
    for sign, c, d in _TERM.findall(m[4]):
        kind = ("add" if sign == "+" else "sub") + ("_product" if d else "")
        ops.append((kind, (int(c), int(d)) if d else (int(c),)))
    if m[6]:
        ops.append(("div", (int(m[6]),)))
    return ops


def arith_actions(
    task: Task, style: str | None = None, seed: int = 0, grammar: Grammar = GRAMMAR
) -> DemoScript:
    """The ideal turns for an arith task (meta["expression"]), in `style` "one_call" (the whole
    expression, numbers written as in the question) or "steps" (one call per operation on the
    previous result); None draws the style from `seed` and the task id. The plan names the
    operations in words from the expression; nothing in it states a result."""
    if "expression" not in task.meta:
        raise ValueError(f"{task.id}: an arith task needs meta['expression'] to build a demonstration")
    style = style or random.Random(f"demo|{seed}|{task.id}").choice(STYLES)
    if style not in STYLES:
        raise ValueError(f"arith demonstration style must be one of {STYLES}, got {style!r}")
    ops = arith_ops(task.meta["expression"])
    theme = str(task.meta.get("template", "")).split(".")[0]
    product, unit = _THEMES.get(theme, ("the first two numbers", "units"))

    steps, seen = [f"Multiply {product} with the calculator."], set()
    for kind, _ in ops[1:]:
        again = "next " if kind in seen else ""  # "Add the bolts ...", then "Add the next bolts ..."
        seen.add(kind)
        steps.append(_PLAN_STEPS[kind].format(unit=unit, again=again))
    if style == "one_call":
        steps.append("Write all of this as one calculator expression and answer with its result.")
        work, answer = _one_call(ops, grammar)
        how = "in one calculator expression"
        lesson = (
            "Write the whole calculation as one calculator expression, then copy the result into the answer."
        )
    else:
        steps.append(
            "Use one calculator call per step, carry each result forward, and answer with the last one."
        )
        work, answer = _step_calls(ops, grammar)
        how = "one calculator call at a time"
        lesson = "Do one operation per calculator call, carry each result into the next call, and answer with the last result."
    if answer != task.answer:
        raise ValueError(
            f"{task.id}: the calculator gives {answer} for {task.meta['expression']}, not {task.answer}"
        )
    whole = _written(ops)
    names = _join(list(dict.fromkeys(["the product", *(_NAMES[k] for k, _ in ops[1:])])))
    reflection = _reflection(
        f"The executor computed {names} {how}, and its answer is the calculator's result, so the result "
        "is consistent.",
        lesson,
        grammar,
    )
    check = (
        Segment(f"I check the whole calculation with one calculator call.\n{_call(whole, grammar)}", answer),
        Segment(_answer(answer, grammar)),
    )
    return DemoScript(task.id, style, plan_text(steps, task.answer, grammar), work, check, reflection, answer)


def _written(ops: list[tuple[str, tuple[int, ...]]]) -> str:
    """The whole calculation with the numbers as the question writes them: "30,662 * 6,330 + 164"."""
    a, b = ops[0][1]
    expr = f"{a:,} * {b:,}"
    for kind, numbers in ops[1:]:
        if kind == "div":
            expr = f"({expr}) / {numbers[0]:,}"
        else:
            expr += f" {'+' if kind.startswith('add') else '-'} " + " * ".join(f"{x:,}" for x in numbers)
    return expr


def _one_call(ops, grammar: Grammar) -> tuple[tuple[Segment, ...], str]:
    whole = _written(ops)
    result = calculate(whole)
    text = f"I write the whole calculation as one expression.\n{_call(whole, grammar)}"
    return (Segment(text, result), Segment(_answer(result, grammar))), result


def _step_calls(ops, grammar: Grammar) -> tuple[tuple[Segment, ...], str]:
    a, b = ops[0][1]
    expression, sentence = f"{a:,} * {b:,}", f"First I multiply {a:,} by {b:,}."
    segments = []
    for i in range(len(ops)):
        result = calculate(expression)
        segments.append(Segment(f"{sentence}\n{_call(expression, grammar)}", result))
        if i + 1 == len(ops):
            break
        kind, numbers = ops[i + 1]
        c = f"{numbers[0]:,}"
        d = f"{numbers[1]:,}" if len(numbers) > 1 else ""
        expression, sentence = {
            "add": (f"{result} + {c}", f"Then I add {c}."),
            "sub": (f"{result} - {c}", f"Then I subtract {c}."),
            "add_product": (f"{result} + {c} * {d}", f"Then I add {c} times {d}."),
            "sub_product": (f"{result} - {c} * {d}", f"Then I subtract {c} times {d}."),
            "div": (f"{result} / {c}", f"Then I divide by {c}."),
        }[kind]
    return (*segments, Segment(_answer(result, grammar))), result


# ---- gsm8k ------------------------------------------------------------------------------------

# "48/2 = <<48/2=24>>24": an annotation with the "=" and "$" before it and the stated result after it.
_ANNOTATION = re.compile(r"\s*(?:=\s*)?\$?\s*<<([^<>]*)>>\s*\$?(?:-?\d+(?:,\d{3})*(?:\.\d+)?|-?\.\d+)?%?")
_NUMBER = re.compile(r"(?<![A-Za-z\d.])(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)(?!\d)")
_UNIT = re.compile(r"\s+[A-Za-z/]+(?![\w])")
_OPERATOR = re.compile(r"\*\*|//|[-+*/^%]")
_VERBS = {
    "+": "add",
    "-": "subtract",
    "*": "multiply",
    "/": "divide",
    "//": "divide",
    "%": "take the remainder",
    "^": "raise to a power",
    "**": "raise to a power",
}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_SLOT = "\x00"  # where a calculation was cut out of a plan step, until it becomes "?"
_CLAUSE_END = re.compile(r"[,.;:!?](?=\s)")
_CONNECTIVE = re.compile(
    r"^(?:so|thus|therefore|hence|then|this means that|that means)\b,?\s*", re.IGNORECASE
)
MAX_PLAN_STEPS = 4  # solution lines shown as plan steps; the answer step comes after them


@dataclass(frozen=True)
class _Annotation:
    match: re.Match[str]
    expression: str  # as the calculator reads it
    value: Fraction
    output: str  # the calculator's text for it


def gsm8k_actions(
    task: Task, max_calls: int = Limits().max_tool_calls, grammar: Grammar = GRAMMAR
) -> DemoScript | None:
    """The ideal turns for a GSM8K task, from its worked solution (meta["solution"]).

    Plan: each annotated line with its calculations and computed numbers replaced by "?", led by
    the operations in words. Executor: per annotation a calculator call (the line's sentence before
    the first one), then the answer. None when the row cannot be scripted: an annotation the real
    calculator does not evaluate to its stated result, one that computes nothing, more calls than
    `max_calls`, or a final answer no call computes.
    """
    if "solution" not in task.meta:
        raise ValueError(f"{task.id}: a GSM8K task needs meta['solution'] to build a demonstration")
    lines = _annotated_lines(task.meta["solution"])
    calls = [a for _, anns in lines or () for a in anns]
    if not calls or len(calls) > max_calls or calls[-1].value != _value(task.answer):
        return None
    given = _values(task.question)

    work, shown, done = [], set(given), 0
    for line, anns in lines:
        operands = {v for a in anns for v in _values(a.expression)}
        upcoming = {a.value for a in calls[done:]}
        # The line may state this line's results before they are computed: those become "?".
        sentence = _tidy(_mask(_work_sentence(line, anns), (upcoming - shown) - operands))
        for j, a in enumerate(anns):
            call = _call(a.expression, grammar)
            work.append(Segment(f"{sentence}\n{call}" if j == 0 and sentence else call, a.output))
            shown.add(a.value)
        done += len(anns)
    work.append(Segment(_answer(task.answer, grammar)))

    steps = [_plan_step(line, anns, {a.value for a in calls} - given) for line, anns in lines]
    if len(steps) > MAX_PLAN_STEPS:
        steps = [*steps[: MAX_PLAN_STEPS - 1], "Work out the remaining quantities the same way."]
    steps.append("Give the last result as the answer.")
    reflection = _reflection(
        "The executor computed each step with the calculator, used the earlier results in the later "
        "calls, and its answer is the result of the last call, so the result is consistent.",
        "Turn each quantity the question asks for into one calculator call, use the earlier results in "
        "the later calls, and answer with the last result.",
        grammar,
    )
    last = calls[-1]
    check = (
        Segment(
            f"I repeat the last calculation to check it.\n{_call(last.expression, grammar)}", last.output
        ),
        Segment(_answer(task.answer, grammar)),
    )
    plan = plan_text(steps, task.answer, grammar)
    return DemoScript(task.id, "solution", plan, tuple(work), check, reflection, task.answer)


def _annotated_lines(solution: str) -> list[tuple[str, list[_Annotation]]] | None:
    """The solution's lines that carry annotations, each checked with the real calculator."""
    lines = []
    for line in solution.split("\n"):
        if line.lstrip().startswith("####"):
            continue
        anns = []
        for m in _ANNOTATION.finditer(line):
            expression, _, stated = m[1].rpartition("=")
            expression = expression.strip().replace("×", "*").replace("÷", "/")
            if not _OPERATOR.search(expression.lstrip("-")) or not re.match(r"[-\d(.]", expression):
                return None  # "<<55=55>>" computes nothing, "<<+30+46=76>>" continues a formula
            if line[m.end() : m.end() + 1].isalpha():
                return None  # "2 * 2S = <<2*2=4>>4S": algebra, not a calculation to call
            try:
                value, exact = evaluate(expression)
                stated_value, _ = evaluate(stated)
            except CalculatorError:
                return None
            if not exact or value != stated_value:
                return None
            anns.append(_Annotation(m, expression, value, format_value(value, exact=True)))
        if anns:
            lines.append((line, anns))
    return lines


def _plan_step(line: str, anns: list[_Annotation], computed: set[Fraction]) -> str:
    """ "Natalia sold 48/2 = <<48/2=24>>24 clips in May." -> "Divide: Natalia sold ? clips in May."

    Only the line's sentences that hold a calculation are kept, so a step stays one sentence or two.
    """
    text = line
    for a in reversed(anns):
        start = _expression_start(text, a.match.start(), a.expression)
        text = f"{text[:start]} {_SLOT} {text[a.match.end() :]}"
    text = " ".join(s for s in _SENTENCE_END.split(text) if _SLOT in s).replace(_SLOT, "?")
    text = _CONNECTIVE.sub("", _tidy(_mask(text, computed)))
    verbs = list(
        dict.fromkeys(_VERBS[op] for a in anns for op in _OPERATOR.findall(a.expression.lstrip("-+")))
    )
    return f"{_join(verbs).capitalize()}: {text[:1].upper()}{text[1:]}"


def _work_sentence(line: str, anns: list[_Annotation]) -> str:
    """The line with its results cut: "Natalia sold 48/2 = <<48/2=24>>24 clips in May." -> "Natalia
    sold 48/2 clips in May."; a unit after the result goes too when the written calculation names
    it already ("10 objects + 3 objects = <<10+3=13>>13 objects" -> "10 objects + 3 objects")."""
    text = line
    for a in reversed(anns):
        end = a.match.end()
        start = _expression_start(text, a.match.start(), a.expression)
        unit = _UNIT.match(text, end)
        written = text[start : a.match.start()]
        if unit and any(part.rstrip("s") in written for part in unit[0].strip().split("/") if part):
            end = unit.end()
        text = text[: a.match.start()] + text[end:]
    return text


def _expression_start(text: str, end: int, expression: str) -> int:
    """Where the written calculation that ends at `end` starts: walking back over numbers that are
    operands of `expression`, in order ("for 20 weeks so 20/4 = " -> at the second "20"); `end` if
    the number before it is none of them."""
    clause = max((m.end() for m in _CLAUSE_END.finditer(text, 0, end)), default=0)
    remaining = [_value(n) for n in _NUMBER.findall(expression)]
    start = end
    for m in reversed(list(_NUMBER.finditer(text, clause, end))):
        value = _value(m[0])
        if value not in remaining:
            break
        remaining = remaining[: len(remaining) - 1 - remaining[::-1].index(value)]
        start = m.start()
        while start > clause and text[start - 1] in "$(":
            start -= 1
        if not remaining:
            break
    return start


def _value(number: str) -> Fraction | None:
    try:
        return Fraction(number.replace(",", "").strip())
    except ValueError:
        return None


def _values(text: str) -> set[Fraction]:
    return {_value(m) for m in _NUMBER.findall(text)}


def _mask(text: str, hidden: set[Fraction]) -> str:
    return _NUMBER.sub(lambda m: "?" if _value(m[0]) in hidden else m[0], text)


def _tidy(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    text = re.sub(r"\s+([.,;:!])(?=\s|$)", r"\1", text)
    text = re.sub(r"\?\s*\?", "?", text)
    text = text.rstrip(",;:")
    if text and text[-1] not in ".!?":
        text += "."
    return text


# ---- shared text ------------------------------------------------------------------------------

GENERIC_PLAN = (
    "- Work out each quantity the question asks for, one calculator call per step.\n"
    "- Use the earlier results in the later calculations.\n"
    "- Give the last result as the answer."
)


def plan_text(steps: Sequence[str], answer: str, grammar: Grammar = GRAMMAR) -> str:
    """A tagged plan: numbered steps; bullets when a step number would equal the answer
    (states_answer reads "2." as the number 2); GENERIC_PLAN when a step itself gives the answer
    away or the plan would be longer than MAX_PLAN_CHARS."""
    bodies = [
        "\n".join(f"{i}. {s}" for i, s in enumerate(steps, start=1)),
        "\n".join(f"- {s}" for s in steps),
    ]
    for body in [*bodies, GENERIC_PLAN]:
        text = f"{grammar.plan[0]}{body}{grammar.plan[1]}"
        if body and len(text) <= MAX_PLAN_CHARS and not states_answer(text, answer, grammar):
            return text
    raise ValueError(f"even the generic plan states the answer {answer!r}")


def calculate(expression: str) -> str:
    """The calculator's output for an expression; ValueError when it fails."""
    try:
        value, exact = evaluate(expression)
    except CalculatorError as e:
        raise ValueError(f"the calculator cannot evaluate {expression!r}: {e.message}") from e
    return format_value(value, exact=exact)


def _call(expression: str, grammar: Grammar) -> str:
    body = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"{grammar.tool_call[0]}{body}{grammar.tool_call[1]}"


def _reflection(reflection: str, lesson: str, grammar: Grammar) -> str:
    (r_open, r_close), (l_open, l_close), (v_open, v_close) = (
        grammar.reflection,
        grammar.lesson,
        grammar.verdict,
    )
    return f"{r_open}{reflection}{r_close}{l_open}{lesson}{l_close}{v_open}accept{v_close}"


def _answer(value: str, grammar: Grammar) -> str:
    return f"{grammar.answer[0]}{value}{grammar.answer[1]}"


def _join(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


# ---- playing a script -------------------------------------------------------------------------


def play_demo(script: DemoScript, task: Task, factory: EpisodeFactory | Callable[[Task], Episode]) -> Episode:
    """Drive a fresh episode (from `factory.new(task)` or `factory(task)`) through `script`.

    The meta-thinker gets the plan and the reflection, the first executor `script.work`, later
    executors `script.check`; each executor segment is fed on its own, as a rollout generates it.
    Returns the finished episode; raises DemoError if any step did not go as scripted or the
    episode did not end correct, untruncated, without tool errors and without a leak.
    """
    if script.task_id != task.id:
        raise ValueError(f"script for {script.task_id} played on task {task.id}")
    episode = factory.new(task) if isinstance(factory, EpisodeFactory) else factory(task)
    executors = [r.name for r in episode.executors]
    while not episode.done:
        turn = episode.current
        assert turn is not None
        if turn.kind == PLAN:
            _act(episode, script.plan)
            if not turn.format_ok:
                raise DemoError(f"{task.id}: the plan was not read as a tagged plan: {script.plan!r}")
        elif turn.kind == REFLECT:
            _act(episode, script.reflection)
            if not episode.done:
                raise DemoError(f"{task.id}: the reflection did not end the episode (revised instead?)")
        else:
            segments = script.work if executors.index(turn.role) == 0 else script.check
            _play_executor(episode, segments)
    problems = [
        what
        for what, bad in (
            (f"it was truncated by the limits {episode.limits}", episode.truncated),
            (
                f"its answer {episode.final_answer!r} is not correct (gold {task.answer!r})",
                not episode.correct,
            ),
            ("the meta-thinker's plan states the answer", episode.leaked),
            (f"{episode.tool_errors} tool call(s) failed", episode.tool_errors),
            ("a turn broke its format", not all(t.format_ok for t in episode.turns)),
        )
        if bad
    ]
    if problems:
        raise DemoError(f"{task.id}: the demonstration episode went wrong: {'; '.join(problems)}")
    return episode


def _play_executor(episode: Episode, segments: Sequence[Segment]) -> None:
    turn = episode.current
    assert turn is not None
    where = f"{episode.task.id}: {turn.role}"
    for i, segment in enumerate(segments):
        if episode.current is not turn:
            raise DemoError(
                f"{where}'s turn ended after {i} of {len(segments)} segments (limits {episode.limits})"
            )
        calls = len(turn.tool_calls)
        _act(episode, segment.text)
        if segment.result is None:
            if episode.current is turn:
                raise DemoError(f"{where}: the answer segment did not end the turn: {segment.text!r}")
            continue
        if episode.current is not turn or len(turn.tool_calls) != calls + 1:
            raise DemoError(
                f"{where}: the tool call was not run (turn over, budget spent?): {segment.text!r}"
            )
        call = turn.tool_calls[-1]
        if not call.ok or call.output != segment.result:
            raise DemoError(f"{where}: the call got {call.output!r}, expected {segment.result!r}")


def _act(episode: Episode, text: str) -> None:
    """advance_text, after checking that generation would stop exactly at the end of `text`."""
    stops = episode.request().stop
    end = len(text.rstrip())
    for stop in stops:
        at = text.find(stop)
        if at >= 0 and at + len(stop) < end:
            raise DemoError(f"{episode.task.id}: generation would stop at {stop!r} inside {text!r}")
    if not text[:end].endswith(stops):
        raise DemoError(f"{episode.task.id}: {text!r} does not end with one of the stops {stops}")
    episode.advance_text(text)


# ---- many demonstrations, on disk -------------------------------------------------------------


def make_demos(
    name: str,
    n: int,
    roles: Sequence[RoleSpec],
    chat: ChatFormat,
    registry: ToolRegistry,
    seed: int = 0,
    *,
    limits: Limits = Limits(),
    data_dir: Path | str | None = None,
) -> list[Episode]:
    """`n` finished demonstration episodes from the train split of `name` ("arith" or "gsm8k").

    arith: problems of 2-4 operations in turn, each in a style drawn from `seed`. gsm8k: rows in
    file order; rows whose solution cannot be scripted (see gsm8k_actions) or does not fit `limits`
    are skipped, so fewer than `n` come back only when the file runs out.
    """
    if name not in SOURCES:
        raise ValueError(f"demonstrations come from {SOURCES}, not {name!r} (sft.source)")
    if n < 0:
        raise ValueError(f"need n >= 0 demonstrations, got {n}")
    grammar = roles[0].grammar
    factory = EpisodeFactory(roles, chat, registry, grade, limits)
    if name == "arith":
        per = math.ceil(n / len(ARITH_STEPS))
        batches = [make_arith_tasks("train", per, seed=seed, steps=s) for s in ARITH_STEPS]
        tasks = [t for group in zip(*batches, strict=True) for t in group][:n]
        return [play_demo(arith_actions(t, seed=seed, grammar=grammar), t, factory) for t in tasks]
    episodes: list[Episode] = []
    skipped = 0
    for task in load_tasks("gsm8k", "train", data_dir=data_dir):
        if len(episodes) >= n:
            break
        script = gsm8k_actions(task, max_calls=limits.max_tool_calls, grammar=grammar)
        if script is None:
            skipped += 1
            continue
        try:
            episodes.append(play_demo(script, task, factory))
        except DemoError as e:  # a row the limits cannot hold (token budget, turns)
            log.debug("skipping %s", e)
            skipped += 1
    log.info("gsm8k demonstrations: %d made, %d rows skipped", len(episodes), skipped)
    if len(episodes) < n:
        log.warning("only %d of %d gsm8k demonstrations: the train file ran out", len(episodes), n)
    return episodes


def write_demos(episodes: Sequence[Episode], path: Path | str) -> Path:
    """One JSON line per turn: the Turn fields of `ep.training_turns(i)` plus "text" for humans."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for i, ep in enumerate(episodes):
            texts = [t.text for t in ep.turns if t.completion_ids]
            for turn, text in zip(ep.training_turns(i), texts, strict=True):
                row = {key: getattr(turn, key) for key in TURN_FIELDS}
                f.write(json.dumps({**row, "text": text}) + "\n")
    return path


def read_demos(path: Path | str) -> list[Turn]:
    """The Turns written by write_demos; FileNotFoundError or ValueError naming the path and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"demonstration file {path} not found; write it with meta_agent.demos.write_demos"
        )
    turns = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                turn = Turn(
                    role=str(row["role"]),
                    group=str(row["group"]),
                    prompt_ids=tuple(int(i) for i in row["prompt_ids"]),
                    completion_ids=tuple(int(i) for i in row["completion_ids"]),
                    loss_mask=tuple(int(m) for m in row["loss_mask"]),
                    logprobs=tuple(float(x) for x in row["logprobs"]),
                    reward=float(row["reward"]),
                    episode=int(row["episode"]),
                )
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise ValueError(
                    f"{path}:{line_no}: not a demonstration turn ({type(e).__name__}: {e})"
                ) from e
            if not len(turn.completion_ids) == len(turn.loss_mask) == len(turn.logprobs):
                raise ValueError(f"{path}:{line_no}: completion_ids, loss_mask and logprobs differ in length")
            turns.append(turn)
    return turns
