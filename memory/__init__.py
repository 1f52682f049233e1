"""Long-term memory: embedders, a FAISS store with SQLite metadata, retrieval scoring."""

from memory.conformance import check_memory
from memory.embedders import HashingEmbedder, SentenceEmbedder
from memory.index import make_index
from memory.scoring import ScoringWeights, combined_score, importance_score, recency_score
from memory.settings import MemorySettings, open_memory
from memory.store import FaissMemory
from memory.types import Embedder, Memory, MemoryConfigError, MemoryEntry, MemoryHit

__all__ = [
    "Embedder",
    "FaissMemory",
    "HashingEmbedder",
    "Memory",
    "MemoryConfigError",
    "MemoryEntry",
    "MemoryHit",
    "MemorySettings",
    "ScoringWeights",
    "SentenceEmbedder",
    "check_memory",
    "combined_score",
    "importance_score",
    "make_index",
    "open_memory",
    "recency_score",
]
