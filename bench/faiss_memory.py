"""FAISS memory latency: add and k=10 search on the product's own indexes, and HNSW recall@10.

    python -m bench.faiss_memory                                  # 10k, 100k, 1M entries
    python -m bench.faiss_memory --sizes 1000,10000 --out /tmp/faiss.json   # a quick look

For each size and index kind ("flat" exact, "hnsw" approximate; built by memory.index.make_index, as
FaissMemory builds them) it measures: adding batches of --batch vectors, adding one vector at a time
into the nearly full index, and single k=10 queries (p50/p95), and for hnsw recall@10 against exact
search on the same queries, also at other efSearch values (a sweep: what a different HNSW_EF_SEARCH
would give). Up to --store-max entries it also measures the same through FaissMemory itself (SQLite
on disk plus the index: add commits, index file write, search with scoring and last_used update).

Vectors are random unit-norm float32 of the default embedder's size (MINILM_DIM), not sentence
embeddings: the sentence model would dominate the run time. Uniform random vectors are the hard case
for HNSW (no cluster structure), so its recall here is a lower bound for real embeddings.

Writes bench/results/faiss.json (or --out): `p50_ms_100k`, `p50_ms_1m`, `recall_at_10` and `kind`
(the index kind those three belong to: the one that meets the targets best), `targets`, `meets`,
the full table per kind and size, `store`, `settings`, `machine`, `measured_at`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from bench.common import RESULTS_DIR, machine_info, parse_sizes, summarize_ms, timed, write_result
from memory import index as memory_index
from memory.embedders import MINILM_DIM
from memory.index import add_vectors, make_index
from memory.store import FaissMemory

# The targets: single k=10 query p50 at 100k and 1M entries, recall@10 against exact search.
TARGETS = {"p50_ms_100k": 2.0, "p50_ms_1m": 10.0, "recall_at_10": 0.95}


def random_unit(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """n random unit-norm float32 vectors, shape [n, dim], uniform on the sphere."""
    vectors = rng.standard_normal((n, dim), dtype=np.float32)  # [n, dim]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def exact_top_k(data: np.ndarray, queries: np.ndarray, k: int, chunk: int = 1 << 17) -> np.ndarray:
    """Row ids of the k largest inner products of each query with data, shape [Q, k] (numpy, no FAISS).

    Works through data a chunk at a time, keeping the best k so far, so [Q, n] scores never exist.
    """
    best_scores = np.zeros((len(queries), 0), dtype=np.float32)  # [Q, <=k]
    best_ids = np.zeros((len(queries), 0), dtype=np.int64)  # [Q, <=k]
    for start in range(0, len(data), chunk):
        scores = queries @ data[start : start + chunk].T  # [Q, C]
        ids = np.broadcast_to(np.arange(start, start + scores.shape[1]), scores.shape)  # [Q, C]
        scores = np.concatenate([best_scores, scores], axis=1)  # [Q, <=k + C]
        ids = np.concatenate([best_ids, ids], axis=1)
        keep = np.argpartition(-scores, min(k, scores.shape[1]) - 1, axis=1)[:, :k]  # [Q, <=k]
        best_scores = np.take_along_axis(scores, keep, axis=1)
        best_ids = np.take_along_axis(ids, keep, axis=1)
    return best_ids


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of the share of the true k neighbours [Q, k] that `found` [Q, k] returned."""
    k = truth.shape[1]
    hits = [len(set(f.tolist()) & set(t.tolist())) for f, t in zip(found, truth, strict=True)]
    return sum(hits) / (k * len(truth))


def spans(start: int, stop: int, step: int) -> list[tuple[int, int]]:
    """[start, stop) cut into consecutive (begin, end) pieces of at most step."""
    return [(i, min(i + step, stop)) for i in range(start, stop, step)]


def search_each(
    index: faiss.Index, queries: np.ndarray, k: int, warmup: int
) -> tuple[np.ndarray, list[float]]:
    """One query at a time, as the agent asks: found ids [Q, k] and each query's seconds."""
    for query in queries[:warmup]:
        index.search(query[None], k)
    found, seconds = [], []
    for query in queries:
        (_, ids), elapsed = timed(index.search, query[None], k)  # [1, k]
        found.append(ids[0])
        seconds.append(elapsed)
    return np.stack(found), seconds


