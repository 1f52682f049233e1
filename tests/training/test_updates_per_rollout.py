"""Several updates per rollout batch (train.updates_per_rollout, train.minibatches): minibatches of whole
episodes, the merged metrics, and the ratio against the policy fixed at the rollout."""

from __future__ import annotations

import pytest
import torch

from tests.training.test_trainer import ROLES, fresh, logprobs_under, rollout_turns
from training.batch import collate, minibatches
from training.grpo import GRPOSettings
from training.trainer import PolicyTrainer, UpdateSettings, merge_updates
from training.types import Turn


def turn(episode: int, role: str = "executor") -> Turn:
    return Turn(role, "g", (1,), (2,), (1,), (0.0,), episode=episode)


def test_minibatches_keep_episodes_whole_and_cut_evenly():
    turns = [turn(e, r) for e in range(5) for r in ROLES]  # 5 episodes, 2 turns each
    parts = minibatches(turns, 2, seed=0)
    assert len(parts) == 2
    # cuts at round(0), round(2.5) = 2, 5: two episodes, then three
    assert [len({t.episode for t in p}) for p in parts] == [2, 3]
    assert sorted((t.episode, t.role) for p in parts for t in p) == sorted((t.episode, t.role) for t in turns)
    for p in parts:  # an episode's turns never split across minibatches
        assert all(sum(t.episode == e for t in p) in (0, 2) for e in range(5))
    assert minibatches(turns, 2, seed=0) == parts  # the same order for the same pass
    orders = {tuple(t.episode for t in minibatches(turns, 1, seed=s)[0]) for s in range(6)}
    assert len(orders) > 1  # each pass shuffles the episodes anew
    # one episode, 3 steps: cuts at round(0), round(1/3), round(2/3), round(1) = 0, 0, 1, 1
    assert [len(p) for p in minibatches(turns[:2], 3, seed=0)] == [0, 2, 0]


def test_merged_metrics_by_hand():
    first = {"role/a/clip_fraction": 0.0, "role/a/ratio_mean": 1.0, "role/a/lr": 1e-3, "role/a/loss": 0.4}
    second = {"role/a/clip_fraction": 0.5, "role/a/ratio_mean": 1.2, "role/a/lr": 5e-4, "role/a/loss": 0.2}
    third = {"role/a/clip_fraction": 0.25, "role/a/ratio_mean": 1.4, "role/a/lr": 2e-4, "role/a/loss": 0.0}
    merged = merge_updates([first, second, third])
    assert merged["role/a/clip_fraction"] == pytest.approx(0.25)  # (0 + 0.5 + 0.25) / 3
    assert merged["role/a/clip_fraction_first"] == 0.0
    assert merged["role/a/clip_fraction_later"] == pytest.approx(0.375)  # (0.5 + 0.25) / 2
    assert merged["role/a/ratio_mean_later"] == pytest.approx(1.3)
    assert merged["role/a/loss"] == pytest.approx(0.2)
    assert merged["role/a/lr"] == 2e-4  # the last
    assert merged["train/updates"] == 3.0


