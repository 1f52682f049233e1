"""Planning by tree search (`planner.name=mcts`): the meta-thinker's plans and revisions are the nodes;
and best-of-N (`planner.name=best_of_n`), the same loop without selection.

    planner = build_planner(PlannerSettings(name="mcts", simulations=8), system.backbone)
    results = planner.search(system.factory, system.backend, tasks, seed=0)
    results[0].answer, results[0].correct, results[0].tree   # the chosen answer and the searched tree

One problem's tree: the root is the question; its children are plans the meta-thinker wrote; a plan's
children are the revisions its reflections made after an execution under it (a revision's, the next
round's). A node is the episode's state right after that turn, kept as the generated segments that led
there, so a simulation from a node replays them (tool calls run again) and plays on with the roles
sampling at their own temperatures: the executors' work and the reflections are drawn afresh each time.

Each simulation walks down from the root by PUCT (Q + c_puct * P * sqrt(N) / (1 + n), P the policy's
own prior: the softmax over siblings of each turn's mean token logprob) until a node may take another
child (progressive widening: at most ceil(N ** widening) children), and plays one episode from there; its
new plan or revision becomes a child. The episode's value, backed up along its path, is what the search
can know without the answer key: `votes` (the share of the problem's answered simulations so far that
reached the same answer: self-consistency), `verdict` (1 when the meta-thinker's last reflection
accepted an answer: the policy's own judgement) or `head` (the executor's value head, trained by a
`grpo.advantage=gae` run, on the state after the simulation's last plan or revision: the policy's own
Q-value estimate of that node, `head_values`). The answer is the majority answer of the simulations
through the most visited plan. Simulations of every problem are played `parallel` at a time in one
batch (pending ones count as visits of value 0, so a wave spreads over the tree).

`planner.name=best_of_n` is the same loop without selection: every simulation starts at the question,
so its N episodes are N independent samples (the seeds `meta-agent eval eval.samples=N` would draw), and
the answer is the majority of all of them (self-consistency); the tree shows the plans they wrote.

Eval, solve and `meta-agent demos` reach a planner through one small interface, `Planner` (`name`,
`parallel`, `search(factory, backend, tasks, seed=, first_problem=)`), with a conformance check,
`check_planner`: a researcher's own planner passes it and goes where `build_planner`'s does
(`evaluate(..., planner=...)`, `searches(planner, ...)`).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

import torch

from meta_agent.analysis.stats import majority, normal_answer
from meta_agent.episode.protocol import Episode
from meta_agent.episode.records import EXECUTE, PLAN, REFLECT
from meta_agent.episode.runner import EpisodeFactory, next_requests
from meta_agent.errors import SettingError
from meta_agent.tasks import Task
from training.backbone import Backbone
from training.checkpoint import load_value_heads
from training.types import GenerationBackend
from training.value import prompt_states

PLANNERS = ("none", "mcts", "best_of_n")
VALUES = ("votes", "verdict", "head")


@dataclass
class PlannerSettings:
    """The `planner:` settings: tree search over the meta-thinker's plans, or best-of-N episodes, in eval and
    solve, and in `meta-agent demos` (the chosen plans as the meta-thinker's demonstrations)."""

    # none (one episode per problem) | mcts (the tree search in meta_agent/evaluation/planning.py) | best_of_n (the
    # majority answer of `simulations` independent episodes: self-consistency)
    name: str = "none"
    simulations: int = 8  # episodes per problem (the search's budget) ...
    max_tokens: int | None = None  # ... or generated tokens per problem, whichever ends first (null: none)
    parallel: int = 4  # simulations of one problem played together in a batch
    c_puct: float = 1.0  # weight of the prior against a child's mean value
    widening: float = 0.5  # a node takes another child while it has fewer than ceil(visits ** widening)
    # mcts: votes (agreement with the other simulations' answers) | verdict (accepted) | head (the executor's
    # value head on the state after the plan or revision: a grpo.advantage=gae run's, planner.value_heads)
    value: str = "votes"
    # value=head: the checkpoint or run folder of a grpo.advantage=gae run whose heads value the states;
    # null: the adapters= one
    value_heads: str | None = None
    # every role's sampling temperature in the search; null: each role's own (roles.<role>.sampling)
    temperature: float | None = None

    def __post_init__(self) -> None:
        if self.name not in PLANNERS:
            raise ValueError(f"planner.name must be one of {PLANNERS}, got {self.name!r}")
        if self.value not in VALUES:
            raise ValueError(f"planner.value must be one of {VALUES}, got {self.value!r}")
        for key in ("simulations", "parallel"):
            if getattr(self, key) < 1:
                raise ValueError(f"planner.{key} must be >= 1, got {getattr(self, key)}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"planner.max_tokens must be >= 1 or null, got {self.max_tokens}")
        if self.c_puct < 0:
            raise ValueError(f"planner.c_puct must be >= 0, got {self.c_puct}")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(
                f"planner.temperature must be > 0 or null, got {self.temperature}: a greedy search finds one episode"
            )
        if not 0.0 <= self.widening <= 1.0:
            raise ValueError(f"planner.widening must be in [0, 1], got {self.widening}")
        defaults = {key: PlannerSettings.__dataclass_fields__[key].default for key in ("c_puct", "widening")}
        changed = [
            f"planner.{key}={getattr(self, key)}" for key in defaults if getattr(self, key) != defaults[key]
        ]
        if self.name == "best_of_n" and changed:
            raise ValueError(
                f"{' and '.join(changed)}: only the tree search (planner.name=mcts) reads "
                f"{'this' if len(changed) == 1 else 'these'}; planner.name=best_of_n plays every episode from "
                "the question: leave it out, or use planner.name=mcts"
            )
        if self.name == "best_of_n" and self.value != "votes":
            raise ValueError(
                f"planner.value={self.value} chooses among plans in the tree search: planner.name=best_of_n "
                "answers by the majority of its episodes (planner.value=votes)"
            )


@dataclass(frozen=True)
class Segment:
    """One generated segment as the episode took it, with the kind of turn it was part of."""

    kind: str  # plan | execute | reflect
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: str
    revised: bool = False  # a reflection that started another round


@dataclass(eq=False)  # nodes are compared by identity
class Node:
    """A state of the search: the question (root), or the episode right after a plan or a revision."""

    kind: str  # root | plan | revision
    segments: tuple[Segment, ...] = ()  # from the episode's start to this state
    text: str = ""  # the meta-thinker's turn that made it
    logprob: float = 0.0  # that turn's mean token logprob: the prior's logit
    children: list[Node] = field(default_factory=list)
    visits: int = 0
    value_sum: float = 0.0
    pending: int = 0  # simulations under way through it (virtual loss)
    answers: list[str | None] = field(default_factory=list)  # of the simulations through it

    @property
    def value(self) -> float:
        """Mean backed-up value, pending simulations counting 0."""
        n = self.visits + self.pending
        return self.value_sum / n if n else 0.0

    def as_dict(self) -> dict:
        """The tree from here as plain data for the traces: text, visits, value, prior, answers."""
        return {
            "kind": self.kind,
            "text": self.text,
            "visits": self.visits,
            "value": round(self.value, 4),
            "logprob": round(self.logprob, 4),
            "answers": dict(Counter(a for a in self.answers if a is not None).most_common()),
            "children": [c.as_dict() for c in self.children],
        }


def priors(nodes: Sequence[Node]) -> list[float]:
    """Softmax of the nodes' mean token logprobs: the policy's preference among siblings."""
    if not nodes:
        return []
    top = max(n.logprob for n in nodes)
    weights = [math.exp(n.logprob - top) for n in nodes]
    total = sum(weights)
    return [w / total for w in weights]


def puct(parent: Node, c_puct: float) -> Node:
    """The child of `parent` with the highest Q + c_puct * P * sqrt(N) / (1 + n) (the first on ties)."""
    n_parent = parent.visits + parent.pending
    scores = [
        child.value + c_puct * p * math.sqrt(n_parent) / (1 + child.visits + child.pending)
        for child, p in zip(parent.children, priors(parent.children), strict=True)
    ]
    return parent.children[scores.index(max(scores))]


def may_widen(node: Node, widening: float) -> bool:
    """Whether `node` takes another child now: fewer than ceil((visits + pending) ** widening), at least 1."""
    return len(node.children) < max(1, math.ceil((node.visits + node.pending) ** widening))


def select(root: Node, settings: PlannerSettings) -> list[Node]:
    """The path from the root to the node the next simulation starts from, marked pending (best_of_n: the
    root, every time)."""
    path = [root]
    while settings.name != "best_of_n" and not may_widen(path[-1], settings.widening):
        path.append(puct(path[-1], settings.c_puct))
    for node in path:
        node.pending += 1
    return path


# Values of states, each given as (the role whose turn it is, its prompt's token ids): planner.value=head's
StateValues = Callable[[Sequence[tuple[str, Sequence[int]]]], list[float]]


def head_values(backbone: Backbone, settings: PlannerSettings) -> StateValues | None:
    """planner.value=head's state values: each state under its role's value head (loaded from
    `settings.value_heads`), read from the backbone's hidden state with that role's adapter active; None
    for the other values."""
    if settings.value != "head":
        return None
    assert settings.value_heads is not None, "Config fills planner.value_heads from adapters="
    heads = load_value_heads(settings.value_heads, "planner.value_heads (by default adapters=)")

    def values(states: Sequence[tuple[str, Sequence[int]]]) -> list[float]:
        out = [0.0] * len(states)
        for role in dict.fromkeys(r for r, _ in states):
            if role not in heads.heads:
                raise SettingError(
                    f"planner.value_heads={settings.value_heads} has value heads for {sorted(heads.heads)}, "
                    f"not for the role {role!r}: name a grpo.advantage=gae run of these roles"
                )
            mine = [i for i, (r, _) in enumerate(states) if r == role]
            backbone.activate(role)
            training = backbone.model.training
            backbone.model.eval()  # no adapter dropout in a value
            try:
                prompts = [states[i][1] for i in mine]
                hidden = prompt_states(backbone.model, backbone.pad_id, prompts, backbone.device)
            finally:
                backbone.model.train(training)
            with torch.no_grad():
                predicted = heads.predict(role, hidden.cpu())
            for i, v in zip(mine, predicted.tolist(), strict=True):
                out[i] = float(v)
        return out

    return values


def leaf_state(sim: Simulation) -> tuple[str, tuple[int, ...]] | None:
    """The state planner.value=head values for a simulation: the first executor turn after the last plan or
    revision on its path (its prompt, with that plan in it), so the value is that node's Q-value under the
    executor's head; None when no executor acted after it (the budget ran out)."""
    round_ = len(sim.path) - 2  # the root, the plan (round 0), then one round more per revision
    turn = next((t for t in sim.episode.turns if t.kind == EXECUTE and t.round == round_), None)
    return None if turn is None else (turn.role, tuple(turn.prompt_ids))


def episode_value(ep: Episode, answers: Sequence[str | None], how: str) -> float:
    """`ep`'s value: votes, the share of `answers` (the problem's answered simulations, its own among
    them) equal to its answer; verdict, 1 when its last reflection accepted an answer."""
    mine = normal_answer(ep.final_answer)
    if mine is None:
        return 0.0
    if how == "verdict":
        return 1.0 if ep.rounds and ep.rounds[-1].verdict == "accept" else 0.0
    counted = [a for a in (normal_answer(x) for x in answers) if a is not None]
    return counted.count(mine) / len(counted) if counted else 0.0


@dataclass
class Simulation:
    problem: int
    path: list[Node]  # root to its start node; after grow, to the last node it made or met
    episode: Episode
    index: int  # its requests' seed index
    segments: list[Segment]
    replayed: int  # how many of `segments` came from its start node

    @property
    def generated_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments[self.replayed :])


@dataclass
class SearchResult:
    task: Task
    # the chosen answer: mcts, the majority of the simulations through the most visited plan; best_of_n,
    # of all of them (as normal_answer compares answers), as the first of that majority wrote it
    answer: str | None
    correct: bool  # that answer passes the task's verifier (the search never reads the answer key)
    episode: Episode  # the one to show: a simulation among those that reached that answer
    simulations: int
    generated_tokens: int  # by every simulation, replayed segments not counted
    tree: Node


def fork(factory: EpisodeFactory, task: Task, segments: Sequence[Segment], final_reflection: bool) -> Episode:
    """A new episode of `task` brought to the state after `segments` (their tool calls run again)."""
    ep = factory.new(task, final_reflection=final_reflection)
    for s in segments:
        ep.advance(s.token_ids, s.logprobs, s.text, s.finish_reason)
    return ep


def play_recorded(
    sims: Sequence[Simulation], backend: GenerationBackend, seed: int, temperature: float | None = None
) -> None:
    """Play the simulations' episodes to the end in shared batches, recording every segment; `temperature`
    overrides every role's."""
    episodes = [s.episode for s in sims]
    indices = [s.index for s in sims]
    while True:
        live = [i for i, ep in enumerate(episodes) if not ep.done]
        if not live:
            return
        steps = [len(s.segments) for s in sims]
        requests = next_requests(episodes, live, steps, indices, seed=seed, temperature=temperature)
        for i, result in zip(live, backend.generate(requests), strict=True):
            ep = episodes[i]
            kind, round_ = ep.turns[-1].kind, ep.round
            ep.advance(result.token_ids, result.logprobs, result.text, result.finish_reason)
            revised = kind == REFLECT and not ep.done and ep.round > round_
            sims[i].segments.append(
                Segment(kind, result.token_ids, result.logprobs, result.text, result.finish_reason, revised)
            )


def grow(sim: Simulation) -> list[Node]:
    """Add the plans and revisions `sim` made beyond its start node to the tree; returns its whole path."""
    path = list(sim.path)
    for k in range(sim.replayed, len(sim.segments)):
        s = sim.segments[k]
        if s.kind != PLAN and not s.revised:
            continue
        prefix = tuple(sim.segments[: k + 1])
        parent = path[-1]
        child = next((c for c in parent.children if c.segments[-1].token_ids == s.token_ids), None)
        if child is None:
            mean = sum(s.logprobs) / len(s.logprobs) if s.logprobs else 0.0
            kind = "plan" if s.kind == PLAN else "revision"
            child = Node(kind, prefix, s.text, mean)
            parent.children.append(child)
        path.append(child)
    return path


def revalue(root: Node) -> None:
    """Votes values of every node from the answers now through the root: each simulation's value is the
    share of the answered simulations that reached its answer (0 for none), as if all were backed up now."""
    counted = [a for a in (normal_answer(x) for x in root.answers) if a is not None]
    share = {a: counted.count(a) / len(counted) for a in set(counted)} if counted else {}
    stack = [root]
    while stack:
        node = stack.pop()
        node.value_sum = sum(share.get(normal_answer(a), 0.0) for a in node.answers)
        stack.extend(node.children)


def majority_answer(answers: Sequence[str | None]) -> str | None:
    """The most frequent answer as `normal_answer` compares them (ties: the first given), as its first
    sample wrote it (a code answer keeps its lines), None when none."""
    first = majority([normal_answer(a) for a in answers])
    return None if first is None else answers[first]


def choose(root: Node) -> tuple[Node, str | None]:
    """The most visited plan (ties: the higher value) and the majority answer through it."""
    if not root.children:
        return root, None
    best = max(root.children, key=lambda c: (c.visits, c.value))
    return best, majority_answer(best.answers)


def wave_size(settings: PlannerSettings, done: int, spent: int) -> int:
    """How many simulations of a problem the next wave plays, after `done` of them spent `spent` tokens:
    up to `parallel`, within `simulations`; under a token budget only as many as its rest pays for at the
    mean so far (rounded down), one at a time before the first is measured and once fewer than
    `parallel` fit, and one more only while the rest is at least half a mean simulation."""
    room = min(settings.parallel, settings.simulations - done)
    if settings.max_tokens is None or room <= 0:
        return max(room, 0)
    if done == 0:
        return 1
    fits = (settings.max_tokens - spent) / (spent / done) if spent else float(room)
    if fits >= settings.parallel:
        return room
    return 1 if fits >= 0.5 else 0


def search(
    factory: EpisodeFactory,
    backend: GenerationBackend,
    tasks: Sequence[Task],
    settings: PlannerSettings,
    *,
    seed: int = 0,
    first_problem: int = 0,
    on_wave: Callable[[int], None] | None = None,
    values: StateValues | None = None,
) -> list[SearchResult]:
    """Search every problem of `tasks` (their simulations batched together); one result per problem.
    Problem p samples with the seeds of problem `first_problem + p`: a search of a later chunk of problems
    draws what one search of them all would.
    The last round's reflection, which can change no answer, is played only for the `verdict` value.
    `values` gives planner.value=head its state values (head_values). With settings.name best_of_n no
    simulation is selected: each starts at the question, and the answer is the majority of all."""
    flat = settings.name == "best_of_n"
    final_reflection = settings.value == "verdict"
    roots = [Node("root") for _ in tasks]
    played: list[list[Simulation]] = [[] for _ in tasks]
    tokens = [0] * len(tasks)
    while True:
        wave: list[Simulation] = []
        for p, task in enumerate(tasks):
            count = wave_size(settings, len(played[p]), tokens[p])
            for _ in range(count):
                path = select(roots[p], settings)
                start = path[-1].segments
                ep = fork(factory, task, start, final_reflection)
                done = len(played[p]) + sum(s.problem == p for s in wave)
                index = (first_problem + p) * settings.simulations + done
                wave.append(Simulation(p, path, ep, index, list(start), len(start)))
        if not wave:
            break
        play_recorded(wave, backend, seed, settings.temperature)
        for sim in wave:
            for node in sim.path:
                node.pending -= 1
            played[sim.problem].append(sim)
            tokens[sim.problem] += sim.generated_tokens
        for sim in wave:
            sim.path = grow(sim)
        if settings.value == "head":
            if values is None:
                raise ValueError(
                    "planner.value=head needs the heads' values: search(..., values=head_values(...))"
                )
            leaves = [leaf_state(sim) for sim in wave]
            valued = iter(values([s for s in leaves if s is not None]))
            wave_values = [0.0 if s is None else next(valued) for s in leaves]
        else:
            wave_values = [
                episode_value(
                    sim.episode, [s.episode.final_answer for s in played[sim.problem]], settings.value
                )
                for sim in wave
            ]
        for sim, value in zip(wave, wave_values, strict=True):
            for node in sim.path:
                node.visits += 1
                node.value_sum += value
                node.answers.append(sim.episode.final_answer)
        if settings.value == "votes":  # an answer's share moves as answers come in: every node's with it
            for p in {sim.problem for sim in wave}:
                revalue(roots[p])
        if on_wave is not None:
            on_wave(len(wave))
    results = []
    for p, task in enumerate(tasks):
        best, answer = (roots[p], majority_answer(roots[p].answers)) if flat else choose(roots[p])
        through = [s for s in played[p] if any(n is best for n in s.path)]
        voted = normal_answer(answer)
        shown = next((s for s in through if normal_answer(s.episode.final_answer) == voted), through[0])
        correct = answer is not None and shown.episode.correct
        results.append(
            SearchResult(task, answer, correct, shown.episode, len(played[p]), tokens[p], roots[p])
        )
    return results


@runtime_checkable
class Planner(Protocol):
    """How eval, solve and `meta-agent demos` answer a problem with several episodes instead of one
    (check_planner is its conformance check). `search` plays episodes of each task with the factory and
    the backend and returns one SearchResult per task, in order, without reading the answer key; problem p
    samples with the seeds of problem `first_problem + p`, so searching a later chunk of problems draws what
    one search of them all would. The same seed gives the same results."""

    name: str
    # episodes of one problem played together: `searches` puts batch // parallel problems in one batch
    parallel: int

    def search(
        self,
        factory: EpisodeFactory,
        backend: GenerationBackend,
        tasks: Sequence[Task],
        *,
        seed: int,
        first_problem: int = 0,
    ) -> list[SearchResult]: ...


class Search:
    """The built-in planners, `planner.name` mcts and best_of_n, as a Planner: `search` above with these
    settings (and planner.value=head's state values)."""

    def __init__(self, settings: PlannerSettings, values: StateValues | None = None):
        if settings.name == "none":
            raise ValueError("planner.name=none plays one episode per problem: it has no Search")
        self.settings, self.values = settings, values
        self.name, self.parallel = settings.name, settings.parallel

    def search(
        self,
        factory: EpisodeFactory,
        backend: GenerationBackend,
        tasks: Sequence[Task],
        *,
        seed: int,
        first_problem: int = 0,
    ) -> list[SearchResult]:
        return search(
            factory, backend, tasks, self.settings, seed=seed, first_problem=first_problem, values=self.values
        )


def build_planner(settings: PlannerSettings, backbone: Backbone) -> Planner | None:
    """The `planner:` settings' planner (None for planner.name=none); value=head loads its heads here."""
    if settings.name == "none":
        return None
    return Search(settings, head_values(backbone, settings))


def searches(
    planner: Planner,
    factory: EpisodeFactory,
    backend: GenerationBackend,
    tasks: Sequence[Task],
    episodes_per_batch: int,
    *,
    seed: int,
) -> Iterator[list[SearchResult]]:
    """`tasks` searched `episodes_per_batch // planner.parallel` problems at a time (each chunk's
    simulations batched together), yielding each chunk's results: every problem samples as one search of
    them all would (`first_problem`)."""
    per_search = max(1, episodes_per_batch // planner.parallel)
    for start in range(0, len(tasks), per_search):
        chunk = tasks[start : start + per_search]
        yield planner.search(factory, backend, chunk, seed=seed, first_problem=start)


def check_planner(
    planner: Planner,
    factory: EpisodeFactory,
    backend: GenerationBackend,
    tasks: Sequence[Task],
    seed: int = 0,
) -> None:
    """Raises AssertionError naming the first broken promise of the Planner protocol on `tasks` (at least
    two, searched with `factory` and a `backend` whose samples follow their seeds):
    - one SearchResult per task, in order, each with at least one simulation, a whole number of generated
      tokens and a tree whose root counts every simulation, with no simulation left pending, that the
      traces can write as JSON;
    - the shown episode is of its task, finished, and answers the chosen answer (none when there is
      none: eval scores the shown episode), and `correct` is that answer's grade;
    - the same seed gives the same answers and tokens; a later chunk (`first_problem`) draws what one
      search of all the tasks drew for it;
    - the answers do not depend on the answer key (the tasks searched again with wrong gold answers).
    """
    tasks = list(tasks)
    if len(tasks) < 2:
        raise ValueError("check_planner() needs at least two tasks")
    _require(isinstance(planner, Planner), f"{planner!r} lacks a member of the Planner protocol")
    _require(
        isinstance(planner.parallel, int) and planner.parallel >= 1, "parallel must be a whole number >= 1"
    )
    results = planner.search(factory, backend, tasks, seed=seed)
    _require(
        isinstance(results, list) and len(results) == len(tasks),
        f"search gave {len(results) if isinstance(results, list) else results!r} results for {len(tasks)} tasks",
    )
    for task, r in zip(tasks, results, strict=True):
        _require(isinstance(r, SearchResult), f"search gave {type(r).__name__}, not a SearchResult")
        _require(r.task.id == task.id, f"results out of order: {r.task.id} where {task.id} was searched")
        _require(r.simulations >= 1, f"{task.id}: {r.simulations} simulations")
        _require(
            isinstance(r.generated_tokens, int) and r.generated_tokens >= 0,
            f"{task.id}: generated_tokens {r.generated_tokens!r}",
        )
        _require(isinstance(r.tree, Node), f"{task.id}: the tree is a {type(r.tree).__name__}, not a Node")
        _require(
            r.tree.visits == r.simulations,
            f"{task.id}: the root counts {r.tree.visits} visits for {r.simulations} simulations",
        )
        try:
            json.dumps(r.tree.as_dict())  # what the traces write
        except (TypeError, ValueError) as e:
            raise AssertionError(f"Planner conformance: {task.id}: the tree is not JSON ({e})") from e
        stack = [r.tree]
        while stack:
            node = stack.pop()
            _require(node.pending == 0, f"{task.id}: a node still counts {node.pending} pending simulations")
            stack.extend(node.children)
        ep = r.episode
        _require(
            isinstance(ep, Episode) and ep.task.id == task.id, f"{task.id}: the shown episode is not its own"
        )
        _require(ep.done, f"{task.id}: the shown episode is unfinished")
        _require(
            normal_answer(ep.final_answer) == normal_answer(r.answer),
            f"{task.id}: the shown episode answers {ep.final_answer!r}, the search chose {r.answer!r}",
        )
        _require(
            r.correct == (r.answer is not None and ep.correct),
            f"{task.id}: correct is {r.correct} for the answer {r.answer!r}",
        )
    answers = [(r.answer, r.generated_tokens) for r in results]
    again = planner.search(factory, backend, tasks, seed=seed)
    _require([(r.answer, r.generated_tokens) for r in again] == answers, "the same seed searched differently")
    later = planner.search(factory, backend, tasks[1:], seed=seed, first_problem=1)
    _require(
        [(r.answer, r.generated_tokens) for r in later] == answers[1:],
        "a later chunk (first_problem=1) searched differently from one search of all the tasks",
    )
    blind = [replace(t, answer=f"{t.answer}1") for t in tasks]  # another gold answer (a digit appended)
    _require(
        [r.answer for r in planner.search(factory, backend, blind, seed=seed)] == [a for a, _ in answers],
        "the answers changed with the answer key: a planner may not read task.answer",
    )


def _require(condition: bool, rule: str) -> None:
    if not condition:
        raise AssertionError(f"Planner conformance: {rule}")


def searched_plans(results: Sequence[SearchResult], meta: str) -> list[Episode]:
    """Training targets for the meta-thinker (role `meta`) from searches of problems whose answers are known
    (a train split): of each problem whose chosen answer is right, the episode the search shows for it (a
    simulation that reached that answer), with only the meta-thinker's turns
    left to learn: its plan and its reflections on the way (a revision, or the accept of a round before the
    last; the last round's reflection is played only under `planner.value=verdict`). The executors' turns
    get loss mask 0, so a demonstrations file (meta_agent.demos.build.write_demos) keeps the meta-thinker's turns
    alone, their prompts showing the executors' work where the protocol shows it (a reflection's).
    Episodes whose plan stated the answer, or whose meta-thinker turns broke their format, are left out."""
    kept = []
    for r in results:
        ep = r.episode
        mine = [t for t in ep.turns if t.role == meta]
        if not r.correct or ep.leaked or not mine or not all(t.format_ok for t in mine):
            continue
        for t in ep.turns:
            if t.role != meta:
                t.mask = [0] * len(t.mask)
        kept.append(ep)
    return kept
