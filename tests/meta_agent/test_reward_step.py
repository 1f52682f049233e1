"""The reward step (meta_agent.episode.reward.score): an episode records what happened to each role as it
ends, and score turns that into the rewards the episode itself computed before (issue 53)."""

from __future__ import annotations

import pytest

from meta_agent.episode.reward import score
from roles import Outcome
from tests.meta_agent.conftest import PLAN, REFLECTION, TASK, answer, tool_call

LEAK = f"<plan>multiply, add, and you get {TASK.answer}</plan>"
BAD_CALLS = (tool_call("calculator", expression="1/0"), tool_call("nope"))
# actions -> (rewards, each turn's reward), as Episode._finish set them before the step was its own
EPISODES = {
    "correct": ((PLAN, answer(TASK.answer), REFLECTION), {"meta_thinker": 1.0, "executor": 1.0}, [1.0] * 3),
    "wrong": ((PLAN, answer("0"), REFLECTION), {"meta_thinker": 0.0, "executor": 0.0}, [0.0] * 3),
    # untagged plan and answer: 1 - format_penalty 0.2 each
    "format": (
        ("multiply, then add", f"The total is {TASK.answer}.", REFLECTION),
        {"meta_thinker": 0.8, "executor": 0.8},
        [0.8] * 3,
    ),
    # the plan states the answer: the meta-thinker pays leak_penalty 0.5, the executor is not blamed
    "leaked": (
        (LEAK, answer(TASK.answer), REFLECTION),
        {"meta_thinker": 0.5, "executor": 1.0},
        [0.5, 1.0, 0.5],
    ),
    # two failed calls: tool_error_penalty 0.05 each, on the executor alone
    "tool errors": (
        (PLAN, *BAD_CALLS, answer(TASK.answer), REFLECTION),
        {"meta_thinker": 1.0, "executor": 0.9},
        [1.0, 0.9, 1.0],
    ),
}


@pytest.mark.parametrize("case", list(EPISODES))
def test_score_gives_the_rewards_the_episode_gave_before(case, make_episode):
    actions, rewards, turn_rewards = EPISODES[case]
    ep = make_episode("hierarchy")
    for action in actions:
        ep.advance_text(action)
    assert ep.done and ep.rewards == {} and {t.reward for t in ep.turns} == {0.0}  # recorded, not rewarded
    assert set(ep.outcomes) == {"meta_thinker", "executor"}
    assert all(isinstance(o, Outcome) for o in ep.outcomes.values())
    score([ep])
    assert ep.rewards == rewards and list(ep.rewards) == ["meta_thinker", "executor"]
    assert [t.reward for t in ep.turns] == turn_rewards
    score([ep])  # again: the same
    assert ep.rewards == rewards


def test_score_only_rewards_finished_episodes(make_episode):
    ep = make_episode("hierarchy")
    ep.advance_text(PLAN)
    with pytest.raises(RuntimeError, match="before the episode finished"):
        score([ep])
