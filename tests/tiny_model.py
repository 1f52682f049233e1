"""A tiny random-initialised model of the SmolLM2 family for tests: fast to build and run, with the real
tokenizer's vocabulary and special token ids (Llama architecture, tied embeddings).

    backbone = build_tiny_backbone(tokenizer, {"executor": AdapterConfig(r=4, alpha=8)}, lora_b_std=0.05)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from training.backbone import AdapterConfig, Backbone

SMOLLM2_VOCAB_SIZE = 49152


def tiny_model_config(
    vocab_size: int = SMOLLM2_VOCAB_SIZE, bos_id: int = 1, eos_id: int = 2, head_dim: int = 16
) -> LlamaConfig:
    """A 2-layer Llama config with SmolLM2's vocabulary and special token ids.

    head_dim: 16 (4 query heads); vLLM's CPU attention needs at least 32 (2 query heads).
    """
    heads = 64 // head_dim
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=2048,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )


def build_tiny_model(tokenizer, seed: int = 0, head_dim: int = 16) -> LlamaForCausalLM:
    """The bare random-initialised tiny model (no adapters), identical for the same seed."""
    config = tiny_model_config(len(tokenizer), tokenizer.bos_token_id or 1, tokenizer.eos_token_id, head_dim)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def build_tiny_backbone(
    tokenizer,
    adapters: Mapping[str, AdapterConfig],
    seed: int = 0,
    lora_b_std: float = 0.0,
    head_dim: int = 16,
) -> Backbone:
    """A random-initialised tiny backbone, identical for the same seed.

    LoRA starts with lora_B = 0, so every adapter equals the base model; `lora_b_std > 0` draws each role's
    lora_B from N(0, std) instead, so tests can tell adapters apart.
    """
    model = build_tiny_model(tokenizer, seed, head_dim)
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
