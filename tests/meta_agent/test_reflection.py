"""Reflection metrics on hand-built rounds, each number worked out in a comment."""

from __future__ import annotations

import pytest

from meta_agent.analysis.adherence import arithmetic_adherence, call_texts, plan_steps
from meta_agent.analysis.reflection import (
    Reflected,
    final_answer_round,
    reflection_metrics,
    transitions,
    verdicts,
)
from meta_agent.episode.records import RoundRecord


def rounds(*spec: tuple[bool, str | None]) -> tuple[RoundRecord, ...]:
    """(correct, verdict) per round; the last round ended the episode; every round answered."""
    return tuple(
        RoundRecord(i, answer=str(i), correct=ok, verdict=v, ended=i == len(spec) - 1)
        for i, (ok, v) in enumerate(spec)
    )


# Four episodes of a two-round hierarchy:
#   A: wrong, revise -> right, accept     (fixed by reflection)
#   B: right, revise -> wrong, accept     (broken by reflection)
#   C: wrong, accept                      (a wrong answer accepted: one round)
#   D: right, accept                      (a right answer accepted)
EPISODES = [
    rounds((False, "revise"), (True, "accept")),
    rounds((True, "revise"), (False, "accept")),
    rounds((False, "accept")),
    rounds((True, "accept")),
]


def test_transitions_count_consecutive_rounds():
    assert transitions(EPISODES) == {
        "wrong_to_right": 1,
        "right_to_wrong": 1,
        "right_to_right": 0,
        "wrong_to_wrong": 0,
    }
    three = [rounds((False, "revise"), (False, "revise"), (True, None))]
    assert transitions(three) == {
        "wrong_to_right": 1,
        "right_to_wrong": 0,
        "right_to_right": 0,
        "wrong_to_wrong": 1,
    }


def test_verdicts_judge_each_reflected_round():
    # verdicts: A revise|wrong, accept|right; B revise|right, accept|wrong; C accept|wrong; D accept|right
    assert verdicts(EPISODES) == {"accept_right": 2, "accept_wrong": 2, "revise_right": 1, "revise_wrong": 1}


def test_reflection_metrics_by_hand():
    m = reflection_metrics([Reflected(r, leaked=i == 0, adherence=None) for i, r in enumerate(EPISODES)])
    assert m["reflection/episodes"] == 4 and m["reflection/transitions"] == 2
    assert m["reflection/wrong_to_right_rate"] == 0.5 and m["reflection/right_to_right_rate"] == 0.0
    assert m["reflection/self_correction"] == 0.0  # (1 fixed - 1 broken) / 4 episodes
    # right answers judged: 3 (A r2, B r1, D) -> accept 2/3, revise 1/3; wrong: 3 (A r1, B r2, C)
    assert m["reflection/accept_given_right"] == pytest.approx(2 / 3)
    assert m["reflection/revise_given_right"] == pytest.approx(1 / 3)
    assert m["reflection/accept_given_wrong"] == pytest.approx(2 / 3)
    assert m["reflection/revise_given_wrong"] == pytest.approx(1 / 3)
    assert m["reflection/revise_precision"] == 0.5  # 2 revisions, 1 of a wrong answer
    assert m["reflection/revise_recall"] == pytest.approx(1 / 3)  # 3 wrong answers, 1 revised
    assert m["reflection/revision_rate"] == pytest.approx(2 / 6)  # 6 verdicts, 2 revise
    assert m["reflection/rounds_used"] == pytest.approx(6 / 4)
    assert m["reflection/final_answer_round"] == pytest.approx(6 / 4)  # 2, 2, 1, 1
    assert m["reflection/answer_leaks"] == 0.25
    assert m["reflection/plan_adherence"] is None and m["reflection/plan_adherence_episodes"] == 0


def test_what_cannot_be_computed_is_none_not_zero():
    """One round, no reflection (the executor alone): no transition, no verdict, nothing to rate."""
    m = reflection_metrics([Reflected(rounds((True, None)), leaked=False, adherence=None)])
    for name in (
        "wrong_to_right_rate",
        "revise_precision",
        "revise_recall",
        "revision_rate",
        "accept_given_right",
    ):
        assert m[f"reflection/{name}"] is None, name
    assert m["reflection/self_correction"] is None  # one round: nothing to correct in
    assert m["reflection/answer_leaks"] == 0.0  # a meta-thinker was there and did not leak
    assert m["reflection/transitions"] == 0 and m["reflection/verdicts"] == 0
    alone = reflection_metrics([Reflected(rounds((True, None)), leaked=False, adherence=None, planned=False)])
    assert alone["reflection/answer_leaks"] is None  # no meta-thinker: nothing could leak
    assert reflection_metrics([])["reflection/rounds_used"] is None


