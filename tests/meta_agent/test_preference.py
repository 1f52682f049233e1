"""Preference pairs mined from hand-played episodes: which turns pair, and which one is chosen."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meta_agent.learning.preference import mine_pairs, pair_metrics
from roles import RewardSpec
from tests.meta_agent.conftest import PLAN, REFLECTION, TASK, answer
from tests.meta_agent.test_rounds import CALC, REVISE, WRONG

OTHER_PLAN = "<plan>add first, then multiply</plan>"


def played(make_episode, *actions):
    ep = make_episode("hierarchy", task=TASK)
    for action in actions:
        ep.advance_text(action)
    assert ep.done
    return ep


def test_plans_and_executor_turns_pair_on_equal_prompts_by_how_their_round_ended(make_episode):
    episodes = [
        played(make_episode, PLAN, answer(TASK.answer), REFLECTION),  # 0: plan A, right
        played(make_episode, OTHER_PLAN, answer(WRONG), REFLECTION),  # 1: plan B, wrong
        played(make_episode, PLAN, answer(TASK.answer), REFLECTION),  # 2: plan A, right
        played(make_episode, PLAN, answer(WRONG), REFLECTION),  # 3: plan A, wrong
    ]
    pairs = mine_pairs(episodes)
    # Plans (one prompt, the question): right 0, 2 over wrong 1, 3; 0 against 3 is the same text, so 0
    # pairs with 1, and 2 is left with no wrong plan that differs from it.
    plans = [p for p in pairs if p.kind == "plan"]
    assert [(p.chosen.episode, p.rejected.episode) for p in plans] == [(0, 1)]
    assert plans[0].role == "meta_thinker" and plans[0].chosen.prompt_ids == plans[0].rejected.prompt_ids
    # The executor's turns pair within a plan: plan A's executors 0, 2 right, 3 wrong -> (0, 3)
    executes = [p for p in pairs if p.kind == "execute"]
    assert [(p.chosen.episode, p.rejected.episode, p.role) for p in executes] == [(0, 3, "executor")]
    # Reflections: 0 and 2 saw the same work and both accepted: equal credit, no pair
    assert not [p for p in pairs if p.kind == "reflection"]
    assert pair_metrics(pairs) == {
        "dpo/pairs_plan": 1.0,
        "dpo/pairs_execute": 1.0,
        "dpo/pairs_reflection": 0.0,
    }
    assert [p.kind for p in mine_pairs(episodes, kinds=["execute"])] == ["execute"]
    with pytest.raises(ValueError, match="dpo.pairs must be among"):
        mine_pairs(episodes, kinds=["plans"])


def test_a_reflection_that_fixed_the_answer_is_chosen_over_one_that_accepted_it(make_episode):
    spec = RewardSpec(improvement_bonus=1.0, accept_wrong_penalty=0.5)
    revised = played(make_episode, PLAN, answer(WRONG), REVISE, CALC, answer(TASK.answer), REFLECTION)
    accepted = played(make_episode, PLAN, answer(WRONG), REFLECTION)
    for ep in (accepted, revised):
        ep.roles["meta_thinker"] = replace(ep.roles["meta_thinker"], reward=spec)
    # Round 1's reflections saw the same plan and the same wrong answer. Credit: the revision that was
    # fixed +1, the accepting one -0.5. Plans and executor turns are the same texts: no pair.
    pairs = mine_pairs([accepted, revised])
    assert [(p.kind, p.chosen.episode, p.rejected.episode) for p in pairs] == [("reflection", 1, 0)]
    assert pairs[0].chosen.prompt_ids == pairs[0].rejected.prompt_ids
    # Without reflection weights (the default reward) both reflections earn 0: nothing to prefer
    for ep in (accepted, revised):
        ep.roles["meta_thinker"] = replace(ep.roles["meta_thinker"], reward=RewardSpec())
    assert mine_pairs([accepted, revised]) == []


def test_bad_dpo_settings_name_the_key():
    from meta_agent.config import load_config
    from meta_agent.errors import SettingError

    with pytest.raises(SettingError, match="train.algorithm must be one of"):
        load_config(["train.algorithm=ppo"])
    with pytest.raises(SettingError, match="dpo.pairs must be some of"):
        load_config(["dpo.pairs=[plans]"])
    with pytest.raises(SettingError, match="dpo.loss must be one of"):
        load_config(["dpo.loss=kto"])
    cfg = load_config(["train.algorithm=dpo", "dpo.loss=simpo", "dpo.pairs=[reflection]"])
    assert cfg.dpo.pairs == ["reflection"] and not cfg.dpo.needs_reference


def test_distinct_texts_pair_by_their_mean_value_so_no_two_pairs_contradict():
    from meta_agent.learning.preference import _matched
    from training.types import Turn

    def turn(text, episode):
        return Turn(
            "meta_thinker", "t", (1,), tuple(text), (1,) * len(text), (0.0,) * len(text), episode=episode
        )

    x, y, z = [5], [6], [7]
    # X right then wrong, Y wrong then right: both worth 0.5, nothing to prefer (not X > Y and Y > X)
    assert (
        _matched([(1.0, turn(x, 0)), (0.0, turn(y, 1)), (1.0, turn(y, 2)), (0.0, turn(x, 3))], "plan") == []
    )
    # X right, Y right and wrong, Z wrong: X 1 > Y 0.5 > Z 0, three pairs, each text by its first turn
    pairs = _matched([(1.0, turn(x, 0)), (1.0, turn(y, 1)), (0.0, turn(y, 2)), (0.0, turn(z, 3))], "plan")
    assert sorted((p.chosen.episode, p.rejected.episode) for p in pairs) == [(0, 1), (0, 3), (1, 3)]


def test_a_resumed_dpo_stage_scores_against_the_adapters_it_began_with(tokenizer, tmp_path):
    from types import SimpleNamespace

    import torch

    from meta_agent.errors import SettingError
    from meta_agent.learning.train import REFERENCE_FILES, stage_reference
    from tests.tiny_model import build_tiny_backbone
    from training.backbone import AdapterConfig
    from training.distributed import Ranks
    from training.trainer import PolicyTrainer

    roles = ("meta_thinker", "executor")
    backbone = build_tiny_backbone(
        tokenizer, {r: AdapterConfig(r=4, alpha=8) for r in roles}, seed=0, lora_b_std=0.05
    )
    trainer = PolicyTrainer(backbone, dict.fromkeys(roles, 5e-3))
    dpo = SimpleNamespace(algorithm="dpo")
    began = stage_reference(SimpleNamespace(resume=None, train=dpo), trainer, tmp_path, Ranks())
    assert (tmp_path / REFERENCE_FILES["dpo"]).is_file()
    with torch.no_grad():  # the stage trains on: the adapters move away from where it began
        for p in backbone.trainable_parameters("executor"):
            p.add_(0.5)
    again = stage_reference(SimpleNamespace(resume="runs/x", train=dpo), trainer, tmp_path, Ranks())
    for role in roles:
        assert all(torch.equal(a, b) for a, b in zip(again[role], began[role], strict=True))
    assert not torch.equal(again["executor"][0], backbone.trainable_parameters("executor")[0])
    with pytest.raises(SettingError, match="is missing"):
        stage_reference(SimpleNamespace(resume="runs/x", train=dpo), trainer, tmp_path / "other", Ranks())


def test_dpo_refuses_what_it_does_not_support_before_anything_loads():
    from meta_agent.config import load_config
    from meta_agent.errors import SettingError

    with pytest.raises(SettingError, match="train.algorithm=dpo takes one optimizer step per rollout"):
        load_config(["train.algorithm=dpo", "train.updates_per_rollout=2"])
