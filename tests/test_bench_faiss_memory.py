"""bench/faiss_memory.py: its maths against hand-worked numbers, and the script run as a user would."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.faiss_memory import (
    best_kind,
    draw_unit,
    exact_top_k,
    fit_gaussian,
    meets_targets,
    recall_at_k,
    setting_needed,
    spans,
    spectrum,
    split_counts,
    text_plan,
)
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


def test_split_counts_keeps_the_total():
    assert split_counts(1400, (5 / 7, 2 / 7)) == [1000, 400]
    assert split_counts(8, (5 / 7, 2 / 7)) == [6, 2]


def test_text_plan_keeps_queries_out_of_the_fitted_rows():
    plan = text_plan(1400, 200)
    math = next(p for p in plan if p["fit_file"] == "math500/test.jsonl")
    assert math["fit_rows"] <= math["query_skip"]  # math500 queries start after its fitted rows
    with pytest.raises(ValueError, match="overlapping its queries from row 400"):
        text_plan(2800, 200)  # would fit 800 math500 rows


def test_gaussian_draws_keep_the_fitted_spectrum():
    rng = np.random.default_rng(0)
    # 16-d data whose variance lies in 4 directions: draws must keep that, unlike uniform vectors.
    basis = np.linalg.qr(rng.standard_normal((16, 16)))[0][:, :4]  # [16, 4]
    fitted = rng.standard_normal((2000, 4)) @ basis.T + 3.0 * basis[:, 0]  # [2000, 16]
    mean, factor = fit_gaussian(fitted)
    np.testing.assert_allclose(mean, fitted.mean(axis=0), atol=1e-5)
    drawn = draw_unit(mean, factor, 5000, rng, chunk=777)
    np.testing.assert_allclose(np.linalg.norm(drawn, axis=1), 1.0, rtol=1e-5)
    assert spectrum(drawn)["participation_ratio"] < 5
    assert spectrum(rng.standard_normal((5000, 16)))["participation_ratio"] > 14


def test_setting_needed_is_the_smallest_value_meeting_recall():
    rows = {
        1000: {"nprobe_sweep": [{"nprobe": 8, "recall_at_10": 0.99}]},
        5000: {"nprobe_sweep": [{"nprobe": 32, "recall_at_10": 0.97}, {"nprobe": 8, "recall_at_10": 0.9}]},
        9000: {},  # the exact fallback: nothing swept
    }
    assert setting_needed(rows, "nprobe") == {"n": 5000, "nprobe": 32, "recall_at_10": 0.97}
    assert setting_needed(rows, "ef_search") is None


@pytest.mark.slow  # a subprocess run of the whole command: about 20 s on a busy 2-core machine
def test_script_writes_the_result_file(tmp_path):
    out = tmp_path / "faiss.json"
    # IVF_MIN_TRAIN is read from memory.index in the child process, so a tiny ivf cannot train
    # there; 2000 entries stay its exact fallback, which the result must say.
    run = run_bench(
        "faiss_memory",
        *("--sizes", "300,2000", "--queries", "8", "--fit-texts", "40", "--single-adds", "5"),
        *("--batch", "100", "--kinds", "flat,ivf,hnsw", "--ef-search", "16,64", "--out", str(out)),
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["kind"] in ("flat", "ivf", "hnsw")
    assert result["p50_ms_100k"] is None and result["p50_ms_1m"] is None  # those sizes were not run
    assert result["table"]["flat"]["300"]["recall_at_10"] == 1.0
    assert result["table"]["ivf"]["2000"]["structure"] == "IndexFlatIP"  # below IVF_MIN_TRAIN: exact
    assert result["table"]["ivf"]["2000"]["recall_at_10"] == 1.0
    assert [p["ef_search"] for p in result["table"]["hnsw"]["300"]["ef_search_sweep"]] == [16, 64]
    assert result["store"]["hnsw"]["300"]["search_ms"]["n"] == 8
    data = result["data"]
    assert data["model"] == "minilm-gaussian" and data["n_fit_texts"] == 40 and data["n_query_texts"] == 8
    assert data["fit_texts"] == {"gsm8k/train.jsonl": "rows 0-28", "math500/test.jsonl": "rows 0-10"}
    assert result["machine"]["faiss"]


def test_script_trains_ivf_on_uniform_data(tmp_path):
    out = tmp_path / "faiss.json"
    run = run_bench(
        "faiss_memory",
        *("--sizes", "50000", "--data", "uniform", "--kinds", "ivf", "--queries", "8", "--nprobe", "1,300"),
        *("--single-adds", "5", "--batch", "10000", "--store-max", "0", "--out", str(out)),
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    row = result["table"]["ivf"]["50000"]
    assert row["structure"] == "IndexIVFScalarQuantizer nlist=224" and row["nprobe"] == 160
    sweep = {p["nprobe"]: p["recall_at_10"] for p in row["nprobe_sweep"]}
    assert sweep[1] < 0.5 and sweep[300] >= 0.99  # every cell: exact but for float16 rounding
    assert result["data"]["model"] == "uniform" and result["store"] == {}
