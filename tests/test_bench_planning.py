"""bench/planning.py: the arms' bookkeeping by hand, and one whole small run on the tiny model."""

from __future__ import annotations

import json

import pytest

from bench.planning import main, per_problem


class Ep:
    def __init__(self, answer, correct, tokens):
        self.final_answer, self.correct = answer, correct
        self.turns = [type("T", (), {"generated_tokens": tokens})()]


def test_per_problem_mean_majority_and_tokens():
    episodes = [Ep("7", False, 10), Ep("8", True, 20), Ep("8", True, 5)]  # one problem, three samples
    episodes += [Ep(None, False, 3), Ep("1,000", True, 4), Ep("1000", True, 4)]
    mean, majority, tokens = per_problem(episodes, 3)
    assert mean == pytest.approx([2 / 3, 2 / 3])
    assert majority == [1.0, 1.0]  # "1,000" and "1000" are one answer
    assert tokens == [35, 11]
    _, majority, _ = per_problem([Ep("7", False, 1), Ep("8", True, 1)], 2)
    assert majority == [0.0]  # a tie: the first sampled answer


def test_a_small_run_writes_every_arm_and_a_figure(tiny_model_dir, tmp_path):
    out = tmp_path / "planning.json"
    out.write_text(json.dumps({"dpo_minus_grpo": {"mean": 0.1}, "stale": 1}))
    small = [
        f"model.path={tiny_model_dir}",
        "roles.meta_thinker.sampling.max_new_tokens=8",
        "roles.executor.sampling.max_new_tokens=8",
        "eval.episodes_per_batch=4",
        "roles.meta_thinker.adapter.top_layers=null",
        "roles.executor.adapter.top_layers=null",
    ]
    written = main(["--budgets", "2,3", "--limit", "2", "--out", str(out), *small])
    for key in ("mcts_accuracy", "best_of_n_accuracy", "sampling_accuracy", "generated_tokens"):
        assert key in written
    assert written["dpo_minus_grpo"] == {"mean": 0.1} and "stale" not in written
    budget = written["per_seed"]["0"]["2"]
    # mcts spends about what sampling did per problem: its budget is the sampling arm's mean
    assert budget["mcts"]["token_budget_per_problem"] == round(budget["sampling"]["generated_tokens"] / 2)
    assert budget["best_of_n"]["generated_tokens"] == budget["sampling"]["generated_tokens"]
    assert out.with_suffix(".png").stat().st_size > 0
