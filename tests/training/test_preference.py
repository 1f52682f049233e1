"""Preference losses against numbers worked out by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from tests.tiny_model import build_tiny_backbone
from tests.training.turns import chat_ids
from training.backbone import AdapterConfig
from training.generation import HFBackend
from training.preference import PreferencePair, PreferenceSettings, preference_loss
from training.trainer import PolicyTrainer, UpdateSettings
from training.types import GenerationRequest, SamplingParams, Turn


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_dpo_loss_and_gradient_by_hand():
    # policy chosen -10, rejected -12; reference both -11; beta 0.1
    # log-ratios: chosen +1, rejected -1; beta * (1 - (-1)) = 0.2; loss = log(1 + e^-0.2) = 0.5981389
    chosen = t(-10.0).requires_grad_()
    losses, stats = preference_loss(chosen, t(-12.0), t(-11.0), t(-11.0), t(5), t(4), PreferenceSettings())
    assert losses.tolist() == pytest.approx([0.5981389], abs=1e-6)
    assert stats["chosen_reward"].tolist() == pytest.approx([0.1]) and stats["accuracy"].tolist() == [1.0]
    losses.sum().backward()
    # d/d chosen = -beta * (1 - sigmoid(0.2)) = -0.1 * (1 - 0.5498340) = -0.0450166
    assert chosen.grad.tolist() == pytest.approx([-0.0450166], abs=1e-6)


def test_ipo_averages_the_log_ratios_over_tokens():
    # log-ratios +1 over 5 tokens = 0.2 and -1 over 4 tokens = -0.25: difference 0.45; beta 0.5 -> target
    # 1 / (2 * 0.5) = 1; loss (0.45 - 1)^2 = 0.3025
    settings = PreferenceSettings(loss="ipo", beta=0.5)
    losses, _ = preference_loss(t(-10.0), t(-12.0), t(-11.0), t(-11.0), t(5), t(4), settings)
    assert losses.tolist() == pytest.approx([0.3025])


def test_simpo_needs_no_reference_and_asks_for_a_margin():
    # mean logprobs -10 / 5 = -2 and -12 / 4 = -3; beta 2, gamma 0.5: 2 * 1 - 0.5 = 1.5;
    # loss log(1 + e^-1.5) = 0.2014133
    settings = PreferenceSettings(loss="simpo", beta=2.0, gamma=0.5)
    losses, stats = preference_loss(t(-10.0, -3.0), t(-12.0, -2.0), None, None, t(5, 1), t(4, 1), settings)
    assert losses[0].item() == pytest.approx(0.2014133, abs=1e-6)
    # second pair: means -3 and -2, 2 * (-1) - 0.5 = -2.5: log(1 + e^2.5) = 2.5789385; chosen is not ahead
    assert losses[1].item() == pytest.approx(math.log1p(math.exp(2.5)), abs=1e-6)
    assert stats["accuracy"].tolist() == [1.0, 0.0]


def test_bad_settings_and_a_missing_reference_are_named():
    with pytest.raises(ValueError, match="dpo.loss must be one of"):
        PreferenceSettings(loss="kto")
    with pytest.raises(ValueError, match="dpo.beta must be > 0"):
        PreferenceSettings(beta=0.0)
    with pytest.raises(ValueError, match="needs the reference"):
        preference_loss(t(-1.0), t(-2.0), None, None, t(1), t(1), PreferenceSettings())


# --- the trainer's preference step on the tiny model ---------------------------------------------------

ROLES = ("meta_thinker", "executor")


def pairs_of(backbone) -> list[PreferencePair]:
    """Real sampled turns of the tiny model, per role four episodes on one prompt: 0 and 2 chosen over
    1 and 3."""
    backend = HFBackend(backbone)
    prompt = chat_ids(backbone.tokenizer, "task 0")
    keys = [(role, ep) for role in ROLES for ep in range(4)]
    results = backend.generate(
        [
            GenerationRequest(r, prompt, SamplingParams(temperature=1.0, max_new_tokens=6), seed=ep)
            for r, ep in keys
        ]
    )
    turns = {
        key: Turn(key[0], "task0", prompt, r.token_ids, (1,) * len(r.token_ids), r.logprobs, 0.0, key[1])
        for key, r in zip(keys, results, strict=True)
    }
    return [PreferencePair(turns[(r, ep)], turns[(r, ep + 1)], "plan") for r in ROLES for ep in (0, 2)]


def scored(trainer, pairs):
    logps = trainer.sequence_logprobs([t for p in pairs for t in (p.chosen, p.rejected)])
    return [replace(p, ref_chosen=logps[2 * i], ref_rejected=logps[2 * i + 1]) for i, p in enumerate(pairs)]


def margins(trainer, pairs) -> list[float]:
    logps = trainer.sequence_logprobs([t for p in pairs for t in (p.chosen, p.rejected)])
    return [logps[2 * i] - logps[2 * i + 1] for i in range(len(pairs))]


def test_a_preference_step_starts_at_log_2_and_widens_the_chosen_margin(tokenizer):
    backbone = build_tiny_backbone(
        tokenizer, {r: AdapterConfig(r=4, alpha=8) for r in ROLES}, seed=0, lora_b_std=0.05
    )
    base = {n: p.detach().clone() for n, p in backbone.model.named_parameters() if "lora_" not in n}
    trainer = PolicyTrainer(backbone, dict.fromkeys(ROLES, 5e-3), update=UpdateSettings(micro_batch_size=2))
    pairs = scored(trainer, pairs_of(backbone))
    before = margins(trainer, pairs)
    settings = PreferenceSettings(loss="dpo", beta=0.5)
    first = trainer.preference_step(pairs, settings)
    # the policy is its reference at the first step: every log-ratio 0, each loss -log sigmoid(0) = ln 2
    for role in ROLES:
        assert first[f"role/{role}/pref_loss"] == pytest.approx(math.log(2), abs=1e-4)
        assert first[f"role/{role}/pairs"] == 2 and first[f"role/{role}/grad_norm"] > 0
    assert first["train/pairs"] == 4
    for _ in range(3):
        last = trainer.preference_step(pairs, settings)
    after = margins(trainer, pairs)
    assert all(a > b for a, b in zip(after, before, strict=True))
    assert all(last[f"role/{r}/pref_loss"] < math.log(2) for r in ROLES)
    for n, p in backbone.model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base[n]), f"base weight {n} changed"


def test_the_reference_snapshot_scores_as_the_adapter_did_before_the_stage(tokenizer):
    backbone = build_tiny_backbone(
        tokenizer, {r: AdapterConfig(r=4, alpha=8) for r in ROLES}, seed=0, lora_b_std=0.05
    )
    trainer = PolicyTrainer(backbone, dict.fromkeys(ROLES, 5e-3))
    pairs = scored(trainer, pairs_of(backbone))
    snapshots = {r: trainer.snapshot(r) for r in ROLES}
    trainer.preference_step(pairs, PreferenceSettings(loss="simpo", beta=2.0))
    moved = margins(trainer, pairs)
    turns = [t for p in pairs for t in (p.chosen, p.rejected)]
    with (
        trainer.weights("meta_thinker", snapshots["meta_thinker"]),
        trainer.weights("executor", snapshots["executor"]),
    ):
        again = trainer.sequence_logprobs(turns)
    assert again == pytest.approx([x for p in pairs for x in (p.ref_chosen, p.ref_rejected)], abs=1e-5)
    assert margins(trainer, pairs) == pytest.approx(moved, abs=1e-6)  # the trained weights are back


def test_a_reference_loss_refuses_unscored_pairs(tokenizer):
    backbone = build_tiny_backbone(tokenizer, {r: AdapterConfig(r=4, alpha=8) for r in ROLES}, seed=0)
    trainer = PolicyTrainer(backbone, dict.fromkeys(ROLES, 5e-3))
    with pytest.raises(ValueError, match="scored by its reference"):
        trainer.preference_step(pairs_of(backbone), PreferenceSettings())
    with pytest.raises(ValueError, match="of one role"):
        pair = pairs_of(backbone)[0]
        PreferencePair(pair.chosen, replace(pair.rejected, role="executor"))


def test_weights_restore_the_adapter_after_an_error_and_refuse_a_snapshot_that_does_not_fit(tokenizer):
    backbone = build_tiny_backbone(
        tokenizer, {r: AdapterConfig(r=4, alpha=8) for r in ROLES}, seed=0, lora_b_std=0.05
    )
    trainer = PolicyTrainer(backbone, dict.fromkeys(ROLES, 5e-3))
    own = trainer.snapshot("executor")
    zeros = [torch.zeros_like(w) for w in own]
    with pytest.raises(RuntimeError, match="inside"), trainer.weights("executor", zeros):
        assert all(float(p.detach().abs().sum()) == 0 for p in backbone.trainable_parameters("executor"))
        raise RuntimeError("inside")
    assert all(torch.equal(p, w) for p, w in zip(backbone.trainable_parameters("executor"), own, strict=True))
    with pytest.raises(ValueError, match="does not fit"), trainer.weights("executor", own[:-1]):
        pass