def measure_index(kind: str, data: np.ndarray, queries: np.ndarray, truth: np.ndarray, args) -> dict:
    """Add and search latency of one index kind filled with data [n, dim]; recall against truth."""
    n = len(data)
    ids = np.arange(n, dtype=np.int64)
    singles = min(args.single_adds, n // 2)  # the last `singles` vectors go in one by one
    index = make_index(kind, data.shape[1])
    batch_s = [
        timed(add_vectors, index, ids[i:j], data[i:j])[1] for i, j in spans(0, n - singles, args.batch)
    ]
    single_s = [timed(add_vectors, index, ids[i : i + 1], data[i : i + 1])[1] for i in range(n - singles, n)]
    found, search_s = search_each(index, queries, args.k, args.warmup)
    row = {
        "n": n,
        "build_s": round(sum(batch_s) + sum(single_s), 3),
        "add_vectors_per_s": round(n / (sum(batch_s) + sum(single_s)), 1),
        "add_batch_ms": {"batch": args.batch, **summarize_ms(batch_s)},
        "add_single_ms": summarize_ms(single_s),
        "search_ms": summarize_ms(search_s),
        "recall_at_10": round(recall_at_k(found, truth), 4),
    }
    if kind == "hnsw":
        row["ef_search"] = memory_index.HNSW_EF_SEARCH
        row["ef_search_sweep"] = sweep_ef_search(index, queries, truth, args)
    return row


def sweep_ef_search(index: faiss.IndexIDMap2, queries: np.ndarray, truth: np.ndarray, args) -> list[dict]:
    """Recall@10 and search latency of the same HNSW graph at each efSearch in args.ef_search."""
    inner = faiss.downcast_index(index.index)  # a view, valid while `index` lives
    sweep = []
    for ef in args.ef_search:
        inner.hnsw.efSearch = ef
        found, seconds = search_each(index, queries, args.k, args.warmup)
        summary = summarize_ms(seconds)
        sweep.append(
            {
                "ef_search": ef,
                "recall_at_10": round(recall_at_k(found, truth), 4),
                "search_p50_ms": summary["p50_ms"],
                "search_p95_ms": summary["p95_ms"],
            }
        )
    inner.hnsw.efSearch = memory_index.HNSW_EF_SEARCH
    return sweep


class TableEmbedder:
    """Embedder over precomputed vectors: text "v12" is data row 12, "q3" is query row 3."""

    def __init__(self, data: np.ndarray, queries: np.ndarray):
        self.dim = data.shape[1]
        self.name = f"bench-random-{self.dim}"
        self._rows = {"v": data, "q": queries}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """The stored rows named by texts, shape [N, dim]."""
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._rows[text[0]][int(text[1:])] for text in texts])  # [N, dim]


