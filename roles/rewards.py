"""Per-role reward shaping: one episode outcome becomes one reward per role.

Pure functions of an Outcome and a RewardSpec, so a researcher can read and test a reward by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from roles.grammar import ACCEPT, REVISE
from roles.spec import EXECUTOR, META_THINKER, RewardSpec


@dataclass(frozen=True)
class Outcome:
    """What happened in an episode, from one role's point of view."""

    correct: bool  # the episode's final answer passed the task's verifier
    format_ok: bool  # this role kept its grammar (tagged answer / tagged plan)
    tool_errors: int = 0  # failed or malformed tool calls made by this role
    leaked: bool = False  # meta-thinker only: it stated the answer itself
    # meta-thinker only: each round's (answer correct, verdict: accept | revise | None), in order
    rounds: tuple[tuple[bool, str | None], ...] = ()


def round_reflection_reward(spec: RewardSpec, rounds: Sequence[tuple[bool, str | None]], k: int) -> float:
    """What round k's reflection earns: accepting a wrong answer costs accept_wrong_penalty; a revise
    verdict on a right one costs revise_right_penalty; a revision whose next round turned wrong into
    right earns improvement_bonus, right into wrong costs regression_penalty, and one of a wrong answer
    that stayed wrong (or had no round left to be carried out) costs revise_unfixed_penalty. Without
    that last one, revising a wrong answer in the last round escapes accept_wrong_penalty for free.
    No verdict: 0."""
    correct, verdict = rounds[k]
    if verdict == ACCEPT:
        return -spec.accept_wrong_penalty if not correct else 0.0
    if verdict != REVISE:
        return 0.0
    if correct:
        following = rounds[k + 1][0] if k + 1 < len(rounds) else True
        return -spec.revise_right_penalty - (0.0 if following else spec.regression_penalty)
    fixed = k + 1 < len(rounds) and rounds[k + 1][0]
    return spec.improvement_bonus if fixed else -spec.revise_unfixed_penalty


def reflection_reward(spec: RewardSpec, rounds: Sequence[tuple[bool, str | None]]) -> float:
    """The sum over the episode's reflections of round_reflection_reward."""
    return sum(round_reflection_reward(spec, rounds, k) for k in range(len(rounds)))


def role_reward(kind: str, spec: RewardSpec, outcome: Outcome) -> float:
    """Executor: outcome minus format and tool-error penalties.

    Meta-thinker: the outcome of its executors, minus the leak penalty (it must plan, not solve)
    and the format penalty.
    """
    reward = spec.correct if outcome.correct else spec.wrong
    if not outcome.format_ok:
        reward -= spec.format_penalty
    if kind == EXECUTOR:
        reward -= min(spec.tool_error_penalty * outcome.tool_errors, spec.max_tool_error_penalty)
    elif kind == META_THINKER:
        if outcome.leaked:
            reward -= spec.leak_penalty
        reward += reflection_reward(spec, outcome.rounds)
    else:
        raise ValueError(f"unknown role kind {kind!r}")
    return reward
