import json
import os
import random

import numpy as np
import pytest
import torch

import training.checkpoint as ckpt
from tests.tiny_model import build_tiny_backbone
from tests.training.turns import chat_ids, with_advantages
from training.backbone import AdapterConfig
from training.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
)
from training.generation import HFBackend
from training.trainer import PolicyTrainer, UpdateSettings
from training.types import GenerationRequest, SamplingParams, Turn

ROLES = ("meta_thinker", "executor")


def fresh(tokenizer, seed: int = 0, roles=ROLES):
    return build_tiny_backbone(
        tokenizer, {r: AdapterConfig(r=4, alpha=8) for r in roles}, seed=seed, lora_b_std=0.05
    )


def make_trainer(backbone) -> PolicyTrainer:
    # Warm-up makes the learning rate differ from step to step, so a lost scheduler state shows.
    update = UpdateSettings(micro_batch_size=4, warmup_steps=3)
    return PolicyTrainer(backbone, dict.fromkeys(backbone.adapters, 5e-3), update=update)


def rollout(backbone, seed: int) -> list[Turn]:
    """Real sampled turns from the current adapters: 4 episodes per role over two task groups."""
    backend = HFBackend(backbone)
    keys = [(role, ep) for role in ROLES for ep in range(4)]
    prompts = [chat_ids(backbone.tokenizer, f"task {ep % 2}") for _, ep in keys]
    requests = [
        GenerationRequest(role, p, SamplingParams(temperature=1.0, max_new_tokens=5), seed=seed * 100 + ep)
        for (role, ep), p in zip(keys, prompts, strict=True)
    ]
    results = backend.generate(requests)
    return with_advantages(
        [
            Turn(
                role, f"task{ep % 2}", p, r.token_ids, (1,) * len(r.token_ids), r.logprobs, float(ep < 2), ep
            )
            for (role, ep), p, r in zip(keys, prompts, results, strict=True)
        ]
    )


def train_steps(trainer: PolicyTrainer, steps: range) -> None:
    for step in steps:
        turns = rollout(trainer.backbone, seed=step)
        random.shuffle(turns)  # draws from the global RNG, so a lost RNG state changes the micro-batches
        trainer.grpo_step(turns)


def adapter_weights(backbone) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backbone.model.named_parameters() if "lora_" in n}


@pytest.fixture
def deterministic():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def test_round_trip_restores_adapters_optimizer_scheduler_rng_and_state(tokenizer, tmp_path):
    trainer = make_trainer(fresh(tokenizer))
    train_steps(trainer, range(1))
    path = save_checkpoint(tmp_path, 1, trainer, {"data_pos": 8, "stage": {"name": "grpo"}})
    assert path == tmp_path / "step-000001"
    assert (tmp_path / "latest").read_text().strip() == "step-000001"
    assert {p.name for p in (path / "adapters").iterdir()} == set(ROLES)
    assert (path / "adapters" / "executor" / "adapter_config.json").is_file()
    draws = (random.random(), float(np.random.rand()), torch.rand(3))

    other = make_trainer(fresh(tokenizer, seed=1))  # different adapters, empty optimizer
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    step, state = load_checkpoint(path, other)

    assert (step, state) == (1, {"data_pos": 8, "stage": {"name": "grpo"}})
    want = adapter_weights(trainer.backbone)
    got = adapter_weights(other.backbone)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name
    saved_opt, loaded_opt = trainer.optimizer.state_dict(), other.optimizer.state_dict()
    assert saved_opt["param_groups"] == loaded_opt["param_groups"]
    assert saved_opt["state"].keys() == loaded_opt["state"].keys() and saved_opt["state"]
    for i, entry in saved_opt["state"].items():
        for key, value in entry.items():
            assert torch.equal(value, loaded_opt["state"][i][key]), (i, key)
    # The optimizer still updates the backbone's own parameters after the in-place load.
    ids = {id(p) for g in other.optimizer.param_groups for p in g["params"]}
    assert ids == {id(p) for r in ROLES for p in other.backbone.trainable_parameters(r)}
    assert other.scheduler.state_dict() == trainer.scheduler.state_dict()
    assert random.random() == draws[0]
    assert float(np.random.rand()) == draws[1]
    assert torch.equal(torch.rand(3), draws[2])