def test_what_a_revision_changed_by_hand():
    """Three revisions carried out by a next round, one not (the last round's revise has no round after
    it): E's fix left the plan as it was and the answer came again; F changed the plan, got the same
    answer; G changed both. Same plan 1 of 3, same answer 2 of 3."""
    plan_a, plan_b = "1. Add 5.", "1. Subtract 5."
    e = (
        RoundRecord(0, "7", False, "revise", plan=plan_a),
        RoundRecord(1, "7", False, "accept", ended=True, plan=plan_a),
    )
    f = (
        RoundRecord(0, "7", False, "revise", plan=plan_a),
        RoundRecord(1, "7", False, "revise", ended=True, plan=plan_b),
    )
    g = (
        RoundRecord(0, "7", False, "revise", plan=plan_a),
        RoundRecord(1, "9", True, "accept", ended=True, plan=plan_b),
    )
    m = reflection_metrics([Reflected(r, leaked=False, adherence=None) for r in (e, f, g)])
    assert m["reflection/revisions_carried_out"] == 3
    assert m["reflection/revise_same_plan_rate"] == pytest.approx(1 / 3)
    assert m["reflection/revise_same_answer_rate"] == pytest.approx(2 / 3)
    # A next round that gave no answer did not give the same one; without revisions there is no rate.
    silent = (
        RoundRecord(0, "7", False, "revise", plan=plan_a),
        RoundRecord(1, None, False, None, ended=True, plan=plan_a),
    )
    m = reflection_metrics([Reflected(silent, leaked=False, adherence=None)])
    assert m["reflection/revise_same_answer_rate"] == 0.0 and m["reflection/revise_same_plan_rate"] == 1.0
    none = reflection_metrics([Reflected(EPISODES[2], leaked=False, adherence=None)])
    assert none["reflection/revisions_carried_out"] == 0 and none["reflection/revise_same_plan_rate"] is None


def test_a_round_without_an_answer_leaves_the_standing_answer():
    # right, revised, then the second round answers nothing: the first answer stays final and right
    silent = (RoundRecord(0, "12", True, "revise"), RoundRecord(1, None, False, "accept", ended=True))
    assert transitions([silent])["right_to_right"] == 1 and transitions([silent])["right_to_wrong"] == 0


def test_verdicts_the_meta_thinker_never_wrote_are_counted():
    r = (RoundRecord(0, "1", False, "accept", ended=True, verdict_tagged=False),)
    m = reflection_metrics([Reflected(r, leaked=False, adherence=None)])
    assert m["reflection/accept_wrong"] == 1 and m["reflection/untagged_verdicts"] == 1


def test_final_answer_round_is_the_last_round_that_answered():
    silent = (RoundRecord(0, "12", False, "revise"), RoundRecord(1, None, False, None, ended=True))
    assert final_answer_round(silent) == 1  # the second round gave no answer: the first one stands
    assert final_answer_round((RoundRecord(0, None, False),)) is None


def test_plan_steps_read_numbers_and_operations():
    plan = "1. Multiply 7,246 by 18,207.\n2. Add 575,028 times 12.\n3. Give the last result as the answer."
    steps = plan_steps(plan)
    assert [sorted(s.numbers) for s in steps] == [["18207", "7246"], ["12", "575028"]]  # step 3 has none
    assert [sorted(s.operations) for s in steps] == [["*"], ["*", "+"]]
    assert plan_steps("Divide: 48/2 = ? clips")[0].operations == {"/"}


def test_arithmetic_adherence_by_hand():
    plan = "1. Multiply 7,246 by 18,207.\n2. Add 575,028.\n3. Divide by 4."
    one_call = call_texts(['{"name": "calculator", "arguments": {"expression": "(7246*18207+575028)/4"}}'])
    assert arithmetic_adherence(plan, one_call) == 1.0
    # the step-by-step style: the later calls hold the step's number with the running result
    steps = ["7246 * 18207", "131927922 + 575,028", "132502950 / 4"]
    assert arithmetic_adherence(plan, steps) == 1.0
    # the division was skipped and 575028 subtracted instead: 1 of 3 steps done
    assert arithmetic_adherence(plan, ["7246*18207", "131927922-575028"]) == pytest.approx(1 / 3)
    assert arithmetic_adherence(plan, []) == 0.0
    assert arithmetic_adherence("Use the calculator.", ["1+1"]) is None  # nothing to check
    assert call_texts(["not json"]) == ["not json"]
