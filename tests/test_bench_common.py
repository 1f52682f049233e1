"""bench/common.py: percentiles and latency summaries against numbers worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.common import parse_sizes, percentile, summarize_ms, write_result


def test_percentile_interpolates_between_ranks():
    # Sorted [1, 2, 3, 4] sit at ranks 0..3; p50 is rank 1.5, p95 is rank 2.85.
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 95) == pytest.approx(3.0 + 0.85 * 1.0)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0


def test_percentile_matches_numpy_default():
    values = [0.3, 7.0, 2.5, 2.5, 11.0, 0.1, 4.2]
    for q in (5, 50, 95, 99):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_of_one_value_is_that_value():
    assert percentile([7.0], 95) == 7.0


def test_percentile_refuses_no_values_and_bad_q():
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentile([1.0], 101)


def test_summarize_ms_converts_seconds_to_milliseconds():
    summary = summarize_ms([0.004, 0.001, 0.003, 0.002])
    assert summary == {
        "n": 4,
        "p50_ms": pytest.approx(2.5),
        "p95_ms": pytest.approx(3.85),
        "mean_ms": pytest.approx(2.5),
        "min_ms": pytest.approx(1.0),
        "max_ms": pytest.approx(4.0),
    }


def test_parse_sizes_reads_suffixes():
    assert parse_sizes("10k,100k,1M") == [10_000, 100_000, 1_000_000]
    assert parse_sizes("1000, 64") == [1000, 64]


@pytest.mark.parametrize("text", ["", "10x", "-5", "0", "1.5k"])
def test_parse_sizes_refuses_what_is_not_a_positive_size(text):
    with pytest.raises(ValueError, match="bad size"):
        parse_sizes(text)


def test_write_result_stamps_the_time(tmp_path):
    path = tmp_path / "sub" / "x.json"
    written = write_result({"p50_ms": 1.5}, path)
    assert json.loads(path.read_text()) == written
    assert written["p50_ms"] == 1.5
    assert written["measured_at"].endswith("+00:00")
