"""Plays many episodes at once: every live episode's next request goes into one generation batch.

Requests of different roles (adapters) share a batch; the backend serves them together. Memory
lessons are collected from a finished batch (`EpisodeFactory.lessons`) and committed after it
(meta_agent.rank_protocol.commit_lessons), so episodes of one GRPO group never see each other's writes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from memory.settings import MemorySettings
from memory.types import Memory
from meta_agent.episode.chat import ChatFormat
from meta_agent.episode.internal_memory import InternalMemory, internal_memory
from meta_agent.episode.protocol import Episode, Limits
from meta_agent.tasks import Task
from roles import RoleSpec
from tools.registry import ToolRegistry
from training.types import GenerationBackend, GenerationRequest


class EpisodeFactory:
    """Builds episodes for tasks: the roles, tools, limits and memory they all share. `internal` (default:
    the one `memory_settings.internal` names) is what each episode's meta-thinker carries between
    reflections (meta_agent.episode.internal_memory): a researcher's own plugs in here."""

    def __init__(
        self,
        roles: Sequence[RoleSpec],
        chat: ChatFormat,
        registry: ToolRegistry,
        grade: Callable[[str, Task], bool],
        limits: Limits | None = None,
        memory: Memory | None = None,
        memory_settings: MemorySettings | None = None,
        internal: InternalMemory | None = None,
    ):
        self.roles = list(roles)
        self.chat = chat
        self.registry = registry
        self.grade = grade
        self.limits = limits or Limits()
        self.memory = memory
        self.memory_settings = memory_settings or MemorySettings()
        self.internal = internal or internal_memory(self.memory_settings.internal)

    def new(
        self,
        task: Task,
        *,
        final_reflection: bool = True,
        roles: Sequence[RoleSpec] | None = None,
        show_plan: bool = True,
        adapters: Mapping[str, str] | None = None,
        limits: Limits | None = None,
    ) -> Episode:
        """A fresh episode of `task`, shown the lessons memory holds for it now. The probes pass a subset
        of the roles, hide the plan or swap a role's adapter (see Episode)."""
        hits = []
        shown = self.memory_settings.shown
        if self.memory is not None and shown > 0 and len(self.memory) > 0:
            hits = self.memory.search(task.question, k=shown)
        return Episode(
            task,
            self.roles if roles is None else roles,
            self.chat,
            self.registry,
            self.grade,
            limits or self.limits,
            memories=hits,
            final_reflection=final_reflection,
            show_plan=show_plan,
            adapters=adapters,
            internal=self.internal,
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


def next_requests(
    episodes: Sequence[Episode],
    live: Sequence[int],
    steps: Sequence[int],
    indices: Sequence[int],
    *,
    seed: int,
    temperature: float | None,
) -> list[GenerationRequest]:
    """The next generation request of each live episode i: its role's sampling (`temperature`, when
    given, overrides every role's), seeded by the episode's index and how many requests it made."""
    requests = []
    for i in live:
        req = episodes[i].request()
        params = req.sampling if temperature is None else replace(req.sampling, temperature=temperature)
        requests.append(
            GenerationRequest(
                req.adapter, req.prompt_ids, params, seed=request_seed(seed, indices[i], steps[i])
            )
        )
    return requests


def play(
    episodes: Sequence[Episode],
    backend: GenerationBackend,
    *,
    seed: int = 0,
    temperature: float | None = None,
    on_step: Callable[[int], None] | None = None,
    first_index: int = 0,
    indices: Sequence[int] | None = None,
    steps: Sequence[int] | None = None,
) -> int:
    """Run episodes to the end with batched generation. Returns the number of generation calls.

    Each request samples as its role is configured (the episode adds stops and the token budget);
    `temperature` overrides every role's (0: greedy evaluation). Episode i samples with the seeds of
    index `first_index + i`: a rank that plays a share of a batch passes its share's offset and samples
    what one process playing the whole batch would. `indices` gives each episode its index instead, and
    `steps` the requests each already made (the probes continue episodes whose plan was replayed).
    """
    indices = list(indices) if indices is not None else [first_index + i for i in range(len(episodes))]
    steps = list(steps) if steps is not None else [0] * len(episodes)
    calls = 0
    while True:
        live = [i for i, ep in enumerate(episodes) if not ep.done]
        if not live:
            return calls
        batch = next_requests(episodes, live, steps, indices, seed=seed, temperature=temperature)
        results = backend.generate(batch)
        for i, result in zip(live, results, strict=True):
            episodes[i].advance(result.token_ids, result.logprobs, result.text, result.finish_reason)
            steps[i] += 1
        calls += 1
        if on_step is not None:
            on_step(calls)
