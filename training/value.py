"""Value heads on the shared backbone and generalised advantage estimation (GAE) over a role's turns.

    heads = ValueHeads(["meta_thinker", "executor"], hidden_size=576, settings=ValueSettings())
    values = heads.predict("executor", features)          # features [N, H]: one state per turn
    advantages, returns = turn_gae(turns, values, gamma=1.0, lam=0.95)
    metrics = heads.fit("executor", features, returns)    # regress the head on what followed

A role's turns in one episode are its trajectory: the state a turn acts in is its prompt (the question,
the plan, the work so far), its action the completion, and its only reward the role's episode reward,
received after its last turn. The value of a state is the head's estimate of that reward from the
backbone's last hidden state at the state's last token, computed with the role's adapter active and
without gradient, so the head learns on fixed features and never pulls on the adapters. Each turn then
gets its own advantage (GAE), where `grpo.advantage: grpo` gives every turn of a role in an episode the
same one: a plan and a reflection of one episode are told apart by what the head expected before each.

Nothing here knows about episodes: Turn records in (training.types), floats and tensors out. Tests with
hand-worked numbers: `pytest tests/training/test_value.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from training.batch import prompt_batch
from training.distributed import Ranks
from training.types import Turn


@dataclass
class ValueSettings:
    """The `value:` settings: GAE's discount and lambda, and how the per-role value heads learn
    (read only with grpo.advantage=gae)."""

    gamma: float = 1.0  # discount per turn of a role: 1 values every turn by the episode's outcome
    # GAE's lambda: 1 is the Monte-Carlo return minus the value (the head is only a baseline), 0 the
    # one-step TD error (each turn judged by the head's estimate after it); PPO's 0.95 between
    lam: float = 0.95
    lr: float = 1.0e-3  # the heads' Adam learning rate
    fit_steps: int = 20  # full-batch Adam steps on each rollout's returns, after its advantages are taken

    def __post_init__(self) -> None:
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"value.{name} must be in [0, 1], got {value}")
        if not self.lr > 0:
            raise ValueError(f"value.lr must be > 0, got {self.lr}")
        if self.fit_steps < 0:
            raise ValueError(f"value.fit_steps must be >= 0, got {self.fit_steps}")


@runtime_checkable
class ValueEstimator(Protocol):
    """What GAE needs of a value function (check_estimator is its conformance check): an estimate of the
    state each turn acted in (its role and prompt), then a fit on those turns' returns. The trainer's
    value heads are one (PolicyTrainer.value_estimator); a researcher's own goes in the same place."""

    def estimate(self, turns: Sequence[Turn]) -> list[float]:
        """One finite float per turn, in order, from the turn's role and prompt alone."""
        ...

    def learn(self, turns: Sequence[Turn], returns: Sequence[float]) -> dict[str, float]:
        """Fit on the returns of turns estimated before; returns metrics by name."""
        ...


def check_estimator(estimator: ValueEstimator, turns: Sequence[Turn]) -> None:
    """Raise AssertionError naming the first broken promise of the ValueEstimator protocol on `turns`
    (at least two, of different prompts or roles): one finite float per turn, in order, unaffected by
    the rest of the batch or by what a turn wrote; learning from returns moves the estimates toward them."""
    turns = list(turns)
    if len(turns) < 2:
        raise ValueError("check_estimator() needs at least two turns")
    _expect(
        isinstance(estimator, ValueEstimator), f"{estimator!r} does not satisfy the ValueEstimator protocol"
    )
    values = estimator.estimate(turns)
    _expect(len(values) == len(turns), f"estimate() gave {len(values)} values for {len(turns)} turns")
    _expect(
        all(isinstance(v, float) and v == v and abs(v) != float("inf") for v in values),
        "estimate() gave a non-finite or non-float value",
    )
    alone = [estimator.estimate([t])[0] for t in turns]
    _expect(
        all(abs(a - v) < 1e-4 for a, v in zip(alone, values, strict=True)),
        "a turn's value depends on the rest of its batch",
    )
    reversed_values = estimator.estimate(turns[::-1])[::-1]
    _expect(
        all(abs(a - v) < 1e-4 for a, v in zip(reversed_values, values, strict=True)),
        "estimate() does not keep the turns' order",
    )
    rewritten = [
        Turn(
            t.role,
            t.group,
            t.prompt_ids,
            t.completion_ids[:1],
            t.loss_mask[:1],
            t.logprobs[:1],
            -t.reward,
            t.episode,
        )
        for t in turns
    ]
    _expect(
        all(abs(a - v) < 1e-4 for a, v in zip(estimator.estimate(rewritten), values, strict=True)),
        "a turn's value depends on what it wrote or earned, not only on its state",
    )
    targets = [v + (1.0 if i % 2 == 0 else -1.0) for i, v in enumerate(values)]
    before = sum((t - v) ** 2 for t, v in zip(targets, values, strict=True))
    metrics = estimator.learn(turns, targets)
    _expect(
        isinstance(metrics, dict) and all(isinstance(k, str) for k in metrics),
        "learn() must return a dict of metrics by name",
    )
    after = sum((t - v) ** 2 for t, v in zip(targets, estimator.estimate(turns), strict=True))
    _expect(
        after < before,
        f"learn() did not move the estimates toward the returns (squared error {before:.4f} -> {after:.4f})",
    )


def _expect(condition: bool, rule: str) -> None:
    if not condition:
        raise AssertionError(f"ValueEstimator conformance: {rule}")


