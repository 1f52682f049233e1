"""Credit for reflection (issue: reflection that learns), by hand: the per-reflection reward, the
meta-thinker's reward with it, per-round advantages of reflect turns, and the RLOO and REINFORCE++
baselines beside GRPO's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meta_agent.config import load_config
from meta_agent.episode.reward import score
from meta_agent.errors import SettingError
from meta_agent.learning.credit import assign_advantages, repeats_plan
from roles import META_THINKER, Outcome, RewardSpec, reflection_reward, role_reward, round_reflection_reward
from tests.meta_agent.conftest import PLAN, REFLECTION, TASK, answer
from tests.meta_agent.test_rounds import CALC, REVISE, WRONG
from training.grpo import GRPOSettings, advantages, batch_advantages, rloo_advantages

SPEC = RewardSpec(
    improvement_bonus=1.0, regression_penalty=1.0, accept_wrong_penalty=0.5, revise_right_penalty=0.25
)


@pytest.mark.parametrize(
    ("rounds", "per_round", "total"),
    [
        ([(False, "revise"), (True, "accept")], [1.0, 0.0], 1.0),  # fixed it, then accepted the right one
        ([(True, "revise"), (False, "accept")], [-1.25, -0.5], -1.75),  # broke it (-0.25 - 1), accepted wrong
        ([(False, "revise"), (False, "accept")], [0.0, -0.5], -0.5),  # revised in vain, accepted wrong
        ([(False, "accept")], [-0.5], -0.5),
        ([(True, "accept")], [0.0], 0.0),
        ([(False, "revise")], [0.0], 0.0),  # the last round: nothing followed the verdict
        ([(True, None)], [0.0], 0.0),  # no reflection
    ],
)
def test_each_reflection_earns_what_its_verdict_did(rounds, per_round, total):
    assert [round_reflection_reward(SPEC, rounds, k) for k in range(len(rounds))] == per_round
    assert reflection_reward(SPEC, rounds) == total
    assert reflection_reward(RewardSpec(), rounds) == 0.0  # the default: episode outcome alone


@pytest.mark.parametrize(
    ("rounds", "per_round"),
    [
        ([(False, "revise")], [-0.5]),  # the last round: a revision nothing carried out
        ([(False, "revise"), (False, "revise")], [-0.5, -0.5]),  # in vain, then again with no round left
        ([(False, "revise"), (True, "accept")], [1.0, 0.0]),  # a fix pays as before
        ([(True, "revise"), (True, "accept")], [-0.25, 0.0]),  # a right answer: revise_right_penalty only
    ],
)
def test_a_revision_that_fixes_nothing_costs_what_accepting_would(rounds, per_round):
    """revise_unfixed_penalty = accept_wrong_penalty = 0.5: on a wrong answer only a fix beats accepting."""
    spec = replace(SPEC, revise_unfixed_penalty=0.5)
    assert [round_reflection_reward(spec, rounds, k) for k in range(len(rounds))] == per_round
    assert RewardSpec(revise_unfixed_penalty=0.5).rewards_reflection


def test_the_meta_thinkers_reward_adds_its_reflections():
    fixed = Outcome(True, format_ok=True, rounds=((False, "revise"), (True, "accept")))
    assert role_reward(META_THINKER, SPEC, fixed) == 2.0  # 1 for the right answer + 1 for the fix
    assert role_reward(META_THINKER, RewardSpec(), fixed) == 1.0
    stamped = Outcome(False, format_ok=True, rounds=((False, "accept"),))
    assert role_reward(META_THINKER, SPEC, stamped) == -0.5  # 0 for wrong - 0.5 for accepting it


def test_rloo_and_reinforce_pp_by_hand():
    keys = [("a", "t1")] * 4 + [("a", "t2")]
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0]
    # RLOO: 1 - (0 + 0 + 1) / 3 = 2/3 and 0 - (1 + 0 + 1) / 3 = -2/3; a group of one gets 0
    assert rloo_advantages(rewards, keys) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0])
    # REINFORCE++: over the role's batch [1, 0, 0, 1, 1]: mean 0.6, sample std sqrt(1.2 / 4) = 0.547723
    expected = [(r - 0.6) / 0.547723 for r in rewards]
    assert batch_advantages(rewards, ["a"] * 5) == pytest.approx(expected, abs=1e-5)
    assert advantages(rewards, keys, "reinforce_pp") == pytest.approx(expected, abs=1e-5)
    assert advantages(rewards, keys, "rloo") == rloo_advantages(rewards, keys)
    assert advantages([1.0, 2.0], [("b", "t")] * 2, "reinforce_pp") == pytest.approx(
        [-0.707106, 0.707106], abs=1e-5
    )


def test_bad_advantage_settings_name_the_key():
    with pytest.raises(ValueError, match="grpo.advantage must be one of"):
        GRPOSettings(advantage="ppo")
    with pytest.raises(ValueError, match="grpo.filter_zero_variance=false"):
        GRPOSettings(advantage="reinforce_pp")
    with pytest.raises(ValueError, match="grpo.reflection_credit must be one of"):
        GRPOSettings(reflection_credit="turn")
    with pytest.raises(ValueError, match="set grpo.reflection_credit=episode with it"):
        GRPOSettings(advantage="gae", filter_zero_variance=False, reflection_credit="none")


def two_rounds(make_episode, fixed: bool):
    """plan -> wrong answer -> revise -> (right | wrong) answer -> accept; scored."""
    ep = make_episode("hierarchy")  # max_rounds=2
    second = (CALC, answer(TASK.answer)) if fixed else (answer(WRONG),)
    for action in (PLAN, answer(WRONG), REVISE, *second, REFLECTION):
        ep.advance_text(action)
    assert ep.done
    score([ep])
    return ep


def test_round_credit_gives_each_reflection_its_own_advantage(make_episode):
    episodes = [two_rounds(make_episode, True), two_rounds(make_episode, False)]
    for ep in episodes:  # the reflection weights of SPEC on the meta-thinker
        ep.roles["meta_thinker"] = replace(ep.roles["meta_thinker"], reward=SPEC)
    # Episode credit first: meta-thinker rewards 1 and 0 (both episodes are scored before the weights
    # changed) -> advantages +0.7071 and -0.7071 (group [1, 0]: mean 0.5, sample std 0.7071).
    assign_advantages(episodes, reflection_credit="round")
    reflect = [[t for t in ep.turns if t.kind == "reflect"] for ep in episodes]
    plans = [[t for t in ep.turns if t.kind == "plan"] for ep in episodes]
    # Round 1 reflections: both revised a wrong answer; the first fixed it (+1), the second did not (0):
    # group [1, 0] -> +0.7071, -0.7071. Round 2: the first accepted a right answer (0), the second a
    # wrong one (-0.5): group [0, -0.5] -> +0.7071, -0.7071.
    assert [t.advantage for t in reflect[0]] == pytest.approx([0.70711, 0.70711], abs=1e-4)
    assert [t.advantage for t in reflect[1]] == pytest.approx([-0.70711, -0.70711], abs=1e-4)
    assert [t.advantage for t in plans[0]] == pytest.approx([0.70711], abs=1e-4)  # the episode's
    # Unscaled: the credits minus their group's mean
    assign_advantages(episodes, scale=False, reflection_credit="round")
    assert [t.advantage for t in reflect[0]] == pytest.approx([0.5, 0.25])
    assert [t.advantage for t in reflect[1]] == pytest.approx([-0.5, -0.25])


def test_round_credit_charges_a_broken_reflection_its_own_format_penalty(make_episode):
    """A reflection cut at its token budget before its verdict (format_ok false) pays format_penalty
    in its round credit: under round credit the episode's penalty reaches only the plan."""
    episodes = [two_rounds(make_episode, False), two_rounds(make_episode, False)]
    for ep in episodes:
        ep.roles["meta_thinker"] = replace(ep.roles["meta_thinker"], reward=SPEC)  # format_penalty 0.2
    first_reflection = next(t for t in episodes[1].turns if t.kind == "reflect")
    first_reflection.format_ok = False
    assign_advantages(episodes, scale=False, reflection_credit="round")
    reflect = [[t for t in ep.turns if t.kind == "reflect"] for ep in episodes]
    # Round 1: both revised in vain (credit 0); the second broke its format: [0, -0.2] -> +0.1, -0.1.
    assert [reflect[0][0].advantage, reflect[1][0].advantage] == pytest.approx([0.1, -0.1])
    # The second round's reflections cannot change the outcome and are left as the episode's.
    assert reflect[0][1].advantage == reflect[1][1].advantage


