"""FAISS memory latency: add and k=10 search on the product's indexes, and recall@10 of the approximate ones.

    python -m bench.faiss_memory                                  # 10k, 100k, 1M entries (~2 min, 2 cores)
    python -m bench.faiss_memory --sizes 1000,10000 --out /tmp/faiss.json   # a quick look
    python -m bench.faiss_memory --data uniform                   # the worst case: no structure at all
    python -m bench.faiss_memory --kinds flat,ivf,hnsw            # hnsw too (its 1M build alone: ~4.5 min)

Data (--data). The memory holds MiniLM embeddings of short maths texts, and how hard approximate
search is depends on their structure: uniform random unit vectors in 384-d have none (every direction
carries the same variance), which makes any index look far worse than it is. So by default ("minilm")
the benchmark embeds real texts that ship with the project (--fit-texts of them: gsm8k/train questions
and math500/test problems, 5:2) with the product's SentenceEmbedder, fits a Gaussian to those
embeddings (their mean and covariance) and draws the N stored vectors from it, normalised to unit
length: the synthetic set has the real spectrum (variance concentrated in ~80 effective dimensions,
recorded as `participation_ratio`; 384 for uniform data) at any N without embedding millions of
texts. It is still the conservative side of real data, having no cluster structure: on 2000 real
embeddings IVF found about twice the true neighbours in its first cell that it found on as many
Gaussian draws.
Queries are real embeddings of held-out texts (gsm8k/test questions and math500/test problems after
the fitted rows): what the agent searches with, never among the fitted texts. Queries drawn from the
Gaussian instead gave the same ivf recall and up to 0.04 lower hnsw recall. Texts are embedded on every
run, nothing is cached: ~50 s of the ~2 min run on 2 cores, which bounds --fit-texts.

Kinds (--kinds), built by memory.index.make_index as FaissMemory builds them: "flat" (exact), "ivf"
(inverted lists of float16 vectors, nlist = sqrt(N) trained on a sample of the N vectors, exact flat
below memory.index.IVF_MIN_TRAIN entries), "hnsw" (graph). For each size and kind it measures: adding
batches of --batch vectors (after training), adding one vector at a time into the nearly full index,
single k=10 queries (p50/p95) and recall@10 against exact search on the same queries, at the kind's
default setting (IVF_NPROBE / HNSW_EF_SEARCH: the latency and recall are of one setting), then a
sweep of that setting (--nprobe / --ef-search: what memory.ivf_nprobe / memory.hnsw_ef_search would
give). Up to --store-max entries it also measures the same through FaissMemory itself (SQLite on
disk plus the index: add commits, ivf training when the store crosses IVF_MIN_TRAIN, index file
write, search with scoring and last_used update).

Writes bench/results/faiss.json (or --out): `p50_ms_100k`, `p50_ms_1m`, `recall_at_10` (at the
largest size) and `kind` (the index kind those three belong to: the one that meets the targets best),
`targets`, `meets`, the full table per kind and size, `store`, `data` (model, texts and files, spectrum),
`settings`, `machine`, `measured_at`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from bench.common import RESULTS_DIR, machine_info, parse_sizes, summarize_ms, timed, write_result
from memory import index as memory_index
from memory.embedders import MINILM_DIM, SentenceEmbedder
from memory.index import add_vectors, make_index, search_one, set_ef_search, set_nprobe, train_sample_size
from memory.store import FaissMemory

# The targets: single k=10 query p50 at 100k and 1M entries, recall@10 against exact search.
TARGETS = {"p50_ms_100k": 2.0, "p50_ms_1m": 10.0, "recall_at_10": 0.95}

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
# Where the real texts come from: (file under data/, text field, share of the texts). Fitted texts
# are the first rows of `fit_file`, queries the first rows of `query_file` after `query_skip` rows
# (math500 has no second split, so its queries are the rows after the most that are ever fitted).
TEXT_SOURCES = (
    {"fit_file": "gsm8k/train.jsonl", "query_file": "gsm8k/test.jsonl", "query_skip": 0},
    {"fit_file": "math500/test.jsonl", "query_file": "math500/test.jsonl", "query_skip": 400},
)
TEXT_FIELDS = {"gsm8k": "question", "math500": "problem"}
TEXT_SHARES = (5 / 7, 2 / 7)  # gsm8k : math500, in fitted texts and in queries alike

# The setting each approximate kind sweeps (a config key of memory.*), with its default.
KNOBS = {
    "hnsw": ("ef_search", lambda: memory_index.HNSW_EF_SEARCH, set_ef_search),
    "ivf": ("nprobe", lambda: memory_index.IVF_NPROBE, set_nprobe),
}


# ---------------------------------------------------------------------------------------------- data


def random_unit(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """n random unit-norm float32 vectors, shape [n, dim], uniform on the sphere."""
    vectors = rng.standard_normal((n, dim), dtype=np.float32)  # [n, dim]
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def split_counts(total: int, shares: Sequence[float]) -> list[int]:
    """total cut into len(shares) whole counts in those proportions, summing to total."""
    rest = [round(total * share) for share in shares[1:]]
    return [total - sum(rest), *rest]


def read_texts(file: str, skip: int, count: int, data_dir: Path = DATA_DIR) -> list[str]:
    """`count` texts of data/<file> after its first `skip` rows; ValueError when the file is short."""
    field = TEXT_FIELDS[file.split("/")[0]]
    with open(data_dir / file) as lines:
        rows = [json.loads(line)[field] for line in lines if line.strip()]
    if skip + count > len(rows):
        raise ValueError(
            f"{file} has {len(rows)} rows, too few for {count} texts after row {skip}: "
            "ask for fewer with --fit-texts / --queries"
        )
    return rows[skip : skip + count]


def text_plan(fit_texts: int, queries: int) -> list[dict[str, Any]]:
    """Per source: the file and rows of its fitted texts and of its queries (disjoint by construction)."""
    plan = []
    for source, n_fit, n_query in zip(
        TEXT_SOURCES, split_counts(fit_texts, TEXT_SHARES), split_counts(queries, TEXT_SHARES), strict=True
    ):
        if source["fit_file"] == source["query_file"] and n_fit > source["query_skip"]:
            raise ValueError(
                f"--fit-texts {fit_texts} would fit {n_fit} rows of {source['fit_file']}, overlapping its "
                f"queries from row {source['query_skip']}: ask for fewer fitted texts"
            )
        plan.append({**source, "fit_rows": n_fit, "query_rows": n_query})
    return plan


def fit_gaussian(embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean [dim] and factor [dim, dim] (x = mean + factor @ z, z standard normal) of embeddings [m, dim]."""
    mean = embeddings.mean(axis=0)
    eigenvalues, eigenvectors = np.linalg.eigh(np.cov(embeddings, rowvar=False))  # ascending
    factor = eigenvectors * np.sqrt(np.clip(eigenvalues, 0.0, None))  # [dim, dim]
    return mean.astype(np.float32), factor.astype(np.float32)


