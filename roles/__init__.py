"""Role specs from config: prompts, output grammar and parser, per-role reward shaping."""

from roles.grammar import (
    ACCEPT,
    REVISE,
    ExecutorStep,
    Grammar,
    MetaOutput,
    parse_executor,
    parse_plan,
    parse_reflection,
    recover_answer,
    states_answer,
)
from roles.rewards import Outcome, reflection_reward, role_reward, round_reflection_reward
from roles.spec import (
    EXECUTOR,
    KINDS,
    META_THINKER,
    RewardSpec,
    RoleConfigError,
    RoleSpec,
    SamplingSpec,
    check_roles,
    executors,
    meta_thinker,
)

__all__ = [
    "ACCEPT",
    "REVISE",
    "EXECUTOR",
    "KINDS",
    "META_THINKER",
    "ExecutorStep",
    "Grammar",
    "MetaOutput",
    "Outcome",
    "RewardSpec",
    "RoleConfigError",
    "RoleSpec",
    "SamplingSpec",
    "check_roles",
    "executors",
    "meta_thinker",
    "parse_executor",
    "parse_plan",
    "parse_reflection",
    "recover_answer",
    "states_answer",
    "reflection_reward",
    "role_reward",
    "round_reflection_reward",
]
