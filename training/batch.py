"""Turn records -> padded tensors, the logits that predict their completions, and micro-batches.

Sequences are left-padded so every completion ends at the last position: the model then computes
logits only for the last `K` positions (`logits_to_keep`), where K covers the longest completion.
The vocabulary projection is most of a small model's cost, so prompts are never projected.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from training.shared_prefix import SharedPrefix
from training.types import Turn


@dataclass(frozen=True)
class TurnBatch:
    input_ids: torch.Tensor  # [B, T] prompt + completion, left-padded
    attention_mask: torch.Tensor  # [B, T]
    position_ids: torch.Tensor  # [B, T]
    targets: torch.Tensor  # [B, K] completion tokens, left-padded to K (the longest completion)
    loss_mask: torch.Tensor  # [B, K] 1 on generated tokens, 0 on observations and padding
    old_logprobs: torch.Tensor  # [B, K] rollout logprobs (0 where loss_mask is 0)
    episode_ids: torch.Tensor  # [B]
    policy_logprobs: torch.Tensor | None = None  # [B, K] Turn.policy_logprobs, when every turn has them
    ref_logprobs: torch.Tensor | None = None  # [B, K] Turn.ref_logprobs, when every turn has them

    @property
    def completion_len(self) -> int:
        return self.targets.shape[1]


def prompt_batch(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu") -> dict:
    """The forward-pass inputs of token sequences (prompts, or prompts with their completions, as collate
    builds), left-padded so each one's last token is at the last position: input_ids, attention_mask and
    position_ids, [B, T] each."""
    if not prompts or not all(prompts):
        raise ValueError("prompt_batch() needs at least one sequence, none of them empty")
    length = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), length), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, length - len(p) :] = torch.tensor(list(p))
        attention[i, length - len(p) :] = 1
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    to = torch.device(device)
    return {
        "input_ids": input_ids.to(to),
        "attention_mask": attention.to(to),
        "position_ids": position_ids.to(to),
    }


def collate(turns: Sequence[Turn], pad_id: int, device: torch.device | str = "cpu") -> TurnBatch:
    """Left-pad prompts+completions to one length, completions to another."""
    if not turns:
        raise ValueError("collate() needs at least one turn")
    for t in turns:
        if not (len(t.completion_ids) == len(t.loss_mask) == len(t.logprobs)) or not t.completion_ids:
            raise ValueError(f"turn of role {t.role!r} has inconsistent or empty completion/mask/logprobs")
    inputs = prompt_batch([tuple(t.prompt_ids) + tuple(t.completion_ids) for t in turns], pad_id)
    k = max(len(t.completion_ids) for t in turns)
    b = len(turns)
    targets = torch.full((b, k), pad_id, dtype=torch.long)
    mask = torch.zeros((b, k), dtype=torch.float32)
    old = torch.zeros((b, k), dtype=torch.float32)
    for i, t in enumerate(turns):
        c = len(t.completion_ids)
        targets[i, k - c :] = torch.tensor(t.completion_ids)
        mask[i, k - c :] = torch.tensor(t.loss_mask, dtype=torch.float32)
        old[i, k - c :] = torch.tensor(t.logprobs, dtype=torch.float32)
    episodes = torch.tensor([t.episode for t in turns], dtype=torch.long)
    policy = _right_aligned([t.policy_logprobs for t in turns], k)
    ref = _right_aligned([t.ref_logprobs for t in turns], k)
    to = torch.device(device)
    return TurnBatch(
        inputs["input_ids"].to(to),
        inputs["attention_mask"].to(to),
        inputs["position_ids"].to(to),
        targets.to(to),
        mask.to(to),
        old.to(to),
        episodes.to(to),
        None if policy is None else policy.to(to),
        None if ref is None else ref.to(to),
    )


def _right_aligned(rows: Sequence[Sequence[float] | None], k: int) -> torch.Tensor | None:
    """Per-token values of each turn's completion, left-padded with 0 to `k` as collate pads the
    completions, [B, K]; None unless every turn has them."""
    if any(r is None for r in rows):
        return None
    out = torch.zeros((len(rows), k), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, k - len(r) :] = torch.tensor(r, dtype=torch.float32)
    return out


def completion_logits(
    model: torch.nn.Module, batch: TurnBatch, prefix: SharedPrefix | None = None
) -> torch.Tensor:
    """Logits that predict each completion token, [B, K, V].

    With left padding the completion occupies the last K positions, predicted by positions
    T-K-1 .. T-2; one extra kept position covers the first of them. With `prefix` the batch holds
    turns' tails, each after the prefix's tokens (training.shared_prefix): positions count on from
    the prefix, and each row sees the prefix and its own tail, not the padding between them.
    """
    k = batch.completion_len
    if prefix is None:
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=k + 1,
            use_cache=False,
        )
    else:
        rows = batch.input_ids.shape[0]
        seen = torch.ones(
            (rows, prefix.length), dtype=batch.attention_mask.dtype, device=batch.input_ids.device
        )
        out = model(
            input_ids=batch.input_ids,
            attention_mask=torch.cat([seen, batch.attention_mask], dim=-1),
            position_ids=batch.position_ids + prefix.length,
            past_key_values=prefix.cache(rows),
            logits_to_keep=k + 1,
            use_cache=True,
        )
    return out.logits[:, :-1, :]  # [B, K, V]


def micro_batches(turns: Sequence[Turn], size: int, *, whole_episodes: bool = False) -> list[list[Turn]]:
    """Split turns into micro-batches of similar length (less padding), in a stable order.

    `whole_episodes` keeps every turn of an episode in one micro-batch (a sequence-level ratio
    pools over the episode); a micro-batch then holds whole episodes up to `size` turns, or one
    larger episode.
    """
    if size < 1:
        raise ValueError(f"micro batch size must be >= 1, got {size}")
    order = sorted(range(len(turns)), key=lambda i: len(turns[i].prompt_ids) + len(turns[i].completion_ids))
    ordered = [turns[i] for i in order]
    if not whole_episodes:
        return [ordered[i : i + size] for i in range(0, len(ordered), size)]
    episodes: dict[int, list[Turn]] = {}
    for t in ordered:
        episodes.setdefault(t.episode, []).append(t)
    chunks: list[list[Turn]] = []
    for group in episodes.values():
        if chunks and len(chunks[-1]) + len(group) <= size:
            chunks[-1].extend(group)
        else:
            chunks.append(list(group))
    return chunks


def minibatches(turns: Sequence[Turn], parts: int, *, seed: int) -> list[list[Turn]]:
    """`turns` in `parts` minibatches of whole episodes: the episodes shuffled by `seed` (one order per
    pass over a rollout), then cut into `parts` runs as even as can be. Always `parts` lists, some empty
    when there are fewer episodes, so every rank takes as many optimizer steps."""
    if parts < 1:
        raise ValueError(f"minibatches needs parts >= 1, got {parts}")
    episodes: dict[int, list[Turn]] = {}
    for t in turns:
        episodes.setdefault(t.episode, []).append(t)
    order = sorted(episodes)
    random.Random(seed).shuffle(order)
    cuts = [round(i * len(order) / parts) for i in range(parts + 1)]
    return [[t for e in order[cuts[i] : cuts[i + 1]] for t in episodes[e]] for i in range(parts)]
