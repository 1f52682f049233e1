"""bench/trl_grpo.py: TRL gets the settings meta-agent runs with, and the script runs as a user would."""

from __future__ import annotations

import json

import pytest

from bench.trl_grpo import compare, load_settings, parse_args, trl_config
from tests.bench_run import run_bench


def test_trl_config_mirrors_the_experiment(tmp_path):
    pytest.importorskip("trl")
    args = parse_args(["--prompts", "2", "--group-size", "4", "--max-new-tokens", "16", "--micro-batch", "2"])
    cfg = load_settings(args)
    config = trl_config(cfg, args, str(tmp_path))
    assert config.generation_batch_size == 8  # prompts x G sampled at once...
    assert config.steps_per_generation == config.gradient_accumulation_steps == 4  # ...one optimizer step
    assert config.per_device_train_batch_size == cfg.train.micro_batch_size == 2
    assert config.generation_kwargs == {"min_new_tokens": 16}  # EOS never ends a completion early
    assert config.temperature == cfg.roles["executor"].sampling.temperature
    assert config.learning_rate == cfg.roles["executor"].lr
    assert (config.epsilon, config.epsilon_high) == (cfg.grpo.eps_low, cfg.grpo.eps_high)
    assert config.beta == cfg.grpo.beta == 0.0
    assert not config.gradient_checkpointing and not config.bf16
    assert not cfg.grpo.filter_zero_variance  # meta-agent trains on every completion, as TRL does


def test_speedup_is_trl_time_over_meta_agent_time():
    meta = {"step_seconds": 10.0, "tokens_per_s": 400.0, "generated_tokens_per_step": 4000}
    trl = {"step_seconds": 20.0, "tokens_per_s": 200.0, "generated_tokens_per_step": 4000}
    result = compare(meta, trl)
    assert result["speedup"] == 2.0 and result["tokens_per_s_ratio"] == 2.0
    assert result["equal_tokens"] and result["meets_target"]
    assert compare(meta, None) == {"speedup": None}


@pytest.mark.slow
def test_smoke_run_writes_both_sides(tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "trl.json"
    sizes = ["--prompts", "1", "--group-size", "2", "--max-new-tokens", "4", "--micro-batch", "2"]
    run = run_bench("trl_grpo", *sizes, "--steps", "1", "--out", str(out), timeout=900)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["speedup"] > 0
    assert (
        result["meta_agent"]["generated_tokens_per_step"] == result["trl"]["generated_tokens_per_step"] == 8
    )
