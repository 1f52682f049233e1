"""Key/value states of token sequences seen before, reused when a new prompt starts the same way.

    cache = PrefixCache(max_bytes=2 << 30)
    cache.store("executor", tokens, keys, values)      # keys/values: one [H, L, D] tensor per layer
    entry, n = cache.lookup("executor", prompt)         # the first n prompt tokens need no prefill

An episode asks for many generations whose prompts extend earlier ones: an executor's prompt after a
tool result is its previous prompt, what it wrote and the result; a reflection starts with the
meta-thinker's planning turn; the G episodes of a task share their first prompt. With left padding and
position ids counted from each row's first real token, the states of a prefix do not depend on the
batch it was computed in, so they can be copied into any later batch.

States depend on the weights: the cache holds a fingerprint of them (each parameter tensor's identity
and in-place version counter) and empties itself when the weights have changed since it was filled.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CachedPrefix:
    adapter: str
    tokens: torch.Tensor  # [L] token ids
    keys: tuple[torch.Tensor, ...]  # per layer [H, L, D]
    values: tuple[torch.Tensor, ...]  # per layer [H, L, D]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading tokens two 1-D id tensors share."""
    m = min(len(a), len(b))
    same = a[:m] == b[:m]
    return m if bool(same.all()) else int(same.int().cumprod(0).sum())


def weights_fingerprint(parameters: Iterable[torch.Tensor]) -> tuple[tuple[int, int], ...]:
    """Changes whenever a parameter is modified in place (optimizer step, load_state_dict) or replaced."""
    return tuple((p.data_ptr(), p._version) for p in parameters)


class PrefixCache:
    """Least-recently-used store of per-adapter prefix states, bounded by `max_bytes`."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"prefix cache size {max_bytes} must be >= 0 bytes (0 turns it off)")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, CachedPrefix] = OrderedDict()
        self._next_id = 0
        self._bytes = 0
        self._fingerprint: tuple | None = None
        self.hits = 0  # prompt tokens served from the cache since it was made
        self.misses = 0  # prompt tokens that needed a forward pass

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def validate(self, fingerprint: tuple) -> None:
        """Empty the cache if the weights are not the ones its states were computed with."""
        if fingerprint != self._fingerprint:
            self.clear()
            self._fingerprint = fingerprint

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def lookup(
        self, adapter: str, prompt: torch.Tensor, *, count: bool = True
    ) -> tuple[CachedPrefix | None, int]:
        """The entry sharing the longest prefix with `prompt`, and how many tokens it covers.

        At most len(prompt) - 1 tokens are covered: the last prompt token is always run, for its logits.
        count=False only looks: the hits and misses stay as they were, the entries' order too.
        """
        best, best_n = None, 0
        for key, entry in self._entries.items():
            if entry.adapter != adapter:
                continue
            n = common_prefix(entry.tokens, prompt)
            if n > best_n:
                best, best_n, best_key = entry, n, key
        n = min(best_n, len(prompt) - 1)
        if not count:
            return (best, n) if best is not None and n > 0 else (None, 0)
        if best is not None and n > 0:
            self._entries.move_to_end(best_key)
            self.hits += n
            self.misses += len(prompt) - n
            return best, n
        self.misses += len(prompt)
        return None, 0

    def store(self, entry: CachedPrefix) -> None:
        """Keep `entry`; entries it extends are dropped, the oldest go when the cache is full."""
        if self.max_bytes == 0 or entry.nbytes > self.max_bytes:
            return
        for key, old in list(self._entries.items()):
            if old.adapter == entry.adapter and common_prefix(old.tokens, entry.tokens) == len(old.tokens):
                self._drop(key)
        self._entries[self._next_id] = entry
        self._next_id += 1
        self._bytes += entry.nbytes
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: int) -> None:
        self._bytes -= self._entries.pop(key).nbytes
