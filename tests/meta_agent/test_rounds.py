"""Every round graded: each round's answer, its correctness, the verdict and whether it ended the episode,
in the episode record and in its traces; and the probes' episode options (plan hidden, adapters swapped)."""

from __future__ import annotations

from meta_agent.analysis.reflection import reflected, reflection_metrics
from meta_agent.episode.protocol import Limits
from meta_agent.episode.trace import episode_dict, episode_markdown
from tests.meta_agent.conftest import PLAN, REFLECTION, TASK, answer, tool_call

CALC = tool_call("calculator", expression=TASK.meta["expression"])
WRONG = str(int(TASK.answer) + 1)
REVISE = (
    "<reflection>it guessed</reflection><lesson>compute</lesson><plan>call the calculator on it all</plan>"
)


def as_tuples(ep):
    return [(r.index, r.answer, r.correct, r.verdict, r.ended) for r in ep.rounds]


def test_a_revision_that_fixes_the_answer_is_graded_round_by_round(make_episode):
    ep = make_episode("hierarchy")  # max_rounds=2
    for action in (PLAN, answer(WRONG), REVISE, CALC, answer(TASK.answer), REFLECTION):
        ep.advance_text(action)
    assert ep.done and ep.correct
    assert as_tuples(ep) == [(0, WRONG, False, "revise", False), (1, TASK.answer, True, "accept", True)]
    assert [r.plan for r in ep.rounds] == ["multiply then add", "call the calculator on it all"]
    record = episode_dict(ep)
    assert record["rounds"] == [
        {
            "round": 1,
            "answer": WRONG,
            "correct": False,
            "verdict": "revise",
            "verdict_tagged": True,
            "ended": False,
            "plan": "multiply then add",
        },
        {
            "round": 2,
            "answer": TASK.answer,
            "correct": True,
            "verdict": "accept",
            "verdict_tagged": True,
            "ended": True,
            "plan": "call the calculator on it all",
        },
    ]
    text = episode_markdown(ep)
    assert "| round | answer | correct | verdict | ended the episode |" in text
    assert (
        f"| 1 | `{WRONG}` | no | revise | no |" in text
        and f"| 2 | `{TASK.answer}` | yes | accept | yes |" in text
    )
    m = reflection_metrics([reflected(ep)])
    assert m["reflection/wrong_to_right"] == 1 and m["reflection/self_correction"] == 1.0


def test_a_revise_verdict_past_max_rounds_is_recorded_though_no_round_follows(make_episode):
    ep = make_episode("hierarchy", limits=Limits(max_rounds=1))
    for action in (PLAN, answer(WRONG), REVISE):
        ep.advance_text(action)
    assert ep.done and as_tuples(ep) == [(0, WRONG, False, "revise", True)]


def test_rounds_without_a_reflection(make_episode):
    single = make_episode("single_agent")
    single.advance_text(answer(TASK.answer))
    assert as_tuples(single) == [(0, TASK.answer, True, None, True)] and single.rounds[0].plan is None
    held_out = make_episode("hierarchy", limits=Limits(max_rounds=1), final_reflection=False)
    held_out.advance_text(PLAN)
    held_out.advance_text(answer(WRONG))
    assert as_tuples(held_out) == [(0, WRONG, False, None, True)]
    cut = make_episode("hierarchy", limits=Limits(max_new_tokens=20))
    cut.advance_text("<plan>" + "think " * 30)  # out of budget inside the plan: no executor answered
    assert cut.done and as_tuples(cut) == [(0, None, False, None, True)]


def test_two_executors_answer_for_their_round(make_episode):
    ep = make_episode("two_executors")
    for action in (PLAN, answer(WRONG), answer(TASK.answer), REFLECTION):
        ep.advance_text(action)
    assert as_tuples(ep) == [(0, TASK.answer, True, "accept", True)]  # the checker's answer is the round's


def test_probe_options_hide_the_plan_and_swap_adapters(make_episode, role_sets, chat, registry):
    from meta_agent.episode.protocol import Episode
    from meta_agent.tasks import grade_task

    ep = Episode(
        TASK,
        role_sets["hierarchy"],
        chat,
        registry,
        grade_task,
        show_plan=False,
        adapters={"meta_thinker": "mt_a"},
    )
    assert ep.request().adapter == "mt_a"
    ep.advance_text(PLAN)
    assert ep.request().adapter == "executor"
    assert (
        "Plan from the meta-thinker" not in ep.observation() and "multiply then add" not in ep.observation()
    )
    ep.advance_text(answer(TASK.answer))
    ep.advance_text(REFLECTION)
    assert ep.rounds[0].plan is None  # the executors saw no plan: nothing to adhere to


def lines_outside_fences(markdown: str) -> list[str]:
    out, fence = [], None
    for line in markdown.splitlines():
        if fence is None and line.startswith("```"):
            fence = line[: len(line) - len(line.lstrip("`"))]
        elif fence is not None and line == fence:
            fence = None
        elif fence is None:
            out.append(line)
    return out


def test_model_text_cannot_forge_the_rounds_table_or_escape_the_page(make_episode):
    forged = "12\n```\n| 2 | `42` | yes | accept | yes |\n````\n<script>alert(1)</script>"
    ep = make_episode("hierarchy")
    for action in (PLAN, answer(forged), "<reflection>```</reflection><lesson>| a | b |\n| 9 |</lesson>"):
        ep.advance_text(action)
    table = [line for line in lines_outside_fences(episode_markdown(ep)) if line.startswith("|")]
    assert len(table) == 3  # the header, its rule and round 1: nothing the model wrote
    assert not any("| 2 |" in row for row in table)  # the forged row stayed inside its code block

    from meta_agent.analysis.report import episode_html

    page = episode_html(episode_dict(ep, step="<b>1</b>"))
    assert "<script>" not in page and "&lt;script&gt;" in page and "<b>1</b>" not in page
