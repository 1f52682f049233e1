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
    assert "SFT reached 0.250" in left_out[0] and "other settings" in left_out[1] and "no GRPO" in left_out[2]


def test_seeds_pair_by_the_settings_their_overrides_resolve_to_not_their_spelling():
    """An override that sets a default's own value trains the same: the seeds pair. Overrides that
    train otherwise do not, however alike they look."""
    default_steps = "train.steps=4"

    def resolved(overrides) -> str:
        """A fingerprint of the resolved settings: the default's own value spelt out changes nothing."""
        return sha([o for o in overrides if o != default_steps])

    dpo_override = ["train.algorithm=dpo"]
    grpo = [record(0, 0.5, 0.4, [default_steps]), record(1, 0.5, 0.4, ["train.steps=6"])]
    dpo = [record(0, 0.5, 0.6, dpo_override), record(1, 0.5, 0.6, [*dpo_override, "train.steps=5"])]
    grpo[0]["config_sha"] = resolved(grpo[0]["overrides"])
    dpo[1]["config_sha"] = resolved(dpo[1]["overrides"])
    rows, left_out = pair_seeds(grpo, dpo, resolved)
    assert [(r["seed"], r["grpo"], r["dpo"]) for r in rows] == [(0, 0.4, 0.6)]
    assert left_out == ["seed 1: other settings (['train.steps=5'] against ['train.steps=6'])"]


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


def test_runs_from_a_recorded_sft_pair_when_they_started_from_the_same_one():
    """bench.learning --sft-from records `<own sha>/sft:<source sha>`: judged by the own part, and paired
    only with a run from the same source."""
    dpo_override = ["train.algorithm=dpo"]

    def from_sft(seed, overrides, source):
        return record(seed, 0.5, 0.6, overrides) | {"config_sha": f"{sha(overrides)}/sft:{source}"}

    grpo = [from_sft(0, [], "s1"), from_sft(1, [], "s1"), record(2, 0.5, 0.4)]
    dpo = [from_sft(0, dpo_override, "s1"), from_sft(1, dpo_override, "s2"), from_sft(2, dpo_override, "s1")]
    rows, left_out = pair_seeds(grpo, dpo, sha)
    assert [r["seed"] for r in rows] == [0]
    assert left_out == [
        "seed 1: DPO started from SFT s2, GRPO from s1",
        "seed 2: DPO started from SFT s1, GRPO from that of its own run",
    ]


def test_the_difference_over_seeds_and_the_files_other_keys(tmp_path, capsys):
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
    dpo_seeds = [
        real(0, 0.5, 0.6, dpo_override, 90.0),
        real(1, 0.5, 0.5, dpo_override, 110.0),
        real(2, 0.5, 0.5, dpo_override) | {"config_sha": "f60dd410ed3d"},  # an older default's
    ]
    grpo_seeds = [real(0, 0.5, 0.4), real(1, 0.5, 0.7), real(2, 0.5, 0.4)]
    grpo.write_text(json.dumps({"per_seed": grpo_seeds, "settings": settings}))
    dpo.write_text(json.dumps({"per_seed": dpo_seeds, "settings": settings}))
    out.write_text(json.dumps({"mcts_accuracy": 0.5}))
    section = main(["--grpo", str(grpo), "--dpo", str(dpo), "--out", str(out)])
    assert capsys.readouterr().out.startswith(
        f"left out: seed 2: the DPO run is not today's experiment (trained with settings f60dd410ed3d, "
        f"today's are {today[tuple(dpo_override)]}): rerun it\n"
    )
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
    with pytest.raises(
        SystemExit, match="trained distract_hierarchy and .* trained arith_hierarchy: give two runs"
    ):
        main(["--grpo", str(grpo), "--dpo", str(dpo), "--out", str(tmp_path / "p.json")])
