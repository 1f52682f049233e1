"""Any Hugging Face causal LM as the backbone: tiny Llama, Qwen2 and GPT-2 models built from config get
LoRA on every linear layer but the LM head (the Llama family's q_proj ... down_proj, as before), roll out
with per-row adapters, train a GRPO step, and save adapters that plain PEFT loads."""

from __future__ import annotations

import json
import re

import pytest
import torch
from peft import PeftModel
from torch.distributed.tensor import DTensor
from transformers.pytorch_utils import Conv1D

from tests.conftest import ROLES
from tests.tiny_model import ARCHITECTURES, build_tiny_backbone, build_tiny_model
from tests.training.turns import chat_ids, with_advantages
from training.backbone import AdapterConfig, Backbone, linear_layer_names
from training.checkpoint import ADAPTERS_DIR, save_checkpoint
from training.generation import HFBackend
from training.grpo import trainable_turns
from training.mixed_lora import RowAdapters
from training.model_files import ModelConfig, ModelMismatch
from training.trainer import PolicyTrainer, UpdateSettings
from training.types import GenerationRequest, SamplingParams, Turn
from training.value import prompt_states

LLAMA_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TARGETS = {"llama": LLAMA_NAMES, "qwen2": LLAMA_NAMES, "gpt2": ("c_attn", "c_proj", "c_fc")}


def backbone_of(tokenizer, arch: str, **adapter) -> Backbone:
    """The tiny `arch` backbone with a distinct nonzero adapter per role."""
    adapters = {role: AdapterConfig(r=4, alpha=8, **adapter) for role in ROLES}
    return build_tiny_backbone(tokenizer, adapters, seed=0, lora_b_std=0.05, arch=arch)


def adapted_modules(backbone: Backbone, role: str) -> set[str]:
    """The paths (inside the transformers model) of the modules that carry `role`'s LoRA matrices."""
    return {
        name.split(".lora_")[0].removeprefix("base_model.model.")
        for name, _ in backbone.named_trainable_parameters(role)
    }


def logits_of(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=torch.tensor([ids])).logits[0]


def adapter_state(backbone: Backbone) -> dict[str, torch.Tensor]:
    return {
        name: p.detach().clone() for role in ROLES for name, p in backbone.named_trainable_parameters(role)
    }


