"""Per-role reward shaping: one episode outcome becomes one reward per role.

Pure functions of an Outcome and a RewardSpec, so a researcher can read and test a reward by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from roles.spec import EXECUTOR, META_THINKER, RewardSpec


@dataclass(frozen=True)
class Outcome:
    """What happened in an episode, from one role's point of view."""

    correct: bool  # the episode's final answer passed the task's verifier
    format_ok: bool  # this role kept its grammar (tagged answer / tagged plan)
    tool_errors: int = 0  # failed or malformed tool calls made by this role
    leaked: bool = False  # meta-thinker only: it stated the answer itself


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
    else:
        raise ValueError(f"unknown role kind {kind!r}")
    return reward