def test_resume_matches_an_uninterrupted_run_exactly(tokenizer, tmp_path, deterministic):
    random.seed(0)
    straight = make_trainer(fresh(tokenizer))
    train_steps(straight, range(4))

    random.seed(0)
    first = make_trainer(fresh(tokenizer))
    train_steps(first, range(2))
    save_checkpoint(tmp_path / "checkpoints", 2, first, {"data_pos": 2})
    del first

    random.seed(12345)  # a new process starts from other RNG states; the checkpoint must bring them back
    resumed = make_trainer(fresh(tokenizer))
    step, state = load_checkpoint(resolve_resume(str(tmp_path)), resumed)
    assert (step, state) == (2, {"data_pos": 2})
    train_steps(resumed, range(step, 4))

    want, got = adapter_weights(straight.backbone), adapter_weights(resumed.backbone)
    moved = adapter_weights(fresh(tokenizer))
    assert any(not torch.equal(want[n], moved[n]) for n in want), "training did not move the adapters"
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_a_write_killed_midway_leaves_the_previous_checkpoint_and_is_cleaned_up(
    tokenizer, tmp_path, monkeypatch
):
    trainer = make_trainer(fresh(tokenizer))
    save_checkpoint(tmp_path, 1, trainer, {"n": 1})
    train_steps(trainer, range(1))

    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).endswith("step-000002"):
            raise OSError("simulated crash while publishing")
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(tmp_path, 2, trainer, {"n": 2})
    monkeypatch.setattr(ckpt.os, "replace", real_replace)
    assert not (tmp_path / "step-000002").exists()
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000001"

    # A SIGKILL runs no cleanup: leave what it would, a half-written folder and a half-written latest.
    partial = tmp_path / f".tmp-step-000002-{os.getpid() + 1}"
    (partial / "adapters" / "executor").mkdir(parents=True)
    (partial / "trainer.pt").write_bytes(b"\x80half")
    (tmp_path / ".tmp-latest-424242").write_text("step-0000")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000001"
    assert resolve_resume(tmp_path) == tmp_path / "step-000001"
    restored = make_trainer(fresh(tokenizer, seed=3))
    assert load_checkpoint(latest_checkpoint(tmp_path), restored) == (1, {"n": 1})

    # A kill between publishing the folder and updating latest: latest still names the previous one.
    def failing_latest(src, dst):
        if str(dst).endswith("latest"):
            raise OSError("simulated crash before latest")
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", failing_latest)
    with pytest.raises(OSError, match="before latest"):
        save_checkpoint(tmp_path, 2, trainer, {"n": 2})
    monkeypatch.setattr(ckpt.os, "replace", real_replace)
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000001"

    save_checkpoint(tmp_path, 3, trainer, {"n": 3})
    assert not list(tmp_path.glob(".tmp-*"))
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000003"


def test_latest_falls_back_to_the_highest_complete_step_when_missing_or_corrupt(tokenizer, tmp_path):
    trainer = make_trainer(fresh(tokenizer))
    for step in (3, 10):
        save_checkpoint(tmp_path, step, trainer, {}, keep=5)
    (tmp_path / "step-000020").mkdir()  # incomplete: no trainer.pt
    (tmp_path / "latest").write_text("garbage")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000010"
    (tmp_path / "latest").unlink()
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000010"
    assert latest_checkpoint(tmp_path / "nowhere") is None


def test_pruning_keeps_the_newest_and_the_one_latest_names(tokenizer, tmp_path):
    trainer = make_trainer(fresh(tokenizer))
    (tmp_path / "sft-best").mkdir()  # other entries of the root are left alone
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, trainer, {"step": step}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "sft-best", "step-000004", "step-000005"]

    # Resumed from an older step: the step just written stays even though higher steps outrank it.
    save_checkpoint(tmp_path, 3, trainer, {"step": 3}, keep=1)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000003", "step-000005"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000003"

    # Re-saving an existing step replaces it.
    save_checkpoint(tmp_path, 5, trainer, {"step": "again"}, keep=1)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000005"]
    assert json.loads((tmp_path / "step-000005" / "state.json").read_text()) == {"step": "again"}
    with pytest.raises(ValueError, match="keep=0"):
        save_checkpoint(tmp_path, 6, trainer, {}, keep=0)


def test_bad_paths_and_mismatches_are_clear_errors(tokenizer, tmp_path):
    trainer = make_trainer(fresh(tokenizer))
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_resume(str(tmp_path / "missing"))
    with pytest.raises(CheckpointError, match="has no trainer.pt.*pass a step-\\* folder or the run folder"):
        resolve_resume(str(tmp_path))
    with pytest.raises(CheckpointError, match="has no trainer.pt"):
        load_checkpoint(tmp_path, trainer)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing", trainer)
    with pytest.raises(TypeError, match="JSON"):
        save_checkpoint(tmp_path, 1, trainer, {"bad": object()})
    assert not list(tmp_path.iterdir())

    path = save_checkpoint(tmp_path, 1, trainer, {})
    other_roles = make_trainer(fresh(tokenizer, roles=("executor",)))
    with pytest.raises(CheckpointError, match="roles"):
        load_checkpoint(path, other_roles)
    (path / "trainer.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path, trainer)
