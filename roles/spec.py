"""Role specs: what a role is told, how it samples, its adapter, and how it is rewarded.

Built from the Hydra roles config by the entry points (meta_agent/config.py); everything here is
plain frozen data so the episode code never sees a DictConfig.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field

from roles.grammar import Grammar

META_THINKER = "meta_thinker"
EXECUTOR = "executor"
KINDS = (META_THINKER, EXECUTOR)

# Placeholders each template may use; anything else is a config error caught at start-up.
USER_FIELDS = frozenset({"question", "memories", "plan", "previous"})
REFLECT_FIELDS = frozenset({"work", "answer"})


class RoleConfigError(ValueError):
    """A roles config that cannot run; the message names the role and key."""


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 256  # per generation segment; the episode budget caps it further


@dataclass(frozen=True)
class AdapterSpec:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    top_layers: int | None = None  # LoRA on the last N decoder layers only (None: all)


@dataclass(frozen=True)
class RewardSpec:
    correct: float = 1.0
    wrong: float = 0.0
    format_penalty: float = (
        0.2  # no tagged answer (executor) / a plan or reflection without its tags (meta-thinker)
    )
    tool_error_penalty: float = 0.05  # per failed or malformed tool call
    max_tool_error_penalty: float = 0.2
    leak_penalty: float = 0.5  # meta-thinker states the answer instead of planning


@dataclass(frozen=True)
class RoleSpec:
    name: str
    kind: str
    system_prompt: str  # may use {tools}: the registry's description of this role's tools
    user_template: str = "{memories}{plan}{previous}Question: {question}"
    reflect_template: str = ""  # meta-thinker only: the message that asks for a reflection
    tools: tuple[str, ...] = ()
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    adapter: AdapterSpec = field(default_factory=AdapterSpec)
    reward: RewardSpec = field(default_factory=RewardSpec)
    grammar: Grammar = field(default_factory=Grammar)

    def __post_init__(self) -> None:
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
        if self.sampling.max_new_tokens < 1:
            raise RoleConfigError(f"{where}.sampling.max_new_tokens must be >= 1")

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


def check_roles(roles: list[RoleSpec]) -> None:
    """One meta-thinker at most, at least one executor, unique names."""
    names = [r.name for r in roles]
    if len(set(names)) != len(names):
        raise RoleConfigError(f"roles: duplicate role names in {names}")
    metas = [r for r in roles if r.kind == META_THINKER]
    if len(metas) > 1:
        raise RoleConfigError(f"roles: at most one meta_thinker, got {[r.name for r in metas]}")
    if not any(r.kind == EXECUTOR for r in roles):
        raise RoleConfigError(f"roles: at least one role of kind 'executor' is needed, got {names}")
