"""Helpers of the training tests: chat prompts as ids, and turns credited as the training loop does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from training.grpo import group_advantages
from training.types import Turn


def chat_ids(tokenizer, text: str) -> tuple[int, ...]:
    """One user message through the chat template, ready for the assistant's reply."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return tuple(ids["input_ids"] if hasattr(ids, "keys") else ids)


def with_advantages(turns: Sequence[Turn], *, scale: bool = True) -> list[Turn]:
    """Each turn with its reward normalised within its (role, group) group: what meta_agent.learning.credit gives
    the turns of one-turn-per-role episodes."""
    advantages = group_advantages([t.reward for t in turns], [(t.role, t.group) for t in turns], scale=scale)
    return [replace(t, advantage=a) for t, a in zip(turns, advantages, strict=True)]
