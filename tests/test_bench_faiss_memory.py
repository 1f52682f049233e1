"""bench/faiss_memory.py: its maths against hand-worked numbers, and the script run as a user would."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.faiss_memory import best_kind, exact_top_k, meets_targets, recall_at_k, spans
from tests.bench_run import run_bench


def test_recall_at_k_counts_shared_ids_whatever_their_order():
    truth = np.array([[1, 2, 3], [4, 5, 6]])
    found = np.array([[3, 2, 9], [6, 5, 4]])  # 2 of 3, then 3 of 3
    assert recall_at_k(found, truth) == pytest.approx(5 / 6)


def test_recall_at_k_ignores_missing_results():
    assert recall_at_k(np.array([[7, -1]]), np.array([[7, 8]])) == pytest.approx(0.5)


def test_exact_top_k_across_chunks():
    data = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [-1.0, 0.0], [0.8, 0.6]], dtype=np.float32)
    queries = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    # Scores of query 0: 1, 0, .6, -1, .8 -> top 2 are rows 0 and 4; query 1: rows 1 and 2.
    for chunk in (1, 2, 5):
        found = exact_top_k(data, queries, k=2, chunk=chunk)
        assert [sorted(row) for row in found.tolist()] == [[0, 4], [1, 2]]


def test_spans_cover_the_range_once():
    assert spans(0, 7, 3) == [(0, 3), (3, 6), (6, 7)]
    assert spans(5, 5, 3) == []


def test_best_kind_prefers_the_kind_meeting_more_targets():
    flat = {"p50_ms_100k": 1.5, "p50_ms_1m": 40.0, "recall_at_10": 1.0}
    hnsw = {"p50_ms_100k": 0.3, "p50_ms_1m": 0.9, "recall_at_10": 0.97}
    assert meets_targets(flat) == {"p50_ms_100k": True, "p50_ms_1m": False, "recall_at_10": True}
    assert best_kind({"flat": flat, "hnsw": hnsw}) == "hnsw"
    assert best_kind({"flat": flat, "hnsw": {**hnsw, "recall_at_10": 0.5}}) == "hnsw"  # 2 each: faster wins
    assert meets_targets({**flat, "p50_ms_1m": None})["p50_ms_1m"] is None


def test_script_writes_the_result_file(tmp_path):
    out = tmp_path / "faiss.json"
    run = run_bench(
        "faiss_memory",
        *("--sizes", "300", "--queries", "8", "--single-adds", "5", "--batch", "100"),
        *("--ef-search", "16,64", "--out", str(out)),
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["kind"] in ("flat", "hnsw")
    assert result["p50_ms_100k"] is None and result["p50_ms_1m"] is None  # those sizes were not run
    assert result["table"]["flat"]["300"]["recall_at_10"] == 1.0
    assert [p["ef_search"] for p in result["table"]["hnsw"]["300"]["ef_search_sweep"]] == [16, 64]
    assert result["store"]["hnsw"]["300"]["search_ms"]["n"] == 8
    assert result["machine"]["faiss"]
