"""Records shared by generation and training. `training/` consumes these; it never sees episodes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request samples. A role's configured sampling is `roles.<role>.sampling`; the episode
    turns it into these, with the stops and the token budget of the moment."""

    temperature: float  # 0 means greedy
    max_new_tokens: int
    top_p: float = 1.0  # 1: the whole distribution (no nucleus)
    stop: tuple[str, ...] = ()  # generation ends after the first of these appears in the decoded text
    # > 0: generation ends ("repetition") once its last this-many tokens are one pattern repeated 4 or
    # more times (see repeats_at_end); 0: never
    repetition_stop: int = 0


def repeats_at_end(tokens: Sequence[int], span: int) -> bool:
    """Whether the last `span` tokens are periodic with a period of at most span // 4: one pattern
    repeated at least four times, the signature of a degenerate loop ("1. 1. 1. ...")."""
    if span < 4 or len(tokens) < span:
        return False
    tail = tokens[len(tokens) - span :]
    for period in range(1, span // 4 + 1):
        if all(tail[i] == tail[i + period] for i in range(span - period)):
            return True
    return False


def first_repetition(tokens: Sequence[int], span: int) -> int | None:
    """The shortest prefix length n at which repeats_at_end(tokens[:n], span) holds, or None."""
    if span < 4:
        return None
    for n in range(span, len(tokens) + 1):
        if repeats_at_end(tokens[:n], span):
            return n
    return None


@dataclass(frozen=True)
class GenerationRequest:
    adapter: str | None  # role adapter name; None runs the bare backbone
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    seed: int | None = None  # per-request seed makes a request reproducible whatever batch it is in


@dataclass(frozen=True)
class GenerationResult:
    token_ids: tuple[int, ...]  # sampled tokens, up to and including the stop string or EOS
    logprobs: tuple[float, ...]  # log p of each sampled token under the sampling distribution
    text: str  # decoded token_ids (special tokens removed)
    finish_reason: str  # "stop" (stop string), "eos", "length" or "repetition" (see repetition_stop)
    stop: str | None = None  # which stop string ended it


@dataclass(frozen=True)
class Turn:
    """One role turn as the trainer sees it: a prompt and a completion with a loss mask.

    Tool results inserted into the completion by the environment are observation, not action:
    their mask is 0 and their logprobs are 0.
    """

    role: str
    group: str  # GRPO group key part: the task id (the trainer groups by (role, group))
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]  # 1 for generated tokens, 0 for observation tokens; len == completion
    logprobs: tuple[float, ...]  # rollout logprobs; 0.0 where loss_mask is 0
    reward: float = 0.0
    episode: int = -1  # episode index within its batch, to tie turns of one episode together
    advantage: float = 0.0  # GRPO: the episode's reward normalised within its (role, group) group
    correct: bool | None = None  # whether the turn's episode ended right (None: not graded)
    # The trainer's own logprobs of the completion before the first of several updates on this rollout
    # (filled by PolicyTrainer with train.updates_per_rollout or train.minibatches above 1 and TIS on):
    # the "old" policy of every later update's ratio. None: one update, whose old policy is itself.
    policy_logprobs: tuple[float, ...] | None = None
    # The KL reference's logprobs of the completion (grpo.kl_reference=start: under the adapters the GRPO
    # stage began with; filled by PolicyTrainer before the step's first update); 0.0 where loss_mask is 0.
    # None: the trainer takes them from the backbone with its adapters off, micro-batch by micro-batch.
    ref_logprobs: tuple[float, ...] | None = None


class GenerationBackend(Protocol):
    """Turns a batch of requests into results, one per request, in order.

    A batch may mix adapters (roles); every backend passes tests/training/test_backend_conformance.py.
    """

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]: ...
