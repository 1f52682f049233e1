"""bench/internal_memory.py: its differences by hand, and one whole small run on the tiny model."""

from __future__ import annotations

import json

import pytest

from bench.internal_memory import main, parse_args, summarise


def arm(correct: list[int], prompt: float) -> dict:
    return {
        "accuracy": sum(correct) / len(correct),
        "correct": correct,
        "prompt_tokens_per_episode": prompt,
        "generated_tokens_per_episode": 100.0,
        "rounds_per_episode": 2.0,
    }


def test_summary_minus_truncate_by_hand():
    per_seed = {
        0: {"truncate": arm([1, 0, 0, 0], 400.0), "summary": arm([1, 1, 0, 0], 460.0)},
        1: {"truncate": arm([0, 0, 1, 0], 420.0), "summary": arm([0, 0, 1, 0], 470.0)},
    }
    out = summarise(per_seed)
    assert out["mean"] == pytest.approx(1 / 8)  # one problem of eight fixed, none broken
    assert out["over_problems"]["better"] == 1 and out["over_problems"]["worse"] == 0
    assert out["over_seeds"]["mean"] == pytest.approx((0.25 + 0.0) / 2)
    # two seeds: 0.125 +- t(1) 12.706 * sd 0.17678 / sqrt 2 = 0.125 +- 1.588
    assert out["over_seeds"]["low"] == pytest.approx(0.125 - 12.7062 * 0.176777 / 2**0.5, abs=1e-3)
    assert out["arms"]["summary"]["prompt_tokens_per_episode"] == pytest.approx(465.0)
    assert out["prompt_tokens_summary_minus_truncate"] == pytest.approx(55.0)


def test_fewer_than_three_rounds_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "2"])
    assert "three rounds or more" in capsys.readouterr().err


@pytest.mark.slow
def test_a_small_run_trains_both_arms_and_keeps_the_files_other_keys(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the runs' folders
    out = tmp_path / "planning.json"
    out.write_text(json.dumps({"mcts_accuracy": 0.5, "measured_at": "then"}))
    small = [
        f"model.path={tiny_model_dir}",
        "roles.meta_thinker.adapter.top_layers=null",
        "roles.executor.adapter.top_layers=null",
        "sft.examples=2",
        "sft.max_steps=1",
        "sft.batch_size=1",
        "eval.episodes_per_batch=2",
        "roles.meta_thinker.sampling.max_new_tokens=8",
        "roles.executor.sampling.max_new_tokens=8",
    ]
    section = main(["--seeds", "0", "--limit", "2", "--out", str(out), *small])
    written = json.loads(out.read_text())
    assert written["mcts_accuracy"] == 0.5 and written["measured_at"] == "then"
    assert written["summary_minus_truncate"]["mean"] == section["mean"]
    for mode in ("truncate", "summary"):
        result = section["per_seed"]["0"][mode]
        assert len(result["correct"]) == 2 and result["prompt_tokens_per_episode"] > 0
        assert result["adapters"].endswith("sft-best")
