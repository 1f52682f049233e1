"""GRPO maths as small pure functions: group advantages, token logprobs, ratios, clipped loss, aggregation.

Tensors in, tensors out (advantages and the choice of trainable turns: floats and Turn records); nothing
here knows about episodes or models. Shapes: B rows (one row is one role turn), T completion tokens, V
vocabulary. `mask` is 1 on generated tokens and 0 on padding and on
observation tokens (tool results), which never contribute to a loss or a metric.

    ratio = importance_ratio(logprobs, old_logprobs, mask, "token")
    loss, metrics = grpo_loss(logprobs, logprobs.detach(), None, advantages, mask,
                              rollout_logprobs=rollout_logprobs, **settings.loss_kwargs())

Rollout backends score tokens with other kernels than the trainer (vLLM, bf16 KV-cache decode), so
the policy that sampled a batch differs a little from the one the trainer holds. With `tis_cap` set,
the PPO ratio is taken against the trainer's own (detached) logprobs, and each token's surrogate is
weighted by the truncated importance weight min(pi_trainer / pi_rollout, cap) (Yao et al. 2025,
"truncated importance sampling"): the rollout's numerics decide the weight, never the clipping.

Tests with hand-worked numbers: `pytest tests/training/test_grpo.py`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from training.types import Turn

RATIO_LEVELS = ("token", "turn", "sequence")
FLAT = 1e-6  # rewards within this of each other count as equal: the group has no signal
# grpo.advantage=gae: each turn against the value heads (training.value, meta_agent.learning.credit.assign_gae),
# so not one of ADVANTAGES, which are taken from the rewards alone
GAE = "gae"
# grpo.reflection_credit: the keys of meta_agent.learning.credit.REFLECTION_CREDITS, named again here
# because training/ may not import meta_agent (tests/meta_agent/test_registries.py keeps the two equal)
REFLECTION_CREDIT_NAMES = ("episode", "round", "revision", "none")
PENALTY_ONLY_RULES = ("unscaled", "scaled", "dropped")  # grpo.penalty_only_groups (outcome_advantages)
SPREADS = ("reward", "outcome")  # what a group must vary in to be trained on (filter_zero_variance)
KL_REFERENCES = ("base", "start")  # what grpo.beta's KL pulls toward


@dataclass
class GRPOSettings:
    """The `grpo:` settings: advantages, clipped surrogate, KL, aggregation, backend-mismatch correction."""

    eps_low: float = 0.2  # ratio clipped below at 1 - eps_low (PPO's epsilon)
    eps_high: float = 0.28  # ratio clipped above at 1 + eps_high; > eps_low leaves room to explore (DAPO)
    beta: float = 0.0  # weight of the k3 KL to the reference (kl_reference); 0 skips the reference pass
    # the KL's reference: base (the backbone with every adapter switched off: free, but after SFT it is the
    # policy before the warm start, which on a generated task scores 0) | start (each role's adapter as the
    # GRPO stage began, its SFT result: the reference of InstructGPT and verl; one more forward pass of
    # every trained turn a step, kept in the checkpoints folder so that resume= goes on against it)
    kl_reference: str = "base"
    ratio_level: str = "token"  # "token", "turn" (GSPO over one turn) or "sequence" (over the episode)
    aggregation: str = "token-mean"  # "token-mean", "seq-mean-token-mean" or "dr-grpo"
    scale_advantages: bool = True  # divide by the group's std; False is Dr.GRPO's unscaled advantage
    # the baseline: grpo (group mean, / group std when scale_advantages) | rloo (leave-one-out mean of
    # the group, unscaled) | reinforce_pp (REINFORCE++: mean and std over the role's whole batch)
    advantage: str = "grpo"
    # the meta-thinker's reflect turns: episode (the episode's advantage, as every turn) | round (each
    # reflection its own: roles.rewards.round_reflection_reward, normalised among the task's reflections)
    # | none (not trained by GRPO: advantage 0, left out of the update; where a reflection can change no
    # answer, as in one round with the memory off, the episode's outcome is noise to it)
    # | revision (Reflect-Retry-Reward: only reflections of a wrong round learn, 1 when their revision's
    # round came out right, else 0, normalised among the task's reflections of that round)
    reflection_credit: str = "episode"
    # groups whose episodes all ended right or all wrong, so that their rewards differ by penalties only:
    # unscaled (reward minus the group's mean: a penalty moves the policy by its own size) | scaled (also
    # divided by the group's std, as any group: a 0.2 penalty gets a full-size advantage) | dropped (0)
    penalty_only_groups: str = "unscaled"
    filter_zero_variance: bool = True  # drop groups whose rewards are all equal: they carry no signal
    # which groups it drops: reward (its rewards all equal) | outcome (its episodes all right or all
    # wrong, however their penalties set their rewards apart: DAPO's dynamic-sampling criterion)
    zero_variance_of: str = "reward"
    max_tokens: int | None = None  # Dr.GRPO's constant normaliser per row; required by "dr-grpo"
    # Truncated importance sampling against the rollout backend's logprobs: the weight's upper bound.
    # None: the ratio is taken against the rollout's logprobs directly (no correction).
    tis_cap: float | None = 2.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.eps_low < 1.0:
            raise ValueError(f"grpo.eps_low must be in [0, 1), got {self.eps_low}")
        if self.eps_high < 0.0:
            raise ValueError(f"grpo.eps_high must be >= 0, got {self.eps_high}")
        if self.beta < 0.0:
            raise ValueError(f"grpo.beta must be >= 0, got {self.beta}")
        if self.kl_reference not in KL_REFERENCES:
            raise ValueError(f"grpo.kl_reference must be one of {KL_REFERENCES}, got {self.kl_reference!r}")
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(f"grpo.ratio_level must be one of {RATIO_LEVELS}, got {self.ratio_level!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"grpo.aggregation must be one of {tuple(AGGREGATIONS)}, got {self.aggregation!r}"
            )
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise ValueError(f"grpo.max_tokens must be a positive int or null, got {self.max_tokens}")
        if self.aggregation == "dr-grpo" and self.max_tokens is None:
            raise ValueError("grpo.aggregation 'dr-grpo' needs grpo.max_tokens (the constant normaliser)")
        if self.advantage not in advantage_names():
            raise ValueError(f"grpo.advantage must be one of {advantage_names()}, got {self.advantage!r}")
        if self.advantage in ("reinforce_pp", GAE) and self.filter_zero_variance:
            raise ValueError(
                f"grpo.advantage={self.advantage} gives a task whose episodes all scored the same a nonzero "
                "advantage: set grpo.filter_zero_variance=false with it"
            )
        if self.advantage == GAE and self.reflection_credit != "episode":
            raise ValueError(
                "grpo.advantage=gae already credits each reflection by itself (what followed it against "
                "the value head's estimate before it): set grpo.reflection_credit=episode with it"
            )
        if self.zero_variance_of not in SPREADS:
            raise ValueError(f"grpo.zero_variance_of must be one of {SPREADS}, got {self.zero_variance_of!r}")
        if self.zero_variance_of == "outcome" and not self.filter_zero_variance:
            raise ValueError(
                "grpo.zero_variance_of=outcome says which groups grpo.filter_zero_variance drops: set "
                "grpo.filter_zero_variance=true with it"
            )
        if self.reflection_credit not in REFLECTION_CREDIT_NAMES:
            raise ValueError(
                f"grpo.reflection_credit must be one of {REFLECTION_CREDIT_NAMES}, got {self.reflection_credit!r}"
            )
        if self.penalty_only_groups not in PENALTY_ONLY_RULES:
            raise ValueError(
                f"grpo.penalty_only_groups must be one of {PENALTY_ONLY_RULES}, got {self.penalty_only_groups!r}"
            )
        if self.tis_cap is not None and not self.tis_cap >= 1.0:
            raise ValueError(
                f"grpo.tis_cap must be >= 1 (or null to turn the correction off), got {self.tis_cap}"
            )

    def loss_kwargs(self) -> dict:
        """The keyword arguments of `grpo_loss` that come from these settings."""
        return {
            "eps_low": self.eps_low,
            "eps_high": self.eps_high,
            "beta": self.beta,
            "ratio_level": self.ratio_level,
            "aggregation": self.aggregation,
            "max_tokens": self.max_tokens,
            "tis_cap": self.tis_cap,
        }


# --- group advantages (plain Python: one float per row) -------------------------------------------


def _groups(rewards: Sequence[float], keys: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    if len(rewards) != len(keys):
        raise ValueError(f"rewards and keys differ in length: {len(rewards)} != {len(keys)}")
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return groups


def _sample_std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def zero_variance_groups(
    rewards: Sequence[float], keys: Sequence[Hashable], eps: float = FLAT
) -> set[Hashable]:
    """Keys of groups whose rewards are all equal (max - min <= eps), groups of one included.

    Every row of such a group has advantage 0, so it adds no gradient, only cost and dilution.
    """
    return {
        key
        for key, idx in _groups(rewards, keys).items()
        if max(rewards[i] for i in idx) - min(rewards[i] for i in idx) <= eps
    }


def group_advantages(
    rewards: Sequence[float], keys: Sequence[Hashable], *, scale: bool = True, eps: float = FLAT
) -> list[float]:
    """Each reward minus its group's mean, divided by (group sample std + eps) when `scale`.

    Rows with equal keys form a group (in this project the key is (role, task)). Groups whose rewards
    are all equal, groups of one included, get advantage 0 exactly. The std is the sample std
    (Bessel-corrected, n - 1), as TRL's GRPOTrainer computes it.
    """
    flat = zero_variance_groups(rewards, keys, eps)
    advantages = [0.0] * len(rewards)
    for key, idx in _groups(rewards, keys).items():
        if key in flat:
            continue
        values = [float(rewards[i]) for i in idx]
        mean = sum(values) / len(values)
        denom = _sample_std(values) + eps if scale else 1.0
        for i, value in zip(idx, values, strict=True):
            advantages[i] = (value - mean) / denom
    return advantages


def rloo_advantages(rewards: Sequence[float], keys: Sequence[Hashable]) -> list[float]:
    """RLOO: each reward minus the mean of the other rewards of its group, unscaled; groups of one get 0.
    Equal to n / (n - 1) times the group-centred reward."""
    advantages = [0.0] * len(rewards)
    for idx in _groups(rewards, keys).values():
        if len(idx) < 2:
            continue
        total = sum(float(rewards[i]) for i in idx)
        for i in idx:
            advantages[i] = float(rewards[i]) - (total - float(rewards[i])) / (len(idx) - 1)
    return advantages


def batch_advantages(rewards: Sequence[float], batches: Sequence[Hashable], eps: float = FLAT) -> list[float]:
    """REINFORCE++: each reward minus the mean over its whole batch (rows with an equal `batches` key:
    here one role's episodes of the rollout), divided by that batch's sample std + eps; a batch whose
    rewards are all equal gets 0."""
    return group_advantages(rewards, batches, scale=True, eps=eps)


# The estimators of grpo.advantage taken from rewards alone, one signature: rewards and their rows' keys
# (role, task, ...) in, one advantage per row out; `scale` is grpo.scale_advantages.
Advantage = Callable[..., list[float]]  # (rewards, keys, *, scale: bool) -> list[float]


def grpo_baseline(rewards: Sequence[float], keys: Sequence[tuple], *, scale: bool) -> list[float]:
    """GRPO: the group's (equal keys') mean, divided by its std when `scale` (group_advantages)."""
    return group_advantages(rewards, keys, scale=scale)


def rloo_baseline(rewards: Sequence[float], keys: Sequence[tuple], *, scale: bool) -> list[float]:
    """RLOO: the leave-one-out mean of the group, unscaled whatever `scale` says (its own normalisation)."""
    return rloo_advantages(rewards, keys)


def reinforce_pp_baseline(rewards: Sequence[float], keys: Sequence[tuple], *, scale: bool) -> list[float]:
    """REINFORCE++: mean and std over the role's (the key's first part's) whole batch, always scaled."""
    return batch_advantages(rewards, [key[0] for key in keys])