@pytest.mark.parametrize("tis_cap", [2.0, None], ids=["tis", "no-tis"])
def test_the_ratio_is_1_on_the_first_update_and_clips_on_later_ones(tokenizer, tis_cap):
    """Two passes, one minibatch: the first update sees ratio 1 and clips nothing; the second is taken
    against the policy fixed at the rollout, and its clip fraction is the share of tokens whose ratio,
    recomputed here from the adapters after the first step, left the clip range in the advantage's way."""
    rewards = {(role, ep): float(ep < 2) for role in ROLES for ep in range(4)}
    backbone = fresh(tokenizer)
    turns = rollout_turns(backbone, rewards)
    grpo = GRPOSettings(tis_cap=tis_cap)
    one_step = PolicyTrainer(
        fresh(tokenizer), dict.fromkeys(ROLES, 0.05), grpo=grpo, update=UpdateSettings(max_grad_norm=1e9)
    )
    one_step.grpo_step(turns)  # the same first update, to read the policy after it
    expected, ratio_mean = {}, {}
    for role in ROLES:
        own = [t for t in turns if t.role == role]
        one_step.backbone.activate(role)
        with torch.no_grad():
            after = logprobs_under(one_step.backbone, own)
        batch = collate(own, backbone.pad_id)
        ratio = torch.exp(after - batch.old_logprobs)  # the rollout's logprobs are the trainer's here
        adv = torch.tensor([t.advantage for t in own]).unsqueeze(-1)
        clipped = ((adv > 0) & (ratio > 1 + grpo.eps_high)) | ((adv < 0) & (ratio < 1 - grpo.eps_low))
        expected[role] = float((clipped.float() * batch.loss_mask).sum() / batch.loss_mask.sum())
        ratio_mean[role] = float((ratio * batch.loss_mask).sum() / batch.loss_mask.sum())

    update = UpdateSettings(max_grad_norm=1e9, updates_per_rollout=2)
    metrics = PolicyTrainer(backbone, dict.fromkeys(ROLES, 0.05), grpo=grpo, update=update).grpo_step(turns)
    assert metrics["train/updates"] == 2.0
    for role in ROLES:
        assert metrics[f"role/{role}/ratio_mean_first"] == pytest.approx(1.0, abs=1e-4)
        assert metrics[f"role/{role}/clip_fraction_first"] == 0.0
        assert metrics[f"role/{role}/ratio_mean_later"] == pytest.approx(ratio_mean[role], abs=1e-5)
        assert metrics[f"role/{role}/clip_fraction_later"] == pytest.approx(expected[role], abs=1e-6)
    assert max(expected.values()) > 0, "lr 0.05 should move some token out of the clip range"


def test_one_update_is_the_old_path_exactly(tokenizer):
    """updates_per_rollout=1, minibatches=1 is today's single step, bit for bit."""
    rewards = {(role, ep): float(ep < 2) for role in ROLES for ep in range(4)}
    results = []
    for update in (UpdateSettings(), UpdateSettings(updates_per_rollout=1, minibatches=1)):
        backbone = fresh(tokenizer)
        turns = rollout_turns(backbone, rewards)
        PolicyTrainer(backbone, dict.fromkeys(ROLES, 1e-3), update=update).grpo_step(turns)
        results.append([p.detach().clone() for p in backbone.trainable_parameters("executor")])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_bad_update_counts_name_the_key():
    with pytest.raises(ValueError, match="train.updates_per_rollout must be >= 1, got 0"):
        UpdateSettings(updates_per_rollout=0)
    with pytest.raises(ValueError, match="train.minibatches must be >= 1, got 0"):
        UpdateSettings(minibatches=0)


def test_truncated_importance_sampling_holds_over_several_updates(tokenizer):
    """Rollout logprobs 0.5 too high (another backend's numerics): with TIS every update weighs tokens by
    e^-0.5 (the trainer's policy at the rollout against the backend's), and the first update still sees
    ratio 1 and clips nothing, so later updates clip only what the updates themselves moved."""
    import math
    from dataclasses import replace

    rewards = {(role, ep): float(ep < 2) for role in ROLES for ep in range(4)}
    backbone = fresh(tokenizer)
    turns = [
        replace(t, logprobs=tuple(lp + 0.5 for lp in t.logprobs)) for t in rollout_turns(backbone, rewards)
    ]
    update = UpdateSettings(max_grad_norm=1e9, updates_per_rollout=2, minibatches=2)
    metrics = PolicyTrainer(
        backbone, dict.fromkeys(ROLES, 1e-4), grpo=GRPOSettings(tis_cap=2.0), update=update
    )
    metrics = metrics.grpo_step(turns)
    assert metrics["train/updates"] == 4.0
    for role in ROLES:
        assert metrics[f"role/{role}/tis_weight_mean"] == pytest.approx(math.exp(-0.5), rel=1e-3)
        assert metrics[f"role/{role}/clip_fraction_first"] == 0.0
        assert metrics[f"role/{role}/ratio_mean_first"] == pytest.approx(1.0, abs=1e-5)


def test_several_updates_on_a_sharded_backbone_with_tis_are_refused_at_load():
    from meta_agent.config import load_config
    from meta_agent.errors import SettingError

    with pytest.raises(SettingError, match="model.fsdp=true and TIS"):
        load_config(["model.fsdp=true", "train.updates_per_rollout=2"])
    assert load_config(["model.fsdp=true", "train.minibatches=2", "grpo.tis_cap=null"]).train.minibatches == 2