def test_round_credit_charges_a_revision_that_repeats_the_plan(make_episode):
    """revise_same_plan_penalty: a revision whose next round carries out the plan before, word for word,
    pays it in its round credit; one that changed the plan does not."""
    same = "<reflection>it guessed</reflection><lesson>compute</lesson>" + PLAN
    episodes = []
    for revise in (REVISE, same):
        ep = make_episode("hierarchy")  # max_rounds=2
        for action in (PLAN, answer(WRONG), revise, answer(WRONG), REFLECTION):
            ep.advance_text(action)
        ep.roles["meta_thinker"] = replace(ep.roles["meta_thinker"], reward=SPEC)
        score([ep])
        episodes.append(ep)
    assert [repeats_plan(ep, 0) for ep in episodes] == [False, True]
    assign_advantages(episodes, scale=False, reflection_credit="round")
    first = [next(t for t in ep.turns if t.kind == "reflect").advantage for ep in episodes]
    assert first == [0.0, 0.0]  # the penalty is 0 by default: both revised in vain alike
    for ep in episodes:
        ep.roles["meta_thinker"] = replace(
            ep.roles["meta_thinker"], reward=replace(SPEC, revise_same_plan_penalty=0.5)
        )
    assign_advantages(episodes, scale=False, reflection_credit="round")
    first = [next(t for t in ep.turns if t.kind == "reflect").advantage for ep in episodes]
    assert first == pytest.approx([0.25, -0.25])  # credits [0, -0.5] less their mean
    with pytest.raises(SettingError, match="revise_same_plan_penalty is read only by round credit"):
        load_config(["roles.meta_thinker.reward.revise_same_plan_penalty=0.5"])


