"""The statistics of evaluations and probes against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from meta_agent.analysis.stats import (
    SeedInterval,
    majority,
    mean_interval,
    paired_difference,
    pass_at_k,
    seed_interval,
    sign_test,
    t_975,
)


def test_pass_at_k_by_hand():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # 1 - C(7,1)/C(10,1) = 1 - 7/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0  # k = n: any correct sample
    assert pass_at_k(3, 2, 2) == 1.0  # n - c = 1 < k: every pair holds a correct one
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(2, 1, 3)


def test_majority_picks_the_most_common_answer_first_seen_on_ties():
    assert majority(["12", "13", "12", None]) == 0
    assert majority([None, "7", "8"]) == 1  # a tie: the first seen
    assert majority([None, None]) is None


def test_mean_interval_by_hand():
    # [0.5, 1, 0.75, 0.75] (means over samples): mean 0.75, sd sqrt((0.0625 + 0.0625) / 3) = 0.2041,
    # half 1.96 * 0.2041 / 2 = 0.2000
    mean, low, high = mean_interval([0.5, 1.0, 0.75, 0.75])
    assert mean == 0.75 and low == pytest.approx(0.55, abs=1e-3) and high == pytest.approx(0.95, abs=1e-3)
    assert mean_interval([0.5]) is None and mean_interval([]) is None
    # 0/1 values: Wilson, z^2 = 3.8415. 3 of 4 right: centre (0.75 + 3.8415/8) / (1 + 3.8415/4) = 0.6275,
    # half 1.96 * sqrt(0.75 * 0.25 / 4 + 3.8415 / 64) / 1.9604 = 0.3269 -> [0.3006, 0.9544]
    mean, low, high = mean_interval([1, 0, 1, 1])
    assert mean == 0.75 and low == pytest.approx(0.3006, abs=1e-3) and high == pytest.approx(0.9544, abs=1e-3)
    # every problem right is not certainty: 8 of 8 -> [0.6756, 1.0]
    assert mean_interval([1] * 8)[1] == pytest.approx(0.6756, abs=1e-3)


def test_sign_test_by_hand():
    # 5 better, 1 worse: P(X <= 1) for Bin(6, 1/2) = (1 + 6) / 64, two-sided 14/64 = 0.21875
    assert sign_test(5, 1) == pytest.approx(14 / 64)
    assert sign_test(0, 0) == 1.0 and sign_test(3, 3) == 1.0
    assert sign_test(10, 0) == pytest.approx(2 / 2**10)


def test_paired_difference_counts_and_interval():
    base = [1, 1, 0, 0, 1, 0, 1, 0]
    arm = [1, 0, 1, 1, 1, 1, 1, 0]  # better on 3 problems, worse on 1: mean (3 - 1) / 8 = 0.25
    d = paired_difference(arm, base, resamples=2000, seed=1)
    assert (d.mean, d.better, d.worse) == (0.25, 3, 1)
    assert d.p_value == pytest.approx(sign_test(3, 1)) == pytest.approx(10 / 16)
    assert d.low < 0.25 < d.high and d.low >= -1 and d.high <= 1
    same = paired_difference(base, base, resamples=100)
    assert (same.mean, same.low, same.high, same.p_value) == (0.0, 0.0, 0.0, 1.0)
    # the bootstrap interval of a mean of n paired differences narrows like 1 / sqrt(n)
    wide = paired_difference(arm, base, resamples=2000, seed=1)
    narrow = paired_difference(arm * 16, base * 16, resamples=2000, seed=1)
    assert (narrow.high - narrow.low) == pytest.approx((wide.high - wide.low) / math.sqrt(16), rel=0.3)


def test_seed_interval_by_hand():
    """Differences 0.3, 0.1, 0.2, 0.0: mean 0.15, sd sqrt(0.05/3) = 0.1291, se 0.06455, t(3) = 3.182,
    half-width 0.2054: [-0.0554, 0.3554]."""
    got = seed_interval([0.3, 0.1, 0.2, 0.0])
    assert got.mean == pytest.approx(0.15)
    assert got.low == pytest.approx(-0.05540, abs=1e-4)
    assert got.high == pytest.approx(0.35540, abs=1e-4)
    assert got.seeds == 4


def test_seed_interval_of_one_seed_has_no_width_and_none_is_refused():
    assert seed_interval([0.25]) == SeedInterval(0.25, None, None, 1)
    with pytest.raises(ValueError, match="at least one seed"):
        seed_interval([])


def test_t_quantile_beyond_the_table_by_the_expansion():
    """Tables give 2.228 (df 10), 2.086 (df 20), 2.042 (df 30); the expansion is within 0.003."""
    assert t_975(3) == 3.182
    for df, table in ((10, 2.228), (20, 2.086), (30, 2.042)):
        assert t_975(df) == pytest.approx(table, abs=3e-3)
