"""Memory search tool: the agent looks up lessons and facts from past tasks.

    MemorySearch(memory)({"query": "adding lengths in different units"})
    -> ToolResult(ok=True, output="1. (lesson, score 0.82) Convert units before adding quantities.")

Depends only on the Memory protocol (memory/types.py), so any store that passes the memory
conformance suite works here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memory.types import Memory
from tools.arguments import string_argument
from tools.types import ToolResult

NO_HITS = "no memories found"


MEMORY_SEARCH_K = 3  # hits a search returns (tools.memory_search_k)


@dataclass(frozen=True)
class MemorySearch:
    """Tool `memory_search`, arguments {"query": str}: the k best memories as numbered lines."""

    memory: Memory
    k: int = MEMORY_SEARCH_K
    max_query_chars: int = 1000
    max_entry_chars: int = 400  # one long entry must not crowd the others out of the context
    name: str = "memory_search"
    description: str = '{"query": str}: finds lessons and facts saved from similar past tasks, best first'

    def __post_init__(self) -> None:
        if self.k <= 0:
            raise ValueError(f"MemorySearch.k must be positive, got {self.k}")

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult:
        query = string_argument(arguments, "query", tool=self.name, max_chars=self.max_query_chars)
        if isinstance(query, ToolResult):
            return query
        hits = self.memory.search(query, k=self.k)
        if not hits:
            return ToolResult(ok=True, output=NO_HITS)
        lines = []
        for rank, hit in enumerate(hits, start=1):
            text = " ".join(hit.entry.text.split())  # one line per hit, whatever the entry's layout
            if len(text) > self.max_entry_chars:
                text = text[: self.max_entry_chars - 1] + "…"
            lines.append(f"{rank}. ({hit.entry.kind}, score {hit.score:.2f}) {text}")
        return ToolResult(ok=True, output="\n".join(lines))