ADVANTAGES: dict[str, Advantage] = {
    "grpo": grpo_baseline,
    "rloo": rloo_baseline,
    "reinforce_pp": reinforce_pp_baseline,
}


def advantage_names() -> tuple[str, ...]:
    """Every valid grpo.advantage: the registered estimators and gae (read now, so an entry added to
    ADVANTAGES counts)."""
    return (*ADVANTAGES, GAE)


def advantages(
    rewards: Sequence[float], keys: Sequence[tuple], kind: str, *, scale: bool = True
) -> list[float]:
    """The advantages of `grpo.advantage` = `kind` (an ADVANTAGES entry) for rows keyed (role, task, ...)."""
    if kind not in ADVANTAGES:
        raise ValueError(f"advantage {kind!r} is not taken from rewards alone; one of {tuple(ADVANTAGES)}")
    return ADVANTAGES[kind](rewards, keys, scale=scale)


def outcome_advantages(
    rewards: Sequence[float],
    keys: Sequence[tuple],
    correct: Sequence[bool],
    kind: str,
    *,
    scale: bool = True,
    penalty_only: str = "unscaled",
) -> list[float]:
    """`advantages(rewards, keys, kind, scale)`, but in groups (rows of one key) whose rows are all
    `correct` or all not, where only penalties set the rewards apart, as grpo.penalty_only_groups says:
    "unscaled" takes those groups' advantages with scale=False, "dropped" sets them to 0, "scaled" keeps
    them. outcome_advantages([1, 0.8, 0, 1], [a, a, b, b], [T, T, F, T], "grpo") -> [0.1, -0.1, -0.71, 0.71]
    (group a is all right: its 0.2 apart is a penalty's, not blown up to +-1 by its std)."""
    if penalty_only not in PENALTY_ONLY_RULES:
        raise ValueError(f"penalty_only must be one of {PENALTY_ONLY_RULES}, got {penalty_only!r}")
    out = advantages(rewards, keys, kind, scale=scale)
    if penalty_only == "scaled":
        return out
    outcomes: dict[tuple, set[bool]] = defaultdict(set)
    for key, c in zip(keys, correct, strict=True):
        outcomes[key].add(bool(c))
    flat = [i for i, key in enumerate(keys) if len(outcomes[key]) == 1]
    if not flat:
        return out
    if penalty_only == "dropped":
        redone = [0.0] * len(flat)
    else:
        redone = advantages([rewards[i] for i in flat], [keys[i] for i in flat], kind, scale=False)
    for i, value in zip(flat, redone, strict=True):
        out[i] = value
    return out


