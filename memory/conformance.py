"""Conformance suite every Memory implementation passes (tests/memory/test_conformance.py runs it).

    from memory.conformance import check_memory
    check_memory(FaissMemory(None, embedder))                      # in memory
    check_memory(FaissMemory(folder, embedder), reopen=lambda: FaissMemory(folder, embedder))

It checks the protocol's contract only: ids, round-trip of metadata, search result shape and order,
bad input, delete, close, and (given `reopen`) persistence. Ranking quality lives in the store's tests.
Failures raise AssertionError with a message naming the broken rule (plain raises, so -O keeps them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from memory.types import Memory, MemoryEntry, MemoryHit

# Distinct topics, so that any reasonable embedder ranks a text's own entry first for that text.
_ENTRIES = [
    ("Preheat the oven before baking bread so the crust sets evenly.", "lesson", "cooking/1"),
    ("Convert every quantity to the same unit before adding them.", "lesson", "math/units"),
    ("The Python sandbox kills programs that run longer than the time limit.", "fact", "tools/python"),
    ("Check the sign of each term when expanding brackets in algebra.", "lesson", "math/algebra"),
    ("Photosynthesis turns sunlight, water and carbon dioxide into sugar.", "fact", "biology/plants"),
]
_REWARD = 0.5  # one reward for all, so importance cannot reorder hits under any weights
_EPS = 1e-4


def _expect(condition: bool, rule: str) -> None:
    if not condition:
        raise AssertionError(f"Memory conformance: {rule}")


def _check_hits(hits: object, k: int, known_ids: set[int]) -> list[MemoryHit]:
    _expect(isinstance(hits, list), f"search returns a list, got {type(hits).__name__}")
    _expect(len(hits) <= k, f"search(k={k}) returns at most k hits, got {len(hits)}")
    for hit in hits:
        _expect(isinstance(hit, MemoryHit), f"search returns MemoryHit items, got {type(hit).__name__}")
        _expect(hit.entry.id in known_ids, f"hit id {hit.entry.id} is a stored entry")
        _expect(-1 - _EPS <= hit.relevance <= 1 + _EPS, f"relevance in [-1, 1], got {hit.relevance}")
        _expect(0 <= hit.recency <= 1, f"recency in [0, 1], got {hit.recency}")
        _expect(0 <= hit.importance <= 1, f"importance in [0, 1], got {hit.importance}")
    scores = [hit.score for hit in hits]
    _expect(scores == sorted(scores, reverse=True), f"hits sorted by score, best first: {scores}")
    ids = [hit.entry.id for hit in hits]
    _expect(len(ids) == len(set(ids)), f"no entry twice in one result: {ids}")
    return hits


def _expect_value_error(call: Callable[[], object], what: str) -> None:
    try:
        call()
    except ValueError:
        return
    raise AssertionError(f"Memory conformance: {what} raises ValueError")


def _same_but_last_used(a: MemoryEntry, b: MemoryEntry) -> bool:
    return dataclasses.replace(a, last_used=0.0) == dataclasses.replace(b, last_used=0.0)


def check_memory(memory: Memory, reopen: Callable[[], Memory] | None = None) -> None:
    """Run the suite on an empty `memory`, which it closes; `reopen` reopens the same store."""
    _expect(isinstance(memory, Memory), f"{type(memory).__name__} implements the Memory protocol")
    _expect(len(memory) == 0, f"the suite starts from an empty memory, got {len(memory)} entries")
    _expect(memory.search("anything at all", k=3) == [], "search on an empty memory returns []")

    # add and get round-trip
    ids = [memory.add(text, kind=kind, task=task, reward=_REWARD) for text, kind, task in _ENTRIES]
    _expect(all(isinstance(i, int) for i in ids), f"add returns int ids, got {ids!r}")
    _expect(len(set(ids)) == len(ids), f"add returns distinct ids, got {ids}")
    _expect(len(memory) == len(_ENTRIES), f"len counts added entries: {len(memory)} != {len(_ENTRIES)}")
    for entry_id, (text, kind, task) in zip(ids, _ENTRIES, strict=True):
        entry = memory.get(entry_id)
        _expect(isinstance(entry, MemoryEntry), f"get({entry_id}) returns a MemoryEntry")
        _expect(
            (entry.id, entry.text, entry.kind, entry.task, entry.reward)
            == (entry_id, text, kind, task, _REWARD),
            f"get returns what add stored, got {entry}",
        )
        _expect(entry.created <= entry.last_used, f"created <= last_used, got {entry}")
    _expect(memory.get(max(ids) + 1000) is None, "get of an unknown id returns None")
    _expect(memory.ids() == sorted(ids), f"ids() lists every stored id ascending, got {memory.ids()}")

    # search: shape, order, exact text ranks its own entry first, last_used refreshed
    known = set(ids)
    for entry_id, (text, _, _) in zip(ids, _ENTRIES, strict=True):
        before = memory.get(entry_id)
        hits = _check_hits(memory.search(text, k=2), 2, known)
        _expect(len(hits) == 2, f"search(k=2) on {len(ids)} entries returns 2 hits, got {len(hits)}")
        _expect(hits[0].entry.id == entry_id, f"searching an entry's own text ranks it first: {text!r}")
        _expect(hits[0].relevance > 0.99, f"an entry's own text has relevance ~1, got {hits[0].relevance}")
        after = memory.get(entry_id)
        _expect(after.last_used >= before.last_used, "search does not move last_used backwards")
        _expect(_same_but_last_used(before, after), "search changes no field but last_used")
    everything = _check_hits(memory.search("memory", k=100), 100, known)
    _expect({hit.entry.id for hit in everything} == known, "search with k > len returns every entry")

    # bad input
    _expect_value_error(lambda: memory.add(""), "add of an empty text")
    _expect_value_error(lambda: memory.add("   \n"), "add of a whitespace-only text")
    _expect_value_error(lambda: memory.search(""), "search with an empty query")
    _expect_value_error(lambda: memory.search("oven", k=0), "search with k=0")
    _expect_value_error(lambda: memory.search("oven", k=-1), "search with k<0")
    _expect(len(memory) == len(_ENTRIES), "rejected input adds nothing")

    # delete
    gone, kept = ids[:2], ids[2:]
    _expect(memory.delete([*gone, max(ids) + 1000]) == 2, "delete returns how many stored entries it removed")
    _expect(memory.delete(gone) == 0, "deleting already deleted ids removes nothing")
    _expect(memory.delete([]) == 0, "delete([]) removes nothing")
    _expect(len(memory) == len(kept), f"len after delete is {len(kept)}, got {len(memory)}")
    for entry_id in gone:
        _expect(memory.get(entry_id) is None, f"get({entry_id}) after delete returns None")
    for text, _, _ in _ENTRIES[:2]:
        hits = _check_hits(memory.search(text, k=100), 100, set(kept))
        _expect(not {hit.entry.id for hit in hits} & set(gone), "deleted entries never come back from search")
    new_text = "Water boils at a lower temperature at high altitude."
    new_id = memory.add(new_text, kind="fact", task="physics")
    _expect(new_id not in ids, "an id is not handed out twice, even after its entry was deleted")
    _expect(memory.search(new_text, k=1)[0].entry.id == new_id, "adds after delete are found")
    kept.append(new_id)

    if reopen is not None:
        stored = {entry_id: memory.get(entry_id) for entry_id in kept}
        memory.close()
        memory = reopen()
        _expect(len(memory) == len(kept), f"reopened memory has {len(kept)} entries, got {len(memory)}")
        for entry_id, entry in stored.items():
            _expect(memory.get(entry_id) == entry, f"entry {entry_id} survives close and reopen")
        for entry_id in gone:
            _expect(memory.get(entry_id) is None, f"deleted entry {entry_id} stays deleted after reopen")
        hits = _check_hits(memory.search(_ENTRIES[2][0], k=1), 1, set(kept))
        _expect(hits[0].entry.id == ids[2], "search works after reopen")

    memory.close()
    memory.close()  # closing twice is harmless
