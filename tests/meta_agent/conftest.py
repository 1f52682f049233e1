"""Shared fixtures of the episode, env and runner tests: real roles config, chat format, tools, memory."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import pytest

from memory.embedders import SentenceEmbedder
from memory.types import MemoryHit
from meta_agent.config import load_config
from meta_agent.episode.chat import ChatFormat
from meta_agent.episode.protocol import Episode, Limits
from meta_agent.tasks import Task, grade_task, make_arith_tasks
from roles import RoleSpec
from tools import default_registry
from tools.registry import ToolRegistry

ROLE_CONFIGS = ("hierarchy", "single_agent", "two_executors")
TASKS = make_arith_tasks("test", 4)
TASK = TASKS[0]  # "A depot holds 728 crates with 734 bolts ...", answer 555491

PLAN = "<plan>multiply then add</plan>"
REFLECTION = "<reflection>ok</reflection><lesson>use the calculator</lesson><verdict>accept</verdict>"


def tool_call(name: str, **arguments: object) -> str:
    """A well-formed tool call as an executor writes it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def answer(value: str) -> str:
    return f"<answer>{value}</answer>"


@pytest.fixture(scope="session")
def role_sets() -> dict[str, list[RoleSpec]]:
    """The RoleSpecs of each configs/roles/*.yaml, built from the real config."""
    return {name: load_config([f"roles={name}"]).role_list for name in ROLE_CONFIGS}


@pytest.fixture(scope="session")
def chat(tokenizer) -> ChatFormat:
    return ChatFormat(tokenizer)


@pytest.fixture(scope="session")
def registry() -> ToolRegistry:
    """Calculator and the python sandbox (no memory_search: these tests give the tools no memory)."""
    return default_registry(None)


@pytest.fixture(scope="session")
def minilm() -> SentenceEmbedder:
    """The real all-MiniLM-L6-v2 embedder, loaded once per session (seconds)."""
    return SentenceEmbedder()


@pytest.fixture
def make_episode(role_sets, chat, registry) -> Callable[..., Episode]:
    """make_episode("hierarchy", limits=Limits(...), task=..., memories=[...]) -> a fresh Episode."""

    def make(
        roles: str = "hierarchy",
        *,
        limits: Limits | None = None,
        task: Task = TASK,
        memories: Sequence[MemoryHit] = (),
        final_reflection: bool = True,
    ) -> Episode:
        return Episode(
            task,
            role_sets[roles],
            chat,
            registry,
            grade_task,
            limits,
            memories=memories,
            final_reflection=final_reflection,
        )

    return make
