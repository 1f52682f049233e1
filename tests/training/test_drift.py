"""training.drift: the per-step KL to the start policy and the cosine of consecutive updates, against
numbers worked out by hand, and on a real trainer step."""

from __future__ import annotations

import math

import pytest
import torch

from training.drift import fixed_turns, flat_cosine, flat_norm, kl_k3
from training.grpo import outcome_advantages
from training.types import Turn


def test_k3_is_the_kl_estimate_of_each_learned_token():
    # r = 0.5: 0.5 - 1 - log 0.5 = 0.19315; r = 2: 2 - 1 - log 2 = 0.30685; masked tokens do not count
    total, n = kl_k3([0.0, -1.0, -3.0], [math.log(0.5), -1.0 + math.log(2), 5.0], [1, 1, 0])
    assert n == 2 and total == pytest.approx(0.19315 + 0.30685, abs=1e-5)
    assert kl_k3([-1.0, -2.0], [-1.0, -2.0], [1, 1]) == (0.0, 2)


def test_cosine_and_norm_read_lists_of_tensors_as_one_vector():
    a = [torch.tensor([1.0, 0.0]), torch.tensor([[0.0]])]
    b = [torch.tensor([1.0, 1.0]), torch.tensor([[0.0]])]
    assert flat_cosine(a, b) == pytest.approx(1 / math.sqrt(2))
    assert flat_cosine(a, [-x for x in a]) == pytest.approx(-1.0)
    assert flat_cosine(a, [torch.zeros(2), torch.zeros(1, 1)]) == 0.0
    assert flat_norm([torch.tensor([3.0]), torch.tensor([4.0])]) == 5.0


def turn(role, learned=True):
    return Turn(role, "t", (1,), (2, 3), (1, 1) if learned else (0, 0), (0.0, 0.0))


def test_the_fixed_turns_are_the_first_learned_ones_of_each_role():
    turns = [turn("a"), turn("b", learned=False), turn("a"), turn("b"), turn("a")]
    assert fixed_turns(turns, 2) == [turns[0], turns[2], turns[3]]


def test_penalty_only_groups_keep_their_penalties_own_size():
    """Group a (both right) differs by a 0.2 penalty: unscaled +-0.1, dropped 0, scaled +-0.71 as any
    group of two; group b (one right, one wrong) is scaled either way (std of [0, 1] with n - 1: 0.707)."""
    rewards, keys, correct = [1.0, 0.8, 0.0, 1.0], ["a", "a", "b", "b"], [True, True, False, True]
    b = [-1 / math.sqrt(2), 1 / math.sqrt(2)]
    got = {
        rule: outcome_advantages(rewards, keys, correct, "grpo", penalty_only=rule)
        for rule in ("unscaled", "scaled", "dropped")
    }
    assert got["unscaled"] == pytest.approx([0.1, -0.1, *b], abs=1e-4)
    assert got["dropped"] == pytest.approx([0.0, 0.0, *b], abs=1e-4)
    assert got["scaled"] == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2), *b], abs=1e-4)
    with pytest.raises(ValueError, match="penalty_only"):
        outcome_advantages(rewards, keys, correct, "grpo", penalty_only="halved")