def trainable_turns(
    turns: Sequence[Turn], *, filter_zero_variance: bool, by: str = "reward", eps: float = FLAT
) -> list[Turn]:
    """The turns a GRPO update learns from, in order: those with a generated token, and, when
    `filter_zero_variance`, only those of (role, group) groups that vary `by` "reward" (the others have
    advantage 0: no gradient, only cost and dilution) or by "outcome" (some of the group's episodes
    right and some wrong: a group all wrong or all right is dropped even where penalties set its
    rewards apart, as DAPO's dynamic sampling drops it)."""
    if by not in SPREADS:
        raise ValueError(f"trainable_turns(by=...) must be one of {SPREADS}, got {by!r}")
    keys = [(t.role, t.group) for t in turns]
    if by == "outcome":
        ungraded = sorted({t.group for t in turns if t.correct is None})
        if ungraded:
            raise ValueError(f"filtering by outcome needs graded turns; {ungraded[:3]} have none")
        values = [float(t.correct) for t in turns]
    else:
        values = [t.reward for t in turns]
    flat = zero_variance_groups(values, keys, eps) if filter_zero_variance else set()
    return [t for t, key in zip(turns, keys, strict=True) if key not in flat and any(t.loss_mask)]


# --- per-token quantities from logits ----------------------------------------------------------------


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature) at `targets`: logits [B, T, V], targets [B, T] -> [B, T] float32.

    One row at a time, as gather minus logsumexp, so at most one [T, V] float32 copy of the logits
    exists at once (the full log_softmax of a 49k vocabulary is the largest tensor of a training step).
    Differentiable with respect to the logits.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    rows = []
    for row_logits, row_targets in zip(logits, targets, strict=True):
        scaled = row_logits.float() / temperature  # [T, V]
        picked = scaled.gather(-1, row_targets.long().unsqueeze(-1)).squeeze(-1)  # [T]
        rows.append(picked - torch.logsumexp(scaled, dim=-1))  # [T]
    return torch.stack(rows) if rows else logits.new_zeros(targets.shape, dtype=torch.float32)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / temperature) per position: [B, T, V] -> [B, T] float32, row by row."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    rows = []
    for row_logits in logits:
        logp = torch.log_softmax(row_logits.float() / temperature, dim=-1)  # [T, V]
        rows.append(-(logp.exp() * logp).sum(-1))  # [T]
    return torch.stack(rows) if rows else logits.new_zeros(logits.shape[:2], dtype=torch.float32)


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(policy || reference) per token: [B, T], [B, T] -> [B, T], >= 0.

    k3 = exp(ref - lp) - (ref - lp) - 1, unbiased for the KL and never negative. The reference is a
    constant (detached); the gradient flows through `logprobs`.
    """
    delta = ref_logprobs.detach() - logprobs  # [B, T]
    return torch.exp(delta) - delta - 1.0


# --- importance ratio, clipped surrogate, aggregation --------------------------------------------------


def _masked_row_sums(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    keep = mask.bool()
    return torch.where(keep, values, 0.0).sum(-1), keep.sum(-1).to(values.dtype)  # [B], [B]


def importance_ratio(
    logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    level: str = "token",
    episode_ids: Tensor | None = None,
) -> Tensor:
    """pi / pi_old per token: [B, T] -> [B, T]; the gradient flows through `logprobs` only.

    level "token": exp(lp - old) per token. "turn": exp of the masked mean of (lp - old) over the row
    (GSPO's length-normalised sequence ratio; a row is one role turn), the same value on every token of
    the row. "sequence": the same mean taken over all masked tokens of all rows sharing an entry of
    `episode_ids` [B]; without `episode_ids` it equals "turn". Masked tokens count in no mean, and at
    token level their ratio is 1. A row (or episode) with no masked token has ratio 1.
    """
    log_ratio = torch.where(mask.bool(), logprobs - old_logprobs.detach(), 0.0)  # [B, T]
    if level == "token":
        return torch.exp(log_ratio)
    if level not in RATIO_LEVELS:
        raise ValueError(f"unknown ratio level {level!r}; expected one of {RATIO_LEVELS}")
    sums, counts = _masked_row_sums(log_ratio, mask)  # [B], [B]
    if level == "sequence" and episode_ids is not None:
        _, inverse = torch.unique(episode_ids, return_inverse=True)  # [B] -> episode slot, < B
        slots = sums.shape[0]  # an upper bound on the episodes, so no device sync to count them
        sums = sums.new_zeros(slots).index_add(0, inverse, sums)[inverse]  # [B]
        counts = counts.new_zeros(slots).index_add(0, inverse, counts)[inverse]  # [B]
    mean_log_ratio = sums / counts.clamp(min=1.0)  # [B]
    return torch.exp(mean_log_ratio).unsqueeze(-1).expand_as(log_ratio)  # [B, T]


def truncated_is_weight(
    trainer_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    cap: float,
    level: str = "token",
    episode_ids: Tensor | None = None,
) -> Tensor:
    """min(pi_trainer / pi_rollout, cap) per token, at the ratio's level: [B, T] -> [B, T], no gradient.

    The correction for a rollout backend whose numerics differ from the trainer's (truncated
    importance sampling). At level "turn" or "sequence" the weight is one value per turn or episode,
    from the mean log difference, like the ratio at that level. Masked tokens get weight 1.
    """
    ratio = importance_ratio(trainer_logprobs.detach(), rollout_logprobs, mask, level, episode_ids)
    return ratio.clamp(max=cap)


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor]:
    """PPO's clipped objective, negated: ratio [B, T], advantages [B] (or [B, T]) -> loss [B, T], clipped.

    loss = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A). `clipped` [B, T] bool marks the
    tokens where the clipped term won the min and differs from the unclipped one (its gradient is 0).
    """
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # [B, 1] or [B, T]
    adv = adv.to(ratio.dtype)
    unclipped = ratio * adv  # [B, T]
    clipped_term = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv  # [B, T]
    return -torch.minimum(unclipped, clipped_term), clipped_term < unclipped


# The reductions of grpo.aggregation, one signature: the per-token loss with 0 off the mask [B, T], the
# mask as bool [B, T] and grpo.max_tokens in, a scalar out (0, still attached, with no masked token).
Aggregation = Callable[[Tensor, Tensor, int | None], Tensor]


def token_mean(masked: Tensor, keep: Tensor, max_tokens: int | None) -> Tensor:
    """Sum / number of masked tokens: long turns weigh more."""
    return masked.sum() / keep.sum().clamp(min=1)


def seq_mean_token_mean(masked: Tensor, keep: Tensor, max_tokens: int | None) -> Tensor:
    """Mean over rows of each row's masked mean, rows without tokens left out (the GRPO paper)."""
    counts = keep.sum(-1)  # [B]
    row_means = masked.sum(-1) / counts.clamp(min=1)  # [B]
    has_tokens = counts > 0
    return torch.where(has_tokens, row_means, 0.0).sum() / has_tokens.sum().clamp(min=1)


