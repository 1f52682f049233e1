"""bench/vllm.py: its batch is the product's, and the speed run works end to end on the real backbone."""

from __future__ import annotations

import json

import pytest

from bench.vllm import BACKENDS, build, compare, paired_difference, parse_args, rollout_requests
from meta_agent.episode.runner import request_seed
from tests.bench_run import run_bench
from tests.tiny_model import build_tiny_model


def test_requests_are_a_rollouts_first_turns_of_both_roles(tokenizer, tmp_path):
    build_tiny_model(tokenizer, seed=0).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    whole = [f"roles.{role}.adapter.top_layers=null" for role in ("meta_thinker", "executor")]  # 2 layers
    cfg, system = build([f"model.path={tmp_path}", *whole])
    requests = rollout_requests(system, n_tasks=2, group_size=3, seed=0)
    roles = {r.name: r for r in system.roles}
    assert [r.adapter for r in requests[:2]] == ["meta_thinker", "executor"] and len(requests) == 12
    plans = requests[0::2]
    # A group's plan requests share their prompt, with a seed per episode as runner.play gives them.
    assert len({r.prompt_ids for r in plans[:3]}) == 1 and plans[0].prompt_ids != plans[3].prompt_ids
    assert [r.seed for r in plans] == [request_seed(0, i, 0) for i in range(6)]
    for r in requests:  # natural stopping: the protocol's stops and the role's own limits and sampling
        role = roles[r.adapter]
        assert r.sampling.stop and r.sampling.max_new_tokens == role.sampling.max_new_tokens
        assert (r.sampling.temperature, r.sampling.top_p) == (role.sampling.temperature, role.sampling.top_p)
    assert cfg.backend.name == "hf"


@pytest.mark.vllm
@pytest.mark.slow
def test_speed_script_on_the_real_backbone(tmp_path):
    pytest.importorskip("vllm")
    out = tmp_path / "vllm.json"
    out.write_text(json.dumps({"learning": {"grpo": 0.5}}))  # a learning section the speed run keeps
    run = run_bench("vllm", "--tasks", "1", "--group-size", "1", "--rounds", "1", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["speedup_vs_hf"] > 0 and result["targets"] == {"speedup_vs_hf": 1.3}
    assert result["engine_startup_seconds"] > 0 and result["adapter_sync_seconds"] > 0
    assert result["dtype"] in ("bfloat16", "float32") and result["learning"] == {"grpo": 0.5}
    for name in BACKENDS:
        backend = result["backends"][name]
        assert backend["tokens"][0] > 0 and backend["median_tokens_per_s"] > 0
        assert set(backend["finish_reasons"]) == {"meta_thinker", "executor"}


def test_paired_difference_by_hand():
    # diffs -0.2, -0.1, 0.1: mean -1/15, sd sqrt(0.07/3), se sd / sqrt(3), t(0.975, 2 df) = 4.303
    d = paired_difference([0.9, 0.8, 0.6], [0.7, 0.7, 0.7])
    assert d["mean"] == pytest.approx(-0.0666667, abs=1e-6)
    assert d["se"] == pytest.approx(0.0881917, abs=1e-6)
    assert d["ci95"] == pytest.approx(4.303 * 0.0881917, abs=1e-6)
    with pytest.raises(ValueError, match="at least 2 seeds"):
        paired_difference([0.5], [0.5])


def test_compare_calls_a_gap_noise_only_inside_the_paired_interval():
    def runs(hf, vllm):
        return {
            name: {str(s): {"sft": 0.6, "grpo": acc} for s, acc in enumerate(values)}
            for name, values in (("hf", hf), ("vllm", vllm))
        }

    noisy = compare(runs([0.9, 0.8, 0.6], [0.7, 0.7, 0.7]), [])
    assert noisy["seeds_compared"] == [0, 1, 2]
    assert noisy["grpo_vllm_minus_hf"] == pytest.approx(-0.0667, abs=1e-4)
    assert noisy["within_noise"]
    # A steady gap of 0.38-0.40 on every seed: far outside both the paired interval and the eval's noise
    # (2 sqrt(2 p (1 - p) / (48 * 3)) = 0.108 at p = 0.703).
    steady = compare(runs([0.9, 0.92, 0.88], [0.5, 0.52, 0.5]), [])
    assert steady["eval_noise_two_se"] == pytest.approx(0.1077, abs=1e-4)
    assert steady["paired_difference"]["ci95"] == pytest.approx(0.0287, abs=1e-4)
    assert not steady["within_noise"]


def test_learning_can_add_one_backends_run():
    assert parse_args(["--learning", "--seeds", "3", "--backends", "vllm"]).backends == ["vllm"]
    assert parse_args(["--learning"]).backends == list(BACKENDS)
    with pytest.raises(SystemExit):
        parse_args(["--learning", "--backends", "sglang"])
