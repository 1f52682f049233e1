"""Credit for a rollout: each role's advantage in each episode, normalised within (role, task) groups.

    assign_advantages(episodes, scale=cfg.grpo.scale_advantages, kind=cfg.grpo.advantage,
                      reflection_credit=cfg.grpo.reflection_credit)   # onto every turn record
    turns = trainable_turns(training_turns(episodes, reflections=cfg.grpo.reflection_credit != "none"),
                            filter_zero_variance=cfg.grpo.filter_zero_variance, by=cfg.grpo.zero_variance_of)

An episode gives each role one reward (meta_agent.episode.reward.score); a role with several turns in an
episode (plan and reflection) counts once in its group's statistics, and all its turns share the advantage,
except the meta-thinker's reflections as REFLECTION_CREDITS[grpo.reflection_credit] sets them: under
"round" each is credited with what it did (roles.rewards.round_reflection_reward), normalised among the
reflections of the same task and round; under "none" they get 0 and `training_turns(episodes,
reflections=False)` leaves them out of the update; under "revision" (Reflect-Retry-Reward) only reflections
of a wrong round learn, from whether their revision came out right. The baselines are training.grpo.ADVANTAGES (grpo, rloo,
reinforce_pp). With grpo.advantage=gae each turn gets its own advantage against the value heads instead
(assign_gae, training.value):

    estimator = trainer.value_estimator()   # training.value.ValueEstimator
    returns = assign_gae(episodes, estimator.estimate(turns), gamma=cfg.value.gamma, lam=cfg.value.lam, scale=...)
    estimator.learn(turns, returns)         # turns = training_turns(episodes)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from meta_agent.episode.protocol import Episode
from meta_agent.episode.records import REFLECT, TurnRecord
from roles import META_THINKER, REVISE, round_reflection_reward
from training.grpo import advantages, batch_advantages, outcome_advantages
from training.types import Turn
from training.value import turn_gae


def credited_roles(episode: Episode) -> list[str]:
    """The roles that generated something in `episode`, in the order they first acted."""
    return list(dict.fromkeys(t.role for t in episode.turns if t.completion_ids))


def assign_advantages(
    episodes: Sequence[Episode],
    *,
    scale: bool = True,
    kind: str = "grpo",
    reflection_credit: str = "episode",
    penalty_only: str = "unscaled",
) -> None:
    """Set `advantage` on every turn record of the finished, scored `episodes`. grpo: its role's reward in
    that episode minus the mean over the group's episodes (the same role on the same task), divided by the
    group's std when `scale`; groups whose rewards are all equal get 0, and groups whose episodes all
    ended alike (right or wrong) as `penalty_only` says (training.grpo.outcome_advantages). Any other
    `kind`: its entry of training.grpo.ADVANTAGES. Then the meta-thinker's reflect turns as
    REFLECTION_CREDITS[reflection_credit] says."""
    if reflection_credit not in REFLECTION_CREDITS:
        raise ValueError(f"reflection credit {reflection_credit!r} is not one of {tuple(REFLECTION_CREDITS)}")
    rows = [(ep, role) for ep in episodes for role in credited_roles(ep)]
    rewards = [ep.rewards[role] for ep, role in rows]
    keys = [(role, ep.task.id) for ep, role in rows]
    correct = [ep.correct for ep, _ in rows]
    gained = outcome_advantages(rewards, keys, correct, kind, scale=scale, penalty_only=penalty_only)
    for (ep, role), advantage in zip(rows, gained, strict=True):
        for turn in ep.turns:
            if turn.role == role and turn.completion_ids:  # a turn with nothing generated trains nothing
                turn.advantage = advantage
    REFLECTION_CREDITS[reflection_credit](episodes, scale=scale, kind=kind)


def is_reflection(episode: Episode, turn: TurnRecord) -> bool:
    """Whether `turn` of `episode` is one of its meta-thinker's reflections."""
    role = episode.roles.get(turn.role)
    return role is not None and role.kind == META_THINKER and turn.kind == REFLECT