def test_round_credit_needs_a_reflection_weight():
    with pytest.raises(SettingError, match="grpo.reflection_credit=round credits each reflection"):
        load_config(["grpo.reflection_credit=round"])
    cfg = load_config(["grpo.reflection_credit=round", "roles.meta_thinker.reward.improvement_bonus=1"])
    assert cfg.roles["meta_thinker"].reward.improvement_bonus == 1.0
    # none credits nothing, so it needs no weight; DPO trains reflections through dpo.pairs instead
    assert load_config(["grpo.reflection_credit=none"]).grpo.reflection_credit == "none"
    with pytest.raises(
        SettingError, match=r"leave reflection out of dpo.pairs, e.g. dpo.pairs=\[plan,execute\]"
    ):
        load_config(["grpo.reflection_credit=none", "train.algorithm=dpo"])
    cfg = load_config(["grpo.reflection_credit=none", "train.algorithm=dpo", "dpo.pairs=[plan,execute]"])
    assert cfg.dpo.pairs == ["plan", "execute"]


def test_gae_gives_each_turn_of_an_episode_its_own_advantage(make_episode):
    """plan -> wrong answer -> revise -> right answer -> accept, valued by hand. The meta-thinker's plan
    and first reflection are one trajectory, the executor's two rounds another, each rewarded at its end;
    the last round's reflection cannot change the outcome and is not trained (can_change_outcome)."""
    from meta_agent.learning.credit import assign_gae, training_turns

    ep = two_rounds(make_episode, True)
    assert ep.rewards == {"meta_thinker": 1.0, "executor": 1.0}
    kinds = [(t.role, t.kind) for t in ep.learned_turns]
    assert kinds == [
        ("meta_thinker", "plan"),
        ("executor", "execute"),
        ("meta_thinker", "reflect"),
        ("executor", "execute"),
        ("meta_thinker", "reflect"),
    ]
    values = [0.2, 0.3, 0.4, 0.5]  # the trained turns: all but the last reflection
    # meta-thinker, V 0.2, 0.4, lambda 0.5: deltas 0.2, 0.6 -> A 0.5, 0.6
    # executor, V 0.3, 0.5: deltas 0.2, 0.5 -> A 0.45, 0.5
    returns = assign_gae([ep], values, gamma=1.0, lam=0.5, scale=False)
    assert [t.advantage for t in ep.learned_turns[:4]] == pytest.approx([0.5, 0.45, 0.6, 0.5])
    assert returns == pytest.approx([0.7, 0.75, 1.0, 1.0])
    assert [t.advantage for t in training_turns([ep])] == pytest.approx([0.5, 0.45, 0.6, 0.5])
    # whitened per role: two turns each, so each is 1/sqrt(2) sample stds from its role's mean
    assign_gae([ep], values, gamma=1.0, lam=0.5, scale=True)
    assert [t.advantage for t in ep.learned_turns[:4]] == pytest.approx(
        [-0.70711, -0.70711, 0.70711, 0.70711], abs=1e-4
    )


