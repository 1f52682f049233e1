"""A tiny random-initialised model of the SmolLM2 family for tests: fast to build and run, with the real
tokenizer's vocabulary and special token ids (Llama architecture, tied embeddings). GPT-2 and Qwen2 models
of the same size check that any causal LM works as a backbone (`arch=`).

    backbone = build_tiny_backbone(tokenizer, {"executor": AdapterConfig(r=4, alpha=8)}, lora_b_std=0.05)
    gpt2 = build_tiny_model(tokenizer, arch="gpt2")
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
)

from training.backbone import AdapterConfig, Backbone

SMOLLM2_VOCAB_SIZE = 49152
ARCHITECTURES = ("llama", "qwen2", "gpt2")


def tiny_model_config(
    vocab_size: int = SMOLLM2_VOCAB_SIZE, bos_id: int = 1, eos_id: int = 2, head_dim: int = 16
) -> LlamaConfig:
    """A 2-layer Llama config with SmolLM2's vocabulary and special token ids.

    head_dim: 16 (4 query heads); vLLM's CPU attention needs at least 32 (2 query heads).
    """
    return LlamaConfig(
        **_llama_family_sizes(head_dim), rope_theta=100000.0, **_token_ids(vocab_size, bos_id, eos_id)
    )


def _llama_family_sizes(head_dim: int) -> dict:
    """Width 64, 2 layers, 64 // head_dim query heads and half as many key/value heads."""
    heads = 64 // head_dim
    return {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 2),
        "max_position_embeddings": 2048,
    }


def _token_ids(vocab_size: int, bos_id: int, eos_id: int) -> dict:
    """The vocabulary, its special ids (pad = eos) and tied embeddings."""
    return {
        "vocab_size": vocab_size,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "tie_word_embeddings": True,
    }


def tiny_config_of(
    arch: str, vocab_size: int, bos_id: int, eos_id: int, head_dim: int = 16
) -> PretrainedConfig:
    """`arch`'s config at the tiny Llama's size: 2 layers, width 64, tied embeddings, no dropout."""
    if arch == "llama":
        return tiny_model_config(vocab_size, bos_id, eos_id, head_dim)
    if arch == "qwen2":
        return Qwen2Config(**_llama_family_sizes(head_dim), **_token_ids(vocab_size, bos_id, eos_id))
    if arch == "gpt2":  # Conv1D projections named c_attn, c_proj, c_fc; learned positions
        no_dropout = {"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}
        return GPT2Config(
            n_embd=64,
            n_inner=128,
            n_layer=2,
            n_head=64 // head_dim,
            n_positions=2048,
            **no_dropout,
            **_token_ids(vocab_size, bos_id, eos_id),
        )
    raise ValueError(f"unknown tiny architecture {arch!r}; known: {ARCHITECTURES}")


def build_tiny_model(tokenizer, seed: int = 0, head_dim: int = 16, arch: str = "llama") -> PreTrainedModel:
    """The bare random-initialised tiny model (no adapters), identical for the same seed."""
    bos_id = tokenizer.bos_token_id or 1
    config = tiny_config_of(arch, len(tokenizer), bos_id, tokenizer.eos_token_id, head_dim)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config) if arch == "llama" else AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def build_tiny_backbone(
    tokenizer,
    adapters: Mapping[str, AdapterConfig],
    seed: int = 0,
    lora_b_std: float = 0.0,
    head_dim: int = 16,
    arch: str = "llama",
) -> Backbone:
    """A random-initialised tiny backbone, identical for the same seed.

    LoRA starts with lora_B = 0, so every adapter equals the base model; `lora_b_std > 0` draws each role's
    lora_B from N(0, std) instead, so tests can tell adapters apart.
    """
    model = build_tiny_model(tokenizer, seed, head_dim, arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        backbone = Backbone.from_model(model, tokenizer, adapters)
        if lora_b_std > 0:
            with torch.no_grad():
                for role in backbone.adapters:
                    for name, param in backbone.named_trainable_parameters(role):
                        if ".lora_B." in name:
                            param.normal_(0.0, lora_b_std)
    return backbone
