"""`meta-agent probe` on a saved tiny model: every arm plays, on one backbone, against the same problems."""

from __future__ import annotations

import json

import torch

from meta_agent.cli import main
from meta_agent.config import load_config
from meta_agent.episode.runner import request_seed
from meta_agent.evaluation.probe import derangement, mixed_slots, probe
from meta_agent.system import build_system
from meta_agent.tasks import load_tasks
from tests.meta_agent.test_saved_adapters import FAST, save_changed_adapters
from tests.meta_agent.test_sft_source import adapter_state
from training.backbone import Backbone

PROBE = [*FAST, "probe.limit=4", "probe.resamples=200", "eval.episodes_per_batch=4"]


def test_derangement_moves_every_problem():
    for n in (2, 3, 7, 64):
        p = derangement(n, seed=n)
        assert sorted(p) == list(range(n)) and all(p[i] != i for i in range(n))
    assert derangement(5, seed=1) == derangement(5, seed=1)


def test_arms_replay_plans_hide_them_and_swap_adapters(tiny_model_dir, tmp_path):
    other = tmp_path / "other"
    saved = save_changed_adapters(tiny_model_dir, other, seed=3)
    cfg = load_config([f"model.path={tiny_model_dir}", *PROBE, f"probe.meta_thinker_from={other}"])
    slots = mixed_slots(list(cfg.roles))
    backbone = Backbone.load(
        cfg.model, cfg.role_adapters | {s: cfg.roles[r].adapter for r, s in slots.items()}, seed=cfg.seed
    )
    system = build_system(cfg, backbone)
    tasks = load_tasks("arith", "test", limit=4, seed=cfg.seed)
    calls = []
    real = system.backend.generate
    system.backend.generate = lambda batch: calls.append(list(batch)) or real(batch)
    results, episodes = probe(system, tasks, cfg.probe, seed=0, temperature=0.0, adapters=None)
    requests = [q for call in calls for q in call]

    assert list(results) == ["base", "no_plan", "other_plan", "no_reflection", "mixed", "executors_alone"]
    for r in results.values():
        assert len(r.correct) == 4 and r.accuracy == sum(r.correct) / 4
        assert (r.difference is None) == (r.arm == "base")
    # the mixed arm's meta-thinker runs on the other checkpoint's weights, in its own slot beside the base's
    assert {q.adapter for q in requests} == {
        "meta_thinker",
        "executor",
        "meta_thinker-mixed",
        "executor-mixed",
    }
    state = adapter_state(backbone)
    mixed = [v for k, v in state.items() if k.startswith("meta_thinker-mixed/")]
    assert mixed and all(
        torch.equal(a, b)
        for a, b in zip(mixed, [v for k, v in saved.items() if k.startswith("meta_thinker/")], strict=True)
    )
    assert results["mixed"].note.startswith(f"the meta-thinker of {other}")
    # plans: replayed into other_plan from another problem, hidden from no_plan's executors
    base, moved = episodes["base"], episodes["other_plan"]
    for i, j in enumerate(derangement(4, 0)):
        assert moved[i].turns[0].completion_ids == base[j].turns[0].completion_ids
        assert moved[i].rounds[0].plan == base[j].rounds[0].plan
    for ep in episodes["no_plan"]:
        executor_prompt = system.chat.decode_raw(ep.turns[1].prompt_ids)
        assert "Plan from the meta-thinker" not in executor_prompt and ep.rounds[0].plan is None
    assert all({t.role for t in ep.turns} == {"executor"} for ep in episodes["executors_alone"])
    # the plans: one batch for the base's meta-thinker, one for the mixed arm's; then every arm together
    assert [q.adapter for q in calls[0]] == ["meta_thinker"] * 4
    assert [q.adapter for q in calls[1]] == ["meta_thinker-mixed"] * 4
    arms_at_once = {q.adapter for q in calls[2]}
    assert {"executor", "executor-mixed"} <= arms_at_once and len(calls[2]) == 6 * 4  # 6 arms x 4 problems


