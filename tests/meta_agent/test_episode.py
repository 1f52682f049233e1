"""The episode protocol driven by scripted text actions: real chat template, tools, parsers and rewards.

Nothing is mocked: each test plays the roles by hand through `advance_text` (or `advance`, where the
test needs rollout logprobs) and checks what the state machine did with it.
"""

from __future__ import annotations

import json

import pytest

from memory.types import MemoryEntry, MemoryHit
from meta_agent.episode.protocol import Limits
from meta_agent.episode.reward import score
from meta_agent.episode.trace import TraceWriter, episode_dict, episode_markdown
from tests.meta_agent.conftest import PLAN, REFLECTION, TASK, answer, tool_call

CALC = tool_call("calculator", expression=TASK.meta["expression"])
WRONG = str(int(TASK.answer) + 1)


def prompt_text(chat, turn) -> str:
    return chat.decode_raw(turn.prompt_ids)


def rewards_spec(role_sets, roles: str) -> dict:
    return {r.name: r.reward for r in role_sets[roles]}


def play_happy(ep) -> None:
    for action in (PLAN, CALC, answer(TASK.answer), REFLECTION):
        ep.advance_text(action)


# ---- (a) the default hierarchy, start to finish -----------------------------------------------------


def test_hierarchy_happy_path(make_episode, chat, role_sets):
    ep = make_episode("hierarchy")
    assert (ep.current_role, ep.current.kind, ep.round) == ("meta_thinker", "plan", 0)
    assert ep.request().sampling.stop == ("</plan>",)
    assert TASK.question in ep.observation()
    assert "Lessons from similar problems" not in ep.observation()

    ep.advance_text(PLAN)
    assert ep.plan == "multiply then add"
    exe = ep.current
    assert (exe.role, exe.kind, exe.round) == ("executor", "execute", 0)
    assert "Plan from the meta-thinker:\nmultiply then add" in prompt_text(chat, exe)
    assert TASK.question in prompt_text(chat, exe)
    assert "calculator" in prompt_text(chat, exe)  # the registry's tool descriptions are in the system prompt
    assert ep.request().sampling.stop == ("</tool_call>", "</answer>")

    # A rollout segment that ends with a tool call: the env runs the calculator and appends the result.
    call_ids = chat.encode(CALC)
    ep.advance(call_ids, [-0.5] * len(call_ids), CALC, "stop")
    assert ep.current is exe, "after a tool call the executor acts again"
    (call,) = exe.tool_calls
    assert (call.name, call.ok, call.error, call.output) == ("calculator", True, None, TASK.answer)
    observation = f"\n<tool_result>\n{TASK.answer}\n</tool_result>\n"
    assert exe.text == CALC + observation
    obs_ids = chat.encode(observation)
    assert exe.completion_ids == call_ids + obs_ids
    assert exe.mask == [1] * len(call_ids) + [0] * len(obs_ids)
    assert exe.logprobs == [-0.5] * len(call_ids) + [0.0] * len(obs_ids)
    assert exe.generated_tokens == len(call_ids)
    # The next request continues the same turn, tool result included.
    assert ep.request().prompt_ids == tuple(exe.prompt_ids + call_ids + obs_ids)
    assert ep.observation().endswith(observation)

    ep.advance_text(answer(TASK.answer))
    assert (exe.answer, exe.format_ok) == (TASK.answer, True)
    reflect = ep.current
    assert (reflect.role, reflect.kind, reflect.round) == ("meta_thinker", "reflect", 0)
    assert ep.request().sampling.stop == ("</verdict>", "</plan>", "</fix>")
    seen = prompt_text(chat, reflect)
    assert "[executor]" in seen and observation.strip() in seen
    assert f"Its final answer: {TASK.answer}" in seen
    assert "<plan>multiply then add</plan>" in seen  # its own plan, as an earlier assistant message

    ep.advance_text(REFLECTION)
    assert ep.done and ep.current is None and ep.current_role is None
    assert (ep.final_answer, ep.correct, ep.truncated, ep.leaked) == (TASK.answer, True, False, False)
    assert ep.lesson == "use the calculator"
    spec = rewards_spec(role_sets, "hierarchy")
    assert spec["executor"].correct == 1.0 and spec["meta_thinker"].correct == 1.0
    score([ep])
    assert ep.rewards == {"meta_thinker": 1.0, "executor": 1.0}
    assert [(t.role, t.kind, t.reward) for t in ep.turns] == [
        ("meta_thinker", "plan", 1.0),
        ("executor", "execute", 1.0),
        ("meta_thinker", "reflect", 1.0),
    ]
    assert (ep.tool_calls, ep.tool_errors) == (1, 0)
    with pytest.raises(RuntimeError, match="finished"):
        ep.advance_text("more")


