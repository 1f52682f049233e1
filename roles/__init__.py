"""Role specs from config: prompts, output grammar and parser, per-role reward shaping."""

from roles.grammar import (
    ExecutorStep,
    Grammar,
    MetaOutput,
    parse_executor,
    parse_plan,
    parse_reflection,
    recover_answer,
    states_answer,
)
from roles.rewards import Outcome, role_reward
from roles.spec import EXECUTOR, KINDS, META_THINKER, AdapterSpec, RewardSpec, RoleSpec, SamplingSpec

__all__ = [
    "EXECUTOR",
    "KINDS",
    "META_THINKER",
    "AdapterSpec",
    "ExecutorStep",
    "Grammar",
    "MetaOutput",
    "Outcome",
    "RewardSpec",
    "RoleSpec",
    "SamplingSpec",
    "parse_executor",
    "parse_plan",
    "parse_reflection",
    "recover_answer",
    "states_answer",
    "role_reward",
]
