"""Plays many episodes at once: every live episode's next request goes into one generation batch.

Requests of different roles (adapters) share a batch; the backend serves them together. Memory
lessons are collected while a batch plays and committed after it, so episodes of one GRPO group
never see each other's writes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from memory.types import Memory
from meta_agent.chat import ChatFormat
from meta_agent.episode import Episode, Limits
from meta_agent.tasks import Task
from roles import RoleSpec
from tools.registry import ToolRegistry
from training.types import GenerationBackend, GenerationRequest, SamplingParams


@dataclass(frozen=True)
class MemorySettings:
    top_k: int = 3  # memories shown to the roles at reset; 0 shows none
    write_lessons: bool = True  # commit the meta-thinker's lesson after each batch
    min_reward_to_write: float = float("-inf")  # only keep lessons from episodes at least this good


class EpisodeFactory:
    """Builds episodes for tasks: the roles, tools, limits and memory they all share."""

    def __init__(
        self,
        roles: Sequence[RoleSpec],
        chat: ChatFormat,
        registry: ToolRegistry,
        grade: Callable[[str, str], bool],
        limits: Limits = Limits(),
        memory: Memory | None = None,
        memory_settings: MemorySettings = MemorySettings(),
    ):
        self.roles = list(roles)
        self.chat = chat
        self.registry = registry
        self.grade = grade
        self.limits = limits
        self.memory = memory
        self.memory_settings = memory_settings

    def new(self, task: Task, *, final_reflection: bool = True) -> Episode:
        hits = []
        if self.memory is not None and self.memory_settings.top_k > 0 and len(self.memory) > 0:
            hits = self.memory.search(task.question, k=self.memory_settings.top_k)
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

    def commit_lessons(self, episodes: Sequence[Episode]) -> int:
        """Write the lessons of finished episodes to memory; returns how many were written."""
        lessons = self.lessons(episodes)
        for text, task, reward in lessons:
            self.memory.add(text, kind="lesson", task=task, reward=reward)
        return len(lessons)

    def lessons(self, episodes: Sequence[Episode]) -> list[tuple[str, str, float]]:
        """(text, task id, reward) of each lesson these finished episodes would store, in order."""
        if self.memory is None or not self.memory_settings.write_lessons:
            return []
        return [
            (ep.lesson, ep.task.id, 1.0 if ep.correct else -1.0)
            for ep in episodes
            if ep.lesson and max(ep.rewards.values(), default=0.0) >= self.memory_settings.min_reward_to_write
        ]


def request_seed(seed: int, episode_index: int, step: int) -> int:
    """A per-request seed, so a request samples the same tokens whatever batch it lands in."""
    digest = hashlib.blake2b(f"{seed}:{episode_index}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


def play(
    episodes: Sequence[Episode],
    backend: GenerationBackend,
    sampling: Mapping[str, SamplingParams],
    *,
    seed: int = 0,
    on_step: Callable[[int], None] | None = None,
    first_index: int = 0,
) -> int:
    """Run episodes to the end with batched generation. Returns the number of generation calls.

    `sampling` gives each role's temperature and top-p; the episode sets max_new_tokens and stops.
    Episode i samples with the seed of index `first_index + i`: a rank that plays a share of a batch
    passes its share's offset and samples what one process playing the whole batch would.
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
            base = sampling[req.role]
            params = SamplingParams(
                temperature=base.temperature,
                top_p=base.top_p,
                max_new_tokens=req.max_new_tokens,
                stop=req.stop,
            )
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
