"""Token-level view of the backbone's chat format, shared by the episode, env and runner."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from training.model_files import ModelMismatch


class ChatFormat:
    """Wraps a Hugging Face tokenizer with a chat template.

    Episodes are built from token ids, not strings, so what the trainer scores is exactly what was
    sampled: prompts come from the chat template, observations are encoded once and appended.
    """

    def __init__(self, tokenizer: Any):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ModelMismatch(
                "the model's tokenizer has no chat template: pass model.path=<an instruct or chat model folder>"
            )
        self.tokenizer = tokenizer

    @functools.cached_property
    def special_tokens(self) -> tuple[str, ...]:
        """Every special token the tokenizer knows: `all_special_tokens` and each added token marked
        special (SmolLM2's lists 3 of its 17 in all_special_tokens; the others still encode as one id)."""
        return special_tokens(self.tokenizer)

    def prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def decode_raw(self, ids: Sequence[int]) -> str:
        """With special tokens: what the model actually sees, for observations."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


def special_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The special tokens of `tokenizer` (see ChatFormat.special_tokens), longest first."""
    found = set(getattr(tokenizer, "all_special_tokens", ()))
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    found |= {str(token) for token in added.values() if getattr(token, "special", False)}
    return tuple(sorted((t for t in found if t), key=lambda t: (-len(t), t)))
