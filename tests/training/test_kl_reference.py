"""grpo.kl_reference: the KL of grpo.beta taken against the adapters the GRPO stage began with (start) or
against the backbone with its adapters off (base)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.training.test_trainer import ROLES, fresh, logprobs_under, rollout_turns
from training.batch import collate
from training.grpo import GRPOSettings
from training.trainer import PolicyTrainer, UpdateSettings

REWARDS = {(role, ep): float(ep < 2) for role in ROLES for ep in range(4)}


def trainer_of(backbone, kl_reference: str) -> PolicyTrainer:
    grpo = GRPOSettings(beta=0.1, kl_reference=kl_reference)
    return PolicyTrainer(
        backbone, dict.fromkeys(ROLES, 0.05), grpo=grpo, update=UpdateSettings(max_grad_norm=1e9)
    )


def k3_by_hand(backbone, turns, role: str, reference) -> float:
    """The masked token mean of exp(ref - lp) - (ref - lp) - 1 over `role`'s turns, the policy's logprobs
    `lp` taken as the adapters are now and `ref` under the role's `reference` weights."""
    own = [t for t in turns if t.role == role]
    backbone.activate(role)
    params = backbone.trainable_parameters(role)
    with torch.no_grad():
        now = [p.detach().clone() for p in params]
        lp = logprobs_under(backbone, own)
        for p, w in zip(params, reference, strict=True):
            p.copy_(w)
        ref = logprobs_under(backbone, own)
        for p, w in zip(params, now, strict=True):
            p.copy_(w)
    mask = collate(own, backbone.pad_id).loss_mask
    k3 = torch.exp(ref - lp) - (ref - lp) - 1.0
    return float((k3 * mask).sum() / mask.sum())


def test_the_kl_to_the_start_is_k3_against_the_adapters_the_stage_began_with(tokenizer):
    """The executor's adapter moved after the snapshot: its KL is k3 of its logprobs now against those under
    the snapshot, worked out here pass by pass; the meta-thinker's, unmoved, is 0. Taking the reference's
    logprobs swaps the snapshot in and leaves every adapter as it was, bit for bit."""
    backbone = fresh(tokenizer)
    turns = rollout_turns(backbone, REWARDS)
    trainer = trainer_of(backbone, "start")
    began = {role: trainer.snapshot(role) for role in ROLES}
    torch.manual_seed(0)
    with torch.no_grad():  # the stage trained on: the executor's adapter is elsewhere now
        for p in backbone.trainable_parameters("executor"):
            p.add_(0.2 * torch.randn_like(p))
    expected = k3_by_hand(backbone, turns, "executor", began["executor"])
    assert expected > 1e-4  # a KL there is to measure
    before = {role: [p.detach().clone() for p in backbone.trainable_parameters(role)] for role in ROLES}
    scored = trainer._with_reference_logprobs(turns, began)
    assert [t.episode for t in scored] == [t.episode for t in turns]  # in their order
    assert all(t.ref_logprobs is not None and len(t.ref_logprobs) == len(t.completion_ids) for t in scored)
    for role in ROLES:
        after = backbone.trainable_parameters(role)
        assert all(torch.equal(a, b) for a, b in zip(after, before[role], strict=True))
    metrics = trainer.grpo_step(turns, began)
    assert metrics["role/executor/kl"] == pytest.approx(expected, rel=1e-4)
    assert metrics["role/meta_thinker/kl"] == pytest.approx(0.0, abs=1e-6)


def test_at_the_start_of_the_stage_its_kl_is_0_where_the_base_one_is_not(tokenizer):
    """From adapters that already differ from the backbone (as after SFT), the first step's KL to the start
    is 0 and the second's is not; the KL to the backbone with adapters off is already there at the first,
    k3 against the logprobs with the adapters disabled."""
    rewards_turns = rollout_turns(fresh(tokenizer), REWARDS)
    start = fresh(tokenizer)
    trainer = trainer_of(start, "start")
    began = {role: trainer.snapshot(role) for role in ROLES}
    first = trainer.grpo_step(rewards_turns, began)
    second = trainer.grpo_step(rewards_turns, began)
    base = fresh(tokenizer)
    own = [t for t in rewards_turns if t.role == "executor"]
    base.activate("executor")
    with torch.no_grad():
        lp = logprobs_under(base, own)
        with base.disabled_adapters():
            ref = logprobs_under(base, own)
    mask = collate(own, base.pad_id).loss_mask
    by_hand = float(((torch.exp(ref - lp) - (ref - lp) - 1.0) * mask).sum() / mask.sum())
    base_first = trainer_of(base, "base").grpo_step(rewards_turns)
    for role in ROLES:
        assert first[f"role/{role}/kl"] == pytest.approx(0.0, abs=1e-6)
        assert second[f"role/{role}/kl"] > 1e-6
        assert base_first[f"role/{role}/kl"] > 1e-6
    assert base_first["role/executor/kl"] == pytest.approx(by_hand, rel=1e-4)


def test_a_bad_kl_reference_names_the_key_and_a_sharded_backbone_is_refused_at_load():
    from meta_agent.config import load_config
    from meta_agent.errors import SettingError

    with pytest.raises(ValueError, match="grpo.kl_reference must be one of"):
        GRPOSettings(kl_reference="sft")
    with pytest.raises(SettingError, match="grpo.kl_reference=start on a sharded backbone"):
        load_config(["model.fsdp=true", "grpo.beta=0.1", "grpo.kl_reference=start"])
    assert load_config(["model.fsdp=true", "grpo.kl_reference=start"]).grpo.beta == 0.0  # no KL, no pass


def test_the_grpo_stage_keeps_its_start_for_resume_only_where_its_kl_reads_it(tokenizer, tmp_path):
    from meta_agent.errors import SettingError
    from meta_agent.learning.train import REFERENCE_FILES, stage_reference
    from training.distributed import Ranks

    def cfg(beta: float, kl_reference: str, resume: str | None = None):
        grpo = SimpleNamespace(beta=beta, kl_reference=kl_reference)
        return SimpleNamespace(resume=resume, train=SimpleNamespace(algorithm="grpo"), grpo=grpo)

    backbone = fresh(tokenizer)
    trainer = trainer_of(backbone, "start")
    assert stage_reference(cfg(0.0, "start"), trainer, tmp_path, Ranks()) is None
    assert stage_reference(cfg(0.1, "base"), trainer, tmp_path, Ranks()) is None
    assert not list(tmp_path.iterdir())
    began = stage_reference(cfg(0.1, "start"), trainer, tmp_path, Ranks())
    assert (tmp_path / REFERENCE_FILES["grpo"]).is_file()
    with torch.no_grad():
        for p in backbone.trainable_parameters("executor"):
            p.add_(0.5)
    again = stage_reference(cfg(0.1, "start", resume="runs/x"), trainer, tmp_path, Ranks())
    for role in ROLES:
        assert all(torch.equal(a, b) for a, b in zip(again[role], began[role], strict=True))
    with pytest.raises(SettingError, match="grpo.kl_reference=start resumes .* is missing"):
        stage_reference(cfg(0.1, "start", resume="runs/x"), trainer, tmp_path / "other", Ranks())
