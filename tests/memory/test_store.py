"""FaissMemory: retrieval with the real MiniLM embedder, ranking terms, persistence and crash safety."""

from __future__ import annotations

import ast
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import faiss
import numpy as np
import pytest

from memory import index as memory_index
from memory.embedders import HashingEmbedder
from memory.index import ivf_nlist, make_index
from memory.scoring import ScoringWeights
from memory.store import INDEX_FILE, SQLITE_FILE, FaissMemory
from memory.types import MemoryConfigError

LESSONS = {
    "cooking": "When baking bread, let the dough rise until it doubles and preheat the oven first.",
    "math": "To solve a quadratic equation, compute the discriminant before taking the square root.",
    "python": "In Python, never use a mutable list as a default function argument.",
    "geography": "The Nile flows north through Egypt into the Mediterranean Sea.",
    "finance": "Compound interest grows savings faster the earlier you start investing.",
}


@pytest.fixture
def lessons(minilm):
    memory = FaissMemory(None, minilm)
    ids = {topic: memory.add(text, task=topic) for topic, text in LESSONS.items()}
    yield memory, ids
    memory.close()


@pytest.mark.parametrize(
    ("query", "topic"),
    [
        ("How long should I knead and proof pizza dough before it goes in the oven?", "cooking"),
        ("What is the formula for the roots of ax^2 + bx + c = 0?", "math"),
        ("Why does my function keep remembering items appended in previous calls?", "python"),
        ("Which river runs through Cairo?", "geography"),
        ("Is it worth putting money in a retirement account when I'm young?", "finance"),
    ],
)
def test_paraphrased_query_finds_the_right_lesson(lessons, query, topic):
    memory, ids = lessons
    hits = memory.search(query, k=3)
    assert [hit.entry.task for hit in hits][0] == topic
    assert hits[0].entry.id == ids[topic]
    assert hits[0].relevance > hits[1].relevance


def test_add_search_delete(lessons):
    memory, ids = lessons
    assert len(memory) == len(LESSONS)
    assert memory.delete([ids["cooking"]]) == 1
    hits = memory.search("recipe for baking bread", k=len(LESSONS))
    assert ids["cooking"] not in [hit.entry.id for hit in hits]
    assert len(hits) == len(LESSONS) - 1


def test_add_many_batches_and_broadcasts(minilm):
    memory = FaissMemory(None, minilm)
    texts = list(LESSONS.values())
    ids = memory.add_many(
        texts, kind="fact", task=list(LESSONS), reward=[0.1, 0.2, 0.3, 0.4, 0.5], batch_size=2
    )
    assert ids == sorted(ids) and len(set(ids)) == len(texts)
    entries = [memory.get(i) for i in ids]
    assert [e.text for e in entries] == texts
    assert [e.task for e in entries] == list(LESSONS)
    assert {e.kind for e in entries} == {"fact"}
    assert [e.reward for e in entries] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert memory.search("Egyptian rivers", k=1)[0].entry.task == "geography"
    with pytest.raises(ValueError, match="2 texts but 3 values of task"):
        memory.add_many(["a", "b"], task=["x", "y", "z"])
    with pytest.raises(ValueError, match="single str"):
        memory.add_many("one text")
    with pytest.raises(ValueError, match="empty"):
        memory.add_many(["fine", " "])
    assert len(memory) == len(texts)  # a bad batch adds nothing


def test_recency_ranks_recently_used_first(minilm, clock):
    memory = FaissMemory(None, minilm, clock=clock)
    old = memory.add("Always double-check units in physics answers.")
    clock.advance_hours(48)
    new = memory.add("Always double-check units in physics answers.")
    hits = memory.search("units in physics", k=2)
    assert [hit.entry.id for hit in hits] == [new, old]
    assert hits[0].recency == pytest.approx(1.0)
    assert hits[1].recency == pytest.approx(0.25)  # two 24 h half-lives
    assert hits[0].relevance == pytest.approx(hits[1].relevance, abs=1e-5)
    assert hits[0].score - hits[1].score == pytest.approx(0.1 * (1.0 - 0.25), abs=1e-5)
    # Both were just returned, so both were refreshed: recency is 1 again for each.
    assert memory.get(old).last_used == clock.now
    assert {hit.recency for hit in memory.search("units in physics", k=2)} == {1.0}


def test_importance_ranks_rewarded_lessons_first(minilm):
    memory = FaissMemory(None, minilm)
    failed = memory.add("Try breaking the problem into smaller steps.", reward=-1.0)
    solved = memory.add("Try breaking the problem into smaller steps.", reward=1.0)
    hits = memory.search("break the problem down", k=2)
    assert [hit.entry.id for hit in hits] == [solved, failed]
    assert [hit.importance for hit in hits] == [1.0, 0.0]