def test_trace_of_a_finished_episode(make_episode, tmp_path):
    ep = make_episode("hierarchy")
    play_happy(ep)
    record = episode_dict(ep, step=3)
    assert json.loads(json.dumps(record)) == record
    assert record["step"] == 3 and record["rounds_used"] == 1 and record["lesson"] == "use the calculator"
    assert [t["kind"] for t in record["turns"]] == ["plan", "execute", "reflect"]
    assert record["turns"][1]["tool_calls"][0]["output"] == TASK.answer
    text = episode_markdown(ep)
    assert f"### {TASK.id} (correct)" in text
    assert "tool `calculator` (ok)" in text and "**Lesson:** use the calculator" in text

    writer = TraceWriter(tmp_path / "traces" / "traces.jsonl")
    writer.write([ep, ep], step=1)
    lines = (tmp_path / "traces" / "traces.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["answer"] == TASK.answer


# ---- (b) revisions and max_rounds -------------------------------------------------------------------

REVISE = (
    "<reflection>the executor guessed</reflection><lesson>compute, never guess</lesson>"
    "<plan>call the calculator on the whole expression</plan>"
)


def test_revised_plan_starts_a_second_round(make_episode, chat):
    ep = make_episode("hierarchy")  # max_rounds=2
    ep.advance_text(PLAN)
    ep.advance_text(answer(WRONG))
    ep.advance_text(REVISE)
    assert not ep.done and ep.round == 1
    assert ep.plan == "call the calculator on the whole expression"
    exe = ep.current
    assert (exe.role, exe.kind, exe.round) == ("executor", "execute", 1)
    seen = prompt_text(chat, exe)
    assert "Previous attempt" in seen and answer(WRONG) in seen
    assert "the executor guessed" in seen  # the reflection that asked for the revision
    assert "Plan from the meta-thinker:\ncall the calculator on the whole expression" in seen

    ep.advance_text(CALC)
    ep.advance_text(answer(TASK.answer))
    reflect = ep.current
    assert (reflect.kind, reflect.round) == ("reflect", 1)
    assert f"Its final answer: {TASK.answer}" in prompt_text(chat, reflect)
    assert answer(WRONG) not in prompt_text(chat, reflect)  # only this round's work

    # A third round would pass max_rounds: the revision is refused and the episode ends.
    ep.advance_text(REVISE.replace("compute, never guess", "check twice"))
    assert ep.done and not ep.truncated and ep.round == 1
    assert [t.round for t in ep.turns] == [0, 0, 0, 1, 1]
    assert (ep.final_answer, ep.correct) == (TASK.answer, True)
    assert ep.lesson == "check twice"
    score([ep])
    assert ep.rewards == {"meta_thinker": 1.0, "executor": 1.0}


def test_a_fix_rewrites_one_step_of_the_plan_for_the_next_round(make_episode, chat):
    ep = make_episode("hierarchy")  # max_rounds=2
    ep.advance_text("<plan>1. Multiply 728 by 734.\n2. Subtract 21,139.\n3. Answer.</plan>")
    ep.advance_text(answer(WRONG))
    assert "</fix>" in ep.request().sampling.stop  # a fix ends the reflection, as a plan does
    ep.advance_text(
        '<reflection>step 2 is backwards</reflection><lesson>read each sentence</lesson><fix step="2">Add 21,139.</fix>'
    )
    assert not ep.done and ep.round == 1 and ep.rounds[0].verdict == "revise"
    assert ep.rounds[0].verdict_tagged and ep.turns[-2].format_ok
    assert ep.plan == "1. Multiply 728 by 734.\n2. Add 21,139.\n3. Answer."
    assert "Plan from the meta-thinker:\n1. Multiply 728 by 734.\n2. Add 21,139.\n3. Answer." in prompt_text(
        chat, ep.current
    )
    ep.advance_text(CALC)
    ep.advance_text(answer(TASK.answer))
    ep.advance_text(REFLECTION)
    assert ep.done and ep.correct and [r.correct for r in ep.rounds] == [False, True]


def test_a_fix_of_a_step_the_plan_lacks_keeps_the_plan_and_breaks_the_format(make_episode, role_sets):
    penalty = rewards_spec(role_sets, "hierarchy")["meta_thinker"].format_penalty
    ep = make_episode("hierarchy")
    ep.advance_text("<plan>1. Multiply 728 by 734.\n2. Add 21,139.</plan>")
    ep.advance_text(answer(WRONG))
    ep.advance_text('<reflection>wrong</reflection><lesson>check</lesson><fix step="7">Add 1.</fix>')
    assert ep.round == 1 and ep.rounds[0].verdict == "revise" and not ep.rounds[0].verdict_tagged
    assert ep.plan == "1. Multiply 728 by 734.\n2. Add 21,139." and not ep.turns[2].format_ok
    ep.advance_text(CALC)
    ep.advance_text(answer(TASK.answer))
    ep.advance_text(REFLECTION)
    score([ep])
    assert ep.correct and ep.rewards["meta_thinker"] == pytest.approx(1.0 - penalty)


def test_max_rounds_one_allows_no_revision(make_episode):
    ep = make_episode("hierarchy", limits=Limits(max_rounds=1))
    ep.advance_text(PLAN)
    ep.advance_text(answer(WRONG))
    ep.advance_text(REVISE)
    assert ep.done and not ep.truncated and ep.round == 0 and len(ep.turns) == 3
    score([ep])
    assert (ep.correct, ep.rewards) == (False, {"meta_thinker": 0.0, "executor": 0.0})


def test_without_final_reflection_the_last_round_ends_after_its_executor(make_episode):
    ep = make_episode("hierarchy", final_reflection=False)  # max_rounds=2: round 0 still reflects
    ep.advance_text(PLAN)
    ep.advance_text(answer(WRONG))
    assert ep.current.kind == "reflect"
    ep.advance_text(REVISE)
    ep.advance_text(CALC)
    ep.advance_text(answer(TASK.answer))
    assert ep.done and not ep.truncated and ep.round == 1
    assert [t.kind for t in ep.turns] == ["plan", "execute", "reflect", "execute"]
    score([ep])
    assert (ep.correct, ep.rewards) == (True, {"meta_thinker": 1.0, "executor": 1.0})
    one_round = make_episode("hierarchy", limits=Limits(max_rounds=1), final_reflection=False)
    one_round.advance_text(PLAN)
    one_round.advance_text(answer(TASK.answer))
    assert one_round.done and [t.kind for t in one_round.turns] == ["plan", "execute"]
    assert one_round.lesson is None


def test_revise_verdict_without_a_plan_keeps_the_old_plan(make_episode, chat):
    ep = make_episode("hierarchy")
    ep.advance_text(PLAN)
    ep.advance_text(answer(WRONG))
    ep.advance_text("<reflection>check it</reflection><verdict>revise</verdict>")
    assert ep.round == 1 and ep.plan == "multiply then add"
    assert "Previous attempt" in prompt_text(chat, ep.current)


# ---- (c) the meta-thinker must plan, not answer -----------------------------------------------------


@pytest.mark.parametrize(
    "plan",
    [
        f"<plan>multiply, add, and you get {TASK.answer}</plan>",
        f"<plan>multiply, add, and you get {int(TASK.answer):,}</plan>",
        "<plan>just write <answer>the total</answer></plan>",
    ],
    ids=["number", "grouped-number", "answer-tags"],
)
def test_leaked_answer_costs_the_meta_thinker(make_episode, role_sets, plan):
    ep = make_episode("hierarchy")
    for action in (plan, answer(TASK.answer), REFLECTION):
        ep.advance_text(action)
    spec = rewards_spec(role_sets, "hierarchy")
    assert ep.correct and ep.leaked
    score([ep])
    assert ep.rewards["meta_thinker"] == pytest.approx(
        spec["meta_thinker"].correct - spec["meta_thinker"].leak_penalty
    )
    assert ep.rewards["executor"] == spec["executor"].correct  # the executor is not blamed


def test_answer_leaked_in_a_revision_costs_the_meta_thinker(make_episode, chat, role_sets):
    # The next round's executor reads the revising reflection, new plan and all: stating the answer
    # there is the same leak as stating it in the first plan.
    ep = make_episode("hierarchy")
    ep.advance_text(PLAN)
    ep.advance_text(answer(WRONG))
    ep.advance_text(f"<reflection>wrong</reflection><plan>just write {TASK.answer}</plan>")
    assert f"just write {TASK.answer}" in prompt_text(chat, ep.current)
    ep.advance_text(answer(TASK.answer))
    ep.advance_text(REFLECTION)
    spec = rewards_spec(role_sets, "hierarchy")["meta_thinker"]
    assert ep.correct and ep.leaked
    score([ep])
    assert ep.rewards["meta_thinker"] == pytest.approx(spec.correct - spec.leak_penalty)


def test_accepting_reflection_may_quote_the_answer(make_episode):
    # No executor reads a final reflection: checking the executor's answer there is no leak.
    ep = make_episode("hierarchy")
    ep.advance_text(PLAN)
    ep.advance_text(answer(TASK.answer))
    ep.advance_text(f"<reflection>{TASK.answer} checks out</reflection><verdict>accept</verdict>")
    score([ep])
    assert ep.done and not ep.leaked and ep.rewards["meta_thinker"] == 1.0


def test_plan_naming_the_questions_numbers_is_not_a_leak(make_episode):
    ep = make_episode("hierarchy")
    for action in ("<plan>multiply 728 by 734, then add 21,139</plan>", answer(TASK.answer), REFLECTION):
        ep.advance_text(action)
    score([ep])
    assert not ep.leaked and ep.rewards == {"meta_thinker": 1.0, "executor": 1.0}


def test_untagged_plan_and_answer_are_used_but_penalised(make_episode, role_sets):
    ep = make_episode("hierarchy")
    ep.advance_text("multiply, then add")  # no tags, ends without a stop string
    assert ep.plan == "multiply, then add" and not ep.turns[0].format_ok
    ep.advance_text(f"The total is {TASK.answer}.")  # EOS without answer tags: recovered from the text
    assert (ep.turns[1].answer, ep.turns[1].format_ok) == (TASK.answer, False)
    ep.advance_text(REFLECTION)
    spec = rewards_spec(role_sets, "hierarchy")
    assert ep.correct
    score([ep])
    assert ep.rewards["meta_thinker"] == pytest.approx(1.0 - spec["meta_thinker"].format_penalty)
    assert ep.rewards["executor"] == pytest.approx(1.0 - spec["executor"].format_penalty)


def test_runaway_plan_or_reflection_costs_the_meta_thinker_and_stores_no_lesson(make_episode, role_sets):
    penalty = rewards_spec(role_sets, "hierarchy")["meta_thinker"].format_penalty
    # A plan that never closes (the model ran out of tokens) still reaches the executor.
    ep = make_episode("hierarchy")
    for action in (
        "<plan>multiply then add, the calculator's calculator's",
        CALC,
        answer(TASK.answer),
        REFLECTION,
    ):
        ep.advance_text(action)
    assert ep.plan.startswith("multiply then add") and not ep.turns[0].format_ok
    score([ep])
    assert ep.rewards == {"meta_thinker": pytest.approx(1.0 - penalty), "executor": 1.0}
    # A reflection whose lesson never closes: penalised, and the half lesson is not kept.
    ep = make_episode("hierarchy")
    for action in (
        PLAN,
        CALC,
        answer(TASK.answer),
        "<reflection>ok</reflection><lesson>the calculator's calculator's",
    ):
        ep.advance_text(action)
    assert ep.done and ep.lesson is None and not ep.turns[-1].format_ok
    score([ep])
    assert ep.rewards == {"meta_thinker": pytest.approx(1.0 - penalty), "executor": 1.0}
    ep = make_episode("hierarchy")
    for action in (PLAN, CALC, answer(TASK.answer), "<reflection>the calculator's calculator's"):
        ep.advance_text(action)
    assert not ep.turns[-1].format_ok
    score([ep])
    assert ep.rewards == {"meta_thinker": pytest.approx(1.0 - penalty), "executor": 1.0}
    # A reflection that closes its tags and then rambles past its verdict (seen in GRPO rollouts sampled
    # at temperature 1.0) accepts, keeps its lesson, and costs the penalty.
    ep = make_episode("hierarchy")
    rambling = (
        "<reflection>ok</reflection><lesson>use the calculator</lesson><versus>copy the result</versing>"
    )
    for action in (PLAN, CALC, answer(TASK.answer), rambling):
        ep.advance_text(action)
    assert ep.done and ep.lesson == "use the calculator" and not ep.turns[-1].format_ok
    assert (ep.rounds[-1].verdict, ep.rounds[-1].verdict_tagged) == ("accept", False)
    score([ep])
    assert ep.rewards == {"meta_thinker": pytest.approx(1.0 - penalty), "executor": 1.0}


# ---- (d) single agent, (e) two executors ------------------------------------------------------------


def test_single_agent_is_the_executor_alone(make_episode, chat):
    ep = make_episode("single_agent")
    assert (ep.current_role, ep.current.kind) == ("executor", "execute")
    assert ep.meta is None and "Plan from the meta-thinker" not in ep.observation()
    ep.advance_text(CALC)
    ep.advance_text(answer(TASK.answer))
    assert ep.done and ep.correct and not ep.truncated and not ep.leaked
    assert [(t.role, t.kind) for t in ep.turns] == [("executor", "execute")]
    score([ep])
    assert ep.rewards == {"executor": 1.0}
    assert ep.lesson is None


def test_two_executors_solver_then_checker(make_episode, chat):
    ep = make_episode("two_executors")
    ep.advance_text(PLAN)
    solver = ep.current
    assert solver.role == "solver" and "Work so far" not in prompt_text(chat, solver)
    ep.advance_text(tool_call("calculator", expression="728*734"))
    ep.advance_text(answer(WRONG))
    checker = ep.current
    assert (checker.role, checker.kind, checker.round) == ("checker", "execute", 0)
    seen = prompt_text(chat, checker)
    assert "Work so far:\n[solver]" in seen
    assert '"expression": "728*734"' in seen and "534352" in seen and answer(WRONG) in seen
    assert "Check the work above with the tools" in seen  # the checker's own template

    ep.advance_text(CALC)
    ep.advance_text(answer(TASK.answer))
    reflect = ep.current
    seen = prompt_text(chat, reflect)
    assert "[solver]" in seen and "[checker]" in seen and f"Its final answer: {TASK.answer}" in seen
    ep.advance_text(REFLECTION)
    assert ep.final_answer == TASK.answer and ep.correct  # the checker's answer, not the solver's
    score([ep])
    assert ep.rewards == {"meta_thinker": 1.0, "solver": 1.0, "checker": 1.0}
    assert [t.role for t in ep.turns] == ["meta_thinker", "solver", "checker", "meta_thinker"]


def test_two_executors_checker_overrules_a_right_solver(make_episode):
    ep = make_episode("two_executors")
    for action in (PLAN, answer(TASK.answer), answer(WRONG), REFLECTION):
        ep.advance_text(action)
    assert ep.final_answer == WRONG and not ep.correct
    score([ep])
    assert ep.rewards == {"meta_thinker": 0.0, "solver": 0.0, "checker": 0.0}


# ---- (f) limits -------------------------------------------------------------------------------------


def test_max_tool_calls_answers_with_an_error(make_episode):
    ep = make_episode("single_agent", limits=Limits(max_tool_calls=1))
    ep.advance_text(CALC)
    ep.advance_text(CALC)
    first, second = ep.current.tool_calls
    assert first.ok and first.output == TASK.answer
    assert not second.ok and second.error == "bad_call" and "tool call limit reached" in second.output
    assert "tool call limit reached" in ep.current.text
    ep.advance_text(answer(TASK.answer))
    assert ep.done and ep.correct and ep.tool_errors == 1


def test_token_budget_ends_the_episode_truncated(make_episode, chat):
    ep = make_episode("hierarchy", limits=Limits(max_new_tokens=40))
    ep.advance_text(PLAN)
    used = len(chat.encode(PLAN))
    assert (
        ep.request().sampling.max_new_tokens == 40 - used
    )  # the executor's cap is what is left of the budget
    ep.advance_text("Let me think. " * 10 + "It may be 12.")  # no answer tags, past the budget
    assert ep.done and ep.truncated
    assert [t.kind for t in ep.turns] == ["plan", "execute"]  # no reflection was started
    assert ep.final_answer == "12" and not ep.correct
    score([ep])
    assert set(ep.rewards) == {"meta_thinker", "executor"}


def test_tool_call_past_the_budget_is_not_run(make_episode, chat):
    budget = len(chat.encode(CALC))
    ep = make_episode("single_agent", limits=Limits(max_new_tokens=budget))
    ep.advance_text(CALC)
    assert ep.done and ep.truncated and ep.tool_calls == 0 and ep.final_answer is None


def test_max_turns_ends_the_episode(make_episode):
    ep = make_episode("hierarchy", limits=Limits(max_turns=2))
    ep.advance_text(PLAN)
    ep.advance_text(answer(TASK.answer))
    assert ep.done and ep.truncated and ep.correct
    assert [t.kind for t in ep.turns] == ["plan", "execute"] and ep.lesson is None
    score([ep])
    assert ep.rewards == {"meta_thinker": 1.0, "executor": 1.0}


def test_max_turns_stops_a_revision(make_episode):
    ep = make_episode("hierarchy", limits=Limits(max_turns=3))
    ep.advance_text(PLAN)
    ep.advance_text(answer(WRONG))
    ep.advance_text(REVISE)
    assert ep.done and ep.round == 0 and len(ep.turns) == 3


def test_single_agent_answer_within_max_turns_is_not_truncated(make_episode):
    # One executor turn is the whole single-agent protocol: ending it is the natural end, not a cut.
    ep = make_episode("single_agent", limits=Limits(max_turns=1))
    ep.advance_text(answer(TASK.answer))
    assert ep.done and ep.correct and not ep.truncated


@pytest.mark.parametrize("field", ["max_rounds", "max_turns", "max_new_tokens", "max_tool_calls"])
def test_limits_out_of_range_name_the_key(field):
    with pytest.raises(ValueError, match=f"protocol.{field}"):
        Limits(**{field: -1})


# ---- (g) model failures are data, (h) the python sandbox --------------------------------------------


def test_bad_tool_calls_come_back_as_errors_and_cost_the_executor(make_episode, role_sets):
    ep = make_episode("hierarchy")
    ep.advance_text(PLAN)
    ep.advance_text('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>')
    ep.advance_text(tool_call("web_search", query="728*734"))
    ep.advance_text("calculator 728*734</tool_call>")  # no opening tag: the body fails to parse
    ep.advance_text(CALC)
    ep.advance_text(answer(TASK.answer))
    calls = ep.turns[1].tool_calls
    assert [c.ok for c in calls] == [False, False, False, True]
    assert "not valid JSON" in calls[0].output
    assert calls[1].name == "web_search"
    # Only what the role may call and the registry holds (no memory here, so no memory_search).
    assert calls[1].output == "unknown tool 'web_search'; available: calculator, python"
    assert all(c.error == "bad_call" for c in calls[:3])
    assert "not valid JSON" in ep.turns[1].text  # the executor sees why
    ep.advance_text(REFLECTION)
    assert ep.correct and (ep.tool_calls, ep.tool_errors) == (4, 3)
    spec = rewards_spec(role_sets, "hierarchy")["executor"]
    score([ep])
    assert ep.rewards["executor"] == pytest.approx(spec.correct - 3 * spec.tool_error_penalty)
    assert ep.rewards["meta_thinker"] == 1.0


def test_tool_error_penalty_is_capped(make_episode, role_sets):
    ep = make_episode("single_agent", limits=Limits(max_tool_calls=8))
    for _ in range(6):
        ep.advance_text(tool_call("calculator", expression="1/0"))
    assert all(not c.ok and c.error == "failed" for c in ep.current.tool_calls)
    ep.advance_text(answer(TASK.answer))
    spec = role_sets["single_agent"][0].reward
    assert ep.tool_errors == 6
    score([ep])
    assert ep.rewards["executor"] == pytest.approx(spec.correct - spec.max_tool_error_penalty)


def test_python_tool_output_comes_back(make_episode):
    ep = make_episode("single_agent")
    ep.advance_text(tool_call("python", code=f"print({TASK.meta['expression']})"))
    (call,) = ep.current.tool_calls
    assert call.ok and call.name == "python" and call.output.strip() == TASK.answer
    assert ep.current.text.endswith(f"<tool_result>\n{TASK.answer}\n\n</tool_result>\n")
    ep.advance_text(answer(TASK.answer))
    assert ep.correct and ep.tool_errors == 0


# ---- (i) memories -----------------------------------------------------------------------------------


def hit(text: str) -> MemoryHit:
    entry = MemoryEntry(1, text, "lesson", "arith/train/0", 1.0, 0.0, 0.0)
    return MemoryHit(entry, score=0.9, relevance=0.8, recency=1.0, importance=0.75)


def test_memories_are_shown_to_every_turn(make_episode, chat):
    lessons = [hit("Use the calculator for every product."), hit("Add deliveries after the product.")]
    ep = make_episode("hierarchy", memories=lessons)
    block = "Lessons from similar problems:\n- Use the calculator for every product.\n- Add deliveries after the product."
    play_happy(ep)
    for turn in ep.turns:
        assert block in prompt_text(chat, turn), turn.kind
    assert episode_dict(ep)["memories"] == [
        {"text": "Use the calculator for every product.", "score": 0.9},
        {"text": "Add deliveries after the product.", "score": 0.9},
    ]
