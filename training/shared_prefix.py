"""Turns that begin alike, trained over their common beginning once (`train.shared_prefix`).

    for shared, members in prefix_groups([t.prompt_ids for t in turns]):   # which turns share what
        prefix = SharedPrefix(model, turns[members[0]].prompt_ids[:shared])  # its forward pass, graph kept
        for turn in members: ... completion_logits(model, tail_batch, prefix); loss.backward()
        prefix.backward()           # the tails' gradients on its keys and values, through it once

A role's turns in one update begin alike: each starts with the role's system prompt, and the G turns
of one task also repeat the question (a plan turn's whole prompt). Trained one by one, every turn runs
its whole prompt forward and backward again. Here a group's common prefix runs forward once with its
graph kept; each turn runs only its tail (the rest of its prompt and its completion) over the prefix's
keys and values, held as leaves that collect the tails' gradients; once every tail has gone backward,
those gradients go back through the prefix's graph once. The losses only add up, so the adapters get
the gradient the whole turns would have given them, up to the order of floating-point sums
(`tests/training/test_shared_prefix.py` checks it against the turn-by-turn path).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from transformers import DynamicCache

# A prefix shared by fewer tokens is not worth its own forward call and graph.
MIN_SHARED = 16
# What one more prefix costs beside the tokens it saves (its forward call, its backward), in tokens.
GROUP_OVERHEAD = 8


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids two sequences share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prefix_groups(
    prompts: Sequence[Sequence[int]], min_shared: int = MIN_SHARED, overhead: int = GROUP_OVERHEAD
) -> list[tuple[int, list[int]]]:
    """The prompts' indices in groups that save the most tokens, each with how many leading tokens its
    members share: (shared, indices). A group shares at most one token less than its shortest prompt
    (a tail keeps the last prompt token, whose logits predict the completion's first), at least
    `min_shared`, and saves (members - 1) * shared - `overhead` tokens. The unshared prompts come last
    in one group with shared 0. Groups are runs of the prompts in sorted order (where common prefixes
    sit next to each other), cut where the savings are largest (dynamic programming over the cuts)."""
    order = sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))
    n = len(order)
    # next_to[j]: the prefix sorted prompt j shares with the one before it
    next_to = [0] + [common_length(prompts[order[j - 1]], prompts[order[j]]) for j in range(1, n)]
    best = [0] * (n + 1)  # best[j]: the most tokens saved over the first j sorted prompts
    cut: list[tuple[int, int]] = [(0, 0)] * (n + 1)  # best[j]'s last group: (its start, its shared)
    for j in range(1, n + 1):
        best[j], cut[j] = best[j - 1], (j - 1, 0)  # prompt j-1 alone
        shared = len(prompts[order[j - 1]]) - 1
        for i in range(j - 2, -1, -1):  # the group order[i:j]
            shared = min(shared, next_to[i + 1], len(prompts[order[i]]) - 1)
            if shared < min_shared:
                break  # a longer group shares no more
            saved = best[i] + (j - i - 1) * shared - overhead
            if saved > best[j]:
                best[j], cut[j] = saved, (i, shared)
    groups: list[tuple[int, list[int]]] = []
    alone: list[int] = []
    j = n
    while j > 0:
        i, shared = cut[j]
        if shared == 0:
            alone.append(order[j - 1])
        else:
            groups.append((shared, [order[k] for k in range(i, j)]))
        j = i
    groups.reverse()
    if alone:
        groups.append((0, sorted(alone)))
    return groups


class SharedPrefix:
    """The keys and values of one prefix, run forward once with its graph kept (training mode, with
    gradient). `cache(rows)` gives a micro-batch of tails a fresh cache over them; `backward()`, once
    every tail's loss has gone backward, sends what those tails left on the keys and values back
    through the prefix. Forgetting `backward()` loses the prefix's share of the gradient."""

    def __init__(self, model: torch.nn.Module, ids: Sequence[int], device: torch.device | str = "cpu"):
        if not ids:
            raise ValueError("SharedPrefix needs at least one token")
        self.length = len(ids)
        out = model(
            input_ids=torch.tensor([list(ids)], device=device),
            position_ids=torch.arange(self.length, device=device)[None],
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.past_key_values
        self._states = [state for layer in cache.layers for state in (layer.keys, layer.values)]
        self._leaves = [state.detach().requires_grad_(state.requires_grad) for state in self._states]
        # What the tails send each leaf, summed in float32: in bfloat16 a sum over many tails would round
        # at every addition, where the turn-by-turn passes add each turn's gradient into float32 weights.
        self._sums: list[torch.Tensor | None] = [None] * len(self._leaves)
        for i, leaf in enumerate(self._leaves):
            if leaf.requires_grad:
                leaf.register_hook(partial(self._add, i))

    def _add(self, i: int, grad: torch.Tensor) -> None:
        total = self._sums[i]
        self._sums[i] = grad.to(torch.float32, copy=True) if total is None else total.add_(grad)

    def cache(self, rows: int) -> DynamicCache:
        """A cache holding the prefix for `rows` rows; the tails' forward pass extends it."""
        if self._leaves is None:
            raise RuntimeError("this prefix has already gone backward")
        rows_of = [leaf.expand(rows, -1, -1, -1) for leaf in self._leaves]
        return DynamicCache(ddp_cache_data=list(zip(rows_of[::2], rows_of[1::2], strict=True)))

    def backward(self) -> None:
        """The tails' gradients on the prefix's keys and values, back through its graph (once)."""
        if self._leaves is None:
            raise RuntimeError("this prefix has already gone backward")
        sent = [
            (state, total.to(state.dtype))
            for state, total in zip(self._states, self._sums, strict=True)
            if total is not None
        ]
        self._states = self._leaves = self._sums = None
        if sent:
            torch.autograd.backward([state for state, _ in sent], [total for _, total in sent])