def test_zero_side_weights_leave_ties_to_the_older_entry(minilm):
    memory = FaissMemory(None, minilm, ScoringWeights(recency=0.0, importance=0.0))
    first = memory.add("Read the question twice.", reward=-1.0)
    second = memory.add("Read the question twice.", reward=1.0)
    assert [hit.entry.id for hit in memory.search("read carefully", k=2)] == [first, second]


def test_survives_close_and_reopen(minilm, tmp_path):
    with FaissMemory(tmp_path, minilm) as memory:
        ids = memory.add_many(list(LESSONS.values()), task=list(LESSONS))
    assert (tmp_path / SQLITE_FILE).is_file() and (tmp_path / INDEX_FILE).is_file()
    with FaissMemory(tmp_path, minilm) as memory:
        assert len(memory) == len(LESSONS)
        assert memory.search("baking tips", k=1)[0].entry.id == ids[0]


def test_index_file_in_step_is_used_without_rebuild(hashing, tmp_path, monkeypatch):
    with FaissMemory(tmp_path, hashing) as memory:
        memory.add_many(["alpha beta", "gamma delta", "epsilon zeta"])

    def no_rebuild(self):
        raise AssertionError("index was rebuilt although the file matched SQLite")

    monkeypatch.setattr(FaissMemory, "_rebuild_index", no_rebuild)
    with FaissMemory(tmp_path, hashing) as memory:
        assert memory.search("gamma delta", k=1)[0].entry.text == "gamma delta"


@pytest.mark.parametrize("damage", ["missing", "garbage", "other_kind"])
def test_damaged_index_file_is_rebuilt_from_sqlite(hashing, tmp_path, damage):
    with FaissMemory(tmp_path, hashing) as memory:
        ids = memory.add_many(["alpha beta", "gamma delta", "epsilon zeta"])
    index_file = tmp_path / INDEX_FILE
    if damage == "missing":
        index_file.unlink()
    elif damage == "garbage":
        index_file.write_bytes(b"not a faiss index")
    else:
        faiss.write_index(make_index("hnsw", 384), str(index_file))
    with FaissMemory(tmp_path, hashing) as memory:
        assert len(memory) == 3
        assert [
            memory.search(text, k=1)[0].entry.id for text in ["alpha beta", "gamma delta", "epsilon zeta"]
        ] == ids


_CRASHING_WRITER = textwrap.dedent(
    """
    import json, os, signal, sys
    from memory.embedders import HashingEmbedder
    from memory.store import FaissMemory

    memory = FaissMemory(sys.argv[1], HashingEmbedder(384), flush_every=3)
    ids = [memory.add(f"lesson number {i} about topic {i}", task=str(i)) for i in range(7)]
    # The index file now holds ids[:6]; deleting ids[0] leaves SQLite with as many entries but
    # a different id set, the hardest kind of stale index to notice.
    memory.delete([ids[0]])
    print(json.dumps(ids), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close(), no flush(), no atexit
    """
)


