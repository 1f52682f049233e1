"""Backbone: adapters per role, grads, reference model, save/load, loading from a local model folder."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import PeftModel

from meta_agent.episode.chat import ChatFormat
from tests.conftest import ROLES
from tests.tiny_model import build_tiny_backbone, build_tiny_model
from training.backbone import AdapterConfig, Backbone
from training.model_files import ModelConfig, resolve_model_dir


def logits_of(model, input_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([input_ids])).logits[0]  # [T, V]


@pytest.fixture
def input_ids(tiny_backbone):
    return ChatFormat(tiny_backbone.tokenizer).prompt([{"role": "user", "content": "What is 2+2?"}])


def test_only_adapter_parameters_train(tiny_backbone):
    trainable = {name for name, p in tiny_backbone.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    per_role = [{id(p) for p in tiny_backbone.trainable_parameters(role)} for role in ROLES]
    assert all(per_role) and not per_role[0] & per_role[1]
    assert sum(len(ids) for ids in per_role) == len(trainable)
    tiny_backbone.activate(ROLES[1])  # PEFT would freeze the inactive adapter; all roles keep training
    assert all(p.requires_grad for role in ROLES for p in tiny_backbone.trainable_parameters(role))
    with pytest.raises(KeyError, match="unknown role"):
        tiny_backbone.trainable_parameters("critic")


def test_activate_selects_the_role(tiny_backbone, input_ids):
    outputs = []
    for role in ROLES:
        tiny_backbone.activate(role)
        outputs.append(logits_of(tiny_backbone.model, input_ids))
    assert not torch.allclose(outputs[0], outputs[1])
    names = list(ROLES)
    with torch.no_grad():
        mixed = tiny_backbone.model.eval()(
            input_ids=torch.tensor([input_ids] * 2), adapter_names=names
        ).logits
    assert torch.allclose(mixed[0], outputs[0], atol=1e-5) and torch.allclose(mixed[1], outputs[1], atol=1e-5)


def test_disabled_adapters_give_base_logits(tiny_backbone, input_ids):
    tiny_backbone.activate(ROLES[0])
    with tiny_backbone.disabled_adapters():
        reference = logits_of(tiny_backbone.model, input_ids)
    # The base model is the same network with every lora_B set to zero.
    zeroed = copy.deepcopy(tiny_backbone)
    with torch.no_grad():
        for name, param in zeroed.model.named_parameters():
            if ".lora_B." in name:
                param.zero_()
    assert torch.allclose(reference, logits_of(zeroed.model, input_ids), atol=1e-6)
    assert not torch.allclose(reference, logits_of(tiny_backbone.model, input_ids), atol=1e-3)
    assert torch.allclose(
        logits_of(tiny_backbone.model, input_ids), logits_of(tiny_backbone.model, input_ids)
    )


def test_save_adapters_round_trip(tiny_backbone, tokenizer, input_ids, tmp_path):
    tiny_backbone.save_adapters(tmp_path)
    for role in ROLES:
        assert (tmp_path / role / "adapter_config.json").is_file()
        assert (tmp_path / role / "adapter_model.safetensors").is_file()
        tiny_backbone.activate(role)
        expected = logits_of(tiny_backbone.model, input_ids)
        # PEFT itself loads the folder onto a plain copy of the base model.
        peft_model = PeftModel.from_pretrained(build_tiny_model(tokenizer, seed=0), tmp_path / role)
        assert torch.allclose(logits_of(peft_model, input_ids), expected, atol=1e-6)
    # And a fresh backbone (zero lora_B, other LoRA init) loads every role back.
    fresh = build_tiny_backbone(tokenizer, {role: AdapterConfig(r=4, alpha=8) for role in ROLES}, seed=0)
    fresh.load_adapters(tmp_path)
    for role in ROLES:
        tiny_backbone.activate(role)
        fresh.activate(role)
        assert torch.equal(logits_of(fresh.model, input_ids), logits_of(tiny_backbone.model, input_ids))


def test_load_adapters_missing_role_folder(tiny_backbone, tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved adapter for role"):
        tiny_backbone.load_adapters(tmp_path)


def test_top_layers_puts_lora_on_the_last_layers_only(tokenizer):
    layers = build_tiny_model(tokenizer).config.num_hidden_layers
    top = build_tiny_backbone(tokenizer, {"executor": AdapterConfig(r=2, top_layers=1)})
    names = [name for name, _ in top.named_trainable_parameters("executor")]
    assert names and all(f".layers.{layers - 1}." in name for name in names)
    full = build_tiny_backbone(tokenizer, {"executor": AdapterConfig(r=2)})
    assert len(list(full.named_trainable_parameters("executor"))) == layers * len(names)
    with pytest.raises(ValueError, match="top_layers=9 must be between 1 and"):
        build_tiny_backbone(tokenizer, {"executor": AdapterConfig(top_layers=9)})


def test_tiny_backbone_is_deterministic_per_seed(tokenizer):
    adapters = {"executor": AdapterConfig(r=2)}
    a, b, c = (build_tiny_backbone(tokenizer, adapters, seed=s, lora_b_std=0.1) for s in (1, 1, 2))
    state_a, state_b, state_c = (x.model.state_dict() for x in (a, b, c))
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert not all(torch.equal(state_a[k], state_c[k]) for k in state_a)
    config = a.model.get_base_model().config
    assert (config.vocab_size, config.eos_token_id, config.tie_word_embeddings) == (len(tokenizer), 2, True)


def test_load_from_local_folder(tiny_backbone, tokenizer, input_ids, tmp_path):
    base = build_tiny_model(tokenizer, seed=0)
    base.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config = ModelConfig(path=str(tmp_path), dtype="float32")
    loaded = Backbone.load(config, {"executor": AdapterConfig(r=4)}, seed=3)
    assert resolve_model_dir(ModelConfig(path=str(tmp_path))) == tmp_path
    assert loaded.adapters == ("executor",) and loaded.device == torch.device("cpu")
    with loaded.disabled_adapters():
        assert torch.allclose(logits_of(loaded.model, input_ids), logits_of(base, input_ids), atol=1e-6)


def test_the_lm_head_gets_a_contiguous_input(tiny_backbone):
    """transformers hands the head a strided slice for logits_to_keep; torch's linear multiplied such a
    slice by a copy of the weight per row. The head sees a contiguous input, at the same logits."""
    seen = []
    head = tiny_backbone.model.get_output_embeddings()
    handle = head.register_forward_pre_hook(lambda _m, args: seen.append(args[0].is_contiguous()))
    ids = torch.randint(3, 200, (3, 9))
    try:
        with torch.no_grad():
            last = tiny_backbone.model(input_ids=ids, logits_to_keep=1).logits[:, -1]
            whole = tiny_backbone.model(input_ids=ids).logits[:, -1]
    finally:
        handle.remove()
    assert seen == [True, True]
    assert torch.allclose(last, whole, atol=1e-5)
