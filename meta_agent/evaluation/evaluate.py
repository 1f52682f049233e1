"""Evaluation: play the hierarchy on benchmark tasks, score with the task's verifier, keep traces.

    scores = evaluate(system, {"arith": tasks}, cfg.eval, seed=cfg.seed)   # per task: a TaskScore

With `eval.samples=k` each problem is played k times at the roles' temperatures: pass@k (the unbiased
estimator), maj@k (the majority answer's accuracy) and the mean accuracy with its 95% interval over
problems; the reflection metrics (meta_agent.analysis.reflection) of every episode come with each score.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from meta_agent.analysis.reflection import reflected, reflection_metrics
from meta_agent.analysis.stats import majority, mean_interval, normal_answer, pass_at_k
from meta_agent.episode import reward
from meta_agent.episode.protocol import Episode
from meta_agent.episode.runner import play
from meta_agent.episode.trace import TraceWriter
from meta_agent.evaluation.planning import Planner, searches
from meta_agent.rank_protocol import commit_lessons
from meta_agent.settings import EvalSettings
from meta_agent.system import System
from meta_agent.tasks import Task
from training.distributed import Ranks


@dataclass(frozen=True)
class TaskScore:
    """One task's evaluation: counts over every episode, and per problem over its `samples` episodes."""

    task: str
    correct: int  # correct episodes, all samples
    total: int  # episodes: problems x samples
    answered: int  # episodes that produced any answer
    tool_calls: int
    tool_errors: int
    leaks: int
    generated_tokens: int
    samples: int = 1  # episodes per problem
    pass_at: dict[int, float] = field(default_factory=dict)  # k -> pass@k, the unbiased estimator
    maj_accuracy: float | None = None  # accuracy of each problem's majority answer (samples > 1)
    # 95% interval of the accuracy over problems (stats.mean_interval); None where none can be given
    interval: tuple[float, float] | None = None
    reflection: dict[str, float | None] = field(default_factory=dict)  # meta_agent.analysis.reflection
    # the tokens of every turn's prompt as the environment built it (what memory.internal changes); a
    # search counts the episodes it shows
    prompt_tokens: int = 0

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    @property
    def problems(self) -> int:
        return self.total // max(self.samples, 1)


def pass_ks(samples: int) -> list[int]:
    """The k of pass@k reported for `samples` per problem: 1, 2, 4, ... and `samples` itself."""
    ks = [1]
    while ks[-1] * 2 < samples:
        ks.append(ks[-1] * 2)
    return sorted({*ks, samples})


