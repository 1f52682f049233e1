"""Plays many episodes at once: every live episode's next request goes into one generation batch.

Requests of different roles (adapters) share a batch; the backend serves them together. Memory
lessons are collected from a finished batch (`EpisodeFactory.lessons`) and committed after it
(meta_agent.rank_protocol.commit_lessons), so episodes of one GRPO group never see each other's writes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace

from memory.settings import MemorySettings
from memory.types import Memory
from meta_agent.chat import ChatFormat
from meta_agent.episode import Episode, Limits
from meta_agent.tasks import Task
from roles import RoleSpec
from tools.registry import ToolRegistry
from training.types import GenerationBackend, GenerationRequest


class EpisodeFactory:
    """Builds episodes for tasks: the roles, tools, limits and memory they all share."""

    def __init__(
        self,
        roles: Sequence[RoleSpec],
        chat: ChatFormat,
        registry: ToolRegistry,
        grade: Callable[[str, str], bool],
        limits: Limits | None = None,
        memory: Memory | None = None,
        memory_settings: MemorySettings | None = None,
    ):
        self.roles = list(roles)
        self.chat = chat
        self.registry = registry
        self.grade = grade
        self.limits = limits or Limits()
        self.memory = memory
        self.memory_settings = memory_settings or MemorySettings()

    def new(self, task: Task, *, final_reflection: bool = True) -> Episode:
        hits = []
        shown = self.memory_settings.shown
        if self.memory is not None and shown > 0 and len(self.memory) > 0:
            hits = self.memory.search(task.question, k=shown)
        return Episode(
            task,
            self.roles,
            self.chat,
            self.registry,
            self.grade,
            self.limits,
            memories=hits,
            final_reflection=final_reflection,
        )

    def lessons(self, episodes: Sequence[Episode]) -> list[tuple[str, str, float]]:
        """(text, task id, reward) of each lesson these finished episodes would store, in order."""
        if self.memory is None or not self.memory_settings.write_lessons:
            return []
        return [(ep.lesson, ep.task.id, 1.0 if ep.correct else -1.0) for ep in episodes if ep.lesson]


def request_seed(seed: int, episode_index: int, step: int) -> int:
    """A per-request seed, so a request samples the same tokens whatever batch it lands in."""
    digest = hashlib.blake2b(f"{seed}:{episode_index}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


def play(
    episodes: Sequence[Episode],
    backend: GenerationBackend,
    *,
    seed: int = 0,
    temperature: float | None = None,
    on_step: Callable[[int], None] | None = None,
    first_index: int = 0,
) -> int:
    """Run episodes to the end with batched generation. Returns the number of generation calls.

    Each request samples as its role is configured (the episode adds stops and the token budget);
    `temperature` overrides every role's (0: greedy evaluation). Episode i samples with the seed of
    index `first_index + i`: a rank that plays a share of a batch passes its share's offset and samples
    what one process playing the whole batch would.
    """
    steps = [0] * len(episodes)
    calls = 0
    while True:
        live = [i for i, ep in enumerate(episodes) if not ep.done]
        if not live:
            return calls
        batch = []
        for i in live:
            req = episodes[i].request()
            params = req.sampling if temperature is None else replace(req.sampling, temperature=temperature)
            batch.append(
                GenerationRequest(
                    req.role, req.prompt_ids, params, seed=request_seed(seed, first_index + i, steps[i])
                )
            )
        results = backend.generate(batch)
        for i, result in zip(live, results, strict=True):
            episodes[i].advance(result.token_ids, result.logprobs, result.text, result.finish_reason)
            steps[i] += 1
        calls += 1
        if on_step is not None:
            on_step(calls)
