"""Evaluation: play the hierarchy on benchmark tasks, score with the task's verifier, keep traces."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from meta_agent.episode import Episode
from meta_agent.runner import EpisodeFactory, play
from meta_agent.tasks import Task
from meta_agent.trace import TraceWriter
from training.types import GenerationBackend, SamplingParams


@dataclass(frozen=True)
class TaskScore:
    task: str
    correct: int
    total: int
    answered: int  # episodes that produced any answer
    tool_calls: int
    tool_errors: int
    leaks: int
    generated_tokens: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


def score(name: str, episodes: Sequence[Episode]) -> TaskScore:
    return TaskScore(
        task=name,
        correct=sum(ep.correct for ep in episodes),
        total=len(episodes),
        answered=sum(ep.final_answer is not None for ep in episodes),
        tool_calls=sum(ep.tool_calls for ep in episodes),
        tool_errors=sum(ep.tool_errors for ep in episodes),
        leaks=sum(ep.leaked for ep in episodes),
        generated_tokens=sum(t.generated_tokens for ep in episodes for t in ep.turns),
    )


def evaluate(
    factory: EpisodeFactory,
    backend: GenerationBackend,
    sampling: Mapping[str, SamplingParams],
    tasks: Mapping[str, Sequence[Task]],
    *,
    episodes_per_batch: int = 8,
    seed: int = 0,
    traces: TraceWriter | None = None,
    on_batch: Callable[[int], None] | None = None,
    write_lessons: bool = True,
    final_reflection: bool = True,
) -> dict[str, TaskScore]:
    """One episode per task, played `episodes_per_batch` at a time.

    Lessons are committed per batch unless `write_lessons` is False (held-out evaluation during
    training must not write what it saw of the test set into the memory it trains with).
    `final_reflection=False` skips the last round's reflection, which cannot change an answer.
    """
    if episodes_per_batch < 1:
        raise ValueError(f"eval.episodes_per_batch must be >= 1, got {episodes_per_batch}")
    scores = {}
    for name, task_list in tasks.items():
        played: list[Episode] = []
        for start in range(0, len(task_list), episodes_per_batch):
            chunk = task_list[start : start + episodes_per_batch]
            batch = [factory.new(t, final_reflection=final_reflection) for t in chunk]
            play(batch, backend, sampling, seed=seed + start)
            if write_lessons:
                factory.commit_lessons(batch)
            if traces is not None:
                traces.write(batch, split="eval")
            played += batch
            if on_batch is not None:
                on_batch(len(batch))
        scores[name] = score(name, played)
    return scores
