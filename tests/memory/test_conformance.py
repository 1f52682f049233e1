"""FaissMemory passes the shared Memory conformance suite: in memory and on disk, flat and HNSW."""

from __future__ import annotations

import pytest

from memory.conformance import check_memory
from memory.store import FaissMemory


@pytest.mark.parametrize("index", ["flat", "hnsw"])
def test_in_memory(minilm, index):
    check_memory(FaissMemory(None, minilm, index=index))


@pytest.mark.parametrize("index", ["flat", "hnsw"])
def test_on_disk(minilm, index, tmp_path):
    folder = tmp_path / "mem"
    check_memory(
        FaissMemory(folder, minilm, index=index),
        reopen=lambda: FaissMemory(folder, minilm, index=index),
    )


def test_on_disk_with_hashing_embedder(hashing, tmp_path):
    # The benchmark embedder must behave like any other behind the protocol.
    folder = tmp_path / "mem"
    check_memory(FaissMemory(folder, hashing), reopen=lambda: FaissMemory(folder, hashing))


def test_suite_catches_a_broken_memory(hashing):
    class ForgetfulMemory(FaissMemory):
        def delete(self, ids):  # claims success but keeps everything
            return len(list(ids))

    with pytest.raises(AssertionError, match="Memory conformance"):
        check_memory(ForgetfulMemory(None, hashing))