def draw_unit(
    mean: np.ndarray, factor: np.ndarray, n: int, rng: np.random.Generator, chunk: int = 1 << 16
) -> np.ndarray:
    """n draws of the Gaussian (mean, factor), each scaled to unit length, shape [n, dim] float32."""
    out = np.empty((n, len(mean)), dtype=np.float32)
    for start, stop in spans(0, n, chunk):
        z = rng.standard_normal((stop - start, len(mean)), dtype=np.float32)  # [C, dim]
        drawn = z @ factor.T + mean
        out[start:stop] = drawn / np.linalg.norm(drawn, axis=1, keepdims=True)
    return out


def spectrum(embeddings: np.ndarray) -> dict[str, float]:
    """How spread the variance of embeddings [m, dim] is: the effective number of dimensions
    (participation ratio (sum l)^2 / sum l^2 of the covariance eigenvalues; dim for uniform data)
    and the share of variance in the top 10 and 50 directions."""
    eigenvalues = np.clip(np.linalg.eigvalsh(np.cov(embeddings, rowvar=False)), 0.0, None)[::-1]
    total = eigenvalues.sum()
    return {
        "participation_ratio": round(float(total**2 / (eigenvalues**2).sum()), 1),
        "variance_top10": round(float(eigenvalues[:10].sum() / total), 3),
        "variance_top50": round(float(eigenvalues[:50].sum() / total), 3),
    }


