"""Preference pairs mined from hand-played episodes: which turns pair, and which one is chosen."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meta_agent.preference import mine_pairs, pair_metrics
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
