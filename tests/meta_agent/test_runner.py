"""Batched play on the tiny backbone with the real hf backend, and lessons committed after a batch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memory.settings import MemorySettings
from memory.store import FaissMemory
from meta_agent.episode.protocol import Episode, Limits
from meta_agent.episode.runner import EpisodeFactory, play, request_seed
from meta_agent.rank_protocol import commit_lessons
from meta_agent.tasks import Task, grade_task
from tests.meta_agent.conftest import PLAN, TASKS, answer, tool_call
from training.distributed import Ranks
from training.generation import HFBackend

SEGMENT_TOKENS = 8  # per generation call: keeps the random model's babble short
LIMITS = Limits(max_new_tokens=96)  # room for the scripted tool call, and a cap on the babble
LESSON = "Multiply the two counts with the calculator first, then add or subtract the rest."


def calc(task: Task) -> str:
    return tool_call("calculator", expression=task.meta["expression"])


def script(ep: Episode, lesson: str | None = LESSON, correct: bool = True) -> None:
    """Play a whole hierarchy episode by hand."""
    reflection = "<reflection>ok</reflection>" + (f"<lesson>{lesson}</lesson>" if lesson else "")
    final = ep.task.answer if correct else ep.task.answer + "1"
    for action in (PLAN, calc(ep.task), answer(final), reflection + "<verdict>accept</verdict>"):
        ep.advance_text(action)
    assert ep.done


@pytest.fixture
def roles(role_sets):
    return [
        replace(r, sampling=replace(r.sampling, max_new_tokens=SEGMENT_TOKENS))
        for r in role_sets["hierarchy"]
    ]


@pytest.fixture
def backend(tiny_backbone):
    return HFBackend(tiny_backbone)


@pytest.fixture
def factory(roles, chat, registry):
    return EpisodeFactory(roles, chat, registry, grade_task, LIMITS)


def staggered(factory: EpisodeFactory) -> list[Episode]:
    """Four episodes at different stages, so one batch holds both roles from the first call."""
    episodes = [factory.new(task) for task in TASKS]
    episodes[1].advance_text(PLAN)  # the executor acts next
    episodes[2].advance_text(PLAN)
    episodes[2].advance_text(calc(TASKS[2]))  # mid-turn, after a tool result
    return episodes


def tokens(episodes: list[Episode]) -> list[list[list[int]]]:
    return [[t.completion_ids for t in ep.turns] for ep in episodes]


def test_play_batches_both_roles_to_the_end(factory, backend, monkeypatch):
    episodes = staggered(factory)
    real = backend.generate
    batches = []

    def spy(requests):
        live = [ep for ep in episodes if not ep.done]
        assert [r.adapter for r in requests] == [ep.current_role for ep in live]
        assert [r.prompt_ids for r in requests] == [ep.request().prompt_ids for ep in live]
        assert [r.sampling for r in requests] == [ep.request().sampling for ep in live]
        batches.append([r.adapter for r in requests])
        return real(requests)

    monkeypatch.setattr(backend, "generate", spy)
    steps = []
    calls = play(episodes, backend, seed=0, on_step=steps.append)

    assert calls == len(batches) >= 2 and steps == list(range(1, calls + 1))
    assert all(ep.done for ep in episodes)
    assert batches[0] == ["meta_thinker", "executor", "executor", "meta_thinker"]  # one batch, both adapters
    for ep in episodes:
        assert set(ep.outcomes) == {"meta_thinker", "executor"}  # each role's, for the reward step
        assert sum(t.generated_tokens for t in ep.turns) <= LIMITS.max_new_tokens
        for turn in ep.turns:
            n = len(turn.completion_ids)
            assert len(turn.mask) == len(turn.logprobs) == n, (ep.task.id, turn.kind)
            for m, lp in zip(turn.mask, turn.logprobs, strict=True):
                assert lp == 0.0 if m == 0 else lp <= 0.0
    observed = episodes[2].turns[1]
    assert 0 in observed.mask and observed.mask[-1] == 1  # the model went on after the tool result
    sampled = [lp for ep in episodes for t in ep.turns for lp in t.logprobs]
    assert any(lp < 0 for lp in sampled)  # real rollout logprobs came back from the backend


def test_play_is_deterministic_for_a_seed(factory, backend):
    first, again, other = staggered(factory), staggered(factory), staggered(factory)
    play(first, backend, seed=3)
    play(again, backend, seed=3)
    play(other, backend, seed=4)
    assert tokens(first) == tokens(again)
    assert tokens(first) != tokens(other)
    # A request's seed depends on its episode and step, not on the batch: alone, the first episode
    # samples what it sampled among the others.
    alone = [factory.new(TASKS[0])]
    play(alone, backend, seed=3)
    assert tokens(alone) == tokens(first[:1])


def test_a_temperature_overrides_every_roles_own(factory, backend, monkeypatch):
    real, seen = backend.generate, []
    monkeypatch.setattr(backend, "generate", lambda requests: seen.extend(requests) or real(requests))
    play([factory.new(TASKS[0])], backend, seed=0, temperature=0.0)
    assert seen and all(r.sampling.temperature == 0.0 for r in seen)


def test_request_seed_is_stable_and_distinct():
    assert request_seed(0, 1, 2) == request_seed(0, 1, 2)
    seeds = {request_seed(s, i, k) for s in range(3) for i in range(4) for k in range(4)}
    assert len(seeds) == 48 and all(0 <= s < 2**31 for s in seeds)


# ---- memory: lessons are committed after the batch --------------------------------------------------


@pytest.fixture
def memory(minilm):
    memory = FaissMemory(None, minilm)
    yield memory
    memory.close()


def test_lessons_are_committed_after_the_batch(roles, chat, registry, memory, backend):
    factory = EpisodeFactory(roles, chat, registry, grade_task, LIMITS, memory=memory)
    batch = [factory.new(TASKS[0])]
    script(batch[0])  # finished, with a lesson, before the rest of the batch even starts
    assert batch[0].lesson == LESSON
    batch += [factory.new(task) for task in TASKS[1:]]
    play(batch, backend, seed=0)

    assert all(ep.done and ep.memories == [] for ep in batch)
    assert len(memory) == 0, "nothing is written while the batch plays"
    written = commit_lessons(memory, factory.lessons(batch), Ranks())
    assert written == sum(1 for ep in batch if ep.lesson) >= 1 and len(memory) == written
    hit = next(h for h in memory.search(LESSON, k=5) if h.entry.text == LESSON)
    assert (hit.entry.kind, hit.entry.task, hit.entry.reward) == ("lesson", TASKS[0].id, 1.0)

    later = factory.new(TASKS[1])  # a similar problem, in the next batch
    assert LESSON in [h.entry.text for h in later.memories]
    assert f"Lessons from similar problems:\n- {LESSON}" in later.observation()


def test_commit_lessons_settings(roles, chat, registry, memory):
    def commit(settings: MemorySettings, **script_kw) -> int:
        factory = EpisodeFactory(roles, chat, registry, grade_task, LIMITS, memory, settings)
        ep = factory.new(TASKS[0])
        script(ep, **script_kw)
        return commit_lessons(memory, factory.lessons([ep]), Ranks())

    assert commit(MemorySettings(write_lessons=False)) == 0
    assert commit(MemorySettings(), lesson=None) == 0  # no <lesson>, nothing to write
    assert len(memory) == 0
    assert commit(MemorySettings()) == 1
    assert commit(MemorySettings(), correct=False) == 1
    assert sorted(h.entry.reward for h in memory.search(LESSON, k=5)) == [-1.0, 1.0]

    for hidden in (MemorySettings(top_k=0), MemorySettings(enabled=False)):
        factory = EpisodeFactory(roles, chat, registry, grade_task, LIMITS, memory, hidden)
        assert factory.new(TASKS[1]).memories == []
    assert EpisodeFactory(roles, chat, registry, grade_task, LIMITS).lessons([]) == []