def measure_store(kind: str, data: np.ndarray, queries: np.ndarray, args) -> dict:
    """The same adds and searches through FaissMemory on disk (SQLite commits, scoring, last_used)."""
    n = len(data)
    texts = [f"v{i}" for i in range(n)]
    singles = min(args.single_adds, n // 2)
    with tempfile.TemporaryDirectory(prefix="bench-faiss-memory-") as folder:
        # flush_every=0: the fill would otherwise rewrite the whole index file every 1000 adds;
        # one flush is timed below instead.
        store = FaissMemory(Path(folder), TableEmbedder(data, queries), index=kind, flush_every=0)
        batch_s = [
            timed(store.add_many, texts[i:j], batch_size=args.batch)[1]
            for i, j in spans(0, n - singles, args.batch)
        ]
        single_s = [timed(store.add, texts[i])[1] for i in range(n - singles, n)]
        _, flush_s = timed(store.flush)
        for j in range(min(args.warmup, len(queries))):
            store.search(f"q{j}", args.k)
        search_s = [timed(store.search, f"q{j}", args.k)[1] for j in range(len(queries))]
        candidates = min(args.k * store.candidate_factor, n)
        store.close()
    return {
        "n": n,
        "add_batch_ms": {"batch": args.batch, **summarize_ms(batch_s)},
        "add_single_ms": summarize_ms(single_s),
        "flush_index_file_ms": round(flush_s * 1000, 2),
        "search_ms": {"candidates": candidates, **summarize_ms(search_s)},
    }


def headline(rows: dict[int, dict]) -> dict[str, Any]:
    """The target numbers of one kind from its rows by size; None where that size was not run."""
    largest = max(rows)
    return {
        "p50_ms_100k": rows[100_000]["search_ms"]["p50_ms"] if 100_000 in rows else None,
        "p50_ms_1m": rows[1_000_000]["search_ms"]["p50_ms"] if 1_000_000 in rows else None,
        "recall_at_10": rows[largest]["recall_at_10"],
        "recall_at_10_n": largest,
    }


def meets_targets(numbers: dict[str, Any]) -> dict[str, bool | None]:
    """Per target: True/False, or None when its size was not measured."""
    met: dict[str, bool | None] = {}
    for key, target in TARGETS.items():
        value = numbers[key]
        met[key] = None if value is None else (value >= target if key == "recall_at_10" else value <= target)
    return met


def best_kind(headlines: dict[str, dict]) -> str:
    """The kind meeting the most targets; ties go to the faster search at the largest size."""

    def rank(kind: str) -> tuple[int, float]:
        numbers = headlines[kind]
        slowest = numbers["p50_ms_1m"] if numbers["p50_ms_1m"] is not None else numbers["p50_ms_100k"]
        return sum(bool(v) for v in meets_targets(numbers).values()), -(slowest or 0.0)

    return max(headlines, key=rank)


def ef_search_needed(rows: dict[int, dict]) -> dict[str, Any] | None:
    """The smallest swept efSearch whose recall@10 meets the target at the largest size; None if none did."""
    largest = max(rows)
    for point in sorted(rows[largest]["ef_search_sweep"], key=lambda p: p["ef_search"]):
        if point["recall_at_10"] >= TARGETS["recall_at_10"]:
            return {"n": largest, **point}
    return None


def main(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    dim = MINILM_DIM
    rng = np.random.default_rng(args.seed)
    queries = random_unit(args.queries, dim, rng)  # [Q, dim], the same queries at every size
    table: dict[str, dict[int, dict]] = {kind: {} for kind in args.kinds}
    store: dict[str, dict[int, dict]] = {kind: {} for kind in args.kinds}
    for n in args.sizes:
        data = random_unit(n, dim, rng)  # [n, dim]
        truth = exact_top_k(data, queries, args.k)  # [Q, k]
        for kind in args.kinds:
            table[kind][n] = measure_index(kind, data, queries, truth, args)
            print(f"{kind} n={n}: {table[kind][n]}", flush=True)
            if n <= args.store_max:
                store[kind][n] = measure_store(kind, data, queries, args)
                print(f"store {kind} n={n}: {store[kind][n]}", flush=True)
        del data
    headlines = {kind: headline(rows) for kind, rows in table.items()}
    kind = best_kind(headlines)
    result = {
        **{key: headlines[kind][key] for key in TARGETS},
        "kind": kind,
        "targets": TARGETS,
        "meets": meets_targets(headlines[kind]),
        "by_kind": {k: {"headline": headlines[k], "meets": meets_targets(headlines[k])} for k in args.kinds},
        "hnsw_ef_search_needed": ef_search_needed(table["hnsw"]) if "hnsw" in table else None,
        "table": {k: {str(n): row for n, row in rows.items()} for k, rows in table.items()},
        "store": {k: {str(n): row for n, row in rows.items()} for k, rows in store.items() if rows},
        "wall_seconds": round(time.perf_counter() - started, 1),
        "settings": {
            "sizes": args.sizes,
            "kinds": args.kinds,
            "dim": dim,
            "vectors": "random unit-norm float32 (normal rows / their norm), not sentence-model embeddings",
            "queries": f"{args.queries} fresh random unit-norm vectors, one search call each, k={args.k}",
            "recall_truth": "exact inner-product top-k computed with numpy",
            "warmup_queries": args.warmup,
            "add_batch": args.batch,
            "single_adds": f"the last {args.single_adds} vectors of each size, one add_with_ids call each",
            "hnsw": {
                "M": memory_index.HNSW_M,
                "ef_construction": memory_index.HNSW_EF_CONSTRUCTION,
                "ef_search": memory_index.HNSW_EF_SEARCH,
                "ef_search_sweep": args.ef_search,
            },
            "store": f"FaissMemory on disk for sizes <= {args.store_max}, flush_every=0 while filling",
            "faiss_threads": faiss.omp_get_max_threads(),
            "seed": args.seed,
        },
        "machine": machine_info(faiss=faiss.__version__),
    }
    written = write_result(result, args.out)
    print(f"wrote {args.out}: kind={kind} " + ", ".join(f"{key}={result[key]}" for key in TARGETS))
    return written


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", type=parse_sizes, default=parse_sizes("10k,100k,1M"), help="entries, e.g. 10k,100k,1M"
    )
    parser.add_argument("--kinds", type=lambda s: s.split(","), default=["flat", "hnsw"], help="index kinds")
    parser.add_argument("--queries", type=int, default=200, help="timed single queries per size and kind")
    parser.add_argument("--k", type=int, default=10, help="neighbours per query")
    parser.add_argument("--warmup", type=int, default=10, help="untimed queries before each timed run")
    parser.add_argument("--batch", type=int, default=1000, help="vectors per batched add")
    parser.add_argument("--single-adds", type=int, default=200, help="vectors added one at a time")
    parser.add_argument(
        "--ef-search",
        type=parse_sizes,
        default=[64, 128, 256, 512, 1024, 2048],
        help="hnsw efSearch values to sweep",
    )
    parser.add_argument(
        "--store-max", type=int, default=100_000, help="also measure FaissMemory up to this size"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "faiss.json")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
