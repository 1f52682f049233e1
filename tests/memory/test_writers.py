"""Several writers, one memory folder: every entry is tagged with its writer, concurrent writers lose
nothing and raise nothing after a commit, a resume undoes only its own run's entries, and a reopen
removes the temporary index files of writers killed mid-write (never a live writer's)."""

from __future__ import annotations

import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from memory.embedders import HashingEmbedder
from memory.store import INDEX_FILE, SQLITE_FILE, FaissMemory, enable_wal
from meta_agent.rank_protocol import rollback_memory
from training.distributed import Ranks

ADDS = 40


def write_lessons(folder: str, writer: str) -> list[int]:
    """One writing process: ADDS lessons, the index file written after every one (flush_every=1)."""
    with FaissMemory(folder, HashingEmbedder(384), flush_every=1, writer=writer) as memory:
        return [memory.add(f"lesson {k} of {writer}: check the units") for k in range(ADDS)]


def test_two_processes_writing_one_folder_lose_nothing(tmp_path, hashing):
    with ProcessPoolExecutor(2) as pool:
        a, b = pool.map(write_lessons, [str(tmp_path)] * 2, ["run-a", "run-b"])
    assert len(set(a) | set(b)) == 2 * ADDS  # every add returned, none raised
    with FaissMemory(tmp_path, hashing) as memory:
        assert memory.ids() == sorted(a + b) and len(memory) == 2 * ADDS  # all indexed on reopen
        assert memory.ids(writer="run-a") == a and memory.ids(writer="run-b") == b
        assert memory.get(b[0]).writer == "run-b"
    assert not list(tmp_path.glob("*.tmp"))  # no temporary index file left behind


def test_switching_to_wal_waits_out_a_lock_sqlite_will_not_wait_for(tmp_path):
    """Two processes opening a new folder together: one gets "database is locked" at once, with no wait
    in SQLite's busy handler (a connection with timeout 0 answers so whenever another holds the lock).
    Opening retries until the lock is gone instead of failing."""
    path = tmp_path / SQLITE_FILE
    holder = sqlite3.connect(path, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.commit()
    holder.execute("BEGIN EXCLUSIVE")
    threading.Timer(0.3, holder.rollback).start()
    opener = sqlite3.connect(path, timeout=0)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        opener.execute("PRAGMA journal_mode=WAL")  # what a single try meets
    started = time.monotonic()
    enable_wal(opener, seconds=10)
    assert opener.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert time.monotonic() - started < 10
    holder.close()
    opener.close()


def test_a_lock_held_past_the_wait_still_fails_with_sqlites_error(tmp_path):
    path = tmp_path / SQLITE_FILE
    holder = sqlite3.connect(path)
    holder.execute("CREATE TABLE t (x)")
    holder.commit()
    holder.execute("BEGIN EXCLUSIVE")
    opener = sqlite3.connect(path, timeout=0)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        enable_wal(opener, seconds=0.2)
    holder.rollback()
    holder.close()
    opener.close()


def test_a_resume_undoes_only_its_own_runs_entries(tmp_path, hashing):
    mine = FaissMemory(tmp_path, hashing, writer="runs/a")
    other = FaissMemory(tmp_path, hashing, writer="runs/b")
    kept = [mine.add("mine, before the checkpoint")]
    newest_at_checkpoint = max(mine.ids())
    replayed = [mine.add("mine, a step that will be played again")]
    others = [other.add("another run's, after the checkpoint"), other.add("and one more")]
    replayed.append(mine.add("mine, again"))
    rollback_memory(mine, newest_at_checkpoint, Ranks())
    assert mine.ids() == sorted(kept + others)  # the other writer's entries survive the resume
    other.refresh()
    assert other.ids() == sorted(kept + others) and len(other) == 3
    mine.close()
    other.close()


def test_a_folder_from_before_writers_opens_and_keeps_its_entries(tmp_path, hashing):
    db = sqlite3.connect(tmp_path / SQLITE_FILE)
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE entries (id INTEGER PRIMARY KEY AUTOINCREMENT, text TEXT NOT NULL, kind TEXT NOT NULL,"
        " task TEXT NOT NULL, reward REAL NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL,"
        " vector BLOB NOT NULL);"
    )
    vector = hashing.embed(["an old lesson"])[0].astype("<f4").tobytes()
    db.execute("INSERT INTO meta VALUES ('dim', '384'), ('embedder', 'hashing-384')")
    db.execute(
        "INSERT INTO entries (text, kind, task, reward, created, last_used, vector) VALUES (?,?,?,?,?,?,?)",
        ("an old lesson", "lesson", "", 1.0, 0.0, 0.0, vector),
    )
    db.commit()
    db.close()
    with FaissMemory(tmp_path, hashing, writer="runs/new") as memory:
        (hit,) = memory.search("an old lesson", k=1)
        assert hit.entry.text == "an old lesson" and hit.entry.writer == ""
        new = memory.add("a new lesson")
        assert memory.ids(writer="runs/new") == [new] and memory.ids(writer="") == [hit.entry.id]
    assert np.isclose(hit.relevance, 1.0, atol=1e-5)


_KILLED_MID_WRITE = textwrap.dedent(
    """
    import os, signal, sys
    import faiss
    from memory.embedders import HashingEmbedder
    from memory.store import FaissMemory

    def write_half(index, path):  # the writer dies with half an index in its temporary file
        with open(path, "wb") as f:
            f.write(b"\\0" * 4096)
            f.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    memory = FaissMemory(sys.argv[1], HashingEmbedder(384), flush_every=1)
    faiss.write_index = write_half
    memory.add("a lesson whose index write is cut short")
    """
)


def test_reopening_removes_the_temporary_index_files_of_killed_writers(tmp_path, hashing):
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "-c", _KILLED_MID_WRITE, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == -signal.SIGKILL, result.stderr
        # what the killed writer left; the second writer's open removed the first's
        assert len(list(tmp_path.glob(f".{INDEX_FILE}.*.tmp"))) == 1
    with FaissMemory(tmp_path, hashing) as memory:
        assert len(memory) == 2  # both adds were committed before the index write
    assert not list(tmp_path.glob("*.tmp"))


def test_reopening_keeps_the_temporary_file_a_live_writer_is_writing(tmp_path, hashing):
    FaissMemory(tmp_path, hashing).close()
    fd, tmp = tempfile.mkstemp(dir=tmp_path, prefix=f".{INDEX_FILE}.", suffix=".tmp")
    fcntl.flock(fd, fcntl.LOCK_EX)  # as write_index_atomic holds it while writing
    FaissMemory(tmp_path, hashing).close()
    assert Path(tmp).is_file()
    os.close(fd)  # the writer is gone without renaming it
    FaissMemory(tmp_path, hashing).close()
    assert not Path(tmp).exists()