def test_gae_settings_are_checked_with_the_config():
    with pytest.raises(SettingError, match="filter_zero_variance=false"):
        load_config(["grpo.advantage=gae"])
    cfg = load_config(["grpo.advantage=gae", "grpo.filter_zero_variance=false", "value.lam=0.9"])
    assert cfg.value.lam == 0.9
    with pytest.raises(SettingError, match="model.fsdp=false"):
        load_config(["grpo.advantage=gae", "grpo.filter_zero_variance=false", "model.fsdp=true"])


@pytest.mark.slow  # one GRPO step on the tiny model, about 15 s on a busy 2-core machine
@pytest.mark.parametrize("credit", ["episode", "none"])
def test_the_update_learns_from_reflections_unless_their_credit_is_none(
    credit, tiny_model_dir, tmp_path, monkeypatch
):
    import json

    from meta_agent.learning.train import train
    from tests.meta_agent.test_train_cli import TINY
    from training.distributed import Ranks
    from training.trainer import PolicyTrainer

    updated = []
    grpo_step = PolicyTrainer.grpo_step

    def seen(self, turns, reference=None):
        updated.extend(turns)
        return grpo_step(self, turns, reference)

    monkeypatch.setattr(PolicyTrainer, "grpo_step", seen)
    run_dir = tmp_path / "run"
    overrides = [f"model.path={tiny_model_dir}", *TINY, "train.steps=1", "train.eval_limit=0"]
    cfg = load_config(
        [
            *overrides,
            f"grpo.reflection_credit={credit}",
            f"run_dir={run_dir}",
            f"memory.path={tmp_path / 'memory'}",
        ]
    )
    train(cfg, run_dir, Ranks())
    episodes = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    kinds = [t["kind"] for ep in episodes for t in ep["turns"] if t["role"] == META_THINKER]
    assert "reflect" in kinds  # the tiny model's episodes reach their reflections
    # TINY keeps flat groups: every meta-thinker turn is trained, or every plan alone
    learnt = kinds if credit == "episode" else [k for k in kinds if k == "plan"]
    assert sum(t.role == META_THINKER for t in updated) == len(learnt)