def test_survives_a_killed_process(hashing, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _CRASHING_WRITER, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    ids = json.loads(result.stdout)
    with FaissMemory(tmp_path, hashing) as memory:
        assert len(memory) == 6
        assert memory.get(ids[0]) is None
        for i, entry_id in enumerate(ids[1:], start=1):
            text = f"lesson number {i} about topic {i}"
            assert memory.get(entry_id).text == text
            assert memory.search(text, k=1)[0].entry.id == entry_id


def test_reopen_with_other_dim_names_the_path(tmp_path):
    FaissMemory(tmp_path, HashingEmbedder(384)).close()
    with pytest.raises(MemoryConfigError, match=r"384-dim.*64-dim") as err:
        FaissMemory(tmp_path, HashingEmbedder(64))
    assert str(tmp_path) in str(err.value)


def test_reopen_with_other_embedder_of_same_dim_is_refused(minilm, tmp_path):
    FaissMemory(tmp_path, HashingEmbedder(384)).close()
    with pytest.raises(MemoryConfigError, match="all-MiniLM-L6-v2") as err:
        FaissMemory(tmp_path, minilm)
    assert str(tmp_path) in str(err.value)


def test_bad_input_and_closed_memory(hashing):
    memory = FaissMemory(None, hashing)
    memory.add("something")
    with pytest.raises(ValueError, match="empty"):
        memory.add("")
    with pytest.raises(ValueError, match="positive int"):
        memory.search("something", k=0)
    with pytest.raises(ValueError, match="positive int"):
        memory.search("something", k=2.5)
    with pytest.raises(ValueError, match=r"unknown index kind 'annoy'.*'flat', 'hnsw', 'ivf'"):
        FaissMemory(None, hashing, index="annoy")
    with pytest.raises(ValueError, match="nprobe must be >= 1"):
        FaissMemory(None, hashing, index="ivf", nprobe=0)
    with pytest.raises(ValueError, match="candidate_factor"):
        FaissMemory(None, hashing, candidate_factor=0)
    memory.close()
    with pytest.raises(ValueError, match="closed"):
        memory.search("something")


def test_flush_every_writes_the_index_file(hashing, tmp_path):
    memory = FaissMemory(tmp_path, hashing, flush_every=2)
    memory.add("one")
    assert not (tmp_path / INDEX_FILE).exists()
    memory.add("two")
    assert (tmp_path / INDEX_FILE).is_file()
    assert faiss.read_index(str(tmp_path / INDEX_FILE)).ntotal == 2
    memory.close()


def test_vectors_are_stored_in_sqlite(hashing):
    memory = FaissMemory(None, hashing)
    entry_id = memory.add("stored vector")
    (blob,) = memory._db.execute("SELECT vector FROM entries WHERE id = ?", (entry_id,)).fetchone()
    np.testing.assert_array_equal(np.frombuffer(blob, dtype="<f4"), hashing.embed(["stored vector"])[0])


def test_memory_imports_no_higher_layer():
    forbidden = {"meta_agent", "training", "roles", "tools"}
    package = Path(__file__).resolve().parents[2] / "memory"
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not {name.split(".")[0] for name in names} & forbidden, f"{source.name} imports {names}"


def _ef_search(memory: FaissMemory) -> int:
    return faiss.downcast_index(memory._index.index).hnsw.efSearch


def test_hnsw_ef_search_holds_after_reopen_and_rebuild(hashing, tmp_path):
    with FaissMemory(tmp_path, hashing, index="hnsw", ef_search=200) as memory:
        ids = memory.add_many(["alpha beta", "gamma delta", "epsilon zeta"])
        assert _ef_search(memory) == 200
        memory.delete([ids[0]])  # hnsw cannot drop nodes: the index is rebuilt from SQLite
        assert _ef_search(memory) == 200
        assert memory.search("gamma delta", k=1)[0].entry.id == ids[1]
    with FaissMemory(tmp_path, hashing, index="hnsw", ef_search=128) as memory:  # read from the file
        assert len(memory) == 2 and _ef_search(memory) == 128
    with pytest.raises(ValueError, match="ef_search must be >= 1"):
        FaissMemory(tmp_path, hashing, index="hnsw", ef_search=0)


# ivf: IVF_MIN_TRAIN lowered to 1600 so that a store of a few thousand hashed texts trains (40 cells).
IVF_TEST_MIN = 1600


@pytest.fixture
def small_ivf(monkeypatch):
    monkeypatch.setattr(memory_index, "IVF_MIN_TRAIN", IVF_TEST_MIN)


def _inner(memory: FaissMemory) -> faiss.Index:
    return faiss.downcast_index(memory._index.index)


def _texts(start: int, stop: int) -> list[str]:
    """Distinct texts: each one's nearest stored text (hashed bag of words) is itself."""
    return [
        f"lesson {i} number {i * 7919 % 10007} topic t{i % 97} step s{i % 13}" for i in range(start, stop)
    ]


def _finds_itself(memory: FaissMemory, texts: list[str], ids: list[int]) -> bool:
    return all(memory.search(text, k=1)[0].entry.id == i for text, i in zip(texts, ids, strict=True))


def test_ivf_store_is_exact_until_it_trains(hashing, small_ivf):
    memory = FaissMemory(None, hashing, index="ivf", nprobe=5)
    ids = memory.add_many(_texts(0, IVF_TEST_MIN - 1))
    assert type(_inner(memory)) is faiss.IndexFlatIP  # exact fallback below the training size
    ids += memory.add_many(_texts(IVF_TEST_MIN - 1, IVF_TEST_MIN + 99))  # crosses it: trained
    inner = _inner(memory)
    assert isinstance(inner, faiss.IndexIVFScalarQuantizer) and inner.is_trained
    assert inner.nlist == ivf_nlist(IVF_TEST_MIN + 99) and inner.nprobe == 5
    assert len(memory) == IVF_TEST_MIN + 99
    sample = slice(0, None, 37)
    assert _finds_itself(memory, _texts(0, IVF_TEST_MIN + 99)[sample], ids[sample])
    memory.close()


def test_ivf_store_round_trip_without_rebuild(hashing, small_ivf, tmp_path, monkeypatch):
    relevance_only = ScoringWeights(recency=0.0, importance=0.0)  # searching refreshes last_used
    queries = _texts(0, 2000)[::101]

    def top5(memory: FaissMemory) -> list[list[int]]:
        return [[hit.entry.id for hit in memory.search(q, k=5)] for q in queries]

    with FaissMemory(tmp_path, hashing, relevance_only, index="ivf") as memory:
        ids = memory.add_many(_texts(0, 2000))
        before = top5(memory)
    assert [found[0] for found in before] == ids[::101]

    def no_rebuild(self):
        raise AssertionError("index was rebuilt although the file matched SQLite")

    monkeypatch.setattr(FaissMemory, "_rebuild_index", no_rebuild)
    with FaissMemory(tmp_path, hashing, relevance_only, index="ivf", nprobe=7) as memory:
        assert isinstance(_inner(memory), faiss.IndexIVFScalarQuantizer)
        assert _inner(memory).nprobe == 7 and len(memory) == 2000  # nprobe comes from the caller
    with FaissMemory(tmp_path, hashing, relevance_only, index="ivf") as memory:
        assert top5(memory) == before


def test_ivf_delete_rebuilds_with_the_right_ids(hashing, small_ivf, tmp_path):
    texts = _texts(0, 2000)
    with FaissMemory(tmp_path, hashing, index="ivf") as memory:
        ids = memory.add_many(texts)
        gone = ids[::10]
        assert memory.delete(gone) == len(gone)
        # Removing in place from IndexIDMap2 over IVF would shift every later id: each survivor
        # must still be found under its own id, and no deleted id may come back.
        assert isinstance(_inner(memory), faiss.IndexIVFScalarQuantizer)
        assert len(memory) == 2000 - len(gone)
        kept = [(t, i) for t, i in zip(texts, ids, strict=True) if i not in set(gone)][::23]
        assert _finds_itself(memory, [t for t, _ in kept], [i for _, i in kept])
        found = {hit.entry.id for t in texts[::10][:40] for hit in memory.search(t, k=5)}
        assert not found & set(gone)
        memory.delete(ids[: 2000 - IVF_TEST_MIN + 1])  # below the training size again: exact
        assert type(_inner(memory)) is faiss.IndexFlatIP
    with FaissMemory(tmp_path, hashing, index="ivf") as memory:
        assert sorted(memory.ids()) == sorted(set(ids[2000 - IVF_TEST_MIN + 1 :]) - set(gone))
        assert type(_inner(memory)) is faiss.IndexFlatIP


def test_ivf_store_retrains_when_outgrown(hashing, small_ivf):
    memory = FaissMemory(None, hashing, index="ivf")
    ids = memory.add_many(_texts(0, 1600))
    assert _inner(memory).nlist == 40  # retrains at 4 * 40**2 = 6400 entries
    ids += memory.add_many(_texts(1600, 6399))
    assert _inner(memory).nlist == 40
    ids += memory.add_many(_texts(6399, 6400))
    assert _inner(memory).nlist == ivf_nlist(6400) == 80
    texts = _texts(0, 6400)
    assert _finds_itself(memory, texts[::211], ids[::211])
    memory.close()


def test_ivf_file_of_a_smaller_store_is_retrained_on_open(hashing, small_ivf, tmp_path):
    with FaissMemory(tmp_path, hashing, index="flat") as memory:  # a flat file is a valid small ivf
        memory.add_many(_texts(0, 2000))
    with FaissMemory(tmp_path, hashing, index="ivf") as memory:
        assert isinstance(_inner(memory), faiss.IndexIVFScalarQuantizer)


def test_a_read_only_reader_never_writes_and_refresh_catches_up_with_the_writer(tmp_path):
    """Rank 0 of a multi-process run writes the folder; the other ranks read it and refresh."""
    embedder = HashingEmbedder(dim=64)
    writer = FaissMemory(tmp_path, embedder)
    first = writer.add("convert units before adding", task="t/1", reward=1.0)
    reader = FaissMemory(tmp_path, embedder, read_only=True)
    assert reader.ids() == [first]
    with pytest.raises(ValueError, match="read-only.*rank 0"):
        reader.add("a lesson from the wrong process")
    with pytest.raises(ValueError, match="read-only"):
        reader.delete([first])
    used = writer.get(first).last_used
    assert [h.entry.id for h in reader.search("units", k=1)] == [first]
    assert writer.get(first).last_used == used  # the reader's search wrote nothing

    second = writer.add("check the sign of the answer", task="t/2", reward=-1.0)
    assert len(reader) == 1
    assert reader.refresh() == 1
    assert len(reader) == 2
    assert reader.search("sign of the answer", k=1)[0].entry.id == second
    writer.delete([first])
    reader.refresh()
    assert reader.ids() == [second] and len(reader) == 1
    reader.close()
    writer.close()
    with pytest.raises(ValueError, match="folder"):
        FaissMemory(None, embedder, read_only=True)
