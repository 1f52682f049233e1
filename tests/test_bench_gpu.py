"""bench/gpu.py run as a user would: the --tiny smoke test on a CPU, and the refusal without a GPU."""

from __future__ import annotations

import json

import pytest

from tests.bench_run import run_bench


def bench(*args: str):
    return run_bench("gpu", *args)


@pytest.mark.slow  # a subprocess run of the whole command: about 20 s on a busy 2-core machine
def test_tiny_run_writes_rollout_speed_and_mfu(tmp_path):
    out = tmp_path / "gpu.json"
    run = bench(
        *("--tiny", "--device", "cpu", "--out", str(out), "--rows", "4", "--prompt-len", "8"),
        *("--new-tokens", "4", "--train-steps", "1", "--peak-tflops", "1"),
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["rollout_generated_tokens"] == 4 * 4  # fixed length: EOS never ends a row
    assert result["finish_reasons"] == ["length"]
    assert result["rollout_tokens_per_s"] > 0
    assert 0 < result["train_mfu_4n"] < result["train_mfu"]
    assert result["train_turns"] == 4
    assert result["parameters"]["base_total"] > 1_000_000


@pytest.mark.slow  # a subprocess run of the whole command: about 20 s on a busy 2-core machine
def test_tiny_run_with_a_sharded_backbone(tmp_path):
    """--fsdp: the same measurement through FSDP shards (here a one-rank group on the CPU)."""
    out = tmp_path / "gpu.json"
    run = bench(
        *("--tiny", "--device", "cpu", "--out", str(out), "--rows", "4", "--prompt-len", "8"),
        *("--new-tokens", "4", "--train-steps", "1", "--peak-tflops", "1", "--fsdp"),
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["settings"]["fsdp"] and result["rollout_generated_tokens"] == 4 * 4
    assert result["train_mfu"] > 0 and result["parameters"]["base_total"] > 1_000_000


@pytest.mark.slow  # a subprocess run of the whole command: about 20 s on a busy 2-core machine
def test_without_a_gpu_it_asks_for_one_or_tiny(tmp_path):
    run = bench("--out", str(tmp_path / "gpu.json"))
    assert run.returncode != 0
    assert "--tiny" in run.stderr
    assert not (tmp_path / "gpu.json").exists()
