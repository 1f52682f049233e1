"""FAISS index factory and file helpers for the memory store.

Every index maps int64 ids (SQLite rowids) to unit-norm vectors and scores by inner product, which on
unit-norm vectors is cosine similarity. The index is a cache of the SQLite table: it can always be
rebuilt from the stored vectors, so writing it is best-effort and reading it is verified by the caller.

Kinds (config `memory.index`), measured by bench/faiss_memory.py (docs/results/memory.md):
- "flat": exact search, scanning every vector. The default: a store of thousands of lessons is
  searched in well under a millisecond, and nothing is approximate.
- "ivf": inverted lists. Vectors are cut into ~sqrt(n) k-means cells and a query scans only the
  `nprobe` cells nearest to it, with vectors stored as float16 (half the bytes to scan). It must be
  trained on the vectors it will hold, so below IVF_MIN_TRAIN vectors it is the exact flat index, and
  the store retrains it as it grows (see needs_retrain). For very large stores (100k to millions).
- "hnsw": a navigable small-world graph, no training; but on the benchmark's MiniLM-like data it
  built 1M vectors far slower than ivf and stayed less exact at the same search time.
"""

from __future__ import annotations

import fcntl
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np


@dataclass(frozen=True)
class IndexKind:
    """How to build one kind of index and how to recognise it read back from a file."""

    name: str
    build: Callable[[int, int], faiss.Index]  # (dim, vectors it is built for) -> inner index
    accepts: Callable[[faiss.Index], bool]  # True for an inner index (downcast) this kind builds


# HNSW parameters: M=32 links per node and efConstruction 80 build a graph in reasonable time;
# efSearch (how many candidates a query visits) trades search time for recall and is the store's
# `ef_search` (config memory.hnsw_ef_search). bench/faiss_memory.py measures the trade.
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 64
DEFAULT_INDEX = "flat"  # exact search: right for the thousands of lessons of a run

# IVF parameters. nprobe (cells a query scans; config memory.ivf_nprobe) trades search time for
# recall: on data with the spectrum of MiniLM embeddings of the project's questions, 160 of the
# 1000 cells of 1M vectors gave recall@10 0.966 at 8 ms p50 on a shared 2-core machine, and 160 of
# 316 cells of 100k vectors 0.997 at 1.7 ms (bench/faiss_memory.py; exact search: 55 and 5.4 ms).
# Below IVF_MIN_TRAIN vectors exact search is fast enough (~2-3 ms) and nprobe would cover most
# cells anyway, so the kind stays exact there. k-means trains on at most
# IVF_TRAIN_PER_LIST vectors per cell (enough for stable centroids, seconds at 1M). The cell count
# fits the size at training; once the store holds IVF_REGROW times that, cells have grown so long
# that a query scans IVF_REGROW times more vectors, and the store retrains.
IVF_NPROBE = 160
IVF_MIN_TRAIN = 50_000
IVF_TRAIN_PER_LIST = 64
IVF_REGROW = 4


def ivf_nlist(n: int) -> int:
    """Cells of an IVF index built for n vectors: round(sqrt(n)), so cells and cell length both grow
    as sqrt(n) and a query's scan (nprobe cells) stays a shrinking share of the store."""
    return max(1, round(math.sqrt(n)))


def _flat(dim: int, n: int) -> faiss.Index:
    return faiss.IndexFlatIP(dim)


def _hnsw(dim: int, n: int) -> faiss.Index:
    index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    index.hnsw.efSearch = HNSW_EF_SEARCH
    return index


def _ivf(dim: int, n: int) -> faiss.Index:
    """Untrained IVF of float16 vectors for n vectors, or the exact fallback when n is too small."""
    if n < IVF_MIN_TRAIN:
        return _flat(dim, n)
    # The factory's index owns its coarse quantizer, so no Python reference has to keep it alive.
    index = faiss.index_factory(dim, f"IVF{ivf_nlist(n)},SQfp16", faiss.METRIC_INNER_PRODUCT)
    # Store vectors, not residuals from their centroid: float16 of a unit vector is already precise
    # to ~1e-3, and scoring skips the per-cell centroid term.
    index.by_residual = False
    index.cp.max_points_per_centroid = IVF_TRAIN_PER_LIST
    index.nprobe = IVF_NPROBE
    return index


def _is_ivf(inner: faiss.Index) -> bool:
    return (
        isinstance(inner, faiss.IndexIVFScalarQuantizer) and inner.sq.qtype == faiss.ScalarQuantizer.QT_fp16
    )


INDEX_KINDS: dict[str, IndexKind] = {
    "flat": IndexKind("flat", _flat, lambda inner: type(inner) is faiss.IndexFlatIP),
    "hnsw": IndexKind("hnsw", _hnsw, lambda inner: type(inner) is faiss.IndexHNSWFlat),
    # A small ivf store is the flat index, so either is a valid "ivf" index file.
    "ivf": IndexKind("ivf", _ivf, lambda inner: type(inner) is faiss.IndexFlatIP or _is_ivf(inner)),
}


def index_kind(kind: str) -> IndexKind:
    """The registered IndexKind called `kind`; ValueError naming the choices otherwise."""
    try:
        return INDEX_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown index kind {kind!r}; choose one of {sorted(INDEX_KINDS)}") from None