class DataModel:
    """Draws the stored vectors and holds the queries of one run: uniform, or Gaussian fitted to MiniLM."""

    def __init__(self, kind: str, dim: int, queries: np.ndarray, fit: tuple | None, info: dict):
        self.kind = kind
        self.dim = dim
        self.queries = queries  # [Q, dim], the same queries at every size
        self._fit = fit
        self.info = info

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n unit-norm stored vectors [n, dim]."""
        if self._fit is None:
            return random_unit(n, self.dim, rng)
        return draw_unit(*self._fit, n, rng)


def uniform_model(n_queries: int, rng: np.random.Generator) -> DataModel:
    info = {
        "model": "uniform",
        "vectors": "random unit-norm float32 (normal rows / their norm): no structure, the worst case",
        "queries": "random unit-norm float32, drawn the same way",
    }
    return DataModel("uniform", MINILM_DIM, random_unit(n_queries, MINILM_DIM, rng), None, info)


def minilm_model(fit_texts: int, n_queries: int) -> DataModel:
    """Embed the planned texts with the product's SentenceEmbedder and fit the Gaussian to them."""
    plan = text_plan(fit_texts, n_queries)
    fit = [text for p in plan for text in read_texts(p["fit_file"], 0, p["fit_rows"])]
    held_out = [text for p in plan for text in read_texts(p["query_file"], p["query_skip"], p["query_rows"])]
    embedder, load_s = timed(SentenceEmbedder)
    (fitted, queries), embed_s = timed(lambda: (embedder.embed(fit), embedder.embed(held_out)))
    info = {
        "model": "minilm-gaussian",
        "vectors": "Gaussian with the mean and covariance of the fitted texts' embeddings, each draw "
        "scaled to unit length",
        "queries": "embeddings of held-out texts (not fitted)",
        "embedder": embedder.name,
        "fit_texts": {p["fit_file"]: f"rows 0-{p['fit_rows'] - 1}" for p in plan},
        "query_texts": {
            p["query_file"]: f"rows {p['query_skip']}-{p['query_skip'] + p['query_rows'] - 1}" for p in plan
        },
        "n_fit_texts": len(fit),
        "n_query_texts": len(held_out),
        "model_load_s": round(load_s, 1),
        "embed_s": round(embed_s, 1),
        "spectrum_fitted_texts": spectrum(fitted),
    }
    print(f"embedded {len(fit)} + {len(held_out)} texts in {embed_s:.0f} s: {info['spectrum_fitted_texts']}")
    return DataModel("minilm", embedder.dim, queries, fit_gaussian(fitted), info)


# ---------------------------------------------------------------------------------------------- maths


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


# ---------------------------------------------------------------------------------------------- index


def search_each(
    index: faiss.Index, queries: np.ndarray, k: int, warmup: int
) -> tuple[np.ndarray, list[float]]:
    """One query at a time, as the agent asks: found ids [Q, k] and each query's seconds."""
    for query in queries[:warmup]:
        search_one(index, query[None], k)
    found, seconds = [], []
    for query in queries:
        (_, ids), elapsed = timed(search_one, index, query[None], k)  # [1, k], on one thread as FaissMemory
        found.append(ids[0])
        seconds.append(elapsed)
    return np.stack(found), seconds


def structure(index: faiss.IndexIDMap2) -> str:
    """What the kind actually built, e.g. "IndexIVFScalarQuantizer nlist=1000" or "IndexFlatIP"."""
    inner = faiss.downcast_index(index.index)
    name = type(inner).__name__
    return f"{name} nlist={inner.nlist}" if isinstance(inner, faiss.IndexIVF) else name


