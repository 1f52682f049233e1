"""FAISS index factory and file helpers for the memory store.

Every index maps int64 ids (SQLite rowids) to unit-norm vectors and scores by inner product, which on
unit-norm vectors is cosine similarity. The index is a cache of the SQLite table: it can always be
rebuilt from the stored vectors, so writing it is best-effort and reading it is verified by the caller.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np


@dataclass(frozen=True)
class IndexKind:
    """How to build one kind of index and what it can do."""

    name: str
    build: Callable[[int], faiss.Index]  # dim -> inner (un-id-mapped) index
    inner_type: type  # the class `build` returns, to recognise an index read from a file
    removable: bool  # False: deleting ids needs a rebuild from the source of truth


# HNSW parameters: M=32 links per node and efConstruction 80 build a graph in reasonable time;
# efSearch (how many candidates a query visits) trades search time for recall and is the store's
# `ef_search` (config memory.hnsw_ef_search). bench/faiss_memory.py measures the trade.
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 64


def _flat(dim: int) -> faiss.Index:
    return faiss.IndexFlatIP(dim)


def _hnsw(dim: int) -> faiss.Index:
    index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    index.hnsw.efSearch = HNSW_EF_SEARCH
    return index


INDEX_KINDS: dict[str, IndexKind] = {
    "flat": IndexKind("flat", _flat, faiss.IndexFlatIP, removable=True),  # exact search, the default
    # HNSW graphs cannot drop nodes, so a delete rebuilds the index from SQLite.
    "hnsw": IndexKind("hnsw", _hnsw, faiss.IndexHNSWFlat, removable=False),
}


def index_kind(kind: str) -> IndexKind:
    """The registered IndexKind called `kind`; ValueError naming the choices otherwise."""
    try:
        return INDEX_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown index kind {kind!r}; choose one of {sorted(INDEX_KINDS)}") from None


def set_ef_search(index: faiss.IndexIDMap2, ef_search: int) -> None:
    """Candidates an HNSW query visits (more: higher recall, slower search); other kinds ignore it."""
    if ef_search < 1:
        raise ValueError(f"HNSW ef_search must be >= 1, got {ef_search}")
    inner = faiss.downcast_index(index.index)  # a view, valid while `index` lives
    if isinstance(inner, faiss.IndexHNSWFlat):
        inner.hnsw.efSearch = ef_search


def make_index(kind: str, dim: int) -> faiss.IndexIDMap2:
    """An empty id-mapped inner-product index of `kind` ("flat" or "hnsw") over `dim`-sized vectors."""
    if dim <= 0:
        raise ValueError(f"index dim must be positive, got {dim}")
    return faiss.IndexIDMap2(index_kind(kind).build(dim))


def index_ids(index: faiss.IndexIDMap2) -> np.ndarray:
    """Sorted int64 ids held by an id-mapped index, shape [ntotal]."""
    return np.sort(faiss.vector_to_array(index.id_map).astype(np.int64))


def add_vectors(index: faiss.IndexIDMap2, ids: np.ndarray, vectors: np.ndarray) -> None:
    """Add vectors [N, dim] under ids [N] to the index."""
    if len(ids) == 0:
        return
    index.add_with_ids(
        np.ascontiguousarray(vectors, dtype=np.float32), np.ascontiguousarray(ids, dtype=np.int64)
    )


def read_index(path: Path) -> faiss.IndexIDMap2 | None:
    """The id-mapped index stored at `path`, or None when it is missing or unreadable.

    An unreadable file is not an error: the caller rebuilds the index from SQLite.
    """
    if not path.is_file():
        return None
    try:
        index = faiss.read_index(str(path))
    except RuntimeError:
        return None
    # read_index already returns the concrete class. Never rebind `index` to a downcast_index()
    # view: the view does not own the C++ object, which would be freed with the original wrapper.
    if not isinstance(index, faiss.IndexIDMap2):
        return None
    set_ef_search(index, HNSW_EF_SEARCH)  # efSearch is not stored in the file
    return index


def write_index_atomic(index: faiss.Index, path: Path) -> None:
    """Write `index` to `path` so that a reader sees either the old file or the new one, never half."""
    tmp = path.with_name(path.name + ".tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, path)


def is_kind(index: faiss.IndexIDMap2, kind: str) -> bool:
    """True when the index's inner index is the type `kind` builds."""
    return type(faiss.downcast_index(index.index)) is index_kind(kind).inner_type
