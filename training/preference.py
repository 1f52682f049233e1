"""Preference losses on pairs of one role's turns: DPO, IPO and SimPO.

    losses, stats = preference_loss(chosen, rejected, ref_chosen, ref_rejected,
                                    chosen_tokens, rejected_tokens, settings=PreferenceSettings())

Each input is one number per pair, [P]: the summed logprob of the chosen (or rejected) completion's
generated tokens under the policy being trained, and under the reference (the role's adapter as it
was before the preference stage); `*_tokens` count those tokens. The losses, per pair:

    dpo    -log sigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected)))     (Rafailov et al.)
    ipo    (((chosen - ref_chosen) / n_c - (rejected - ref_rejected) / n_r) - 1 / (2 beta))^2
                                                  (Azar et al.; logprobs averaged over tokens, as TRL does)
    simpo  -log sigmoid(beta * (chosen / n_c - rejected / n_r) - gamma)
                                                  (Meng et al.: no reference, a target margin gamma)

Plain tensors in, plain tensors out: the trainer (training.trainer.PolicyTrainer.preference_step) computes
the logprobs and backpropagates the mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from training.types import Turn

PREFERENCE_LOSSES = ("dpo", "ipo", "simpo")


@dataclass(frozen=True)
class PreferencePair:
    """Two turns of one role, `chosen` preferred to `rejected`, with their summed logprobs under the
    reference (None until scored; simpo needs none). `kind` says what was compared ("plan",
    "reflection", ...), for metrics."""

    chosen: Turn
    rejected: Turn
    kind: str = ""
    ref_chosen: float | None = None
    ref_rejected: float | None = None

    def __post_init__(self) -> None:
        if self.chosen.role != self.rejected.role:
            raise ValueError(
                f"a pair's turns must be of one role, got {self.chosen.role} and {self.rejected.role}"
            )

    @property
    def role(self) -> str:
        return self.chosen.role


@dataclass
class PreferenceSettings:
    """The `dpo:` loss settings."""

    loss: str = "dpo"  # dpo | ipo | simpo (reference-free, length-normalised, with a target margin)
    beta: float = 0.1  # how far from the reference the implied reward may pull (dpo, ipo); simpo's scale
    gamma: float = 0.5  # simpo's target margin between the chosen and rejected mean logprobs, times beta

    def __post_init__(self) -> None:
        if self.loss not in PREFERENCE_LOSSES:
            raise ValueError(f"dpo.loss must be one of {PREFERENCE_LOSSES}, got {self.loss!r}")
        if not self.beta > 0:
            raise ValueError(f"dpo.beta must be > 0, got {self.beta}")
        if self.gamma < 0:
            raise ValueError(f"dpo.gamma must be >= 0, got {self.gamma}")

    @property
    def needs_reference(self) -> bool:
        return self.loss != "simpo"


def preference_loss(
    chosen: Tensor,
    rejected: Tensor,
    ref_chosen: Tensor | None,
    ref_rejected: Tensor | None,
    chosen_tokens: Tensor,
    rejected_tokens: Tensor,
    settings: PreferenceSettings,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-pair losses [P] and, per pair, the implied rewards of the chosen and rejected completions
    (beta times the log-ratio to the reference: dpo's summed, ipo's per token; simpo: beta times the mean
    logprob) and whether the chosen one's is the larger. The gradient flows through `chosen` and
    `rejected` only."""
    s = settings
    if s.needs_reference and (ref_chosen is None or ref_rejected is None):
        raise ValueError(f"dpo.loss={s.loss} needs the reference's logprobs")
    n_c, n_r = chosen_tokens.clamp(min=1).to(chosen.dtype), rejected_tokens.clamp(min=1).to(rejected.dtype)
    if s.loss == "dpo":
        reward_c, reward_r = chosen - ref_chosen.detach(), rejected - ref_rejected.detach()
        losses = -F.logsigmoid(s.beta * (reward_c - reward_r))
    elif s.loss == "ipo":
        reward_c, reward_r = (chosen - ref_chosen.detach()) / n_c, (rejected - ref_rejected.detach()) / n_r
        losses = (reward_c - reward_r - 1 / (2 * s.beta)) ** 2
    else:
        reward_c, reward_r = chosen / n_c, rejected / n_r
        losses = -F.logsigmoid(s.beta * (reward_c - reward_r) - s.gamma)
    with torch.no_grad():
        stats = {
            "chosen_reward": s.beta * reward_c.detach(),
            "rejected_reward": s.beta * reward_r.detach(),
            "accuracy": (reward_c.detach() > reward_r.detach()).float(),
        }
    return losses, stats