def build_index(kind: str, data: np.ndarray, rng: np.random.Generator) -> tuple[faiss.IndexIDMap2, float]:
    """An empty index of `kind` for data [n, dim], trained as FaissMemory trains it; and seconds spent."""
    n = len(data)
    size = train_sample_size(kind, n)
    sample = data[np.sort(rng.choice(n, size=size, replace=False))] if size else None
    return timed(make_index, kind, data.shape[1], n=n, sample=sample)


def measure_index(
    kind: str, data: np.ndarray, queries: np.ndarray, truth: np.ndarray, args, rng: np.random.Generator
) -> dict:
    """Add and search latency of one index kind filled with data [n, dim]; recall against truth."""
    n = len(data)
    ids = np.arange(n, dtype=np.int64)
    singles = min(args.single_adds, n // 2)  # the last `singles` vectors go in one by one
    index, train_s = build_index(kind, data, rng)
    batch_s = [
        timed(add_vectors, index, ids[i:j], data[i:j])[1] for i, j in spans(0, n - singles, args.batch)
    ]
    single_s = [timed(add_vectors, index, ids[i : i + 1], data[i : i + 1])[1] for i in range(n - singles, n)]
    found, search_s = search_each(index, queries, args.k, args.warmup)
    add_s = sum(batch_s) + sum(single_s)
    row = {
        "n": n,
        "structure": structure(index),
        "train_s": round(train_s, 3),
        "build_s": round(train_s + add_s, 3),
        "add_vectors_per_s": round(n / add_s, 1),
        "add_batch_ms": {"batch": args.batch, **summarize_ms(batch_s)},
        "add_single_ms": summarize_ms(single_s),
        "search_ms": summarize_ms(search_s),
        "recall_at_10": round(recall_at_k(found, truth), 4),
    }
    if kind in KNOBS and row["structure"] != "IndexFlatIP":  # not the exact fallback of a small ivf
        name, default, _ = KNOBS[kind]
        row[name] = default()
        row[f"{name}_sweep"] = sweep(index, kind, queries, truth, getattr(args, name), args)
    return row


def sweep(
    index: faiss.IndexIDMap2, kind: str, queries: np.ndarray, truth: np.ndarray, values: list[int], args
) -> list[dict]:
    """Recall@10 and search latency of the same index at each value of its kind's setting."""
    name, default, setter = KNOBS[kind]
    points = []
    for value in values:
        setter(index, value)
        found, seconds = search_each(index, queries, args.k, args.warmup)
        summary = summarize_ms(seconds)
        points.append(
            {
                name: value,
                "recall_at_10": round(recall_at_k(found, truth), 4),
                "search_p50_ms": summary["p50_ms"],
                "search_p95_ms": summary["p95_ms"],
            }
        )
    setter(index, default())
    return points


# ---------------------------------------------------------------------------------------------- store


class TableEmbedder:
    """Embedder over precomputed vectors: text "v12" is data row 12, "q3" is query row 3."""

    def __init__(self, data: np.ndarray, queries: np.ndarray):
        self.dim = data.shape[1]
        self.name = f"bench-table-{self.dim}"
        self._rows = {"v": data, "q": queries}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """The stored rows named by texts, shape [N, dim]."""
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._rows[text[0]][int(text[1:])] for text in texts])  # [N, dim]


def measure_store(kind: str, data: np.ndarray, queries: np.ndarray, args) -> dict:
    """The same adds and searches through FaissMemory on disk (SQLite commits, scoring, last_used).

    An ivf store trains on the add that crosses IVF_MIN_TRAIN (a rebuild from SQLite): that batch is
    the add_batch_ms max, and its cells fit the size then, not the final size as in the index table.
    """
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
        built = structure(store.faiss_index)
        store.close()
    return {
        "n": n,
        "structure": built,
        "add_batch_ms": {"batch": args.batch, **summarize_ms(batch_s)},
        "add_single_ms": summarize_ms(single_s),
        "flush_index_file_ms": round(flush_s * 1000, 2),
        "search_ms": {"candidates": candidates, **summarize_ms(search_s)},
    }


# ---------------------------------------------------------------------------------------------- result


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