def rollout(backbone: Backbone) -> list[Turn]:
    """Sampled turns of both roles in one batch (per-row adapters), 4 episodes per role over two tasks."""
    keys = [(role, ep) for role in ROLES for ep in range(4)]
    prompts = [chat_ids(backbone.tokenizer, f"What is {ep % 2} + 3?") for _, ep in keys]
    results = HFBackend(backbone).generate(
        [
            GenerationRequest(role, p, SamplingParams(temperature=1.0, max_new_tokens=6), seed=ep)
            for (role, ep), p in zip(keys, prompts, strict=True)
        ]
    )
    turns = [
        Turn(role, f"task{ep % 2}", p, r.token_ids, (1,) * len(r.token_ids), r.logprobs, float(ep < 2), ep)
        for (role, ep), p, r in zip(keys, prompts, results, strict=True)
    ]
    return with_advantages(turns)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_lora_adapts_every_linear_layer_but_the_lm_head(tokenizer, arch):
    model = build_tiny_model(tokenizer, arch=arch)
    assert linear_layer_names(model) == TARGETS[arch]
    head = model.get_output_embeddings()
    linear = {
        n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear | Conv1D) and m is not head
    }
    backbone = backbone_of(tokenizer, arch)
    for role in ROLES:
        assert set(backbone.model.peft_config[role].target_modules) == set(TARGETS[arch])
        assert adapted_modules(backbone, role) == linear


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_top_layers_and_named_targets_hold_on_every_architecture(tokenizer, arch):
    top = backbone_of(tokenizer, arch, top_layers=1)
    layers = {int(re.search(r"\.(\d+)\.", path).group(1)) for path in adapted_modules(top, ROLES[0])}
    assert layers == {1}  # the last of the 2 layers
    first = TARGETS[arch][0]
    named = backbone_of(tokenizer, arch, target_modules=[first])
    assert {path.rsplit(".", 1)[-1] for path in adapted_modules(named, ROLES[0])} == {first}
    wrong = "c_attn" if arch != "gpt2" else "q_proj"  # the other family's names
    with pytest.raises(ModelMismatch, match=rf"names \['{wrong}'\].*linear layers are named"):
        backbone_of(tokenizer, arch, target_modules=[wrong])
    with pytest.raises(ValueError, match="targets nothing"):
        AdapterConfig(target_modules=[])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_row_runs_its_own_adapter_and_the_value_pass_reads_the_final_state(tokenizer, arch):
    backbone = backbone_of(tokenizer, arch)
    ids = chat_ids(tokenizer, "What is 2+2?")
    alone = []
    for role in ROLES:
        backbone.activate(role)
        alone.append(logits_of(backbone.model, ids))
    assert not torch.allclose(alone[0], alone[1])
    with RowAdapters(backbone.model) as rows, torch.no_grad():
        rows.set(list(ROLES))
        mixed = backbone.model(input_ids=torch.tensor([ids, ids])).logits
    for row, expected in zip(mixed, alone, strict=True):
        assert torch.allclose(row, expected, atol=1e-5)
    states = prompt_states(backbone.model, backbone.pad_id, [ids], backbone.device)
    with torch.no_grad():
        hidden = backbone.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    assert states.shape == (1, 64) and torch.allclose(states[0], hidden[-1][0, -1], atol=1e-5)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_grpo_step_trains_both_adapters_and_peft_loads_what_the_checkpoint_saved(tokenizer, arch, tmp_path):
    backbone = backbone_of(tokenizer, arch)
    base = {n: p.detach().clone() for n, p in backbone.model.named_parameters() if ".lora_" not in n}
    turns = rollout(backbone)
    trainer = PolicyTrainer(backbone, dict.fromkeys(ROLES, 5e-3), update=UpdateSettings(micro_batch_size=4))
    before = adapter_state(backbone)
    metrics = trainer.grpo_step(trainable_turns(turns, filter_zero_variance=True))
    after = adapter_state(backbone)
    for role in ROLES:
        assert metrics[f"role/{role}/grad_norm"] > 0
        moved = [n for n in after if f".{role}." in n and not torch.equal(after[n], before[n])]
        assert moved, f"{role}'s adapter did not move"
    assert all(torch.equal(p, base[n]) for n, p in backbone.model.named_parameters() if ".lora_" not in n)

    folder = save_checkpoint(tmp_path / "checkpoints", 1, trainer, {}) / ADAPTERS_DIR
    ids = chat_ids(tokenizer, "What is 2+2?")
    for role in ROLES:
        saved = json.loads((folder / role / "adapter_config.json").read_text())
        assert saved["target_modules"] == sorted(TARGETS[arch])  # in one order whatever the process
        backbone.activate(role)
        expected = logits_of(backbone.model, ids)
        plain = PeftModel.from_pretrained(build_tiny_model(tokenizer, arch=arch), folder / role)
        assert torch.allclose(logits_of(plain, ids), expected, atol=1e-5)
    fresh = backbone_of(tokenizer, arch)
    fresh.load_adapters(folder)
    assert all(torch.equal(value, after[n]) for n, value in adapter_state(fresh).items())


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])  # llama: tests/training/test_sharding.py
def test_fsdp_shards_the_base_weights_of_other_architectures(tokenizer, arch, tmp_path):
    build_tiny_model(tokenizer, arch=arch).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    adapters = {role: AdapterConfig(r=4, alpha=8) for role in ROLES}
    whole, sharded = (
        Backbone.load(ModelConfig(path=str(tmp_path), dtype="float32", fsdp=fsdp), adapters)
        for fsdp in (False, True)
    )
    try:
        bases = [p for n, p in sharded.model.named_parameters() if ".lora_" not in n]
        assert bases and all(isinstance(p, DTensor) for p in bases)
        asked = [
            GenerationRequest(
                role,
                chat_ids(tokenizer, f"What is {k} + 1?"),
                SamplingParams(temperature=0.0, max_new_tokens=5),
            )
            for k, role in enumerate(ROLES * 2)
        ]
        a, b = (HFBackend(bb).generate(asked) for bb in (whole, sharded))
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
    finally:
        sharded.close()
