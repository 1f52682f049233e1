"""Reflection made measurable: what each verdict did to the answer, and how much of the plan was done.

    metrics = reflection_metrics([reflected(ep) for ep in episodes])   # the `reflection/...` scalars
    counts = transitions([ep.rounds for ep in episodes])

Pure functions of graded rounds (meta_agent.episode.records.RoundRecord: each round's answer, whether it
is correct, the meta-thinker's verdict, whether it ended the episode). A rate whose denominator is empty
is None, which the logs leave out and the printed tables show as "n/a": never a made-up number.

- transitions: consecutive rounds of one episode, wrong->right, right->wrong, right->right,
  wrong->wrong, as counts and as shares of all transitions; `self_correction` is (wrong->right minus
  right->wrong) per episode.
- verdict calibration: each reflected round's verdict against its answer: accept|right, accept|wrong,
  revise|right, revise|wrong; the precision (revisions that were needed) and recall (wrong answers that
  were revised) of "revise when wrong".
- revision rate (revise verdicts per verdict), rounds used, the round of the final answer, answer leaks.
- what a revision changed, over revisions that a next round carried out: the share whose next round was
  shown the same plan (a fix that rewrote a step to what it already said, or a bare revise verdict), and
  the share whose next round gave the same answer again (it redid the same work).
- plan adherence: the share of the plan's steps the executors carried out, where the task defines it
  (meta_agent.analysis.adherence); the episodes it was measured on are counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from meta_agent.analysis.adherence import episode_adherence
from meta_agent.episode.protocol import Episode
from meta_agent.episode.records import RoundRecord
from roles.grammar import ACCEPT, REVISE

TRANSITIONS = ("wrong_to_right", "right_to_wrong", "right_to_right", "wrong_to_wrong")
VERDICTS = ("accept_right", "accept_wrong", "revise_right", "revise_wrong")


def ratio(part: float, whole: float) -> float | None:
    """part / whole, or None when there is nothing to divide by."""
    return part / whole if whole else None


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def standing(rounds: Sequence[RoundRecord]) -> list[bool]:
    """After each round, whether the episode's answer so far is right: a round that gave no answer leaves
    the previous round's standing (its answer stays the final one)."""
    out: list[bool] = []
    for r in rounds:
        out.append(r.correct if r.answer is not None or not out else out[-1])
    return out


def transitions(episodes: Sequence[Sequence[RoundRecord]]) -> Counter:
    """Counts of each kind of step between consecutive rounds of the same episode, judged by the answer
    standing after each round (see `standing`)."""
    counts: Counter = Counter(dict.fromkeys(TRANSITIONS, 0))
    for rounds in episodes:
        marks = standing(rounds)
        for before, after in zip(marks, marks[1:], strict=False):
            counts[f"{'right' if before else 'wrong'}_to_{'right' if after else 'wrong'}"] += 1
    return counts


def verdicts(episodes: Sequence[Sequence[RoundRecord]]) -> Counter:
    """Counts of each (verdict, correctness of the answer judged) over the rounds that were reflected on."""
    counts: Counter = Counter(dict.fromkeys(VERDICTS, 0))
    for rounds in episodes:
        for r in rounds:
            if r.verdict in (ACCEPT, REVISE):
                counts[f"{r.verdict}_{'right' if r.correct else 'wrong'}"] += 1
    return counts


def final_answer_round(rounds: Sequence[RoundRecord]) -> int | None:
    """The 1-based round whose answer is the episode's final one (the last round that answered)."""
    answered = [r.index for r in rounds if r.answer is not None]
    return answered[-1] + 1 if answered else None


def revisions_carried_out(episodes: Sequence[Sequence[RoundRecord]]) -> list[tuple[RoundRecord, RoundRecord]]:
    """(revised round, the round after it) for every revise verdict that a next round carried out."""
    return [
        (a, b) for rounds in episodes for a, b in zip(rounds, rounds[1:], strict=False) if a.verdict == REVISE
    ]


