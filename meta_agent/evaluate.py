"""Evaluation: play the hierarchy on benchmark tasks, score with the task's verifier, keep traces."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from meta_agent.episode import Episode
from meta_agent.rank_protocol import commit_lessons
from meta_agent.runner import play
from meta_agent.settings import EvalSettings
from meta_agent.system import System
from meta_agent.tasks import Task
from meta_agent.trace import TraceWriter
from training.distributed import Ranks


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
    system: System,
    tasks: Mapping[str, Sequence[Task]],
    settings: EvalSettings,
    *,
    seed: int = 0,
    traces: TraceWriter | None = None,
    on_batch: Callable[[int], None] | None = None,
    write_lessons: bool | None = None,
    final_reflection: bool = True,
    ranks: Ranks | None = None,
) -> dict[str, TaskScore]:
    """One episode per task, played `settings.episodes_per_batch` at a time at `settings.temperature`.

    Lessons are committed per batch when `write_lessons` (default `settings.write_lessons`); held-out
    evaluation during training never writes what it saw of the test set into the memory it trains with.
    `final_reflection=False` skips the last round's reflection, which cannot change an answer.
    """
    write = settings.write_lessons if write_lessons is None else write_lessons
    ranks = ranks or Ranks()
    scores = {}
    for name, task_list in tasks.items():
        played: list[Episode] = []
        for start in range(0, len(task_list), settings.episodes_per_batch):
            chunk = task_list[start : start + settings.episodes_per_batch]
            batch = [system.factory.new(t, final_reflection=final_reflection) for t in chunk]
            play(batch, system.backend, seed=seed + start, temperature=settings.temperature)
            if write:
                lessons = system.factory.lessons(batch)
                commit_lessons(system.memory, lessons, ranks, private=system.memory_private)
            if traces is not None:
                traces.write(batch, split="eval")
            played += batch
            if on_batch is not None:
                on_batch(len(batch))
        scores[name] = score(name, played)
    return scores


def held_out_accuracy(
    system: System, tasks: Mapping[str, Sequence[Task]], settings: EvalSettings, seed: int, ranks: Ranks
) -> float:
    """Greedy accuracy on held-out `tasks` during training, each rank playing its share of the problems
    (greedy: the same answers as one process), the counts summed over ranks.

    No lesson writes: what the roles saw of the test set must not reach the memory they train with. So
    the last reflection, which can only write a lesson, is skipped: the answers are the same."""
    mine = {name: ranks.shard(task_list) for name, task_list in tasks.items()}
    scores = evaluate(system, mine, settings, seed=seed, write_lessons=False, final_reflection=False)
    system.backbone.lockstep.drain()  # a sharded backbone: until every rank's episodes are done
    correct, total = ranks.sum(
        [sum(s.correct for s in scores.values()), sum(s.total for s in scores.values())]
    )
    return correct / max(total, 1)
