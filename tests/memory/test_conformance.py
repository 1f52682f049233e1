"""FaissMemory passes the shared Memory conformance suite: in memory and on disk, every index kind."""

from __future__ import annotations

import pytest

from memory import index as memory_index
from memory.conformance import check_memory
from memory.store import FaissMemory

KINDS = ["flat", "hnsw", "ivf", "ivf-trained"]


@pytest.fixture
def kind(request, monkeypatch) -> str:
    """The index kind; "ivf-trained" is ivf trained from 4 entries on, so the suite's handful of
    entries exercises a trained IVF index (and its retraining) rather than the exact fallback."""
    if request.param == "ivf-trained":
        monkeypatch.setattr(memory_index, "IVF_MIN_TRAIN", 4)
        return "ivf"
    return request.param


@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_in_memory(minilm, kind):
    check_memory(FaissMemory(None, minilm, index=kind))


@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_on_disk(minilm, kind, tmp_path):
    folder = tmp_path / "mem"
    check_memory(
        FaissMemory(folder, minilm, index=kind),
        reopen=lambda: FaissMemory(folder, minilm, index=kind),
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
