"""The `memory:` settings and the memory they describe.

memory = open_memory(MemorySettings(path="runs/memory"), SentenceEmbedder)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memory.index import DEFAULT_INDEX, HNSW_EF_SEARCH, IVF_NPROBE, index_kind
from memory.store import FaissMemory
from memory.types import Embedder, MemoryConfigError

# What the meta-thinker carries from one reflection to the next (meta_agent.episode.internal_memory)
INTERNAL_KINDS = ("truncate", "summary")


@dataclass
class MemorySettings:
    """Where lessons are kept, how many each episode is shown, and the FAISS index that finds them."""

    enabled: bool = True  # false: no retrieval, no lessons, and no memory_search tool
    # a folder of FAISS index + SQLite, shared by runs so lessons accumulate; null: this process only
    path: str | None = "runs/memory"
    top_k: int = 3  # lessons shown to the roles at the start of an episode
    write_lessons: bool = True  # the meta-thinker's lesson is committed after each batch of episodes
    index: str = (
        DEFAULT_INDEX  # flat (exact search) | ivf (approximate, exact below 50k entries; for 100k+) | hnsw
    )
    # hnsw only: candidates a query visits; higher = better recall, slower (bench/faiss_memory.py)
    hnsw_ef_search: int = HNSW_EF_SEARCH
    # ivf only: cells a query scans; higher = better recall, slower (bench/faiss_memory.py)
    ivf_nprobe: int = IVF_NPROBE
    # Internal memory, within one episode and independent of the lessons above (enabled=false keeps it):
    # truncate = each reflection reads this round's work cut to its last 1,500 characters and the plan in
    # force, nothing of earlier rounds; summary = each reflection also rewrites a running state in
    # <notes>...</notes> (what was tried, what failed, what to check) that the next reflection reads. The
    # notes are trained with the reflection: SFT demonstrations write them, GRPO credits them.
    internal: str = "truncate"

    def __post_init__(self) -> None:
        index_kind(self.index)  # an unknown index fails at start-up, with the kinds it knows
        if self.internal not in INTERNAL_KINDS:
            raise ValueError(f"memory.internal={self.internal!r}: must be one of {', '.join(INTERNAL_KINDS)}")
        if self.top_k < 0:
            raise ValueError(f"memory.top_k={self.top_k} must be >= 0")

    @property
    def shown(self) -> int:
        """Lessons an episode is shown: top_k, or none when the memory is off."""
        return self.top_k if self.enabled else 0


def open_memory(
    settings: MemorySettings,
    make_embedder: Callable[[], Embedder],
    *,
    read_only: bool = False,
    writer: str = "",
) -> FaissMemory | None:
    """The memory `settings` describe, or None when it is off. `make_embedder` is called only for a memory
    that is on (a sentence model takes seconds and memory to load). `read_only`: another process writes
    the folder (the ranks after the first of a multi-process run); an in-process memory is always
    writable. `writer` tags what this process adds (a run passes its folder)."""
    if not settings.enabled:
        return None
    path = Path(settings.path) if settings.path else None
    try:
        return FaissMemory(
            path,
            make_embedder(),
            index=settings.index,
            ef_search=settings.hnsw_ef_search,
            nprobe=settings.ivf_nprobe,
            read_only=read_only and path is not None,
            writer=writer,
        )
    except MemoryConfigError as err:
        raise MemoryConfigError(f"memory.path={settings.path}: {err}; or memory.enabled=false") from err