def round_advantages(episodes: Sequence[Episode], *, scale: bool = True, kind: str = "grpo") -> None:
    """Each meta-thinker reflect turn's advantage from its own round's credit (what its verdict did to
    correctness, weighted by the role's reward spec, minus its format_penalty where the reflection broke
    its tags or ran out of tokens before its verdict, and its revise_same_plan_penalty where it revised
    and the next round's plan is the same), normalised among the reflections of the same role, task and
    round in this rollout."""
    rows, credits, keys = [], [], []
    for ep in episodes:
        graded = [(r.correct, r.verdict) for r in ep.rounds]
        for turn in ep.turns:
            if not is_reflection(ep, turn) or not turn.completion_ids:
                continue
            if turn.round >= len(graded):
                continue  # the episode ended inside this reflection: it judged nothing
            rows.append(turn)
            spec = ep.roles[turn.role].reward
            broken = 0.0 if turn.format_ok else spec.format_penalty  # its own: not the plan's to pay
            same = spec.revise_same_plan_penalty if repeats_plan(ep, turn.round) else 0.0
            credits.append(round_reflection_reward(spec, graded, turn.round) - broken - same)
            keys.append((turn.role, ep.task.id, REFLECT, turn.round))
    for turn, advantage in zip(rows, advantages(credits, keys, kind, scale=scale), strict=True):
        turn.advantage = advantage


def repeats_plan(episode: Episode, k: int) -> bool:
    """Whether round k's reflection revised and round k + 1 carried out the same plan as round k."""
    rounds = episode.rounds
    return (
        rounds[k].verdict == REVISE
        and k + 1 < len(rounds)
        and rounds[k].plan is not None
        and rounds[k + 1].plan == rounds[k].plan
    )


def revision_advantages(episodes: Sequence[Episode], *, scale: bool = True, kind: str = "grpo") -> None:
    """Reflect-Retry-Reward: a reflection learns only from what its revision achieved. Reflections of a
    round that came out wrong are credited 1 when they revised and the next round came out right, else 0
    (accepted the miss, or revised into another miss), normalised among the reflections of the same role,
    task and round; every other reflection (of a right round, or with no round after it) gets 0."""
    rows, credits, keys = [], [], []
    for ep in episodes:
        for turn in ep.turns:
            if not is_reflection(ep, turn) or not turn.completion_ids:
                continue
            turn.advantage = 0.0
            k = turn.round
            if k >= len(ep.rounds) or ep.rounds[k].correct:
                continue  # it judged nothing, or judged a right answer: nothing to retry
            if not can_change_outcome(ep, turn):
                continue  # no round after it: its verdict could not be carried out
            fixed = ep.rounds[k].verdict == REVISE and k + 1 < len(ep.rounds) and ep.rounds[k + 1].correct
            rows.append(turn)
            credits.append(1.0 if fixed else 0.0)
            keys.append((turn.role, ep.task.id, REFLECT, k))
    for turn, advantage in zip(rows, advantages(credits, keys, kind, scale=scale), strict=True):
        turn.advantage = advantage


def episode_credit(episodes: Sequence[Episode], *, scale: bool = True, kind: str = "grpo") -> None:
    """Each reflection keeps its episode's advantage, as every turn of its role does."""


def no_credit(episodes: Sequence[Episode], *, scale: bool = True, kind: str = "grpo") -> None:
    """Each reflection gets advantage 0 (training_turns(reflections=False) also leaves it out of the update)."""
    for ep in episodes:
        for turn in ep.turns:
            if is_reflection(ep, turn):
                turn.advantage = 0.0


# grpo.reflection_credit: name -> what sets the meta-thinker's reflect turns' advantages once every turn
# has its episode's; one signature (episodes, *, scale, kind). A new name goes into
# training.grpo.REFLECTION_CREDIT_NAMES too (the settings there may not import this module).
ReflectionCredit = Callable[..., None]
REFLECTION_CREDITS: dict[str, ReflectionCredit] = {
    "episode": episode_credit,
    "round": round_advantages,
    "revision": revision_advantages,
    "none": no_credit,
}


