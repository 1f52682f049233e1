"""Credit for a rollout on hand-played episodes: advantages within (role, task) groups, each episode once."""

from __future__ import annotations

import pytest

from meta_agent.analysis.metrics import rollout_metrics
from meta_agent.episode.reward import score
from meta_agent.learning.credit import (
    advantage_shares,
    assign_advantages,
    credit_metrics,
    credited_roles,
    training_turns,
)
from tests.meta_agent.conftest import PLAN, REFLECTION, TASKS, answer
from training.grpo import trainable_turns
from training.types import Turn


def played(make_episode, task, correct: bool):
    """plan -> a tagged answer (right or wrong, no tool call) -> reflection that accepts; scored."""
    ep = make_episode("hierarchy", task=task)
    for action in (PLAN, answer(task.answer if correct else "0"), REFLECTION):
        ep.advance_text(action)
    assert ep.done
    score([ep])
    return ep


@pytest.fixture
def episodes(make_episode):
    # Task 0 three times: right, wrong, right. Task 1 once, right: a group of one.
    outcomes = [(TASKS[0], True), (TASKS[0], False), (TASKS[0], True), (TASKS[1], True)]
    return [played(make_episode, task, ok) for task, ok in outcomes]


def test_advantages_are_normalised_within_role_and_task_groups(episodes):
    assert [ep.rewards["executor"] for ep in episodes] == [1.0, 0.0, 1.0, 1.0]
    assert [ep.rewards["meta_thinker"] for ep in episodes] == [1.0, 0.0, 1.0, 1.0]
    assign_advantages(episodes)
    # (role, task 0) = [1, 0, 1]: mean 2/3, sample std sqrt(((1/3)^2 + (2/3)^2 + (1/3)^2) / 2) = sqrt(1/3)
    # -> (1 - 2/3) / 0.57735 = +0.57735 and (0 - 2/3) / 0.57735 = -1.15470; task 1 alone -> 0
    expected = [0.57735, -1.15470, 0.57735, 0.0]
    for ep, advantage in zip(episodes, expected, strict=True):
        # the meta-thinker's plan and reflection share its advantage: its episode counts once
        assert [t.role for t in ep.turns] == ["meta_thinker", "executor", "meta_thinker"]
        assert [t.advantage for t in ep.turns] == pytest.approx([advantage] * 3, abs=1e-5)
    turns = training_turns(episodes)
    assert [t.episode for t in turns] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [t.correct for t in turns] == [ok for ok in (True, False, True, True) for _ in range(3)]
    assert [t.advantage for t in turns] == pytest.approx([a for a in expected for _ in range(3)], abs=1e-5)
    unscaled = episodes[:3]
    assign_advantages(unscaled, scale=False)  # Dr.GRPO: reward minus the group mean
    assert [ep.turns[1].advantage for ep in unscaled] == pytest.approx([1 / 3, -2 / 3, 1 / 3])


