"""FaissMemory: a FAISS index over unit-norm embeddings with SQLite metadata, persisted in one folder.

Layout of `path/`: `memory.sqlite` (entries with their float32 vectors, and a meta table naming the
embedder) and `index.faiss` (the search index). SQLite is the source of truth: every add commits before
it returns, and the index file is only a cache, written atomically on flush()/close() and every
`flush_every` adds. On open, an index file that is missing, unreadable or out of step with SQLite is
rebuilt from the stored vectors, so a killed process loses nothing that was committed.

    memory = FaissMemory(Path("runs/mem"), SentenceEmbedder())
    memory.add("Convert units before adding quantities.", task="gsm8k/17", reward=1.0)
    hits = memory.search("how do I add 3 km and 200 m?", k=3)
    memory.close()
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from memory.index import (
    DEFAULT_INDEX,
    HNSW_EF_SEARCH,
    IVF_NPROBE,
    add_vectors,
    index_ids,
    index_kind,
    is_kind,
    make_index,
    needs_retrain,
    read_index,
    remove_stale_temporaries,
    removes_in_place,
    search_one,
    set_ef_search,
    set_nprobe,
    train_sample_size,
    write_index_atomic,
)
from memory.scoring import ScoringWeights, score_entry
from memory.types import Embedder, MemoryConfigError, MemoryEntry, MemoryHit

SQLITE_FILE = "memory.sqlite"
INDEX_FILE = "index.faiss"
# How long opening a folder retries switching its journal to WAL while another process holds the lock
# that takes (sqlite3's own default wait for a lock).
WAL_WAIT_SECONDS = 5.0
_REBUILD_CHUNK = 65536  # rows read from SQLite at a time when rebuilding the index
_SAMPLE_CHUNK = 500  # ids per query when reading a training sample (SQLite limits bound parameters)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- AUTOINCREMENT: a deleted id is never handed out again, so an old index file can never map a
-- reused id to the wrong vector, and comparing id sets is enough to detect a stale index.
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    text TEXT NOT NULL,
    kind TEXT NOT NULL,
    task TEXT NOT NULL,
    reward REAL NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    vector BLOB NOT NULL,  -- float32 little-endian, dim values
    writer TEXT NOT NULL DEFAULT ''  -- who wrote it (a run's folder); '' for untagged writes
);
"""
_ENTRY_COLUMNS = "id, text, kind, task, reward, created, last_used, writer"


def _embedder_name(embedder: Embedder) -> str:
    return str(getattr(embedder, "name", type(embedder).__name__))


def _broadcast(value: object, n: int, what: str) -> list:
    """A scalar repeated n times, or a per-text sequence checked to be n long."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        return [value] * n
    if len(value) != n:
        raise ValueError(f"add_many got {n} texts but {len(value)} values of {what}")
    return list(value)


def first_missing(path: Path) -> Path | None:
    """The outermost folder of `path` (itself included) that does not exist yet; None if it exists."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            return missing
        missing = folder
    return missing


