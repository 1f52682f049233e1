"""Scoring functions against numbers worked out by hand."""

from __future__ import annotations

import pytest

from memory.scoring import ScoringWeights, combined_score, importance_score, recency_score, score_entry

NOW = 1_700_000_000.0
HOUR = 3600.0


@pytest.mark.parametrize(
    ("hours_ago", "half_life", "expected"),
    [
        (0.0, 24.0, 1.0),
        (24.0, 24.0, 0.5),  # one half-life
        (48.0, 24.0, 0.25),  # two half-lives
        (12.0, 24.0, 2**-0.5),  # half a half-life: 1/sqrt(2) = 0.70710678
        (6.0, 2.0, 0.125),  # three half-lives of 2 h
        (-5.0, 24.0, 1.0),  # last_used in the future counts as just used
    ],
)
def test_recency_halves_every_half_life(hours_ago, half_life, expected):
    assert recency_score(NOW - hours_ago * HOUR, NOW, half_life) == pytest.approx(expected)


def test_recency_rejects_non_positive_half_life():
    with pytest.raises(ValueError, match="half_life_hours"):
        recency_score(NOW, NOW, 0.0)


@pytest.mark.parametrize(
    ("reward", "expected"),
    [(-1.0, 0.0), (0.0, 0.5), (1.0, 1.0), (0.5, 0.75), (-0.2, 0.4), (3.0, 1.0), (-7.0, 0.0)],
)
def test_importance_maps_reward_onto_unit_interval(reward, expected):
    assert importance_score(reward) == pytest.approx(expected)


def test_combined_score_default_weights():
    # 1.0 * 0.8 + 0.1 * 0.5 + 0.1 * 0.75 = 0.8 + 0.05 + 0.075
    assert combined_score(0.8, 0.5, 0.75, ScoringWeights()) == pytest.approx(0.925)


def test_combined_score_custom_weights():
    weights = ScoringWeights(relevance=0.5, recency=2.0, importance=0.0)
    # 0.5 * 0.6 + 2.0 * 0.25 + 0 * 1.0 = 0.3 + 0.5
    assert combined_score(0.6, 0.25, 1.0, weights) == pytest.approx(0.8)


def test_score_entry_combines_all_terms():
    # relevance 0.9, used 24 h ago (recency 0.5), reward 0.5 (importance 0.75)
    parts = score_entry(0.9, NOW - 24 * HOUR, 0.5, NOW, ScoringWeights())
    assert parts.relevance == pytest.approx(0.9)
    assert parts.recency == pytest.approx(0.5)
    assert parts.importance == pytest.approx(0.75)
    assert parts.score == pytest.approx(0.9 + 0.05 + 0.075)


def test_score_entry_clamps_float_error_in_relevance():
    assert score_entry(1.0000002, NOW, 0.0, NOW, ScoringWeights()).relevance == 1.0
    assert score_entry(-1.0000002, NOW, 0.0, NOW, ScoringWeights()).relevance == -1.0


def test_weights_are_frozen_and_validated():
    weights = ScoringWeights()
    assert (weights.relevance, weights.recency, weights.importance, weights.half_life_hours) == (
        1.0,
        0.1,
        0.1,
        24.0,
    )
    with pytest.raises(AttributeError):
        weights.recency = 0.5  # type: ignore[misc]
    with pytest.raises(ValueError, match="recency"):
        ScoringWeights(recency=-0.1)
    with pytest.raises(ValueError, match="half_life_hours"):
        ScoringWeights(half_life_hours=0.0)