def gae(rewards: Sequence[float], values: Sequence[float], gamma: float, lam: float) -> tuple[list, list]:
    """GAE over one trajectory that ends after its last step (the value after it is 0): returns
    (advantages, returns), A_t = sum_k (gamma lam)^k delta_{t+k} with delta_t = r_t + gamma V_{t+1} - V_t,
    and the value targets A_t + V_t."""
    if len(rewards) != len(values):
        raise ValueError(f"gae() got {len(rewards)} rewards and {len(values)} values")
    advantages = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        following = values[t + 1] if t + 1 < len(values) else 0.0
        delta = rewards[t] + gamma * following - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages, [a + v for a, v in zip(advantages, values, strict=True)]


def turn_gae(
    turns: Sequence[Turn], values: Sequence[float], *, gamma: float, lam: float
) -> tuple[list, list]:
    """GAE for every turn: the turns of one (episode, role), in the order given, are one trajectory whose
    only reward is that role's reward (Turn.reward, the same on each of its turns), at its last turn.
    Returns (advantages, returns) aligned with `turns`."""
    if len(turns) != len(values):
        raise ValueError(f"turn_gae() got {len(turns)} turns and {len(values)} values")
    trajectories: dict[tuple[int, str], list[int]] = {}
    for i, turn in enumerate(turns):
        trajectories.setdefault((turn.episode, turn.role), []).append(i)
    advantages, returns = [0.0] * len(turns), [0.0] * len(turns)
    for rows in trajectories.values():
        rewards = [0.0] * (len(rows) - 1) + [turns[rows[-1]].reward]
        adv, ret = gae(rewards, [values[i] for i in rows], gamma, lam)
        for i, a, r in zip(rows, adv, ret, strict=True):
            advantages[i], returns[i] = a, r
    return advantages, returns


def explained_variance(predicted: Sequence[float], targets: Sequence[float]) -> float:
    """1 - Var(targets - predicted) / Var(targets): 1 for a perfect head, 0 for one that predicts the
    mean, below 0 for worse; 0 when the targets do not vary (nothing to explain)."""
    n = len(targets)
    if n != len(predicted):
        raise ValueError(f"explained_variance() got {len(predicted)} predictions and {n} targets")
    if n == 0:
        return 0.0
    mean = sum(targets) / n
    total = sum((y - mean) ** 2 for y in targets)
    if total == 0:
        return 0.0
    errors = [y - p for p, y in zip(predicted, targets, strict=True)]
    error_mean = sum(errors) / n
    return 1.0 - sum((e - error_mean) ** 2 for e in errors) / total


def prompt_states(model: torch.nn.Module, pad_id: int, prompts: Sequence[Sequence[int]], device) -> Tensor:
    """The backbone's last hidden state (after its final norm) at each prompt's last token, without
    gradient, [N, H] float32: the state a turn on that prompt acts in, as the value heads read it. `model`
    is the PEFT-wrapped backbone, with the adapter of the role whose state it is active."""
    base = model.get_base_model()
    decoder = getattr(base, base.base_model_prefix)  # the transformer without its vocabulary head
    with torch.no_grad():
        hidden = decoder(**prompt_batch(prompts, pad_id, device), use_cache=False).last_hidden_state[:, -1]
    return hidden.float()


class ValueHeads(torch.nn.Module):
    """One linear head per role on the backbone's hidden state (float32, zero at the start: every state
    is first valued at 0), each with its own Adam state. Under several processes `fit` sums the
    gradients over ranks, so every rank's heads stay the same."""

    def __init__(self, roles: Sequence[str], hidden_size: int, settings: ValueSettings | None = None):
        super().__init__()
        self.settings = settings or ValueSettings()
        self.heads = torch.nn.ModuleDict({role: torch.nn.Linear(hidden_size, 1) for role in roles})
        for head in self.heads.values():
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
        self.optimizer = torch.optim.Adam(self.parameters(), lr=self.settings.lr)

    def predict(self, role: str, features: Tensor) -> Tensor:
        """Values [N] of N states' features [N, H] under `role`'s head."""
        return self.heads[role](features.float()).squeeze(-1)

    def fit(self, role: str, features: Tensor, targets: Sequence[float], ranks: Ranks | None = None) -> dict:
        """`settings.fit_steps` full-batch Adam steps of the mean squared error of `role`'s head against
        `targets` over every rank's states; returns its "value/<role>/..." metrics: the loss before and
        after, and the explained variance of the values the advantages were taken with."""
        ranks = ranks or Ranks()
        head = self.heads[role]
        y = torch.tensor([float(v) for v in targets], dtype=torch.float32, device=features.device)
        x = features.float()
        total = ranks.sum([float(len(y))])[0]
        with torch.no_grad():
            before = [float(v) for v in self.predict(role, x)]
        losses = []
        for _ in range(self.settings.fit_steps + 1):
            self.optimizer.zero_grad(set_to_none=True)
            loss = ((self.predict(role, x) - y) ** 2).sum() / max(total, 1.0)
            losses.append(ranks.sum([float(loss.detach())])[0])
            if len(losses) > self.settings.fit_steps:
                break  # the last pass only measures
            loss.backward()
            ranks.sum_gradients(list(head.parameters()))
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not before:  # this rank had no state of the role: it took part in the collectives, reports nothing
            return {}
        # loss_before and loss_after are over every rank already; the others are this rank's, which the
        # run log averages over the ranks that report them
        return {
            f"value/{role}/loss_before": losses[0],
            f"value/{role}/loss_after": losses[-1],
            f"value/{role}/explained_variance": explained_variance(before, [float(v) for v in y]),
            f"value/{role}/mean": sum(before) / len(before),
        }

    def state(self) -> dict:
        """The heads and their optimizer, for a checkpoint."""
        return {"heads": self.heads.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state(self, saved: dict) -> None:
        self.heads.load_state_dict(saved["heads"])
        self.optimizer.load_state_dict(saved["optimizer"])