def enable_wal(db: sqlite3.Connection, seconds: float = WAL_WAIT_SECONDS) -> None:
    """Switch `db` to WAL, retrying for up to `seconds` while another connection holds the lock it needs.
    SQLite answers "database is locked" at once there, without waiting in its busy handler, where a wait
    could deadlock: two processes opening a new folder together both read it, then each needs it alone."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


class FaissMemory:
    """Memory backed by FAISS (relevance search) and SQLite (metadata, vectors, durability).

    path: folder for `memory.sqlite` and `index.faiss` (created if missing); None keeps everything in
        process memory and loses it on close.
    embedder: turns texts into unit-norm vectors; its dim and name are recorded, and reopening the
        folder with a different one raises MemoryConfigError.
    weights: how relevance, recency and importance combine into the ranking score.
    candidate_factor: search ranks k * candidate_factor nearest entries by the combined score, so
        recency and importance reorder near neighbours but never surface unrelated entries.
    index: "flat" (exact, default), "ivf" or "hnsw" (approximate, for very large stores); see
        memory.index. ivf is exact below memory.index.IVF_MIN_TRAIN entries and is trained (or
        retrained, when the store has outgrown it) from the stored vectors by the add that crosses
        the line, which then takes as long as a rebuild.
    ef_search: candidates an hnsw query visits; nprobe: cells an ivf query scans (more of either:
        higher recall, slower search). Other kinds ignore them.
    flush_every: write the index file after this many adds (0: only on flush/close).
    clock: unix-seconds time source; tests pass a fake one to age entries without sleeping.
    read_only: another process owns the folder (rank 0 of a multi-process run): this one never writes
        to it (adds and deletes raise, searches leave last_used alone, the index file is never written)
        and calls refresh() to see what the owner committed.
    writer: tags every entry this handle adds (a run passes its folder), so that `ids(writer=...)`
        finds one writer's entries in a memory that several share (a resume undoes only its own).

    Several processes may write one folder at once: each add commits to SQLite (which serialises
    them), and each process writes the index file through a temporary file of its own.
    """

    def __init__(
        self,
        path: Path | str | None,
        embedder: Embedder,
        weights: ScoringWeights | None = None,
        candidate_factor: int = 4,
        *,
        index: str = DEFAULT_INDEX,
        ef_search: int = HNSW_EF_SEARCH,
        nprobe: int = IVF_NPROBE,
        flush_every: int = 1000,
        clock: Callable[[], float] = time.time,
        read_only: bool = False,
        writer: str = "",
    ):
        if candidate_factor < 1:
            raise ValueError(f"candidate_factor must be >= 1, got {candidate_factor}")
        index_kind(index)  # fail on an unknown kind before touching the disk
        if ef_search < 1:
            raise ValueError(f"ef_search must be >= 1 (candidates an HNSW query visits), got {ef_search}")
        if nprobe < 1:
            raise ValueError(f"nprobe must be >= 1 (cells an IVF query scans), got {nprobe}")
        self.ef_search = ef_search
        self.nprobe = nprobe
        self.path = Path(path) if path is not None else None
        self.embedder = embedder
        self.dim = int(embedder.dim)
        self.weights = weights if weights is not None else ScoringWeights()
        self.candidate_factor = candidate_factor
        self.index_kind = index
        self.flush_every = flush_every
        self.read_only = read_only
        self.writer = writer
        if read_only and path is None:
            raise ValueError("a read-only memory needs a folder (path) that another process writes")
        self._clock = clock
        self._adds_since_flush = 0
        self._dirty = False

        made = first_missing(self.path) if self.path is not None else None
        self._db = None
        try:
            self._db = self._connect()
            self._db.executescript(_SCHEMA)
            self._upgrade_schema()
            self._check_meta()
            self._index = self._open_index()
        except BaseException as err:
            if self._db is not None:
                self._db.close()  # a refused open must not keep the database file locked
            if made is not None:  # nor leave a folder it created
                shutil.rmtree(made, ignore_errors=True)
            if isinstance(err, sqlite3.DatabaseError | OSError):
                raise MemoryConfigError(
                    f"{self._where()} cannot be opened as a memory ({err}): pass a writable folder with room "
                    f"to spare, or move a damaged {SQLITE_FILE} aside"
                ) from err
            raise

    def _connect(self) -> sqlite3.Connection:
        """The SQLite database: in process memory, or the folder's file (the folder made if missing)."""
        if self.path is None:
            return sqlite3.connect(":memory:")
        self.path.mkdir(parents=True, exist_ok=True)
        if not self.read_only:  # what writers killed while writing the index file left
            remove_stale_temporaries(self.path / INDEX_FILE)
        db = sqlite3.connect(self.path / SQLITE_FILE)
        try:
            # WAL + synchronous=NORMAL: a committed transaction survives a killed process (only an OS
            # crash could roll back the last commits), and adds stay fast.
            enable_wal(db)
            db.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            db.close()
            raise
        return db

    # ----------------------------------------------------------------------------------- opening

    def _where(self) -> str:
        return str(self.path) if self.path is not None else "the in-memory store"

    def _upgrade_schema(self) -> None:
        """A folder written before entries had a writer gets the column; its entries stay untagged."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(entries)")}
        if "writer" not in columns and not self.read_only:
            with self._db:
                self._db.execute("ALTER TABLE entries ADD COLUMN writer TEXT NOT NULL DEFAULT ''")

    def _check_meta(self) -> None:
        """Record the embedder on first open; refuse a different one on reopen."""
        stored = dict(self._db.execute("SELECT key, value FROM meta"))
        name = _embedder_name(self.embedder)
        if not stored:
            # Two processes opening a new folder at once both find it empty: the second's rows are
            # ignored, and it is checked against what the first recorded like any reopen.
            with self._db:
                self._db.executemany(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                    [("dim", str(self.dim)), ("embedder", name)],
                )
            stored = dict(self._db.execute("SELECT key, value FROM meta"))
        if int(stored["dim"]) != self.dim:
            raise MemoryConfigError(
                f"memory at {self._where()} holds {stored['dim']}-dim vectors from embedder "
                f"{stored['embedder']!r}, but the embedder given ({name!r}) makes {self.dim}-dim vectors; "
                "reopen it with the same embedder or use a new folder"
            )
        if stored["embedder"] != name:
            raise MemoryConfigError(
                f"memory at {self._where()} was written with embedder {stored['embedder']!r}, "
                f"not {name!r}; vectors of different models are not comparable: reopen it with the "
                "same embedder or use a new folder"
            )

    def _sqlite_ids(self) -> np.ndarray:
        rows = self._db.execute("SELECT id FROM entries ORDER BY id").fetchall()
        return np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))

    @property
    def faiss_index(self):
        """The FAISS index searched (an IndexIDMap2 around the configured kind): for measurements."""
        return self._index

    def _open_index(self):
        """The index file when it matches SQLite exactly, else a fresh index rebuilt from SQLite."""
        if self.path is not None:
            index = read_index(self.path / INDEX_FILE)
            if (
                index is not None
                and index.d == self.dim
                and is_kind(index, self.index_kind)
                and np.array_equal(index_ids(index), self._sqlite_ids())
                and not needs_retrain(index, self.index_kind)
            ):
                self._set_search_params(index)
                return index
        return self._rebuild_index()

    def _set_search_params(self, index) -> None:
        set_ef_search(index, self.ef_search)
        set_nprobe(index, self.nprobe)

    def _training_sample(self, n: int) -> np.ndarray | None:
        """Vectors of train_sample_size(kind, n) entries drawn at random, [m, dim]; None if none needed.

        Seeded by n, so rebuilding the same store trains the same index.
        """
        size = train_sample_size(self.index_kind, n)
        if size == 0:
            return None
        ids = np.random.default_rng(n).choice(self._sqlite_ids(), size=size, replace=False)
        blobs = []
        for start in range(0, size, _SAMPLE_CHUNK):
            chunk = [int(i) for i in ids[start : start + _SAMPLE_CHUNK]]
            placeholders = ",".join("?" * len(chunk))
            rows = self._db.execute(f"SELECT vector FROM entries WHERE id IN ({placeholders})", chunk)
            blobs.extend(row[0] for row in rows)
        return np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), self.dim)

    def _rebuild_index(self):
        """A fresh index of every stored vector, trained on a sample of them if the kind trains."""
        (n,) = self._db.execute("SELECT COUNT(*) FROM entries").fetchone()
        index = make_index(self.index_kind, self.dim, n=n, sample=self._training_sample(n))
        cursor = self._db.execute("SELECT id, vector FROM entries ORDER BY id")
        while rows := cursor.fetchmany(_REBUILD_CHUNK):
            ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
            vectors = np.frombuffer(b"".join(row[1] for row in rows), dtype="<f4").reshape(
                len(rows), self.dim
            )
            add_vectors(index, ids, vectors)
        self._set_search_params(index)
        self._dirty = True  # the file on disk (if any) no longer matches
        return index

    # ----------------------------------------------------------------------------------- writing

    def add(self, text: str, *, kind: str = "lesson", task: str = "", reward: float = 0.0) -> int:
        """Store one entry and return its id; it is committed to SQLite before this returns."""
        return self.add_many([text], kind=kind, task=task, reward=reward)[0]

    def add_many(
        self,
        texts: Sequence[str],
        *,
        kind: str | Sequence[str] = "lesson",
        task: str | Sequence[str] = "",
        reward: float | Sequence[float] = 0.0,
        batch_size: int = 512,
    ) -> list[int]:
        """Store many entries, embedding and committing `batch_size` at a time; returns their ids.

        kind, task and reward are either one value for all texts or one value per text.
        """
        self._check_writable()
        if isinstance(texts, str):
            raise ValueError("add_many takes a sequence of texts, got a single str; use add()")
        for text in texts:
            self._check_text(text, "memory text")
        kinds = _broadcast(kind, len(texts), "kind")
        tasks = _broadcast(task, len(texts), "task")
        rewards = [float(r) for r in _broadcast(reward, len(texts), "reward")]
        ids: list[int] = []
        for start in range(0, len(texts), batch_size):
            stop = start + batch_size
            ids.extend(
                self._add_batch(texts[start:stop], kinds[start:stop], tasks[start:stop], rewards[start:stop])
            )
        return ids

    def _add_batch(
        self, texts: Sequence[str], kinds: list[str], tasks: list[str], rewards: list[float]
    ) -> list[int]:
        vectors = self._embed(texts)  # [B, dim]
        now = self._clock()
        ids = []
        with self._db:  # one transaction per batch, committed on exit
            for text, kind, task, reward, vector in zip(texts, kinds, tasks, rewards, vectors, strict=True):
                cursor = self._db.execute(
                    "INSERT INTO entries (text, kind, task, reward, created, last_used, vector, writer) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        text,
                        str(kind),
                        str(task),
                        reward,
                        now,
                        now,
                        vector.astype("<f4").tobytes(),
                        self.writer,
                    ),
                )
                ids.append(int(cursor.lastrowid))
        add_vectors(self._index, np.asarray(ids, dtype=np.int64), vectors)
        if needs_retrain(self._index, self.index_kind):
            self._index = self._rebuild_index()  # the batch is committed, so the rebuild includes it
        self._dirty = True
        self._adds_since_flush += len(ids)
        if self.flush_every and self._adds_since_flush >= self.flush_every:
            self.flush()
        return ids

    def delete(self, ids: Sequence[int] | Iterable[int]) -> int:
        """Remove the entries with these ids; unknown ids are ignored. Returns how many were removed."""
        self._check_writable()
        wanted = sorted({int(i) for i in ids})
        if not wanted:
            return 0
        with self._db:
            removed = sum(
                self._db.execute("DELETE FROM entries WHERE id = ?", (entry_id,)).rowcount
                for entry_id in wanted
            )
        if removed:
            if removes_in_place(self._index):
                self._index.remove_ids(np.asarray(wanted, dtype=np.int64))
            else:  # also retrains an ivf index for the smaller store (or falls back to exact)
                self._index = self._rebuild_index()
            self._dirty = True
        return removed

    def flush(self) -> None:
        """Write the index file atomically if it changed since the last write (no-op in memory)."""
        self._check_open()
        self._adds_since_flush = 0
        if self.path is None or not self._dirty or self.read_only:
            return
        write_index_atomic(self._index, self.path / INDEX_FILE)
        self._dirty = False

    def close(self) -> None:
        """Flush the index and close the database; calling it again does nothing."""
        if self._db is None:
            return
        self.flush()
        self._db.close()
        self._db = None

    def __enter__(self) -> FaissMemory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------- reading

    def search(self, query: str, k: int = 3) -> list[MemoryHit]:
        """The k best entries for `query` by combined score, best first; refreshes their last_used.

        Each hit's entry and score are as they were when scored, before last_used was refreshed.
        """
        self._check_open()
        self._check_text(query, "search query")
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k <= 0:
            raise ValueError(f"search k must be a positive int, got {k!r}")
        n_candidates = min(int(k) * self.candidate_factor, self._index.ntotal)
        if n_candidates == 0:
            return []
        similarities, found = search_one(self._index, self._embed([query]), n_candidates)  # [1, C], [1, C]
        relevance = {int(i): float(s) for i, s in zip(found[0], similarities[0], strict=True) if i >= 0}
        now = self._clock()
        hits = []
        for entry in self._entries(relevance):
            parts = score_entry(relevance[entry.id], entry.last_used, entry.reward, now, self.weights)
            hits.append(MemoryHit(entry, parts.score, parts.relevance, parts.recency, parts.importance))
        # Ties go to the older entry so that equal scores rank the same way every time.
        hits.sort(key=lambda hit: (-hit.score, hit.entry.id))
        hits = hits[:k]
        if self.read_only:
            return hits
        with self._db:
            self._db.executemany(
                "UPDATE entries SET last_used = ? WHERE id = ?", [(now, h.entry.id) for h in hits]
            )
        return hits

    def get(self, entry_id: int) -> MemoryEntry | None:
        """The entry with this id, or None."""
        self._check_open()
        entries = self._entries([int(entry_id)])
        return entries[0] if entries else None

    def __len__(self) -> int:
        self._check_open()
        return int(self._index.ntotal)

    def ids(self, writer: str | None = None) -> list[int]:
        """Every stored id, ascending; with `writer`, only the ids of the entries it wrote. Ids only
        grow, so a checkpoint can record the newest one."""
        self._check_open()
        if writer is None:
            return [int(i) for i in self._sqlite_ids()]
        rows = self._db.execute("SELECT id FROM entries WHERE writer = ? ORDER BY id", (writer,))
        return [int(row[0]) for row in rows]

    def _entries(self, ids: Iterable[int]) -> list[MemoryEntry]:
        ids = list(ids)
        if not ids:
            return []
        placeholders = ",".join("?" * len(ids))
        rows = self._db.execute(f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE id IN ({placeholders})", ids)
        return [MemoryEntry(*row) for row in rows]

    # ----------------------------------------------------------------------------------- checks

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.asarray(self.embedder.embed(texts), dtype=np.float32)  # [N, dim]
        if vectors.shape != (len(texts), self.dim):
            raise MemoryConfigError(
                f"embedder {_embedder_name(self.embedder)!r} returned shape {vectors.shape} for "
                f"{len(texts)} texts; expected ({len(texts)}, {self.dim})"
            )
        return vectors

    def refresh(self) -> int:
        """Catch up with what another process committed to this folder: index new entries, drop
        deleted ones. Returns the number of entries added to the index."""
        self._check_open()
        stored, indexed = self._sqlite_ids(), index_ids(self._index)
        if np.setdiff1d(indexed, stored).size:  # deletions: rebuild, as delete() does for most kinds
            self._index = self._rebuild_index()
            return max(len(stored) - len(indexed), 0)
        new = np.setdiff1d(stored, indexed)
        for start in range(0, len(new), _SAMPLE_CHUNK):
            chunk = [int(i) for i in new[start : start + _SAMPLE_CHUNK]]
            placeholders = ",".join("?" * len(chunk))
            rows = self._db.execute(
                f"SELECT id, vector FROM entries WHERE id IN ({placeholders}) ORDER BY id", chunk
            ).fetchall()
            ids = np.asarray([row[0] for row in rows], dtype=np.int64)
            vectors = np.frombuffer(b"".join(row[1] for row in rows), dtype="<f4").reshape(
                len(rows), self.dim
            )
            add_vectors(self._index, ids, vectors)
        if needs_retrain(self._index, self.index_kind):
            self._index = self._rebuild_index()
        return int(new.size)

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise ValueError(
                f"memory at {self._where()} is open read-only (another process, rank 0, writes it): "
                "write through that process"
            )

    def _check_open(self) -> None:
        if self._db is None:
            raise ValueError(f"memory at {self._where()} is closed")

    @staticmethod
    def _check_text(text: object, what: str) -> None:
        if not isinstance(text, str):
            raise ValueError(f"{what} must be a str, got {type(text).__name__}")
        if not text.strip():
            raise ValueError(f"{what} must not be empty or whitespace")
