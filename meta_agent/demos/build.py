"""Demonstration episodes for the SFT warm start: the real Episode driven by scripted ideal actions.

    roles = load_config(["roles=hierarchy"]).role_list
    episodes = make_demos("arith", 256, roles, ChatFormat(tokenizer), default_registry())
    write_demos(episodes, "runs/demos/arith.jsonl")  # or: meta-agent demos demos_out=runs/demos/arith.jsonl
    turns = read_demos("runs/demos/arith.jsonl")  # the same Turns as ep.training_turns(i)
    # meta-agent sft sft.source=runs/demos/arith.jsonl trains on them

A `DemoScript` holds the text of every role turn. `play_demo` feeds it through `Episode.advance_text`,
so prompts, tool results (mask 0) and rewards are exactly what a rollout produces, and raises
`DemoError` when the protocol did not go as scripted. Arith scripts come from a task's canonical
expression (one calculator call, or one call per operation); GSM8K scripts from the worked solution's
`<<expr=result>>` calculator annotations; Countdown scripts from a solution found by search. A new
source is one DEMO_SOURCES entry.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from meta_agent.demos.arith import (
    ARITH_STEPS,
    STYLES,
    arith_actions,
    arith_ops,
    check_lines,
    distract_actions,
)
from meta_agent.demos.code import pyfunc_actions
from meta_agent.demos.countdown import countdown_actions
from meta_agent.demos.gsm8k import MAX_PLAN_STEPS, gsm8k_actions
from meta_agent.demos.script import (
    GENERIC_PLAN,
    GRAMMAR,
    MAX_PLAN_CHARS,
    DemoScript,
    Segment,
    calculate,
    plan_text,
)
from meta_agent.episode.chat import ChatFormat
from meta_agent.episode.internal_memory import InternalMemory
from meta_agent.episode.protocol import EXECUTE, PLAN, REFLECT, Episode, Limits
from meta_agent.episode.reward import score
from meta_agent.episode.runner import EpisodeFactory
from meta_agent.errors import BadData, MissingFile, SettingError
from meta_agent.tasks import Task, grade_task, load_tasks, make_arith_tasks
from meta_agent.tasks.jsonl import decoded
from roles import RoleSpec, executors, meta_thinker
from tools.registry import ToolRegistry
from training.types import Turn

__all__ = [
    "ARITH_STEPS",
    "GENERIC_PLAN",
    "GRAMMAR",
    "MAX_PLAN_CHARS",
    "MAX_PLAN_STEPS",
    "SOURCES",
    "STYLES",
    "TURN_FIELDS",
    "DemoError",
    "DemoScript",
    "Segment",
    "arith_actions",
    "check_lines",
    "distract_actions",
    "arith_ops",
    "calculate",
    "demo_path",
    "gsm8k_actions",
    "make_demos",
    "plan_text",
    "play_demo",
    "read_demos",
    "write_demos",
]

log = logging.getLogger(__name__)

TURN_FIELDS = (
    "role", "group", "prompt_ids", "completion_ids", "loss_mask", "logprobs", "reward", "episode", "correct"
)  # fmt: skip


class DemoError(RuntimeError):
    """A demonstration did not play as scripted: the message names the task and the step."""


# ---- playing a script -------------------------------------------------------------------------


def play_demo(script: DemoScript, task: Task, factory: EpisodeFactory | Callable[[Task], Episode]) -> Episode:
    """Drive a fresh episode (from `factory.new(task)` or `factory(task)`) through `script`.

    The meta-thinker gets the plan and the reflection, the first executor `script.work`, later
    executors `script.check`; each executor segment is fed on its own, as a rollout generates it.
    With `script.revision` the first round's first executor plays its work (after the revision's own
    plan, if it has one) and the meta-thinker revises; that work's loss mask, and that plan's, are then
    set to 0 (shown to the reflection, never learned).
    Returns the finished, scored episode; raises DemoError if any step did not go as scripted or the
    episode did not end correct, untruncated, without tool errors and without a leak.
    """
    if script.task_id != task.id:
        raise ValueError(f"script for {script.task_id} played on task {task.id}")
    episode = factory.new(task) if isinstance(factory, EpisodeFactory) else factory(task)
    executor_names = [r.name for r in episode.executors]

    def revising(ep: Episode) -> bool:  # in the first round of a script that revises it
        return script.revision is not None and ep.round == 0

    while not episode.done:
        turn = episode.current
        assert turn is not None
        if turn.kind == PLAN:
            plan = script.revision.plan if revising(episode) and script.revision.plan else script.plan
            _act(episode, plan)
            if not turn.format_ok:
                raise DemoError(f"{task.id}: the plan was not read as a tagged plan: {plan!r}")
        elif turn.kind == REFLECT and revising(episode):
            _act(episode, episode.scripted_reflection(script.revision.reflection))
            if episode.done or episode.round != 1:
                raise DemoError(
                    f"{task.id}: the revising reflection did not start a second round (a revision "
                    f"needs protocol.max_rounds >= 2, got {episode.limits.max_rounds})"
                )
        elif turn.kind == REFLECT:
            _act(episode, episode.scripted_reflection(script.reflection))
            if not episode.done:
                raise DemoError(f"{task.id}: the reflection did not end the episode (revised instead?)")
        elif executor_names.index(turn.role) == 0:
            _play_executor(episode, script.revision.work if revising(episode) else script.work)
        else:
            _play_executor(episode, script.check)
    if script.revision is not None:
        if episode.rounds[0].correct:
            raise DemoError(
                f"{task.id}: the first round of a revising demonstration was right: nothing to catch"
            )
        mistaken = {EXECUTE, PLAN} if script.revision.plan else {EXECUTE}
        for t in episode.turns:
            if t.kind in mistaken and t.round == 0:
                t.mask = [0] * len(t.mask)  # the mistake the reflection caught is not taught
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
    score([episode])  # its turns carry their rewards, as a rollout's do
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
    stops = episode.request().sampling.stop
    end = len(text.rstrip())
    for stop in stops:
        at = text.find(stop)
        if at >= 0 and at + len(stop) < end:
            raise DemoError(f"{episode.task.id}: generation would stop at {stop!r} inside {text!r}")
    if not text[:end].endswith(stops):
        raise DemoError(f"{episode.task.id}: {text!r} does not end with one of the stops {stops}")
    episode.advance_text(text)


# ---- many demonstrations, on disk -------------------------------------------------------------


@dataclass(frozen=True)
class DemoContext:
    """What every demonstration builder (DEMO_SOURCES) is given besides the count."""

    factory: EpisodeFactory
    roles: Sequence[RoleSpec]
    limits: Limits
    seed: int
    data_dir: Path | str | None

    @property
    def grammar(self):
        return self.roles[0].grammar

    @property
    def can_revise(self) -> bool:
        """Only a meta-thinker with a second round to give, reflecting on one executor's work, revises
        (with a checker the first round's answer would be right); otherwise every demonstration accepts."""
        one = meta_thinker(self.roles) is not None and len(executors(self.roles)) == 1
        return one and self.limits.max_rounds >= 2


def make_demos(
    name: str,
    n: int,
    roles: Sequence[RoleSpec],
    chat: ChatFormat,
    registry: ToolRegistry,
    seed: int = 0,
    *,
    limits: Limits | None = None,
    data_dir: Path | str | None = None,
    internal: InternalMemory | None = None,
) -> list[Episode]:
    """`n` finished demonstration episodes from the train split of `name` (one of SOURCES, built by its
    DEMO_SOURCES entry). `internal`: what the meta-thinker carries between reflections
    (meta_agent.episode.internal_memory); its reflections are written so."""
    if name not in DEMO_SOURCES:
        raise SettingError(
            f"sft.source={name} is neither a demonstration generator {SOURCES} nor a .jsonl file of "
            "demonstrations (write one with `meta-agent demos sft.source=arith demos_out=FILE.jsonl`)"
        )
    if n < 0:
        raise ValueError(f"need n >= 0 demonstrations, got {n}")
    limits = limits or Limits()
    factory = EpisodeFactory(roles, chat, registry, grade_task, limits, internal=internal)
    return DEMO_SOURCES[name](n, DemoContext(factory, roles, limits, seed, data_dir))


def arith_demos(n: int, ctx: DemoContext) -> list[Episode]:
    """Problems of 2-4 operations in turn, each in a style drawn from the seed."""
    per = math.ceil(n / len(ARITH_STEPS))
    batches = [make_arith_tasks("train", per, seed=ctx.seed, steps=s) for s in ARITH_STEPS]
    tasks = [t for group in zip(*batches, strict=True) for t in group][:n]
    return [play_demo(arith_actions(t, seed=ctx.seed, grammar=ctx.grammar), t, ctx.factory) for t in tasks]


def distract_demos(n: int, ctx: DemoContext, check: bool = False) -> list[Episode]:
    """As distract_actions writes them, REVISE_SHARE caught and revised where a meta-thinker can revise;
    `check` (arith_distract_check): each reflection written as one check whatever its verdict."""
    tasks = load_tasks("arith_distract", "train", limit=n, seed=ctx.seed)
    revise = None if ctx.can_revise else False
    return [
        play_demo(
            distract_actions(t, seed=ctx.seed, grammar=ctx.grammar, revise=revise, check=check),
            t,
            ctx.factory,
        )
        for t in tasks
    ]


def pyfunc_demos(n: int, ctx: DemoContext) -> list[Episode]:
    """REVISE_SHARE with a wrong constant caught, as for arith_distract."""
    tasks = load_tasks("pyfunc", "train", limit=n, seed=ctx.seed)
    revise = None if ctx.can_revise else False
    return [play_demo(pyfunc_actions(t, ctx.seed, ctx.grammar, revise), t, ctx.factory) for t in tasks]


def countdown_demos(n: int, ctx: DemoContext, task: str = "countdown") -> list[Episode]:
    """Generated Countdown problems of family `task`, half of them a first round that misses, caught and
    revised where a meta-thinker can revise, or retried by a lone executor after the check's miss."""
    tasks = load_tasks(task, "train", limit=n, seed=ctx.seed, data_dir=ctx.data_dir)
    # A lone executor with the attempt check retries after a miss (Episode._retries): it is shown the same.
    alone = meta_thinker(ctx.roles) is None and ctx.limits.attempt_check and ctx.limits.max_rounds >= 2
    revise = None if ctx.can_revise or alone else False
    return [
        play_demo(countdown_actions(t, seed=ctx.seed, grammar=ctx.grammar, revise=revise), t, ctx.factory)
        for t in tasks
    ]


def gsm8k_demos(n: int, ctx: DemoContext) -> list[Episode]:
    """Rows in file order; rows whose solution cannot be scripted (see gsm8k_actions) or does not fit the
    limits are skipped, so fewer than `n` come back only when the file runs out."""
    episodes: list[Episode] = []
    skipped = 0
    for task in load_tasks("gsm8k", "train", data_dir=ctx.data_dir):
        if len(episodes) >= n:
            break
        script = gsm8k_actions(task, max_calls=ctx.limits.max_tool_calls, grammar=ctx.grammar)
        if script is None:
            skipped += 1
            continue
        try:
            episodes.append(play_demo(script, task, ctx.factory))
        except DemoError as e:  # a row the limits cannot hold (token budget, turns)
            log.debug("skipping %s", e)
            skipped += 1
    log.info("gsm8k demonstrations: %d made, %d rows skipped", len(episodes), skipped)
    if len(episodes) < n:
        log.warning("only %d of %d gsm8k demonstrations: the train file ran out", len(episodes), n)
    return episodes


# sft.source: name -> builder of `n` finished demonstration episodes of that task family's train split.
DEMO_SOURCES: dict[str, Callable[[int, DemoContext], list[Episode]]] = {
    "arith": arith_demos,
    "arith_distract": distract_demos,
    "arith_distract_check": partial(distract_demos, check=True),
    "countdown": countdown_demos,
    "countdown3": partial(countdown_demos, task="countdown3"),
    "gsm8k": gsm8k_demos,
    "pyfunc": pyfunc_demos,
}
SOURCES = tuple(DEMO_SOURCES)


def write_demos(episodes: Sequence[Episode], path: Path | str) -> Path:
    """One JSON line per turn: the Turn fields of `ep.training_turns(i)` plus "text" for humans."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for i, ep in enumerate(episodes):
            texts = [t.text for t in ep.learned_turns]  # the turns training_turns keeps
            for turn, text in zip(ep.training_turns(i), texts, strict=True):
                row = {key: getattr(turn, key) for key in TURN_FIELDS}
                f.write(json.dumps({**row, "text": text}) + "\n")
    return path


def demo_path(source: str) -> Path | None:
    """The demonstration file `sft.source` names, or None when it names a generator in SOURCES.

    A file is anything else that ends in .jsonl or exists, so a missing file is reported as one.
    """
    if source in SOURCES:
        return None
    path = Path(source).expanduser()
    return path if source.endswith(".jsonl") or path.is_file() else None


def read_demos(
    path: Path | str,
    roles: Collection[str] | None = None,
    vocab_size: int | None = None,
    context: int | None = None,
) -> list[Turn]:
    """The Turns written by write_demos, each role one of `roles`, each token id below `vocab_size` and
    each turn no longer than `context` tokens, when given.

    Raises FileNotFoundError for a missing file, ValueError naming the path (and line) for an empty
    file, a line that is not a turn, or a role outside `roles`.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFile(
            f"demonstration file {path} not found: write it with "
            f"`meta-agent demos sft.source=arith demos_out={path}` (or meta_agent.demos.build.write_demos)"
        )
    turns = []
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            line = decoded(raw, path, line_no)
            if line.strip():
                turns.append(_read_turn(line, f"{path}:{line_no}", roles, vocab_size, context))
    if not turns:
        raise BadData(
            f"demonstration file {path} is empty: write demonstrations into it with `meta-agent demos`"
        )
    return turns


def _read_turn(
    line: str, where: str, roles: Collection[str] | None, vocab_size: int | None, context: int | None
) -> Turn:
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
            correct=None if row.get("correct") is None else bool(row["correct"]),  # files before it: None
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise BadData(
            f"{where}: not a demonstration turn ({type(e).__name__}: {e}); "
            "rewrite the file with `meta-agent demos`"
        ) from e
    if not len(turn.completion_ids) == len(turn.loss_mask) == len(turn.logprobs):
        raise BadData(f"{where}: completion_ids, loss_mask and logprobs differ in length")
    ids = turn.prompt_ids + turn.completion_ids
    if vocab_size is not None and ids and not 0 <= min(ids) <= max(ids) < vocab_size:
        bad = next(i for i in ids if not 0 <= i < vocab_size)
        raise BadData(
            f"{where}: token id {bad} is outside this model's vocabulary (0..{vocab_size - 1}): the file was "
            "written for another tokenizer; write it again with `meta-agent demos` and this model"
        )
    if context is not None and len(ids) > context:
        raise BadData(
            f"{where}: the turn is {len(ids)} tokens, longer than the model's {context}-token context: write "
            "the demonstrations again with `meta-agent demos` and this model"
        )
    if roles is not None and turn.role not in roles:
        raise BadData(
            f"{where}: role {turn.role!r} is not a configured role ({', '.join(roles)}): write the "
            "demonstrations with the roles= of this run, or train with the roles that wrote them"
        )
    return turn