def setting_needed(rows: dict[int, dict], name: str) -> dict[str, Any] | None:
    """The smallest swept value of setting `name` whose recall@10 meets the target at the largest swept
    size; None if none did or nothing was swept."""
    swept = [n for n, row in rows.items() if f"{name}_sweep" in row]
    if not swept:
        return None
    largest = max(swept)
    for point in sorted(rows[largest][f"{name}_sweep"], key=lambda p: p[name]):
        if point["recall_at_10"] >= TARGETS["recall_at_10"]:
            return {"n": largest, **point}
    return None


def main(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    if args.data == "uniform":
        model = uniform_model(args.queries, rng)
    else:
        model = minilm_model(args.fit_texts, args.queries)
    queries = model.queries  # [Q, dim]
    table: dict[str, dict[int, dict]] = {kind: {} for kind in args.kinds}
    store: dict[str, dict[int, dict]] = {kind: {} for kind in args.kinds}
    for n in args.sizes:
        data = model.draw(n, rng)  # [n, dim]
        truth = exact_top_k(data, queries, args.k)  # [Q, k]
        for kind in args.kinds:
            table[kind][n] = measure_index(kind, data, queries, truth, args, rng)
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
        "data": model.info,
        "by_kind": {k: {"headline": headlines[k], "meets": meets_targets(headlines[k])} for k in args.kinds},
        "ivf_nprobe_needed": setting_needed(table["ivf"], "nprobe") if "ivf" in table else None,
        "hnsw_ef_search_needed": setting_needed(table["hnsw"], "ef_search") if "hnsw" in table else None,
        "table": {k: {str(n): row for n, row in rows.items()} for k, rows in table.items()},
        "store": {k: {str(n): row for n, row in rows.items()} for k, rows in store.items() if rows},
        "wall_seconds": round(time.perf_counter() - started, 1),
        "settings": {
            "sizes": args.sizes,
            "kinds": args.kinds,
            "data": args.data,
            "dim": model.dim,
            "queries": f"{len(queries)} queries, the same at every size, one search call each, k={args.k}",
            "recall_truth": "exact inner-product top-k computed with numpy",
            "warmup_queries": args.warmup,
            "add_batch": args.batch,
            "single_adds": f"the last {args.single_adds} vectors of each size, one add_with_ids call each",
            "ivf": {
                "vectors": "float16 (SQfp16), not residuals",
                "nlist": "round(sqrt(n)) at training",
                "min_train": memory_index.IVF_MIN_TRAIN,
                "train_per_list": memory_index.IVF_TRAIN_PER_LIST,
                "retrain_at": f"{memory_index.IVF_REGROW} x nlist**2 entries",
                "nprobe": memory_index.IVF_NPROBE,
                "nprobe_sweep": args.nprobe,
            },
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
    parser.add_argument(
        "--kinds", type=lambda s: s.split(","), default=["flat", "ivf"], help="index kinds: flat,ivf,hnsw"
    )
    parser.add_argument(
        "--data",
        choices=["minilm", "uniform"],
        default="minilm",
        help="minilm: Gaussian fitted to MiniLM embeddings of the project's texts; uniform: worst case",
    )
    parser.add_argument(
        "--fit-texts", type=int, default=1400, help="texts embedded to fit the minilm data model"
    )
    parser.add_argument("--queries", type=int, default=200, help="timed single queries per size and kind")
    parser.add_argument("--k", type=int, default=10, help="neighbours per query")
    parser.add_argument("--warmup", type=int, default=10, help="untimed queries before each timed run")
    parser.add_argument("--batch", type=int, default=1000, help="vectors per batched add")
    parser.add_argument("--single-adds", type=int, default=200, help="vectors added one at a time")
    parser.add_argument(
        "--nprobe",
        type=parse_sizes,
        default=[32, 64, 96, 128, 160, 192, 256],
        help="ivf nprobe values to sweep",
    )
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
    args = parser.parse_args(argv)
    unknown = sorted(set(args.kinds) - set(memory_index.INDEX_KINDS))
    if unknown:
        parser.error(f"unknown --kinds {unknown}; choose from {sorted(memory_index.INDEX_KINDS)}")
    return args


if __name__ == "__main__":
    main(parse_args())
