"""Evaluation a reader can compare with papers: pass@k, maj@k, intervals, seeds; on hand-played episodes
and through `meta-agent eval` on the tiny model."""

from __future__ import annotations

import json

import pytest

from meta_agent.analysis.stats import normal_answer
from meta_agent.cli import main
from meta_agent.evaluation.evaluate import pass_ks, score
from tests.meta_agent.conftest import PLAN, REFLECTION, TASKS, answer
from tests.meta_agent.test_saved_adapters import FAST


def played(make_episode, task, given: str):
    ep = make_episode("hierarchy", task=task)
    for action in (PLAN, answer(given), REFLECTION):
        ep.advance_text(action)
    return ep


def test_score_of_sampled_problems_by_hand(make_episode):
    a, b = TASKS[0], TASKS[1]
    # problem a, 3 samples: right, "0", "0" -> majority "0" (wrong); problem b: right, right, "0" -> right
    episodes = [
        played(make_episode, a, a.answer),
        played(make_episode, a, "0"),
        played(make_episode, a, "0"),
        played(make_episode, b, b.answer),
        played(make_episode, b, f"{int(b.answer):,}"),  # the same answer with thousands commas
        played(make_episode, b, "0"),
    ]
    s = score("arith", episodes, samples=3)
    assert (s.correct, s.total, s.problems, s.accuracy) == (3, 6, 2, 0.5)
    # pass@1 = mean(1/3, 2/3) = 0.5; pass@2 = mean(1 - C(2,2)/C(3,2), 1 - 0) = mean(2/3, 1) = 5/6
    assert s.pass_at == pytest.approx({1: 0.5, 2: 5 / 6, 3: 1.0})
    assert s.maj_accuracy == 0.5  # a's majority is wrong, b's is right
    # per-problem accuracies [1/3, 2/3]: sd 0.2357, half 1.96 * 0.2357 / sqrt(2) = 0.3267
    assert s.interval == pytest.approx((0.5 - 0.3267, 0.5 + 0.3267), abs=1e-3)
    assert s.reflection["reflection/verdicts"] == 6 and s.reflection["reflection/accept_given_wrong"] == 1.0


def test_pass_ks_and_answer_normalisation():
    assert pass_ks(1) == [1] and pass_ks(4) == [1, 2, 4] and pass_ks(10) == [1, 2, 4, 8, 10]
    assert normal_answer(" 1,234. ") == "1234" and normal_answer(None) is None


def test_eval_samples_and_seeds_through_the_command(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    args = [f"model.path={tiny_model_dir}", *FAST, "eval.limit=2", "eval.samples=3", "eval.seeds=[0,1]"]
    assert main(["eval", *args, f"run_dir={run}"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "over 2 seeds (0, 1)" in out and "reflection (n/a: nothing to compute it from)" in out
    results = json.loads((run / "eval.json").read_text())
    assert set(results) == {"0", "1"}
    arith = results["0"]["arith"]
    assert arith["total"] == 6 and arith["samples"] == 3 and set(arith["pass_at"]) == {"1", "2", "3"}
    assert 0 <= arith["maj_accuracy"] <= 1 and len(arith["interval"]) == 2
    # the tiny model's reflections carry no verdict: every one is the protocol's default accept, of a
    # wrong answer (it never answers right)
    ref = arith["reflection"]
    assert ref["reflection/accept_given_wrong"] == 1.0 and ref["reflection/untagged_verdicts"] == 6
    traces = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 12 and {t["seed"] for t in traces} == {0, 1}


def test_eval_bad_sample_count_is_one_clear_error(capsys):
    assert main(["eval", "eval.samples=0"]) == 2
    assert "eval.samples must be >= 1" in capsys.readouterr().out
