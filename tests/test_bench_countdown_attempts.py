"""bench.countdown_attempts: the first-attempt and second-attempt shares, worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

from bench.countdown_attempts import attempt_rates
from roles import ACCEPT, REVISE


def episode(*rounds):
    """rounds: (correct, verdict) of each round played."""
    played = [SimpleNamespace(correct=c, verdict=v) for c, v in rounds]
    return SimpleNamespace(rounds=played, correct=played[-1].correct)


def test_rates_of_hits_misses_revisions_and_fixes():
    episodes = [
        episode((True, ACCEPT)),  # right at once
        episode((False, REVISE), (True, None)),  # missed, revised, fixed
        episode((False, REVISE), (False, None)),  # missed, revised, still wrong
        episode((False, ACCEPT)),  # missed and accepted
    ]
    assert attempt_rates(episodes) == {
        "episodes": 4,
        "first_attempt": 0.25,
        "final": 0.5,
        "missed": 3,
        "revised_given_missed": 0.6667,
        "fixed_given_missed": 0.3333,
    }
    assert attempt_rates([episode((True, ACCEPT))])["revised_given_missed"] is None