def round_metrics(episodes: Sequence[Sequence[RoundRecord]]) -> dict[str, float | None]:
    """Transitions, self-correction, verdict calibration, revisions and rounds, from graded rounds."""
    n = len(episodes)
    moves, judged = transitions(episodes), verdicts(episodes)
    steps, total = sum(moves.values()), sum(judged.values())
    right = judged["accept_right"] + judged["revise_right"]
    wrong = judged["accept_wrong"] + judged["revise_wrong"]
    revised = judged["revise_right"] + judged["revise_wrong"]
    out: dict[str, float | None] = {"episodes": float(n), "transitions": float(steps)}
    for name in TRANSITIONS:
        out[name] = float(moves[name])
        out[f"{name}_rate"] = ratio(moves[name], steps)
    # Per episode, where any episode had a second round to correct in (one round: nothing to measure).
    out["self_correction"] = ratio(moves["wrong_to_right"] - moves["right_to_wrong"], n) if steps else None
    out["verdicts"] = float(total)
    # verdicts the meta-thinker never wrote: neither a verdict nor a plan, so the protocol accepted
    # (counted as accepts above)
    untagged = sum(1 for rounds in episodes for r in rounds if r.verdict and not r.verdict_tagged)
    out["untagged_verdicts"] = float(untagged)
    for name in VERDICTS:
        out[name] = float(judged[name])
    out["accept_given_right"] = ratio(judged["accept_right"], right)
    out["revise_given_right"] = ratio(judged["revise_right"], right)
    out["accept_given_wrong"] = ratio(judged["accept_wrong"], wrong)
    out["revise_given_wrong"] = ratio(judged["revise_wrong"], wrong)
    out["revise_precision"] = ratio(judged["revise_wrong"], revised)
    out["revise_recall"] = ratio(judged["revise_wrong"], wrong)
    out["revision_rate"] = ratio(revised, total)
    carried = revisions_carried_out(episodes)
    out["revisions_carried_out"] = float(len(carried))
    out["revise_same_plan_rate"] = ratio(sum(a.plan == b.plan for a, b in carried), len(carried))
    same_answer = sum(b.answer is not None and b.answer == a.answer for a, b in carried)
    out["revise_same_answer_rate"] = ratio(same_answer, len(carried))
    out["rounds_used"] = mean([float(len(rounds)) for rounds in episodes])
    final = [final_answer_round(rounds) for rounds in episodes]
    out["final_answer_round"] = mean([float(r) for r in final if r is not None])
    return out


@dataclass(frozen=True)
class Reflected:
    """What the reflection metrics read of one finished episode (small, so ranks can gather them)."""

    rounds: tuple[RoundRecord, ...]
    leaked: bool  # the meta-thinker stated the answer where an executor reads it
    adherence: float | None  # meta_agent.analysis.adherence.episode_adherence
    planned: bool = True  # a meta-thinker took part (without one nothing can leak)


def reflected(episode: Episode) -> Reflected:
    return Reflected(
        tuple(episode.rounds), episode.leaked, episode_adherence(episode), episode.meta is not None
    )


def reflection_metrics(episodes: Sequence[Reflected]) -> dict[str, float | None]:
    """Every reflection metric of finished episodes, keyed "reflection/<name>" (see the module doc)."""
    out = round_metrics([ep.rounds for ep in episodes])
    out["answer_leaks"] = mean([float(ep.leaked) for ep in episodes if ep.planned])
    adherence = [ep.adherence for ep in episodes if ep.adherence is not None]
    out["plan_adherence"] = mean(adherence)
    out["plan_adherence_episodes"] = float(len(adherence))
    return {f"reflection/{k}": v for k, v in out.items()}


def defined(metrics: dict[str, float | None]) -> dict[str, float]:
    """The metrics that have a value (what TensorBoard and metrics.jsonl get)."""
    return {k: v for k, v in metrics.items() if v is not None}