def test_credit_metrics_count_the_turns_no_update_learns_from(episodes):
    assign_advantages(episodes)
    turns = training_turns(episodes)
    trained = trainable_turns(turns, filter_zero_variance=True)
    assert len(trained) == 9  # task 1's group of one is flat: its 3 turns are filtered
    metrics = credit_metrics(turns, trained, ["meta_thinker", "executor"])
    assert metrics["train/turns"] == 12 and metrics["train/filtered_turns"] == 3
    assert metrics["role/executor/reward"] == pytest.approx(0.75)
    assert metrics["role/executor/filtered_fraction"] == pytest.approx(0.25)
    # advantages sum to 0 within a group: mean over the executor's 4 turns = 0
    assert metrics["role/executor/advantage"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["role/executor/advantage_abs"] == pytest.approx((0.57735 * 2 + 1.15470) / 4, abs=1e-5)
    assert metrics["role/meta_thinker/filtered_fraction"] == pytest.approx(3 / 12)
    # task 0 = right, wrong, right: a spread, so none of the trained mass is from a flat outcome
    assert metrics["role/executor/advantage_share_all_wrong"] == 0.0


def test_reflection_credit_none_trains_no_reflection(episodes):
    assign_advantages(episodes, reflection_credit="none")
    # as above, task 0 = [1, 0, 1] -> +0.57735, -1.15470, +0.57735; task 1 alone -> 0; the reflections 0
    expected = [0.57735, -1.15470, 0.57735, 0.0]
    for ep, advantage in zip(episodes, expected, strict=True):
        assert [t.kind for t in ep.turns] == ["plan", "execute", "reflect"]
        assert [t.advantage for t in ep.turns] == pytest.approx([advantage, advantage, 0.0], abs=1e-5)
    turns = training_turns(episodes)
    assert len(turns) == 12 and turns[2].advantage == 0.0  # every turn still there for the metrics
    learnable = training_turns(episodes, reflections=False)
    assert [(t.episode, t.role) for t in learnable] == [
        (i, role) for i in range(4) for role in ("meta_thinker", "executor")
    ]
    trained = trainable_turns(learnable, filter_zero_variance=True)
    assert len(trained) == 6  # task 0's plans and executor turns; task 1's group of one is flat
    metrics = credit_metrics(turns, trained, ["meta_thinker", "executor"])
    assert metrics["train/filtered_turns"] == 6
    assert metrics["role/meta_thinker/filtered_fraction"] == pytest.approx(1 - 3 / 8)  # 3 plans of 8 turns
    assert metrics["role/executor/filtered_fraction"] == pytest.approx(1 - 3 / 4)


def test_advantage_shares_say_how_much_signal_came_from_groups_without_an_outcome_spread():
    def turn(group, advantage, correct, role="meta_thinker"):
        return Turn(role, group, (1,), (2,), (1,), (0.0,), 0.0, advantage=advantage, correct=correct)

    trained = [
        turn("mixed", 1.5, True),  # |adv| 1.5 + 0.5 + 0.5 + 0.5 = 3.0 from a group with a spread
        turn("mixed", -0.5, False),
        turn("mixed", -0.5, False),
        turn("mixed", -0.5, False),
        turn("wrong", 0.87, False),  # all wrong, a penalty apart: 0.87 + 0.87 = 1.74
        turn("wrong", -0.87, False),
        turn("right", 0.13, True),  # all right: 0.13 + 0.13 = 0.26
        turn("right", -0.13, True),
        turn("mixed", 9.0, True, role="executor"),  # another role's: not counted in the meta-thinker's
    ]
    # total 3.0 + 1.74 + 0.26 = 5.0: all wrong 1.74 / 5 = 0.348, all right 0.26 / 5 = 0.052
    shares = advantage_shares(trained, "meta_thinker")
    assert shares == pytest.approx({"advantage_share_all_wrong": 0.348, "advantage_share_all_right": 0.052})
    # the executor's groups are its own: its one turn on "mixed" is a group all right
    assert advantage_shares(trained, "executor") == {
        "advantage_share_all_wrong": 0.0,
        "advantage_share_all_right": 1.0,
    }
    assert advantage_shares([turn("x", 0.0, True)], "meta_thinker") == {}  # no mass: nothing to share out


def test_only_roles_that_generated_are_credited(make_episode):
    ep = played(make_episode, TASKS[0], True)
    assert credited_roles(ep) == ["meta_thinker", "executor"]


def test_rollout_metrics_of_hand_played_episodes(episodes, role_sets):
    metrics = rollout_metrics(episodes, role_sets["hierarchy"])
    assert metrics["rollout/accuracy"] == 0.75
    assert metrics["rollout/tool_calls"] == 0.0 and metrics["rollout/truncated"] == 0.0
    assert metrics["role/executor/format_ok"] == 1.0  # every answer was tagged
