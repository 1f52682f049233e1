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
    "role_reward",
]
