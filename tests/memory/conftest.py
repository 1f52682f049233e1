"""Shared fixtures of the memory tests: the real MiniLM embedder is loaded once per test session."""

from __future__ import annotations

import pytest

from memory.embedders import HashingEmbedder, SentenceEmbedder


@pytest.fixture(scope="session")
def minilm() -> SentenceEmbedder:
    """The real all-MiniLM-L6-v2 embedder (seconds to load, so once per session)."""
    return SentenceEmbedder()


@pytest.fixture
def hashing() -> HashingEmbedder:
    """Model-free embedder for tests about storage, where embedding quality does not matter."""
    return HashingEmbedder(384)


class FakeClock:
    """Callable unix-seconds clock that tests move by hand instead of sleeping."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance_hours(self, hours: float) -> None:
        self.now += hours * 3600.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
