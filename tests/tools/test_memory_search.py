"""Memory search tool against the real FaissMemory (FAISS + SQLite) and the real MiniLM embedder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memory.embedders import SentenceEmbedder
from memory.store import FaissMemory
from tools.memory_search import NO_HITS, MemorySearch
from tools.types import BAD_CALL, ToolResult


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return SentenceEmbedder()  # seconds to load: once for this file


@pytest.fixture
def memory(embedder: SentenceEmbedder) -> Iterator[FaissMemory]:
    store = FaissMemory(None, embedder)
    yield store
    store.close()


def test_empty_memory_finds_nothing(memory: FaissMemory) -> None:
    assert MemorySearch(memory)({"query": "anything"}) == ToolResult(ok=True, output=NO_HITS)


def test_hits_are_numbered_lines_best_first(memory: FaissMemory) -> None:
    memory.add("Convert units before adding quantities.", task="gsm8k/1", reward=1.0)
    memory.add("Check the discriminant's sign before taking square roots.", task="math/2", reward=1.0)
    memory.add("Read the question twice\nto find what is asked.", kind="fact", task="gsm8k/3")
    result = MemorySearch(memory, k=2)({"query": "how do I add 3 km and 200 m?"})
    assert result.ok
    lines = result.output.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("1. (lesson, score ") and lines[0].endswith(
        "Convert units before adding quantities."
    )
    assert lines[1].startswith("2. (")


def test_long_entries_are_cut_to_one_short_line(memory: FaissMemory) -> None:
    memory.add("units " * 200)
    output = MemorySearch(memory, max_entry_chars=50)({"query": "units"}).output
    assert "\n" not in output and output.endswith("…")
    assert len(output.split(") ", 1)[1]) == 50


def test_bad_query_is_a_bad_call(memory: FaissMemory) -> None:
    assert MemorySearch(memory)({"q": "units"}).error == BAD_CALL
    with pytest.raises(ValueError, match="k must be positive"):
        MemorySearch(memory, k=0)
