"""Ranks without a process group: shares of a batch and the combination of per-rank metrics."""

from __future__ import annotations

import pytest
import torch

from training.distributed import Ranks, combine_metrics


def test_one_process_is_rank_zero_of_one_and_collectives_are_the_identity():
    ranks = Ranks.start("cpu")
    assert (ranks.rank, ranks.size, ranks.main) == (0, 1, True)
    assert ranks.sum([1, 2.5]) == [1.0, 2.5]
    assert ranks.max([1, 2.5]) == [1.0, 2.5]
    assert ranks.gather([("a", 1)]) == [("a", 1)]
    assert ranks.broadcast({"x": 1}) == {"x": 1}
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([1.0, 2.0, 3.0])
    ranks.sum_gradients([p])
    assert p.grad.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("n", "size", "expected"),
    [
        (8, 2, [(0, 4), (4, 8)]),
        (5, 2, [(0, 3), (3, 5)]),  # the first n % size ranks take one more
        (7, 3, [(0, 3), (3, 5), (5, 7)]),
        (1, 2, [(0, 1), (1, 1)]),
    ],
)
def test_shards_are_contiguous_cover_everything_once_and_differ_by_at_most_one(n, size, expected):
    bounds = [Ranks(rank=r, size=size).shard_bounds(n) for r in range(size)]
    assert bounds == expected
    items = list(range(n))
    assert sum((Ranks(rank=r, size=size).shard(items) for r in range(size)), []) == items


def test_combine_metrics_sums_counts_maxes_maxima_and_averages_the_rest():
    rank0 = {"train/turns": 8, "role/executor/loss": -0.25, "role/executor/reward": 1.0, "x_max": 0.3}
    rank1 = {"train/turns": 6, "role/executor/loss": 0.05, "role/executor/reward": 0.5, "x_max": 0.7}
    rank1["role/meta_thinker/reward"] = 0.2  # reported by one rank only: its own value
    out = combine_metrics([rank0, rank1])
    assert out == pytest.approx(
        {
            "train/turns": 14,
            "role/executor/loss": -0.2,
            "role/executor/reward": 0.75,
            "x_max": 0.7,
            "role/meta_thinker/reward": 0.2,
        }
    )