def score(name: str, episodes: Sequence[Episode], samples: int = 1) -> TaskScore:
    """The score of `episodes`, played problem by problem with `samples` consecutive episodes each."""
    problems = [episodes[i : i + samples] for i in range(0, len(episodes), samples)]
    per_problem = [sum(ep.correct for ep in group) / len(group) for group in problems]
    majority_right = []
    for group in problems:
        pick = majority([normal_answer(ep.final_answer) for ep in group])
        majority_right.append(pick is not None and group[pick].correct)
    spread = mean_interval(per_problem)
    return TaskScore(
        task=name,
        correct=sum(ep.correct for ep in episodes),
        total=len(episodes),
        answered=sum(ep.final_answer is not None for ep in episodes),
        tool_calls=sum(ep.tool_calls for ep in episodes),
        tool_errors=sum(ep.tool_errors for ep in episodes),
        leaks=sum(ep.leaked for ep in episodes),
        generated_tokens=sum(t.generated_tokens for ep in episodes for t in ep.turns),
        samples=samples,
        pass_at={
            k: sum(pass_at_k(len(g), sum(ep.correct for ep in g), k) for g in problems) / len(problems)
            for k in pass_ks(samples)
        }
        if problems
        else {},
        maj_accuracy=sum(majority_right) / len(problems) if problems and samples > 1 else None,
        interval=None if spread is None else spread[1:],
        reflection=reflection_metrics([reflected(ep) for ep in episodes]),
        prompt_tokens=sum(len(t.prompt_ids) for ep in episodes for t in ep.turns),
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
    planner: Planner | None = None,
) -> dict[str, TaskScore]:
    """`settings.samples` episodes per problem, played `settings.episodes_per_batch` at a time: greedy
    at `settings.temperature` 0 with one sample; with more, each role samples at its own temperature
    (or at `settings.temperature` when that is above 0).

    Lessons are committed per batch when `write_lessons` (default `settings.write_lessons`); held-out
    evaluation during training never writes what it saw of the test set into the memory it trains with.
    `final_reflection=False` skips the last round's reflection, which cannot change an answer.
    A `planner` (meta_agent.evaluation.planning.build_planner's, or a researcher's own Planner) answers each problem
    with several episodes instead (searched, below).
    """
    if planner is not None:
        return searched(system, tasks, settings, planner, seed=seed, traces=traces, on_batch=on_batch)
    write = settings.write_lessons if write_lessons is None else write_lessons
    ranks = ranks or Ranks()
    temperature = None if settings.samples > 1 and settings.temperature == 0 else settings.temperature
    scores = {}
    for name, task_list in tasks.items():
        played: list[Episode] = []
        items = [t for t in task_list for _ in range(settings.samples)]
        for start in range(0, len(items), settings.episodes_per_batch):
            chunk = items[start : start + settings.episodes_per_batch]
            batch = [system.factory.new(t, final_reflection=final_reflection) for t in chunk]
            # Episode i of the task samples with the seeds of index i: no two seeds' samples coincide.
            play(batch, system.backend, seed=seed, temperature=temperature, first_index=start)
            reward.score(batch)  # the traces show each role's reward
            if write:
                lessons = system.factory.lessons(batch)
                commit_lessons(system.memory, lessons, ranks, private=system.memory_private)
            if traces is not None:
                traces.write(batch, split="eval", seed=seed)
            played += batch
            if on_batch is not None:
                on_batch(len(batch))
        scores[name] = score(name, played, settings.samples)
    return scores


def searched(
    system: System,
    tasks: Mapping[str, Sequence[Task]],
    settings: EvalSettings,
    planner: Planner,
    *,
    seed: int,
    traces: TraceWriter | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> dict[str, TaskScore]:
    """Each problem answered by `planner` (meta_agent.evaluation.planning), `settings.episodes_per_batch // planner.parallel`
    problems searched together. A score counts the chosen answers; its episodes are the simulations shown
    for them, its generated tokens every simulation's. The traces carry each problem's tree (`search`).
    A search writes no lessons (its simulations would read each other's) and plays the last round's
    reflection only for planner.value=verdict (the built-in planners)."""
    scores = {}
    for name, task_list in tasks.items():
        results = []
        batch = settings.episodes_per_batch
        for chunk in searches(planner, system.factory, system.backend, task_list, batch, seed=seed):
            reward.score(r.episode for r in chunk)  # the traces show each role's reward
            if traces is not None:
                for r in chunk:
                    traces.write(
                        [r.episode],
                        split="eval",
                        seed=seed,
                        search=r.tree.as_dict(),
                        simulations=r.simulations,
                    )
            results += chunk
            if on_batch is not None:
                on_batch(len(chunk))
        shown = score(name, [r.episode for r in results])
        scores[name] = replace(shown, generated_tokens=sum(r.generated_tokens for r in results))
    return scores


def held_out_accuracy(
    system: System, tasks: Mapping[str, Sequence[Task]], settings: EvalSettings, seed: int, ranks: Ranks
) -> float:
    """Greedy accuracy on held-out `tasks` during training, each rank playing its share of the problems
    (greedy: the same answers as one process), the counts summed over ranks.

    No lesson writes: what the roles saw of the test set must not reach the memory they train with. So
    the last reflection, which can only write a lesson, is skipped: the answers are the same."""
    mine = {name: ranks.shard(task_list) for name, task_list in tasks.items()}
    greedy_once = replace(settings, samples=1)  # eval.samples is for meta-agent eval, not every step
    scores = evaluate(system, mine, greedy_once, seed=seed, write_lessons=False, final_reflection=False)
    system.backbone.lockstep.drain()  # a sharded backbone: until every rank's episodes are done
    correct, total = ranks.sum(
        [sum(s.correct for s in scores.values()), sum(s.total for s in scores.values())]
    )
    return correct / max(total, 1)
