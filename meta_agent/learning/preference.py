"""Preference pairs mined from a rollout: the G episodes of a task, compared turn by turn.

    pairs = mine_pairs(episodes, kinds=cfg.dpo.pairs)   # PreferencePair(chosen, rejected, kind)

Two turns make a pair when they are of one role and one kind, saw the same prompt token for token
(the same question for a first plan; the same plan for the executor's first turn; the same plan and
work for a reflection), wrote different completions, and what followed them differs:

    plan        a meta-thinker's plan whose round ended right, over one whose round ended wrong
    execute     an executor's turn whose round ended right, over one whose round ended wrong
    reflection  a reflection whose verdict did more for the answer (roles.round_reflection_reward:
                a wrong answer revised into a right one over one accepted, ...) over one that did less

Within a bucket of equal prompts each distinct completion is valued at the mean over the turns that
wrote it, and every two distinct completions of different value make a pair (at most 6 for G = 4). Everything a pair needs is in the episodes: no second rollout.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from meta_agent.episode.protocol import Episode
from meta_agent.episode.records import EXECUTE, PLAN, REFLECT, TurnRecord
from roles import META_THINKER, round_reflection_reward
from training.preference import PreferencePair
from training.types import Turn

PAIR_KINDS = ("plan", "execute", "reflection")
_KIND_OF = {PLAN: "plan", EXECUTE: "execute", REFLECT: "reflection"}


def mine_pairs(episodes: Sequence[Episode], kinds: Sequence[str] = PAIR_KINDS) -> list[PreferencePair]:
    """The preference pairs of finished `episodes` (all G of each task among them), of `kinds`."""
    unknown = sorted(set(kinds) - set(PAIR_KINDS))
    if unknown:
        raise ValueError(f"dpo.pairs must be among {PAIR_KINDS}, got {unknown}")
    buckets: dict[tuple, list[tuple[float, Turn]]] = defaultdict(list)
    for i, ep in enumerate(episodes):
        if not ep.done:
            raise RuntimeError("mine_pairs() before every episode finished")
        learned = ep.learned_turns
        for record, turn in zip(learned, ep.training_turns(i), strict=True):
            kind = _KIND_OF.get(record.kind)
            if kind not in kinds or not _first_of_its_round(ep, record):
                continue
            value = _value(ep, record, kind)
            if value is None:
                continue
            key = (ep.task.id, record.role, kind, record.round, tuple(record.prompt_ids))
            buckets[key].append((value, turn))
    pairs = []
    for (_, _, kind, _, _), members in buckets.items():
        pairs += _matched(members, kind)
    return pairs


def _first_of_its_round(ep: Episode, record: TurnRecord) -> bool:
    """Whether `record` is its role's first turn of its kind in its round: later ones (a second
    executor segment) saw what came before them, not only the shared prompt."""
    for t in ep.turns:
        if t.role == record.role and t.kind == record.kind and t.round == record.round:
            return t is record
    return False


def _value(ep: Episode, record: TurnRecord, kind: str) -> float | None:
    """How well what followed the turn went: its round right (1) or wrong (0); a reflection's round
    credit. None: nothing to compare (the episode ended inside the turn's round)."""
    if record.round >= len(ep.rounds):
        return None
    if kind != "reflection":
        return float(ep.rounds[record.round].correct)
    role = ep.roles.get(record.role)
    if role is None or role.kind != META_THINKER:
        return None
    graded = [(r.correct, r.verdict) for r in ep.rounds]
    return round_reflection_reward(role.reward, graded, record.round)


def _matched(members: list[tuple[float, Turn]], kind: str) -> list[PreferencePair]:
    """Pairs of one bucket: its distinct completions, each valued at the mean of its turns' values (a
    text that went right once and wrong once is worth 0.5, so no two pairs contradict), every one against
    every other of lower value, the better first; each text stands for itself once (its first turn)."""
    by_text: dict[tuple[int, ...], list[tuple[float, Turn]]] = {}
    for value, turn in members:
        by_text.setdefault(turn.completion_ids, []).append((value, turn))
    texts = [(sum(v for v, _ in group) / len(group), group[0][1]) for group in by_text.values()]
    return [
        PreferencePair(better, worse, kind)
        for i, (high, better) in enumerate(texts)
        for low, worse in texts[i + 1 :] + texts[:i]
        if high > low
    ]


def pair_metrics(pairs: Sequence[PreferencePair]) -> dict[str, float]:
    """How many pairs of each kind the rollout gave."""
    counts = dict.fromkeys(PAIR_KINDS, 0)
    for pair in pairs:
        counts[pair.kind] += 1
    return {f"dpo/pairs_{kind}": float(n) for kind, n in counts.items()}
