"""One episode of the hierarchy as a token-level state machine (docs/ARCHITECTURE.md, "The episode protocol").

plan (meta-thinker) -> execute (each executor in order, with tool calls) -> reflect (meta-thinker)
-> finish, or revise and execute again, up to `max_rounds`. Without a meta-thinker the episode is
the executors alone: the single-agent baseline runs through this same code.

The episode never generates: it says who acts next and on which prompt (`request`), and takes the
sampled tokens back (`advance`). The batched runner and the PettingZoo env both drive it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from memory.types import MemoryHit
from meta_agent.episode.chat import ChatFormat
from meta_agent.episode.internal_memory import CARRIED_LIMIT, InternalMemory, Truncate
from meta_agent.episode.prompts import (
    ATTEMPT_HEADER,
    CHECK_HEADER,
    NOTES_HEADER,
    PLAN_HEADER,
    environment_markers,
    memory_block,
    neutralise,
    notes_block,
    number_check,
    previous_block,
    tail,
    template_headers,
    valid_text,
    without_notes,
    without_plans,
    work_block,
)
from meta_agent.episode.records import (
    EXECUTE,
    PLAN,
    REFLECT,
    Limits,
    PlayedEpisode,
    Request,
    RoundRecord,
    ToolCall,
    TurnRecord,
)
from meta_agent.errors import SettingError
from meta_agent.tasks import Task
from meta_agent.tasks.countdown import GRADER as COUNTDOWN_GRADER
from meta_agent.tasks.countdown import describe_attempt, read_gold
from roles import (
    ACCEPT,
    META_THINKER,
    REVISE,
    Outcome,
    RoleSpec,
    apply_fix,
    check_roles,
    executors,
    meta_thinker,
    parse_executor,
    parse_plan,
    parse_reflection,
    states_answer,
)
from tools.registry import ToolRegistry, parse_tool_call
from tools.types import BAD_CALL, ToolResult


def run_call(registry: ToolRegistry, allowed: Sequence[str], body: str) -> tuple[str, ToolResult]:
    """A tool call as a model wrote it (`body`, between the call tags), run when it parses and names one of
    `allowed` that `registry` holds: (the tool's name, "?" when the body does not parse; its result). A
    call that does not parse or names another tool is a BAD_CALL result saying why."""
    parsed = parse_tool_call(body)
    if isinstance(parsed, ToolResult):
        return "?", parsed
    name, arguments = parsed
    name = valid_text(name)  # JSON can spell a lone surrogate; the traces must still write it
    available = [t for t in allowed if t in registry]
    if name not in available:
        return name, ToolResult(
            False, f"unknown tool {name!r}; available: {', '.join(available) or 'none'}", BAD_CALL
        )
    return name, registry.call(name, arguments)


__all__ = [
    "ACCEPT",
    "EXECUTE",
    "REVISE",
    "PLAN",
    "REFLECT",
    "Episode",
    "Limits",
    "Request",
    "RoundRecord",
    "ToolCall",
    "TurnRecord",
    "run_call",
]


class Episode(PlayedEpisode):
    def __init__(
        self,
        task: Task,
        roles: Sequence[RoleSpec],
        chat: ChatFormat,
        registry: ToolRegistry,
        grade: Callable[[str, Task], bool],
        limits: Limits | None = None,
        memories: Sequence[MemoryHit] = (),
        final_reflection: bool = True,
        *,
        show_plan: bool = True,
        adapters: Mapping[str, str] | None = None,
        internal: InternalMemory | None = None,
    ):
        """`final_reflection=False` ends the episode after the executors of the last round: that
        reflection can neither revise nor change the answer, only write a lesson (scoring that keeps
        no lessons skips it). The counterfactual probes (meta_agent.evaluation.probe) change two more things:
        `show_plan=False` keeps the plan out of the executors' prompts, and `adapters` maps a role to
        the adapter its requests run on (default: the role's own). `internal` is what the meta-thinker
        carries from one reflection to the next (meta_agent.episode.internal_memory; default: nothing)."""
        check_roles(roles)
        self.task = task
        self.roles = {r.name: r for r in roles}
        self.meta = meta_thinker(roles)
        self.executors = executors(roles)
        self.chat = chat
        self.registry = registry
        self.grade = grade
        self.limits = limits or Limits()
        self.memories = list(memories)
        self.final_reflection = final_reflection and self.limits.final_reflection
        if self.limits.attempt_check and task.grader != COUNTDOWN_GRADER:
            raise SettingError(
                f"protocol.attempt_check checks Countdown answers, and {task.id} is graded {task.grader!r}: "
                "set protocol.attempt_check=false for this task"
            )
        self.show_plan = show_plan
        self.adapters = {r.name: r.name for r in roles} | dict(adapters or {})
        self.internal = internal or Truncate()
        # the framing lines of the roles' own prompts ("Question:", "Its final answer:") are markers too
        extra = template_headers(t for r in roles for t in (r.user_template, r.reflect_template))
        extra += (NOTES_HEADER,) if self.internal.carries else ()
        extra += (CHECK_HEADER,) if self.limits.number_check else ()
        extra += (ATTEMPT_HEADER,) if self.limits.attempt_check else ()
        self._markers = environment_markers(
            [r.grammar for r in roles], self.roles, chat.special_tokens, extra
        )
        self.turns: list[TurnRecord] = []
        self.rounds: list[RoundRecord] = []  # each round graded as its executors finish
        self.round = 0
        self.plan: str | None = None
        self.final_answer: str | None = None
        self.correct = False
        self.truncated = False
        self.lesson: str | None = None
        self.outcomes: dict[str, Outcome] = {}  # per role that acted, once done
        self.rewards: dict[str, float] = {}  # per role, set by meta_agent.episode.reward.score
        self._executor_index = 0
        self._tokens_used = 0
        self._segment_start = 0  # index in the current turn's text where the live segment starts
        self.done = False
        self._start_turn(PLAN if self.meta else EXECUTE)

    # ---- who acts, on what -------------------------------------------------------------------

    @property
    def current(self) -> TurnRecord | None:
        return None if self.done else self.turns[-1]

    def request(self) -> Request:
        turn = self.turns[-1]
        role = self.roles[turn.role]
        grammar = role.grammar
        stop = {
            PLAN: grammar.plan_stops(),
            EXECUTE: grammar.executor_stops(),
            REFLECT: grammar.reflect_stops(),
        }
        return self._request(turn.prompt_ids + turn.completion_ids, stop[turn.kind])

    # ---- taking a generated segment ----------------------------------------------------------

    def advance(
        self, token_ids: Sequence[int], logprobs: Sequence[float], text: str, finish_reason: str
    ) -> None:
        """Append one generated segment to the current turn and move the protocol on. The text is the
        model's: what in it imitates the environment is quoted before anyone reads it, and counted."""
        if self.done:
            raise RuntimeError("advance() on a finished episode")
        turn = self.turns[-1]
        text, forged = neutralise(text, self._markers)
        turn.forged += forged
        turn.completion_ids += list(token_ids)
        turn.mask += [1] * len(token_ids)
        turn.logprobs += list(logprobs) if logprobs else [0.0] * len(token_ids)
        turn.text += text
        self._tokens_used += len(token_ids)
        out_of_budget = self._tokens_used >= self.limits.max_new_tokens
        final = finish_reason != "stop" or out_of_budget
        if turn.kind == EXECUTE:
            self._advance_executor(turn, final=final, out_of_budget=out_of_budget, forged=forged > 0)
        elif turn.kind == PLAN:
            turn.answer = None
            self.plan, format_ok = parse_plan(turn.text, self.roles[turn.role].grammar)
            turn.format_ok = format_ok and not turn.forged
            self._after_turn(out_of_budget)
        else:
            self._after_reflection(turn, out_of_budget)

    def advance_text(self, text: str) -> None:
        """Advance with a text action (the PettingZoo env): tokenised, no rollout logprobs."""
        stops = self.request().sampling.stop
        ids = self.chat.encode(text)
        reason = "stop" if any(text.rstrip().endswith(s) for s in stops) else "eos"
        self.advance(ids, [0.0] * len(ids), text, reason)

    def _advance_executor(self, turn: TurnRecord, *, final: bool, out_of_budget: bool, forged: bool) -> None:
        if forged:  # a segment that writes its own observation is refused: no call, no answer, broken format
            turn.answer, turn.format_ok = None, False
            self._after_turn(out_of_budget)
            return
        role = self.roles[turn.role]
        segment = turn.text[self._segment_start :]
        step = parse_executor(segment, role.grammar, final=final)
        if step.tool_call is not None and not out_of_budget:
            self._run_tool(turn, role, step.tool_call)
            return
        # An answer, or the end of what the executor may write: the turn is over.
        turn.answer = step.answer
        turn.format_ok = step.answer_tagged
        self._after_turn(out_of_budget)

    def _run_tool(self, turn: TurnRecord, role: RoleSpec, body: str) -> None:
        if len(turn.tool_calls) >= self.limits.max_tool_calls:
            result = ToolResult(
                False, "tool call limit reached for this turn: give your answer now", BAD_CALL
            )
            name = "?"
        else:
            # What the role may call and the registry holds: its system prompt lists the same.
            name, result = run_call(self.registry, role.tools, body)
        # A tool's output can echo what the model wrote (a program's prints, an error quoting the call):
        # markers in it are quoted and counted too, so no output closes its own tag early.
        output, forged = neutralise(result.output, self._markers)
        turn.forged += forged
        turn.tool_calls.append(ToolCall(name, body, output, result.ok, result.error))
        observation = role.grammar.wrap_tool_result(output)
        ids = self.chat.encode(observation)
        turn.completion_ids += ids
        turn.mask += [0] * len(ids)
        turn.logprobs += [0.0] * len(ids)
        turn.text += observation
        self._segment_start = len(turn.text)

    def _after_reflection(self, turn: TurnRecord, out_of_budget: bool) -> None:
        assert self.meta is not None
        out = parse_reflection(turn.text, self.meta.grammar)
        grammar = self.meta.grammar
        self.rounds[-1].verdict = out.verdict  # what the meta-thinker judged, whether or not a round follows
        # A fix rewrites one step of the plan; one naming a step the plan lacks changes nothing and breaks
        # the format, though the revision stands (the next round sees the reflection).
        fixed = apply_fix(self.plan, *out.fix) if out.fix else None
        self.rounds[-1].verdict_tagged = (
            out.plan is not None or fixed is not None or grammar.verdict[1] in turn.text
        )
        # Kept only when closed: a reflection or lesson that ran out of tokens broke its format. So did one
        # that ends in neither a verdict nor a plan nor a fix: it counts as accepting (parse_reflection), and
        # costs the format penalty, or sampling drifts into reflections that ramble past their verdict.
        lesson_open = grammar.lesson[0] in turn.text and grammar.lesson[1] not in turn.text
        turn.format_ok = (
            out.reflection is not None
            and all(tag in turn.text for tag in grammar.reflection)
            and not lesson_open
            and self.rounds[-1].verdict_tagged
            and not turn.forged
        )
        self.lesson = out.lesson
        revise = out.verdict == REVISE and self.round + 1 < self.limits.max_rounds
        if revise and not out_of_budget and len(self.turns) < self.limits.max_turns:
            self.round += 1
            self.plan = out.plan or fixed or self.plan
            self._executor_index = 0
            self._start_turn(EXECUTE)
        else:
            self._finish(truncated=out_of_budget)

    def _after_turn(self, out_of_budget: bool) -> None:
        turn = self.turns[-1]
        last = turn.kind == EXECUTE and self._executor_index + 1 >= len(self.executors) and self.meta is None
        if last and not out_of_budget and self._retries():
            self.round += 1
            self._executor_index = 0
            self._start_turn(EXECUTE)
        elif last and not out_of_budget:
            # The protocol's natural end (single agent): max_turns cut nothing short.
            self._finish(truncated=False)
        elif out_of_budget or len(self.turns) >= self.limits.max_turns:
            self._finish(truncated=True)
        elif turn.kind == PLAN:
            self._executor_index = 0
            self._start_turn(EXECUTE)
        elif self._executor_index + 1 < len(self.executors):
            self._executor_index += 1
            self._start_turn(EXECUTE)
        elif self.meta is not None and (self.final_reflection or self.round + 1 < self.limits.max_rounds):
            self._grade_round()
            self._start_turn(REFLECT)
        else:
            self._finish(truncated=False)

    def _retries(self) -> bool:
        """A lone executor (no meta-thinker) with protocol.attempt_check gets the hierarchy's second
        attempt when the check of its answer shows a miss and a round and a turn are left: the executor
        alone given the same attempts and the same check, without a meta-thinker's judgement or plan."""
        if not self.limits.attempt_check or self.round + 1 >= self.limits.max_rounds:
            return False
        if len(self.turns) >= self.limits.max_turns:
            return False
        self._grade_round()
        return not self.rounds[-1].correct

    # ---- prompts -----------------------------------------------------------------------------

    def _start_turn(self, kind: str) -> None:
        role = self.meta if kind in (PLAN, REFLECT) else self.executors[self._executor_index]
        assert role is not None
        tools = self.registry.describe(role.tools) if role.tools else ""
        messages = [{"role": "system", "content": role.system_text(tools)}]
        memories = memory_block(self.memories)
        if kind == PLAN:
            messages.append(
                {"role": "user", "content": role.user_text(self.task.question, memories=memories)}
            )
        elif kind == EXECUTE:
            shown = self.plan if self.show_plan else None
            plan = f"{PLAN_HEADER}\n{shown}\n\n" if shown else ""
            last = self._round_turns(self.round - 1) if self.round > 0 else []
            if self.meta is None and self.round > 0:  # a lone executor's retry reads the check of its miss
                check = describe_attempt(self.rounds[-1].answer, *read_gold(self.task.answer))
                previous = previous_block(self._round_turns(self.round), last, check, header=ATTEMPT_HEADER)
            else:
                reflection = next(
                    (self._shown_text(t) for t in reversed(self.turns) if t.kind == REFLECT), ""
                )
                previous = previous_block(self._round_turns(self.round), last, reflection)
            user = role.user_text(self.task.question, memories=memories, plan=plan, previous=previous)
            messages.append({"role": "user", "content": user})
        else:
            plan_tags = role.grammar.plan
            messages.append(
                {"role": "user", "content": role.user_text(self.task.question, memories=memories)}
            )
            messages.append(
                {"role": "assistant", "content": f"{plan_tags[0]}{self.plan or ''}{plan_tags[1]}"}
            )
            work = work_block(self._round_turns(self.round)) or "(no work)"
            answer = self._round_answer() or "(no answer)"
            carried = tail(self.internal.carried(self._reflections(), role.grammar), CARRIED_LIMIT)
            state, _ = neutralise(carried, self._markers)
            carried = notes_block(state)
            instruction = self.internal.instruction(role.grammar)
            asked = role.reflect_text(work=work, answer=answer) + (
                f"\n\n{instruction}" if instruction else ""
            )
            if self.limits.number_check:
                calls = [c.arguments for t in self._round_turns(self.round) for c in t.tool_calls]
                found = number_check(self.task.question, self.plan, calls)
                asked = f"{CHECK_HEADER}\n{found}\n\n{asked}"
            if self.limits.attempt_check:
                found = describe_attempt(self._round_answer(), *read_gold(self.task.answer))
                asked = f"{ATTEMPT_HEADER}\n{neutralise(found, self._markers)[0]}\n\n{asked}"
            messages.append({"role": "user", "content": carried + asked})
        self.turns.append(
            TurnRecord(role=role.name, kind=kind, round=self.round, prompt_ids=self.chat.prompt(messages))
        )
        self._segment_start = 0

    def _reflections(self) -> list[str]:
        return [t.text for t in self.turns if t.kind == REFLECT]

    def scripted_reflection(self, text: str) -> str:
        """A demonstration's reflection for the turn that is next, written as the internal memory asks."""
        assert self.meta is not None and self.current is not None and self.current.kind == REFLECT
        answers = [r.answer for r in self.rounds]  # this round's graded already: its executors are done
        return self.internal.demonstrate(text, self._reflections(), answers, self.meta.grammar)

    def _round_turns(self, round_: int) -> list[TurnRecord]:
        return [t for t in self.turns if t.kind == EXECUTE and t.round == round_]

    def _round_answer(self) -> str | None:
        answers = [t.answer for t in self._round_turns(self.round) if t.answer is not None]
        return answers[-1] if answers else None

    # ---- outcome -----------------------------------------------------------------------------

    def _grade_round(self) -> None:
        """Grade this round's answer, once: when its executors are done, or when the episode ends."""
        if self.rounds and self.rounds[-1].index == self.round:
            return
        answer = self._round_answer()
        correct = bool(answer) and self.grade(answer, self.task)
        # The plan the round's executors saw: none when it was hidden or no executor got to act.
        shown = self.plan if self.show_plan and self._round_turns(self.round) else None
        self.rounds.append(RoundRecord(self.round, answer, correct, plan=shown))

    def _finish(self, *, truncated: bool) -> None:
        self._grade_round()
        self.rounds[-1].ended = True
        self.truncated = truncated
        answers = [t.answer for t in self.turns if t.kind == EXECUTE and t.answer is not None]
        self.final_answer = answers[-1] if answers else None
        graded = {r.answer: r.correct for r in self.rounds}
        if self.final_answer in graded:  # the answer of a round, graded already
            self.correct = graded[self.final_answer]
        else:
            self.correct = bool(self.final_answer) and self.grade(self.final_answer, self.task)
        for role in self.roles.values():  # what happened to each role that acted; score() rewards it
            turns = [t for t in self.turns if t.role == role.name]
            if not turns:
                continue
            if role.kind == META_THINKER:
                # Every plan and reflection must keep its tags: a runaway turn costs the format penalty.
                rounds = tuple((r.correct, r.verdict) for r in self.rounds)
                outcome = Outcome(
                    self.correct, format_ok=all(t.format_ok for t in turns), leaked=self.leaked, rounds=rounds
                )
            else:
                errors = sum(1 for t in turns for c in t.tool_calls if not c.ok)
                # A forged observation in any of its turns costs the format penalty, whatever came after.
                format_ok = turns[-1].format_ok and not any(t.forged for t in turns)
                outcome = Outcome(self.correct, format_ok=format_ok, tool_errors=errors)
            self.outcomes[role.name] = outcome
        self.done = True

    @property
    def tool_calls(self) -> int:
        return sum(len(t.tool_calls) for t in self.turns)

    @property
    def tool_errors(self) -> int:
        return sum(1 for t in self.turns for c in t.tool_calls if not c.ok)

    @property
    def leaked(self) -> bool:
        """Whether the meta-thinker stated the answer where an executor reads it: in its plan, or in
        a reflection that revised the plan (the next round's executor is shown that reflection)."""
        if self.meta is None:
            return False
        shown = [
            t
            for t in self.turns
            if (t.kind == PLAN and self.show_plan) or (t.kind == REFLECT and t.round < self.round)
        ]
        return any(
            states_answer(self._shown_text(t), self.task.answer, self.meta.grammar, self.task.question)
            for t in shown
        )

    def _shown_text(self, turn: TurnRecord) -> str:
        """A meta-thinker turn as later executors read it (and the leak check scans it): with its plans cut out
        when plans are hidden, and its notes when the internal memory carries them."""
        text = turn.text.strip()
        if self.meta is None:
            return text
        if self.internal.carries:  # the notes are the meta-thinker's own: no executor reads them
            text = without_notes(text, self.meta.grammar)
        return text if self.show_plan else without_plans(text, self.meta.grammar)
