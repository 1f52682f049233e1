"""bench.speed's comparison of two arms' rollouts, worked out by hand."""

from __future__ import annotations

from bench.speed import agreement


def rollout(*episodes):
    return {"turns": [list(turns) for turns in episodes]}


def test_agreement_counts_tokens_up_to_each_episodes_first_difference():
    same = [[1, 2, 3], [-0.5, -0.25, -1.0]]
    ours = rollout(
        [same, [[7, 8], [-0.1, -0.2]]],  # identical episode
        [[[4, 5, 6], [-1.0, -2.0, -3.0]], [[9], [-0.3]]],  # differs at its first turn's third token
    )
    theirs = rollout(
        [same, [[7, 8], [-0.1, -0.2]]],
        [[[4, 5, 9], [-1.0, -2.5, -0.1]], [[1], [-9.0]]],  # its second turn is never compared
    )
    got = agreement(ours, theirs)
    assert got == {
        "episodes": 2,
        "identical_episodes": 1,
        "tokens_before_first_difference": 3 + 2 + 2,
        "max_abs_logprob_diff_before_it": 0.5,
    }


def test_an_episode_with_an_extra_turn_is_not_identical():
    turn = [[1], [-0.5]]
    got = agreement(rollout([turn, turn]), rollout([turn]))
    assert got["identical_episodes"] == 0 and got["tokens_before_first_difference"] == 1
