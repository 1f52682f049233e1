"""Whether GRPO steps climb or re-randomise: per-step drift of the policy, logged beside the update.

    drift = Drift(trainer, turns=8)
    drift.fix(rollout_turns)          # first step, before its update: the SFT policy's logprobs of them
    before = drift.snapshot()
    trainer.grpo_step(...)
    metrics |= drift.measure(before)  # role/<r>/kl_to_start, role/<r>/update_norm, role/<r>/update_cosine

- `kl_to_start`: KL(start || now) on a fixed set of turns sampled from the policy the stage began with
  (after SFT: the first rollout's), estimated per token as (r - 1) - log r with r = pi_now / pi_start
  (k3, unbiased and never negative for tokens drawn from pi_start), averaged over their learned tokens.
- `update_norm`: the L2 norm of this step's change of the role's adapter weights.
- `update_cosine`: the cosine between this step's change and the previous step's. Near 0: the steps point
  in unrelated directions (noise); well above 0: they keep climbing the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from training.grpo import kl_k3 as grpo_kl_k3
from training.types import Turn


def kl_k3(start: Sequence[float], now: Sequence[float], mask: Sequence[int]) -> tuple[float, int]:
    """(sum over the tokens where `mask` is 1 of training.grpo.kl_k3, (r - 1) - log r with
    r = exp(now - start); how many tokens).

    kl_k3([0.0], [math.log(0.5)], [1]) -> (0.5 - 1 - log 0.5, 1) = (0.1931..., 1)."""
    learned = torch.tensor(mask, dtype=torch.bool)
    per_token = grpo_kl_k3(torch.tensor(start, dtype=torch.float64), torch.tensor(now, dtype=torch.float64))
    return float(per_token[learned].sum()), int(learned.sum())


def flat_cosine(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """The cosine between two lists of tensors read as one vector each; 0 when either is all zeros."""
    dot = sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b, strict=True))
    na, nb = flat_norm(a), flat_norm(b)
    return dot / (na * nb) if na > 0 and nb > 0 else 0.0


def flat_norm(a: Sequence[torch.Tensor]) -> float:
    return math.sqrt(sum(float(x.double().pow(2).sum()) for x in a))


def fixed_turns(turns: Sequence[Turn], per_role: int) -> list[Turn]:
    """The first `per_role` turns of each role with a learned token, in rollout order."""
    taken: dict[str, int] = {}
    out = []
    for t in turns:
        if any(t.loss_mask) and taken.get(t.role, 0) < per_role:
            taken[t.role] = taken.get(t.role, 0) + 1
            out.append(t)
    return out


class Drift:
    """The per-step drift metrics of one trainer's roles (module docstring). `per_role` 0: only the
    update's norm and cosine, no KL."""

    def __init__(self, trainer, per_role: int):
        self.trainer = trainer
        self.per_role = per_role
        self.turns: list[Turn] = []
        self.start: list[tuple[float, ...]] = []
        self.previous: dict[str, list[torch.Tensor]] = {}

    def fix(self, turns: Sequence[Turn]) -> None:
        """Take the fixed turns from a rollout of the start policy, and their logprobs under it now."""
        if self.turns or self.per_role <= 0:
            return
        self.turns = fixed_turns(turns, self.per_role)
        self.start = self.trainer.completion_logprobs(self.turns) if self.turns else []

    def snapshot(self) -> dict[str, list[torch.Tensor]]:
        return {role: self.trainer.snapshot(role) for role in self.trainer.backbone.adapters}

    def measure(self, before: Mapping[str, Sequence[torch.Tensor]]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for role, old in before.items():
            now = self.trainer.snapshot(role)
            delta = [b - a for a, b in zip(old, now, strict=True)]
            metrics[f"role/{role}/update_norm"] = flat_norm(delta)
            if role in self.previous:
                metrics[f"role/{role}/update_cosine"] = flat_cosine(self.previous[role], delta)
            self.previous[role] = delta
        if self.turns:
            rows = self.trainer.completion_logprobs(self.turns)
            sums: dict[str, list[float]] = {}
            for t, start, now in zip(self.turns, self.start, rows, strict=True):
                total, n = kl_k3(start, now, t.loss_mask)
                acc = sums.setdefault(t.role, [0.0, 0])
                acc[0] += total
                acc[1] += n
            for role, (total, n) in sums.items():
                if n:
                    metrics[f"role/{role}/kl_to_start"] = total / n
        return metrics