def _inner(index: faiss.IndexIDMap2) -> faiss.Index:
    return faiss.downcast_index(index.index)  # a view, valid while `index` lives


def set_ef_search(index: faiss.IndexIDMap2, ef_search: int) -> None:
    """Candidates an HNSW query visits (more: higher recall, slower search); other kinds ignore it."""
    if ef_search < 1:
        raise ValueError(f"HNSW ef_search must be >= 1, got {ef_search}")
    inner = _inner(index)
    if isinstance(inner, faiss.IndexHNSWFlat):
        inner.hnsw.efSearch = ef_search


def set_nprobe(index: faiss.IndexIDMap2, nprobe: int) -> None:
    """Cells an IVF query scans (more: higher recall, slower search); other kinds ignore it."""
    if nprobe < 1:
        raise ValueError(f"IVF nprobe must be >= 1, got {nprobe}")
    inner = _inner(index)
    if isinstance(inner, faiss.IndexIVF):
        inner.nprobe = nprobe


def train_sample_size(kind: str, n: int) -> int:
    """How many of the n vectors an index of `kind` built for them must be trained on; 0: no training.

    Only ivf trains, and only from IVF_MIN_TRAIN vectors on (below that it is exact).
    """
    if index_kind(kind).name != "ivf" or n < IVF_MIN_TRAIN:
        return 0
    return min(n, ivf_nlist(n) * IVF_TRAIN_PER_LIST)


def make_index(kind: str, dim: int, *, n: int = 0, sample: np.ndarray | None = None) -> faiss.IndexIDMap2:
    """An empty id-mapped inner-product index of `kind` over `dim`-sized vectors, for about n of them.

    An index that trains (see train_sample_size) is trained here on `sample` [m, dim], m rows drawn
    at random from those n vectors; ValueError when it is missing or too small.
    """
    if dim <= 0:
        raise ValueError(f"index dim must be positive, got {dim}")
    inner = index_kind(kind).build(dim, n)
    wanted = train_sample_size(kind, n)
    if wanted:
        if sample is None or sample.ndim != 2 or sample.shape[1] != dim or len(sample) < ivf_nlist(n):
            got = "none" if sample is None else f"shape {sample.shape}"
            raise ValueError(
                f"a {kind} index for {n} vectors is trained on a sample of them: pass sample= with "
                f"{wanted} rows of {dim} values (train_sample_size), got {got}"
            )
        inner.train(np.ascontiguousarray(sample, dtype=np.float32))
    return faiss.IndexIDMap2(inner)


def needs_retrain(index: faiss.IndexIDMap2, kind: str) -> bool:
    """True when an index of `kind` no longer fits the vectors it holds and should be rebuilt.

    ivf: still the exact fallback though it has reached IVF_MIN_TRAIN vectors, or trained for a
    size its contents have since outgrown IVF_REGROW times (cells too long, queries too slow).
    """
    if index_kind(kind).name != "ivf":
        return False
    inner = _inner(index)
    if not _is_ivf(inner):
        return index.ntotal >= IVF_MIN_TRAIN
    return index.ntotal >= IVF_REGROW * inner.nlist**2


def removes_in_place(index: faiss.IndexIDMap2) -> bool:
    """True when ids can be removed from this index; False: a delete must rebuild it.

    HNSW graphs cannot drop nodes, and IndexIDMap2 over IVF would remove the vectors but then map
    the survivors to the wrong ids (IVF keeps its internal ids while the id map is compacted).
    """
    return type(_inner(index)) is faiss.IndexFlatIP


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
    # A temporary file of its own: two processes flushing one folder never write (or rename) each
    # other's. The last rename wins; SQLite stays the truth, and an index file that misses another
    # writer's entries is rebuilt on the next open. The temporary file stays locked while it is written,
    # so that remove_stale_temporaries can tell a killed writer's file from a live one's.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        faiss.write_index(index, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)  # releases the lock


TEMPORARY_SUFFIX = ".tmp"


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary files that writers of `path` killed mid-write left beside it (up to an
    index's size each); returns them. A file whose writer is alive holds its lock and is kept."""
    removed = []
    for tmp in path.parent.glob(f".{path.name}.*{TEMPORARY_SUFFIX}"):
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except FileNotFoundError:  # its writer renamed it meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # being written now
            continue
        else:
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
        finally:
            os.close(fd)
    return removed


def is_kind(index: faiss.IndexIDMap2, kind: str) -> bool:
    """True when the index's inner index is one that `kind` builds."""
    return index_kind(kind).accepts(_inner(index))


@contextmanager
def one_thread() -> Iterator[None]:
    """FAISS on one OpenMP thread inside, as it was outside after.

    For one query its threads gain little (IVF at 1M: 8 ms on two threads, 11 on one, 2 cores), and
    when other work holds the cores they wait out scheduler slices: an exact 10k search that takes
    0.2 ms took 24 ms on two threads beside a busy job, 0.16 ms on one.
    """
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def search_one(index: faiss.Index, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores and ids [1, k] of the k nearest vectors to one query [1, dim], on one thread."""
    with one_thread():
        return index.search(query, k)