def test_arms_sample_with_the_seeds_of_their_problem(tiny_model_dir):
    """Sampled (temperature > 0), each arm's request for problem i uses the base's seed for problem i."""
    cfg = load_config(
        [f"model.path={tiny_model_dir}", *PROBE, "probe.arms=[no_plan,other_plan,executors_alone]"]
    )
    system = build_system(cfg)
    tasks = load_tasks("arith", "test", limit=4, seed=cfg.seed)
    calls = []
    real = system.backend.generate
    system.backend.generate = lambda batch: calls.append(list(batch)) or real(batch)
    probe(system, tasks, cfg.probe, seed=5, temperature=0.9, adapters=None)
    plans, first = calls[0], calls[1]  # the plans, then every arm's first executor request
    assert [q.seed for q in plans] == [request_seed(5, i, 0) for i in range(4)]
    hierarchy = [request_seed(5, i, 1) for i in range(4)]  # after the plan: its second request
    alone = [request_seed(5, i, 0) for i in range(4)]  # the executors alone make no plan first
    assert [q.seed for q in first] == hierarchy * 3 + alone  # base, no_plan, other_plan, executors_alone


def test_no_reflection_plays_one_round_and_matches_the_base_first_round(tiny_model_dir):
    cfg = load_config(
        [f"model.path={tiny_model_dir}", *PROBE, "protocol.max_rounds=2", "probe.arms=[no_reflection]"]
    )
    system = build_system(cfg)
    tasks = load_tasks("arith", "test", limit=4, seed=cfg.seed)
    results, episodes = probe(system, tasks, cfg.probe, seed=0, temperature=0.0, adapters=None)
    assert all(len(ep.rounds) == 1 and ep.rounds[0].verdict is None for ep in episodes["no_reflection"])
    # greedy, same prompts: one round without reflection answers as the base's first round did
    assert results["no_reflection"].correct == [ep.rounds[0].correct for ep in episodes["base"]]
    assert results["no_reflection"].note == ""  # two rounds allowed: the arms differ in principle


def test_probe_command_writes_json_and_markdown_and_loads_the_backbone_once(
    tiny_model_dir, tmp_path, monkeypatch
):
    loads = []
    real = Backbone.load.__func__

    def counting(cls, *args, **kwargs):
        loads.append(1)
        return real(cls, *args, **kwargs)

    other = tmp_path / "other"
    save_changed_adapters(tiny_model_dir, other, seed=4)
    monkeypatch.setattr(Backbone, "load", classmethod(counting))
    run = tmp_path / "run"
    args = [f"model.path={tiny_model_dir}", *PROBE, f"probe.executors_from={other}", f"run_dir={run}"]
    assert main(["probe", *args]) == 0
    assert len(loads) == 1
    data = json.loads((run / "probe.json").read_text())
    assert set(data["arms"]) == {"base", "no_plan", "other_plan", "no_reflection", "mixed", "executors_alone"}
    assert data["problems"] == 4 and data["arms"]["mixed"]["difference"]["p_value"] <= 1
    table = (run / "probe.md").read_text()
    assert "| arm | accuracy | difference | 95% interval | better / worse | p |" in table
    assert "| executors_alone |" in table
    traces = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    assert {t["arm"] for t in traces} == set(data["arms"]) and len(traces) == 6 * 4


def test_mixed_arm_without_checkpoints_is_reported_not_run(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    assert (
        main(["probe", f"model.path={tiny_model_dir}", *PROBE, "probe.arms=[mixed]", f"run_dir={run}"]) == 0
    )
    arms = json.loads((run / "probe.json").read_text())["arms"]
    assert arms["mixed"]["accuracy"] is None and "not run" in arms["mixed"]["note"]
    assert "| mixed | not run |" in (run / "probe.md").read_text()
