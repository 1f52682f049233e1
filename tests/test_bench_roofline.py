"""bench.roofline's arithmetic, against numbers worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.roofline import flops_per_token, ideal_step, model_shapes


def test_shapes_and_flops_of_a_small_llama_by_hand():
    config = SimpleNamespace(
        hidden_size=4,
        intermediate_size=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=2,
        num_hidden_layers=1,
        vocab_size=10,
    )
    shapes = model_shapes(config)
    # q 4x4, k and v 4x2, o 4x4 (the same shape as q: counted twice), gate and up 4x8, down 8x4, head 4x10
    assert sorted(shapes) == sorted([(4, 4, 2), (4, 2, 2), (4, 8, 2), (8, 4, 1), (4, 10, 1)])
    assert flops_per_token(shapes) == 2 * (16 * 2 + 8 * 2 + 32 * 2 + 32 + 40)  # 368


def test_the_ideal_step_takes_the_slower_of_compute_and_weight_reads():
    step = {"generated_tokens": 64, "trained_tokens": 100, "rollout_s": 10.0, "step_s": 16.4}
    best = {"decode": 100.0, "update": 200.0}  # GFLOP/s
    # 2 decode steps of 32 rows: compute 32 x 1e9 / 100e9 = 0.32 s each, weights 1e10 B / 50 GB/s = 0.2 s
    out = ideal_step(step, best, decode_rows=32, flops=10**9, bytes_read=10**10, bandwidth=50.0)
    assert out["ideal_rollout_s"] == pytest.approx(0.64)
    assert out["ideal_update_s"] == pytest.approx(1.0)  # 100 tokens x 2 x 1e9 / 200e9
    assert out["fraction_of_ideal"] == pytest.approx(0.1)
    slow_memory = ideal_step(step, best, decode_rows=32, flops=10**9, bytes_read=10**10, bandwidth=10.0)
    assert slow_memory["ideal_rollout_s"] == pytest.approx(2.0)  # 1 s of weight reads a step
