"""Retrieval scoring: relevance, recency and importance combined into one ranking score.

score = w_rel * relevance + w_rec * recency + w_imp * importance, where relevance is the cosine
similarity of query and entry in [-1, 1], recency halves every `half_life_hours` since the entry was last
used, and importance maps the episode reward from [-1, 1] onto [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class ScoringWeights:
    """Weights of the three score terms and the recency half-life."""

    relevance: float = 1.0  # relevance dominates: memories must be about the query first
    recency: float = 0.1  # breaks near-ties in favour of lessons used lately
    importance: float = 0.1  # breaks near-ties in favour of lessons from rewarded episodes
    half_life_hours: float = 24.0  # recency falls to 0.5 after this long without use

    def __post_init__(self) -> None:
        for name in ("relevance", "recency", "importance"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"ScoringWeights.{name} must be a finite number >= 0, got {value}")
        if not math.isfinite(self.half_life_hours) or self.half_life_hours <= 0:
            raise ValueError(f"ScoringWeights.half_life_hours must be > 0, got {self.half_life_hours}")


def recency_score(last_used: float, now: float, half_life_hours: float) -> float:
    """0.5 ** (hours since last_used / half_life_hours), in (0, 1].

    A last_used in the future (clock skew between writers) counts as just used, not as more than 1.
    """
    if half_life_hours <= 0:
        raise ValueError(f"half_life_hours must be > 0, got {half_life_hours}")
    age_hours = max(0.0, now - last_used) / SECONDS_PER_HOUR
    return 0.5 ** (age_hours / half_life_hours)


def importance_score(reward: float) -> float:
    """clip((reward + 1) / 2, 0, 1): reward -1 -> 0, reward 0 -> 0.5, reward 1 -> 1."""
    return min(1.0, max(0.0, (reward + 1.0) / 2.0))


def combined_score(relevance: float, recency: float, importance: float, weights: ScoringWeights) -> float:
    """Weighted sum of the three terms, the value hits are ranked by."""
    return weights.relevance * relevance + weights.recency * recency + weights.importance * importance


@dataclass(frozen=True)
class ScoreParts:
    """One candidate's score and the terms it was made of."""

    score: float
    relevance: float  # cosine similarity in [-1, 1]
    recency: float  # in (0, 1]
    importance: float  # in [0, 1]


def score_entry(
    relevance: float, last_used: float, reward: float, now: float, weights: ScoringWeights
) -> ScoreParts:
    """Score one candidate from its relevance, metadata and the current time."""
    # Float error can push the inner product of two unit vectors a hair past +-1.
    relevance = min(1.0, max(-1.0, relevance))
    recency = recency_score(last_used, now, weights.half_life_hours)
    importance = importance_score(reward)
    return ScoreParts(combined_score(relevance, recency, importance, weights), relevance, recency, importance)