def dr_grpo(masked: Tensor, keep: Tensor, max_tokens: int | None) -> Tensor:
    """Sum / (B * max_tokens): a constant normaliser, so no length bias (Dr.GRPO)."""
    if max_tokens is None or max_tokens <= 0:
        raise ValueError(f"aggregation 'dr-grpo' needs a positive max_tokens, got {max_tokens}")
    return masked.sum() / (masked.shape[0] * max_tokens)


AGGREGATIONS: dict[str, Aggregation] = {
    "token-mean": token_mean,
    "seq-mean-token-mean": seq_mean_token_mean,
    "dr-grpo": dr_grpo,
}
# Those divided by the number of masked tokens: a micro-batch's loss then counts by its share of the batch's
# tokens (training.trainer), any other's by its share of the rows, so the micro-batches sum to the batch's.
TOKEN_NORMALISED = ("token-mean",)


def aggregate(per_token: Tensor, mask: Tensor, mode: str, max_tokens: int | None = None) -> Tensor:
    """Reduce a per-token loss [B, T] over masked tokens to a scalar by AGGREGATIONS[mode]."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; expected one of {tuple(AGGREGATIONS)}")
    keep = mask.bool()
    return AGGREGATIONS[mode](torch.where(keep, per_token, 0.0), keep, max_tokens)


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    keep = mask.bool()
    return float(values[keep].float().mean()) if keep.any() else 0.0


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    beta: float,
    ratio_level: str,
    aggregation: str,
    max_tokens: int | None = None,
    episode_ids: Tensor | None = None,
    rollout_logprobs: Tensor | None = None,
    tis_cap: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The GRPO loss of one batch and its metrics.

    logprobs [B, T] (current policy, with grad), old_logprobs [B, T] (the policy the ratio is taken
    against), ref_logprobs [B, T] or None, advantages [B] (or [B, T]), mask [B, T], episode_ids [B] for
    ratio_level "sequence". Per token: clipped surrogate + beta * k3 KL (the KL term only when beta > 0;
    it needs ref_logprobs), then `aggregate`d. With `tis_cap` and rollout_logprobs [B, T], the surrogate
    is weighted by `truncated_is_weight(old_logprobs, rollout_logprobs)`; old_logprobs are then the
    trainer's. Metrics are masked token means unless named otherwise: "loss", "kl" (0 without a
    reference), "clip_fraction", "ratio_mean", "tis_weight_mean" and "tis_capped_fraction" (1 and 0
    without TIS), "tokens" (count).
    """
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (the reference model's logprobs)")
    if tis_cap is not None and rollout_logprobs is None:
        raise ValueError("tis_cap needs rollout_logprobs (the rollout backend's logprobs)")
    ratio = importance_ratio(logprobs, old_logprobs, mask, ratio_level, episode_ids)  # [B, T]
    per_token, clipped = clipped_surrogate(ratio, advantages, eps_low, eps_high)  # [B, T]
    weight = None
    if tis_cap is not None:
        weight = truncated_is_weight(old_logprobs, rollout_logprobs, mask, tis_cap, ratio_level, episode_ids)
        per_token = per_token * weight
    kl = kl_k3(logprobs, ref_logprobs) if ref_logprobs is not None else None  # [B, T]
    if kl is not None and beta > 0:
        per_token = per_token + beta * kl
    loss = aggregate(per_token, mask, aggregation, max_tokens)

    with torch.no_grad():
        metrics = {
            "loss": float(loss.detach()),
            "kl": _masked_mean(kl, mask) if kl is not None else 0.0,
            "clip_fraction": _masked_mean(clipped, mask),
            "ratio_mean": _masked_mean(ratio, mask),
            "tis_weight_mean": _masked_mean(weight, mask) if weight is not None else 1.0,
            "tis_capped_fraction": _masked_mean(weight >= tis_cap, mask) if weight is not None else 0.0,
            "tokens": float(mask.bool().sum()),
        }
    return loss, metrics


def sft_loss(logprobs: Tensor, mask: Tensor) -> Tensor:
    """Masked mean negative log-likelihood: logprobs [B, T], mask [B, T] -> scalar (0 without tokens)."""
    return aggregate(-logprobs, mask, "token-mean")
