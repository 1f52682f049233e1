"""bench/rollout.py: the arms do equal work on the tiny backbone, and the script runs on the real one."""

from __future__ import annotations

import json

import pytest

from bench.rollout import ARMS, arm_calls, diagnose, run_calls
from tests.bench_run import run_bench
from tests.conftest import ROLES
from training.types import GenerationRequest, SamplingParams


def requests(n: int = 6, new_tokens: int = 5) -> list[GenerationRequest]:
    sampling = SamplingParams(temperature=0.7, max_new_tokens=new_tokens)
    return [GenerationRequest(ROLES[i % 2], tuple(range(10, 13 + i)), sampling, seed=i) for i in range(n)]


def test_arms_split_the_same_requests():
    reqs = requests()
    assert arm_calls("mixed", reqs, ROLES) == [reqs]
    sequential = arm_calls("sequential", reqs, ROLES)
    assert [{r.adapter for r in call} for call in sequential] == [{ROLES[0]}, {ROLES[1]}]
    assert sorted(r.seed for call in sequential for r in call) == sorted(r.seed for r in reqs)
    (base,) = arm_calls("base", reqs, ROLES)
    assert {r.adapter for r in base} == {None}
    assert [(r.prompt_ids, r.seed, r.sampling) for r in base] == [
        (r.prompt_ids, r.seed, r.sampling) for r in reqs
    ]


def test_every_arm_generates_the_same_number_of_tokens(tiny_backbone):
    reqs = requests()
    # EOS ids are off and no stop strings are set, so no row ends early whatever it samples.
    counts = {arm: run_calls(tiny_backbone, arm_calls(arm, reqs, ROLES), batch_size=8).tokens for arm in ARMS}
    assert counts == dict.fromkeys(ARMS, 6 * 5)


def test_decode_diagnostics_time_every_variant(tiny_backbone):
    out = diagnose(tiny_backbone, requests(4), ROLES, steps=1)
    assert set(out["ms_per_step"]) == {
        "mixed",
        "sequential",
        "base",
        "mixed_peft",
        "bare",
        "bare_two_calls",
    }
    assert all(v > 0 for v in out["ms_per_step"].values())
    # The product's stacked LoRA computes what PEFT's per-adapter path does (the adapters differ here).
    assert not out["fresh_adapters"] and out["product_vs_peft_max_abs_logit_diff"] < 1e-3
    assert out["mixed_top_ops"] and out["mixed_top_ops"][0]["self_ms_per_step"] >= 0
    assert not any("forward" in m.__dict__ for m in tiny_backbone.model.modules())  # RowAdapters left


@pytest.mark.slow
def test_script_on_the_real_backbone(tmp_path):
    out = tmp_path / "rollout.json"
    run = run_bench(
        "rollout",
        "--tasks",
        "1",
        "--new-tokens",
        "2",
        "--repeats",
        "1",
        "--decode-steps",
        "1",
        "--out",
        str(out),
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["mixed_vs_sequential"] > 0 and result["mixed_vs_base"] > 0
    assert len(result["notes"]) >= 4
    assert {arm: a["generated_tokens"] for arm, a in result["arms"].items()} == dict.fromkeys(ARMS, 2 * 2)