def assign_gae(
    episodes: Sequence[Episode], values: Sequence[float], *, gamma: float, lam: float, scale: bool = True
) -> list[float]:
    """Set each learned turn's `advantage` by GAE over its role's turns in its episode, `values` being
    the value heads' estimates of the turns of training_turns(episodes), in that order; with `scale`
    whitened over each role's turns of the rollout (PPO's normalisation). Returns the turns' value
    targets (GAE's returns), in the same order."""
    turns = training_turns(episodes)
    gained, returns = turn_gae(turns, values, gamma=gamma, lam=lam)
    if scale:
        gained = batch_advantages(gained, [t.role for t in turns])
    records = [record for ep in episodes for record in ep.learned_turns if can_change_outcome(ep, record)]
    for record, advantage in zip(records, gained, strict=True):
        record.advantage = advantage
    return returns


def can_change_outcome(episode: Episode, turn: TurnRecord) -> bool:
    """False for a reflection of the last round (no round left to carry a revision out): whatever it
    writes, the answer stands, so it gets no gradient (training_turns leaves it out)."""
    return not (is_reflection(episode, turn) and turn.round + 1 >= episode.limits.max_rounds)


def training_turns(
    episodes: Sequence[Episode], *, reflections: bool = True, last_reflections: bool = False
) -> list[Turn]:
    """Every turn with a token to learn of the finished `episodes`, as the trainer's records, episode i
    numbered i (the numbers tie a role's turns of one episode together); without `reflections`, not the
    meta-thinker's reflect turns (grpo.reflection_credit=none); without `last_reflections` (GRPO), not
    those that cannot change the outcome (can_change_outcome); SFT learns them from demonstrations."""
    return [
        turn
        for i, ep in enumerate(episodes)
        for record, turn in zip(ep.learned_turns, ep.training_turns(i), strict=True)
        if (reflections or not is_reflection(ep, record))
        and (last_reflections or can_change_outcome(ep, record))
    ]


def credit_metrics(turns: Sequence[Turn], trained: Sequence[Turn], roles: Sequence[str]) -> dict[str, float]:
    """Per role, over its turns of the rollout: mean reward, mean and mean absolute advantage, and
    the share of turns no update learns from (zero-variance groups, filtered, and under
    grpo.reflection_credit=none the meta-thinker's reflections); the batch's turn counts."""
    metrics = {"train/turns": float(len(turns)), "train/filtered_turns": float(len(turns) - len(trained))}
    for role in roles:
        mine = [t for t in turns if t.role == role]
        if mine:
            n = len(mine)
            metrics[f"role/{role}/reward"] = sum(t.reward for t in mine) / n
            metrics[f"role/{role}/advantage"] = sum(t.advantage for t in mine) / n
            metrics[f"role/{role}/advantage_abs"] = sum(abs(t.advantage) for t in mine) / n
            metrics[f"role/{role}/filtered_fraction"] = 1 - sum(t.role == role for t in trained) / n
        metrics.update({f"role/{role}/{k}": v for k, v in advantage_shares(trained, role).items()})
    return metrics


def advantage_shares(trained: Sequence[Turn], role: str) -> dict[str, float]:
    """Of the advantage mass (sum of |advantage|) `role`'s trained turns carry, the share from (role, task)
    groups whose episodes all ended wrong, and from those that all ended right: the signal an update takes
    from penalties alone, with no outcome to tell its episodes apart. Empty when the role has no mass."""
    mine = [t for t in trained if t.role == role]
    total = sum(abs(t.advantage) for t in mine)
    if total == 0:
        return {}
    outcomes: dict[str, set] = {}
    for t in mine:
        outcomes.setdefault(t.group, set()).add(t.correct)
    mass = {
        flat: sum(abs(t.advantage) for t in mine if outcomes[t.group] == {flat}) / total
        for flat in (False, True)
    }
    return {"advantage_share_all_wrong": mass[False], "advantage_share_all_right": mass[True]}
