"""Role specs: what a role is told, which tools it may call, how it samples and how it is rewarded.

These records are the schema of the `roles:` config (meta_agent.settings.RoleConfig adds each role's
adapter and learning rate; meta_agent/config.py registers them with Hydra); the episode code takes them
as plain typed data.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from roles.grammar import Grammar

META_THINKER = "meta_thinker"
EXECUTOR = "executor"
KINDS = (META_THINKER, EXECUTOR)

# Placeholders each template may use; anything else is a config error caught at start-up.
USER_FIELDS = frozenset({"question", "memories", "plan", "previous"})
REFLECT_FIELDS = frozenset({"work", "answer"})


class RoleConfigError(ValueError):
    """A roles config that cannot run; the message names the role and key."""


@dataclass
class SamplingSpec:
    """How a role samples (`roles.<role>.sampling`)."""

    temperature: float = 0.7  # 0: greedy
    top_p: float = 1.0  # nucleus sampling; 1: the whole distribution
    max_new_tokens: int = 256  # per generation segment; the episode's token budget caps it further
    # end a segment once its last N tokens are one short pattern repeated 4+ times; 0: off (`solve`
    # turns it on, see meta_agent.cli.SOLVE_REPETITION_STOP)
    repetition_stop: int = 0


@dataclass
class RewardSpec:
    """How one episode's outcome becomes this role's reward (`roles.<role>.reward`, see roles.rewards)."""

    correct: float = 1.0  # the episode's final answer passed the task's verifier
    wrong: float = 0.0  # it did not
    # no tagged answer (executor); a plan or reflection that broke or never closed its tags (meta-thinker)
    format_penalty: float = 0.2
    tool_error_penalty: float = 0.05  # executor: per failed or malformed tool call
    max_tool_error_penalty: float = 0.2  # executor: at most this much in all
    leak_penalty: float = 0.5  # meta-thinker: it stated the answer instead of planning
    # meta-thinker, per reflection (roles.rewards.reflection_reward; all 0: the episode outcome alone):
    improvement_bonus: float = 0.0  # it revised a wrong answer and the next round's is right
    regression_penalty: float = 0.0  # it revised a right answer and the next round's is wrong
    accept_wrong_penalty: float = 0.0  # it accepted a wrong answer
    revise_right_penalty: float = 0.0  # it asked to revise a right answer
    # it asked to revise a wrong answer and no round made it right (the next round's is still wrong, or
    # none was left): at accept_wrong_penalty, only a revision that fixes earns more than accepting
    revise_unfixed_penalty: float = 0.0
    # round credit only (meta_agent.learning.credit.round_advantages): it asked to revise and the next
    # round's plan is the one before, word for word: the fix changed nothing the executor reads
    revise_same_plan_penalty: float = 0.0

    @property
    def rewards_reflection(self) -> bool:
        """Whether any per-reflection weight is set."""
        return any(
            (
                self.improvement_bonus,
                self.regression_penalty,
                self.accept_wrong_penalty,
                self.revise_right_penalty,
                self.revise_unfixed_penalty,
                self.revise_same_plan_penalty,
            )
        )


@dataclass
class RoleSpec:
    """One role: what it is told, which tools it may call, how it samples and how it is rewarded.

    Under `roles:` in the config each role is keyed by its name, which is also its adapter's name.
    """

    name: str  # set from the role's key under roles: at start-up
    kind: str  # meta_thinker | executor
    system_prompt: str  # may use {tools}: the registry's description of this role's tools
    # the first user message; placeholders {memories} {plan} {previous} {question}
    user_template: str = "{memories}{plan}{previous}Question: {question}"
    # meta-thinker only: the message that asks for a reflection; placeholders {work} {answer}
    reflect_template: str = ""
    tools: tuple[str, ...] = ()  # tool names this role may call (calculator, python, memory_search)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)  # how this role's turns are sampled
    reward: RewardSpec = field(default_factory=RewardSpec)  # how an episode's outcome becomes its reward
    # The tags roles write and the parser reads: one grammar for every role, not a setting.
    grammar: ClassVar[Grammar] = Grammar()

    def __post_init__(self) -> None:
        self.tools = tuple(self.tools)  # a list when it comes from the config
        where = f"roles.{self.name}"
        if self.kind not in KINDS:
            raise RoleConfigError(f"{where}.kind={self.kind!r}: must be one of {KINDS}")
        _check_fields(f"{where}.user_template", self.user_template, USER_FIELDS)
        _check_fields(f"{where}.system_prompt", self.system_prompt, frozenset({"tools"}))
        if self.kind == META_THINKER:
            if not self.reflect_template:
                raise RoleConfigError(f"{where}.reflect_template is empty: a meta-thinker needs one")
            _check_fields(f"{where}.reflect_template", self.reflect_template, REFLECT_FIELDS)
            if self.tools:
                raise RoleConfigError(f"{where}.tools: the meta-thinker plans and calls no tools")
        sampling = self.sampling
        if sampling.temperature < 0 or not 0 < sampling.top_p <= 1:
            raise RoleConfigError(
                f"{where}.sampling: temperature={sampling.temperature} must be >= 0 and top_p={sampling.top_p} "
                "in (0, 1]"
            )
        if sampling.max_new_tokens < 1:
            raise RoleConfigError(f"{where}.sampling.max_new_tokens must be >= 1")
        if sampling.repetition_stop != 0 and sampling.repetition_stop < 8:
            raise RoleConfigError(f"{where}.sampling.repetition_stop must be 0 (off) or at least 8 tokens")

    def system_text(self, tool_descriptions: str) -> str:
        return self.system_prompt.format(tools=tool_descriptions)

    def user_text(self, question: str, *, memories: str = "", plan: str = "", previous: str = "") -> str:
        return self.user_template.format(question=question, memories=memories, plan=plan, previous=previous)

    def reflect_text(self, work: str, answer: str) -> str:
        return self.reflect_template.format(work=work, answer=answer)


def _check_fields(where: str, template: str, allowed: frozenset[str]) -> None:
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as err:
        raise RoleConfigError(
            f"{where}: not a valid template ({err}); write literal braces as {{{{ }}}}"
        ) from err
    unknown = used - allowed
    if unknown:
        raise RoleConfigError(f"{where} uses {sorted(unknown)}; allowed placeholders: {sorted(allowed)}")


def check_roles(roles: Sequence[RoleSpec]) -> None:
    """One meta-thinker at most, at least one executor, unique names."""
    names = [r.name for r in roles]
    if len(set(names)) != len(names):
        raise RoleConfigError(f"roles: duplicate role names in {names}")
    metas = [r for r in roles if r.kind == META_THINKER]
    if len(metas) > 1:
        raise RoleConfigError(f"roles: at most one meta_thinker, got {[r.name for r in metas]}")
    if not any(r.kind == EXECUTOR for r in roles):
        raise RoleConfigError(f"roles: at least one role of kind 'executor' is needed, got {names}")


def meta_thinker(roles: Sequence[RoleSpec]) -> RoleSpec | None:
    """The role that plans and reflects, if the hierarchy has one (check_roles allows at most one)."""
    return next((r for r in roles if r.kind == META_THINKER), None)


def executors(roles: Sequence[RoleSpec]) -> list[RoleSpec]:
    """The roles that act with tools, in config order (the first one acts first)."""
    return [r for r in roles if r.kind == EXECUTOR]
