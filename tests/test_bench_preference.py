"""bench/preference.py: DPO and GRPO runs paired by seed, by hand."""

from __future__ import annotations

import json

import pytest

from bench.learning import settings_of
from bench.preference import main, pair_seeds


def sha(overrides) -> str:
    """A stand-in for today's fingerprint: one sha per set of overrides."""
    return "sha:" + ",".join(overrides)


def record(seed: int, sft: float, after: float, overrides=(), tokens=100.0) -> dict:
    return {
        "seed": seed,
        "sft": sft,
        "grpo": after,
        "overrides": list(overrides),
        "config_sha": sha(overrides),
        "dtype": "float32",
        "generated_tokens": tokens,
        "seconds": 10.0,
        "grpo_steps": 4.0,
        "run": "runs/gone",
    }


def test_seeds_pair_only_when_trained_alike():
    grpo = [
        record(0, 0.5, 0.4),
        record(1, 0.5, 0.7),
        record(2, 0.3, 0.3),
        record(3, 0.2, 0.2, ["train.steps=6"]),
        record(5, 0.2, 0.2) | {"grpo_steps": 2.0},
    ]
    dpo = [
        record(0, 0.5, 0.6, ["train.algorithm=dpo"]),
        record(1, 0.5, 0.5, ["train.algorithm=dpo"]),
        record(2, 0.25, 0.3, ["train.algorithm=dpo"]),  # another SFT result: not the same start
        record(3, 0.2, 0.2, ["train.algorithm=dpo"]),  # the GRPO run had other overrides
        record(4, 0.2, 0.2, ["train.algorithm=dpo"]),  # no GRPO run
        record(5, 0.2, 0.2, ["train.algorithm=dpo"]),  # the GRPO run stopped after 2 steps
    ]
    rows, left_out = pair_seeds(grpo, dpo, sha)
    assert [r["seed"] for r in rows] == [0, 1]
    assert [(r["grpo"], r["dpo"]) for r in rows] == [(0.4, 0.6), (0.7, 0.5)]
    assert [line.split(":")[0] for line in left_out] == ["seed 2", "seed 3", "seed 4", "seed 5"]
    assert "4 DPO steps against 2 GRPO steps" in left_out[3]
    assert (
        "SFT reached 0.250" in left_out[0] and "overrides differ" in left_out[1] and "no GRPO" in left_out[2]
    )


def test_seeds_of_other_settings_code_or_dtype_are_left_out():
    """A DPO seed of an older default (its yaml or training code changed since) must not pair with
    today's GRPO seed however alike their overrides and SFT accuracy."""
    grpo = [record(0, 0.5, 0.4), record(1, 0.5, 0.4) | {"config_sha": "old"}, record(2, 0.5, 0.4)]
    dpo = [
        record(0, 0.5, 0.6, ["train.algorithm=dpo"]) | {"config_sha": "old"},
        record(1, 0.5, 0.6, ["train.algorithm=dpo"]),
        record(2, 0.5, 0.6, ["train.algorithm=dpo"]) | {"dtype": "bfloat16"},
    ]
    rows, left_out = pair_seeds(grpo, dpo, sha)
    assert rows == []
    assert left_out == [
        "seed 0: the DPO run is not today's experiment (trained with settings old, today's are "
        "sha:train.algorithm=dpo): rerun it",
        "seed 1: the GRPO run is not today's experiment (trained with settings old, today's are sha:): rerun it",
        "seed 2: DPO computed in bfloat16, GRPO in float32",
    ]


def test_the_difference_over_seeds_and_the_files_other_keys(tmp_path):
    """Through main, whose fingerprint is bench.learning's for the files' experiment."""
    grpo, dpo, out = tmp_path / "g.json", tmp_path / "d.json", tmp_path / "planning.json"
    dpo_override = ["train.algorithm=dpo"]
    today = {
        (): settings_of("arith_hierarchy", [])[1],
        (*dpo_override,): settings_of("arith_hierarchy", dpo_override)[1],
    }
    assert len(set(today.values())) == 2  # the algorithm is in the fingerprint

    def real(seed, sft, after, overrides=(), tokens=100.0):
        return record(seed, sft, after, overrides, tokens) | {"config_sha": today[tuple(overrides)]}

    settings = {"experiments": ["arith_hierarchy", "arith_single_agent"]}
    grpo.write_text(json.dumps({"per_seed": [real(0, 0.5, 0.4), real(1, 0.5, 0.7)], "settings": settings}))
    dpo_seeds = [real(0, 0.5, 0.6, dpo_override, 90.0), real(1, 0.5, 0.5, dpo_override, 110.0)]
    dpo.write_text(json.dumps({"per_seed": dpo_seeds, "settings": settings}))
    out.write_text(json.dumps({"mcts_accuracy": 0.5}))
    section = main(["--grpo", str(grpo), "--dpo", str(dpo), "--out", str(out)])
    # differences +0.2 and -0.2: mean 0, sd 0.2828, t(1) = 12.706: half-width 12.706 * 0.2828 / sqrt 2 = 2.541
    assert section["mean"] == pytest.approx(0.0, abs=1e-12)
    assert section["ci_high"] == pytest.approx(2.5412, abs=1e-3)
    assert section["generated_tokens"] == {"grpo": 100.0, "dpo": 100.0}
    assert section["dpo_minus_sft"]["mean"] == pytest.approx(0.05)
    assert section["dpo_settings"] is None  # the run folder is gone
    written = json.loads(out.read_text())
    assert written["mcts_accuracy"] == 0.5 and written["dpo_minus_grpo"]["seeds"] == [0, 1]


def test_files_of_two_experiments_are_refused_in_one_line(tmp_path):
    grpo, dpo = tmp_path / "g.json", tmp_path / "d.json"
    grpo.write_text(json.dumps({"per_seed": [], "settings": {"experiments": ["arith_hierarchy"]}}))
    dpo.write_text(json.dumps({"per_seed": [], "settings": {"experiments": ["distract_hierarchy"]}}))
    with pytest.raises(SystemExit, match="trained distract_hierarchy and .* arith_hierarchy: give two runs"):
        main(["--grpo", str(grpo), "--dpo", str(dpo), "--out", str(tmp_path / "p.json")])
