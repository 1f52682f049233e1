"""The choices of the GRPO step as name -> function registries: every registered name runs on a small
hand-made input and gives the numbers the if-chains gave before (issue 53), and a name added to a
registry is a valid setting that the step then uses."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from meta_agent.config import load_config
from meta_agent.learning import credit
from meta_agent.learning.credit import assign_advantages, is_reflection
from tests.meta_agent.test_reflection_credit import SPEC, two_rounds
from training import grpo
from training.grpo import GRPOSettings

# Three groups: (a, t1) [1, 0, 0.5]: mean 0.5, sample std 0.5; (a, t2) [2, 2]: flat, 0; (b, t1) [-1, 3]:
# mean 1, sample std 2 * sqrt(2). Role a's batch [1, 0, 0.5, 2, 2]: mean 1.1, sample std sqrt(0.8).
REWARDS = [1.0, 0.0, 0.5, 2.0, 2.0, -1.0, 3.0]
KEYS = [("a", "t1")] * 3 + [("a", "t2")] * 2 + [("b", "t1")] * 2
REINFORCE_PP = [  # (r - 1.1) / (sqrt(0.8) + 1e-6) for role a; (r - 1) / (2 sqrt 2 + 1e-6) for role b
    -0.11180327387512934,
    -1.2298360126264216,
    -0.6708196432507755,
    1.006229464876163,
    1.006229464876163,
    -0.7071065311866358,
    0.7071065311866358,
]
ADVANTAGES = {  # name -> (scale=True, scale=False), as the old code gave them
    "grpo": (
        # (r - mean) / (std + 1e-6) within each group
        [0.999998000004, -0.999998000004, 0.0, 0.0, 0.0, -0.7071065311866358, 0.7071065311866358],
        [0.5, -0.5, 0.0, 0.0, 0.0, -2.0, 2.0],  # r - mean
    ),
    # r minus the mean of the others of its group, never scaled: 1 - 0.25, 0 - 0.75, 0.5 - 0.5; 2 - 2; -1 - 3
    "rloo": ([0.75, -0.75, 0.0, 0.0, 0.0, -4.0, 4.0],) * 2,
    "reinforce_pp": (REINFORCE_PP,) * 2,  # always scaled, over the role's whole batch
}


@pytest.mark.parametrize("name", list(grpo.ADVANTAGES))
def test_every_registered_advantage_gives_the_numbers_of_before(name):
    assert set(ADVANTAGES) == set(grpo.ADVANTAGES)  # a new estimator brings its own hand-worked numbers
    scaled, unscaled = ADVANTAGES[name]
    assert grpo.advantages(REWARDS, KEYS, name, scale=True) == scaled
    assert grpo.advantages(REWARDS, KEYS, name, scale=False) == unscaled
    assert GRPOSettings(advantage=name, filter_zero_variance=name != "reinforce_pp").advantage == name


def test_gae_is_a_setting_apart_from_the_estimators_taken_from_rewards():
    assert grpo.GAE in grpo.advantage_names() and grpo.GAE not in grpo.ADVANTAGES
    assert GRPOSettings(advantage=grpo.GAE, filter_zero_variance=False).advantage == "gae"
    with pytest.raises(ValueError, match="not taken from rewards alone"):
        grpo.advantages(REWARDS, KEYS, grpo.GAE)


# Rows: [1, 2] kept, nothing kept, [7, 8, 9] kept: 27 over 5 tokens, 3 rows, of which 2 have tokens.
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
AGGREGATIONS = {
    "token-mean": 5.400000095367432,  # 27 / 5 in float32
    "seq-mean-token-mean": 4.75,  # (1.5 + 8) / 2
    "dr-grpo": 2.25,  # 27 / (3 rows * max_tokens 4)
}


@pytest.mark.parametrize("name", list(grpo.AGGREGATIONS))
def test_every_registered_aggregation_gives_the_numbers_of_before(name):
    assert set(AGGREGATIONS) == set(grpo.AGGREGATIONS) >= set(grpo.TOKEN_NORMALISED)
    assert float(grpo.aggregate(PER_TOKEN, MASK, name, max_tokens=4)) == AGGREGATIONS[name]
    assert float(grpo.aggregate(PER_TOKEN, torch.zeros_like(MASK), name, max_tokens=4)) == 0.0
    assert GRPOSettings(aggregation=name, max_tokens=4).aggregation == name


def test_the_settings_name_the_reflection_credits_the_registry_holds():
    assert tuple(credit.REFLECTION_CREDITS) == grpo.REFLECTION_CREDIT_NAMES


# Scored with the default reward spec (meta-thinker 1 and 0), then given SPEC's reflection weights, so
# "round" credits round 1's reflections [+1 (fixed), 0] and round 2's [0 (right), -0.5 (accepted wrong)].
# Unscaled: the episode's advantage +-0.5 on every turn; "round" gives the reflections +-0.5 and +-0.25.
REFLECTION_CREDITS = {
    "episode": ([0.5] * 5, [-0.5] * 5),
    "round": ([0.5, 0.5, 0.5, 0.5, 0.25], [-0.5, -0.5, -0.5, -0.5, -0.25]),
    "none": ([0.5, 0.5, 0.0, 0.5, 0.0], [-0.5, -0.5, 0.0, -0.5, 0.0]),
    # Round 1's reflections both judged a wrong round and revised: credit 1 (fixed) and 0 (still wrong);
    # round 2's have no round after them: 0.
    "revision": ([0.5, 0.5, 0.5, 0.5, 0.0], [-0.5, -0.5, -0.5, -0.5, 0.0]),
}


def two_episodes(make_episode):
    """plan, execute, reflect (revise), execute, reflect (accept): fixed in round 2, and not."""
    episodes = [two_rounds(make_episode, True), two_rounds(make_episode, False)]
    for ep in episodes:
        ep.roles["meta_thinker"] = replace(ep.roles["meta_thinker"], reward=SPEC)
    return episodes


@pytest.mark.parametrize("name", list(credit.REFLECTION_CREDITS))
def test_every_registered_reflection_credit_gives_the_numbers_of_before(name, make_episode):
    assert set(REFLECTION_CREDITS) == set(credit.REFLECTION_CREDITS)
    episodes = two_episodes(make_episode)
    assign_advantages(episodes, scale=False, reflection_credit=name)
    assert tuple([t.advantage for t in ep.turns] for ep in episodes) == REFLECTION_CREDITS[name]
    assert GRPOSettings(reflection_credit=name).reflection_credit == name


def test_an_advantage_added_to_the_registry_is_a_setting_and_is_used(monkeypatch, make_episode):
    with pytest.raises(ValueError, match="grpo.advantage must be one of"):
        GRPOSettings(advantage="constant")

    def constant(rewards, keys, *, scale):
        return [0.25] * len(rewards)

    monkeypatch.setitem(grpo.ADVANTAGES, "constant", constant)
    assert load_config(["grpo.advantage=constant"]).grpo.advantage == "constant"
    episodes = two_episodes(make_episode)
    assign_advantages(episodes, kind="constant")
    assert {t.advantage for ep in episodes for t in ep.turns} == {0.25}


def test_an_aggregation_added_to_the_registry_is_a_setting_and_is_used(monkeypatch):
    with pytest.raises(ValueError, match="grpo.aggregation must be one of"):
        GRPOSettings(aggregation="half-sum")

    def half_sum(masked, keep, max_tokens):
        return masked.sum() / 2

    monkeypatch.setitem(grpo.AGGREGATIONS, "half-sum", half_sum)
    settings = load_config(["grpo.aggregation=half-sum"]).grpo
    logprobs = torch.zeros(1, 3, requires_grad=True)
    mask = torch.ones(1, 3)
    kwargs = settings.loss_kwargs()
    loss, _ = grpo.grpo_loss(
        logprobs, logprobs.detach(), None, torch.ones(1), mask, rollout_logprobs=logprobs.detach(), **kwargs
    )
    assert float(loss) == -1.5  # each of 3 tokens -ratio * A = -1, summed and halved (token-mean: -1)


def test_a_reflection_credit_added_to_the_registry_is_a_setting_and_is_used(monkeypatch, make_episode):
    with pytest.raises(ValueError, match="grpo.reflection_credit must be one of"):
        GRPOSettings(reflection_credit="half")

    def half(episodes, *, scale, kind):
        for ep in episodes:
            for turn in ep.turns:
                if is_reflection(ep, turn):
                    turn.advantage /= 2

    monkeypatch.setitem(credit.REFLECTION_CREDITS, "half", half)
    monkeypatch.setattr(grpo, "REFLECTION_CREDIT_NAMES", (*grpo.REFLECTION_CREDIT_NAMES, "half"))
    assert load_config(["grpo.reflection_credit=half"]).grpo.reflection_credit == "half"
    episodes = two_episodes(make_episode)
    assign_advantages(episodes, scale=False, reflection_credit="half")
    assert [t.advantage for t in episodes[0].turns] == [0.5, 0.5, 0.25, 0.5, 0.25]
    with pytest.raises(ValueError, match="reflection credit 'turn' is not one of"):
        assign_advantages(episodes, reflection_credit="turn")
