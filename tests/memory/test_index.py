"""memory.index: the ivf kind against exact search, its exact fallback, and when it asks to be retrained."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from memory import index as memory_index
from memory.index import (
    add_vectors,
    is_kind,
    ivf_nlist,
    make_index,
    needs_retrain,
    one_thread,
    removes_in_place,
    search_one,
    set_nprobe,
    train_sample_size,
)

DIM = 32


@pytest.fixture
def small_ivf(monkeypatch):
    """IVF_MIN_TRAIN lowered so that a few thousand vectors make a trained ivf index."""
    monkeypatch.setattr(memory_index, "IVF_MIN_TRAIN", 1000)


def clustered_unit(n: int, rng: np.random.Generator, clusters: int = 50) -> np.ndarray:
    """n unit vectors [n, DIM] around `clusters` random centres: structure an IVF index can exploit."""
    centres = rng.standard_normal((clusters, DIM)).astype(np.float32)  # [C, DIM]
    vectors = centres[rng.integers(clusters, size=n)] + 0.5 * rng.standard_normal((n, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def recall_against_flat(index: faiss.IndexIDMap2, data: np.ndarray, queries: np.ndarray, k: int) -> float:
    """Share of the exact top-k ids (by inner product) that `index` returns for the queries."""
    truth = np.argsort(-(queries @ data.T), axis=1)[:, :k] * 7  # [Q, k]; ids are 7 * row
    _, found = index.search(queries, k)  # [Q, k]
    return np.mean([len(set(f) & set(t)) / k for f, t in zip(found.tolist(), truth.tolist(), strict=True)])


def trained_ivf(data: np.ndarray, rng: np.random.Generator) -> faiss.IndexIDMap2:
    n = len(data)
    sample = data[rng.choice(n, size=train_sample_size("ivf", n), replace=False)]
    index = make_index("ivf", DIM, n=n, sample=sample)
    add_vectors(index, np.arange(n, dtype=np.int64) * 7, data)
    return index


def test_ivf_recall_against_exact_search(small_ivf):
    rng = np.random.default_rng(0)
    data, queries = clustered_unit(4000, rng), clustered_unit(100, rng)
    index = trained_ivf(data, rng)
    inner = faiss.downcast_index(index.index)
    assert isinstance(inner, faiss.IndexIVFScalarQuantizer) and inner.nlist == ivf_nlist(4000) == 63
    set_nprobe(index, 63)  # every cell: exact but for float16 rounding
    assert recall_against_flat(index, data, queries, k=10) >= 0.99
    set_nprobe(index, 4)  # a sixteenth of the cells still finds most neighbours of clustered data
    assert 0.85 <= recall_against_flat(index, data, queries, k=10) < 0.99
    set_nprobe(index, 1)
    assert recall_against_flat(index, data, queries, k=10) < 0.8  # nprobe really limits the scan


def test_ivf_is_exact_below_the_training_size(small_ivf):
    assert train_sample_size("ivf", 999) == 0 and train_sample_size("flat", 10**6) == 0
    index = make_index("ivf", DIM, n=999)  # no sample needed
    assert type(faiss.downcast_index(index.index)) is faiss.IndexFlatIP
    assert is_kind(index, "ivf") and is_kind(index, "flat") and removes_in_place(index)
    add_vectors(index, np.arange(999), clustered_unit(999, np.random.default_rng(1)))
    assert not needs_retrain(index, "ivf") and not needs_retrain(index, "flat")
    add_vectors(index, np.array([999]), clustered_unit(1, np.random.default_rng(2)))
    assert needs_retrain(index, "ivf")  # reached IVF_MIN_TRAIN: time to train
    assert not needs_retrain(index, "flat")


def test_trained_ivf_asks_for_retraining_once_outgrown(small_ivf):
    rng = np.random.default_rng(3)
    index = trained_ivf(clustered_unit(1600, rng), rng)  # 40 cells: retrain at 4 * 40**2 = 6400
    assert is_kind(index, "ivf") and not is_kind(index, "flat") and not removes_in_place(index)
    more = clustered_unit(6400 - 1600, rng)
    add_vectors(index, np.arange(1600, 6399) * 7, more[:-1])
    assert not needs_retrain(index, "ivf")
    add_vectors(index, np.array([6399 * 7]), more[-1:])
    assert needs_retrain(index, "ivf")


def test_make_ivf_without_a_sample_says_what_to_pass(small_ivf):
    with pytest.raises(ValueError, match=r"pass sample= with 1000 rows of 32 values"):
        make_index("ivf", DIM, n=1000)
    with pytest.raises(ValueError, match="got shape"):
        make_index("ivf", DIM, n=1000, sample=np.zeros((10, DIM), dtype=np.float32))
    with pytest.raises(ValueError, match="nprobe must be >= 1"):
        set_nprobe(make_index("flat", DIM), 0)


def test_search_one_runs_on_one_thread_and_restores_the_setting():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((500, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = make_index("flat", 16)
    add_vectors(index, np.arange(500, dtype=np.int64), vectors)
    outside = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)  # the suite runs with OMP_NUM_THREADS=1: make "restored" mean something
    try:
        seen = []
        with one_thread():
            seen.append(faiss.omp_get_max_threads())
        assert seen == [1] and faiss.omp_get_max_threads() == 2
        scores, ids = search_one(index, vectors[7:8], 5)
        expected_scores, expected_ids = index.search(vectors[7:8], 5)
        assert ids[0, 0] == 7 and np.array_equal(ids, expected_ids) and np.allclose(scores, expected_scores)
        assert faiss.omp_get_max_threads() == 2
    finally:
        faiss.omp_set_num_threads(outside)
