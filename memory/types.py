"""Records and protocols of the memory layer. Every Memory passes tests/memory/test_conformance.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class MemoryEntry:
    id: int
    text: str
    kind: str  # "lesson", "fact", ...: free-form, chosen by the writer
    task: str  # task id or family the entry came from
    reward: float  # outcome of the episode that wrote it; feeds the importance score
    created: float  # unix seconds
    last_used: float  # unix seconds; refreshed by search hits, feeds the recency score
    writer: str = ""  # who wrote it (a run's folder); "" when untagged


@dataclass(frozen=True)
class MemoryHit:
    entry: MemoryEntry
    score: float  # weighted sum used for ranking
    relevance: float  # cosine similarity in [-1, 1]
    recency: float  # in [0, 1]
    importance: float  # in [0, 1]


@runtime_checkable
class Embedder(Protocol):
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm float32 embeddings, shape [N, dim]."""
        ...


@runtime_checkable
class Memory(Protocol):
    writer: str  # tags what this handle adds (a run's folder); "" for untagged writes

    def add(self, text: str, *, kind: str = "lesson", task: str = "", reward: float = 0.0) -> int: ...

    def search(self, query: str, k: int = 3) -> list[MemoryHit]: ...

    def get(self, entry_id: int) -> MemoryEntry | None: ...

    def delete(self, ids: Sequence[int]) -> int: ...

    def ids(self, writer: str | None = None) -> list[int]:
        """Stored ids, ascending; with `writer`, only those of the entries it wrote."""
        ...

    def refresh(self) -> int:
        """Catch up with entries another process committed (multi-process runs); returns how many."""
        ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...


class MemoryConfigError(RuntimeError):
    """A memory that cannot be set up as asked: missing model package, mismatched embedder on reopen.

    The message names the package or path and what to do about it.
    """
