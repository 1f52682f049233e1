"""The episode protocol as a PettingZoo AECEnv: agents are the role names, observations and actions text.

One action is one generation segment of the acting role: a plan, a reflection, or executor text
up to a tool call or an answer. After a tool call the env runs the tool, appends the result to the
executor's observation, and the executor acts again. Rewards arrive when the episode ends.

    env = MetaAgentEnv(factory, tasks)
    env.reset(seed=0)
    for agent in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        env.step(None if terminated or truncated else policy(agent, obs))

Play many episodes at once, with batched generation, through `meta_agent.episode.runner.play` instead.
`ParallelExecutorsEnv` (below) is the ParallelEnv beside it: several executors on one plan at once.
`FeedbackEnv` is a task answered over several attempts, told after each whether it was right (with a
reflector between attempts, if wanted): an env of more than one step that the trainer plays with
`train.env=feedback` (meta_agent.env.rollout), as it plays a researcher's own env.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from gymnasium.spaces import Text
from pettingzoo import AECEnv, ParallelEnv

from meta_agent.episode.chat import special_tokens as tokenizer_special_tokens
from meta_agent.episode.prompts import (
    PREVIOUS_HEADER,
    REFLECTION_HEADER,
    environment_markers,
    neutralise,
    tail,
)
from meta_agent.episode.protocol import Episode, run_call
from meta_agent.episode.reward import score
from meta_agent.episode.runner import EpisodeFactory
from meta_agent.tasks import Task, grade_task, load_tasks
from roles import Grammar, meta_thinker, parse_executor
from roles import executors as executor_specs
from tools import build_registry
from tools.registry import ToolRegistry
from training.model_files import ModelConfig, load_tokenizer

MAX_OBSERVATION_CHARS = 200_000
MAX_ACTION_CHARS = 4_000


class TextSpace(Text):
    """Any string up to max_length: model text is free Unicode, not a fixed alphabet.

    Sampling (used by PettingZoo's tests) draws from printable ASCII plus the grammar's brackets.
    """

    def __init__(self, max_length: int, seed: int | None = None):
        super().__init__(max_length=max_length, min_length=0, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length


class TextObservation(str):
    """A str that also carries the space's numpy dtype: PettingZoo's api_test compares
    `observation.dtype` with `observation_space.dtype`, and a plain str has no dtype."""

    dtype = np.dtype(str)


def reset_task(tasks: Sequence[Task], seed: int | None, options: dict) -> Task:
    """The task a reset plays: `options["task"]` when given, else one of `tasks` drawn by `seed`."""
    task = options.get("task")
    if isinstance(task, Task):
        return task
    return tasks[int(np.random.default_rng(seed).integers(len(tasks)))]


class MetaAgentEnv(AECEnv):
    metadata = {"name": "meta_agent_v0", "render_modes": ["ansi"], "is_parallelizable": False}

    def __init__(self, factory: EpisodeFactory, tasks: Sequence[Task], render_mode: str | None = None):
        super().__init__()
        if not tasks:
            raise ValueError("MetaAgentEnv needs at least one task")
        self.factory = factory
        self.tasks = list(tasks)
        self.render_mode = render_mode
        self.possible_agents = [r.name for r in factory.roles]
        self.observation_spaces = {a: TextSpace(MAX_OBSERVATION_CHARS) for a in self.possible_agents}
        self.action_spaces = {a: TextSpace(MAX_ACTION_CHARS) for a in self.possible_agents}
        self.episode: Episode | None = None
        self._last_obs: dict[str, str] = {}

    def observation_space(self, agent: str) -> TextSpace:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> TextSpace:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        options = options or {}
        task = reset_task(self.tasks, seed, options)
        self.episode = self.factory.new(task)
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {"task": task.id} for a in self.agents}
        self._last_obs = dict.fromkeys(self.agents, "")
        self.agent_selection = self.episode.current_role

    def observe(self, agent: str) -> str:
        if self.episode is not None and not self.episode.done and agent == self.episode.current_role:
            self._last_obs[agent] = self.episode.observation()[-MAX_OBSERVATION_CHARS:]
        return TextObservation(self._last_obs.get(agent, ""))

    def step(self, action: str | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        assert self.episode is not None
        if not isinstance(action, str):
            raise TypeError(
                f"action for {agent} must be a str (the generated text), got {type(action).__name__}"
            )
        self._cumulative_rewards[agent] = 0.0
        self.episode.advance_text(action)
        if self.episode.done:
            ep = self.episode
            score([ep])  # the rewards the agents are handed now
            for a in self.agents:
                self.rewards[a] = ep.rewards.get(a, 0.0)
                self.terminations[a] = not ep.truncated
                self.truncations[a] = ep.truncated
                self.infos[a] = {"task": ep.task.id, "answer": ep.final_answer, "correct": ep.correct}
        else:
            self.rewards = dict.fromkeys(self.agents, 0.0)
            self.agent_selection = self.episode.current_role
        self._accumulate_rewards()

    def render(self) -> str | None:
        if self.episode is None or self.render_mode != "ansi":
            return None
        from meta_agent.episode.trace import episode_markdown

        return episode_markdown(self.episode)

    def close(self) -> None:
        self.episode = None


class ParallelExecutorsEnv(ParallelEnv):
    """Several executors on one plan, acting at the same time: a PettingZoo ParallelEnv.

    Agents are `executor_0` ... `executor_{n-1}`. Each plays its own episode of the same task with the
    factory's executor (its tools, limits and grader), shown the same plan: `reset(options={"plan":
    "<plan>...</plan>"})`, or none (the executor alone reads the question). Every step each live executor
    sends one action, a generation segment as in MetaAgentEnv; the env runs any tool call and the
    executor observes the result next step. An executor that answers (or runs out of budget) is done:
    its reward is its episode's reward (1 for a right answer, less the penalties), `infos` give the
    answer and whether it is right, and it leaves `agents`.

        env = ParallelExecutorsEnv(factory, tasks, executors=4)
        observations, infos = env.reset(seed=0, options={"plan": plan})
        while env.agents:
            observations, rewards, terminations, truncations, infos = env.step(
                {agent: policy(observations[agent]) for agent in env.agents})
    """

    metadata = {"name": "meta_agent_parallel_executors_v0", "render_modes": []}

    def __init__(self, factory: EpisodeFactory, tasks: Sequence[Task], executors: int = 2):
        super().__init__()
        if not tasks:
            raise ValueError("ParallelExecutorsEnv needs at least one task")
        if executors < 1:
            raise ValueError(f"ParallelExecutorsEnv needs at least one executor, got {executors}")
        executor_roles = executor_specs(factory.roles)
        if not executor_roles:
            raise ValueError("ParallelExecutorsEnv needs a factory whose roles include an executor")
        self.factory = factory
        self.tasks = list(tasks)
        self.executor = executor_roles[0]
        self.planner = meta_thinker(factory.roles)
        self.possible_agents = [f"executor_{i}" for i in range(executors)]
        self.observation_spaces = {a: TextSpace(MAX_OBSERVATION_CHARS) for a in self.possible_agents}
        self.action_spaces = {a: TextSpace(MAX_ACTION_CHARS) for a in self.possible_agents}
        self.episodes: dict[str, Episode] = {}

    def observation_space(self, agent: str) -> TextSpace:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> TextSpace:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        options = options or {}
        task = reset_task(self.tasks, seed, options)
        plan = options.get("plan")
        if plan is not None and self.planner is None:
            raise ValueError("a plan needs a meta-thinker among the factory's roles to carry it")
        roles = [self.planner, self.executor] if plan is not None else [self.executor]
        self.agents = list(self.possible_agents)
        self.episodes = {}
        for agent in self.agents:
            # one round, no reflection: the episode ends when its executor answers
            one_round = replace(self.factory.limits, max_rounds=1)
            episode = self.factory.new(task, roles=roles, final_reflection=False, limits=one_round)
            if plan is not None:
                episode.advance_text(plan)  # the meta-thinker's turn, the same text for every executor
            self.episodes[agent] = episode
        return {a: self._observe(a) for a in self.agents}, {a: {"task": task.id} for a in self.agents}

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        missing = [a for a in self.agents if a not in actions]
        if missing:
            raise ValueError(f"every live agent acts each step; no action for {missing}")
        observations, rewards, terminations, truncations, infos = {}, {}, {}, {}, {}
        for agent in list(self.agents):
            action = actions[agent]
            if not isinstance(action, str):
                raise TypeError(
                    f"action for {agent} must be a str (the generated text), got {type(action).__name__}"
                )
            episode = self.episodes[agent]
            if not episode.done:
                episode.advance_text(action)
                if episode.done:
                    score([episode])  # the reward its agent is handed now
            done = episode.done
            observations[agent] = self._observe(agent)
            rewards[agent] = episode.rewards.get(self.executor.name, 0.0) if done else 0.0
            terminations[agent] = done and not episode.truncated
            truncations[agent] = done and episode.truncated
            infos[agent] = {"task": episode.task.id}
            if done:
                infos[agent] |= {"answer": episode.final_answer, "correct": episode.correct}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        return observations, rewards, terminations, truncations, infos

    def _observe(self, agent: str) -> TextObservation:
        episode = self.episodes[agent]
        text = episode.observation() if not episode.done else ""
        return TextObservation(text[-MAX_OBSERVATION_CHARS:])

    def close(self) -> None:
        self.episodes = {}


MAX_REFLECTION_CHARS = 1_000  # a reflection as the solver's next attempt shows it
# the framing lines FeedbackEnv lays out as the hierarchy's episode does, so roles warm-started on its
# demonstrations read them as they learnt to (meta_agent.episode.prompts), and its agents' `[role]`
# headers. Model text that writes one of them at the start of a line, a tool-result tag or a chat special
# token is quoted, counted and refused, as the hierarchy's episode refuses it.
FRAMING_HEADERS = (
    PREVIOUS_HEADER,
    REFLECTION_HEADER,
    "Question:",
    "The executor's work:",
    "Its final answer:",
)


@functools.cache
def default_special_tokens() -> tuple[str, ...]:
    """The special tokens of the default backbone's tokenizer (model.path unset): what FeedbackEnv quotes
    when it is played directly, without a run to say which tokenizer reads its observations."""
    return tokenizer_special_tokens(load_tokenizer(ModelConfig()))


@dataclass
class Attempt:
    """One attempt of FeedbackEnv's solver: its work (text, tool calls and their results), its answer,
    whether that was right, and the reflector's reflection on it (when there is a reflector)."""

    work: str = ""
    calls: int = 0
    answer: str | None = None
    correct: bool = False
    reflection: str | None = None


class FeedbackEnv(AECEnv):
    """A task answered over several attempts, told after each whether it was right: the Reflexion loop,
    as a PettingZoo AECEnv of more than one step per episode.

    Agents: `solver` (a role name, default "executor") and, when `reflector` names a second role, that
    role. Each solver action is one generation segment: a tool call (`tools`, run by the env; the call and
    its result become the start of the solver's next reply, `prefill`, which it continues) or an answer in
    <answer>...</answer>. A right answer ends the episode with reward 1 less `attempt_cost` for each wrong
    attempt before it; a wrong one is told so and, while attempts are left, starts the next attempt, after
    the reflector's reflection on it. Every agent gets the episode's reward when it ends; `infos` give the
    answer, whether it was right, the attempts, tool calls and errors, and per action what it forged.

    The solver's prompts are laid out as the hierarchy's episode lays them out, so an executor
    warm-started on its demonstrations reads them as it learnt to: its role's own system prompt
    (`system_prompt` is None; `tool_names` says which tools it describes), then "Previous attempt:"
    blocks, each told wrong, "The meta-thinker's reflection:" and "Question: ...". The reflector gets its
    role's system prompt, the question, "The executor's work:" and "Its final answer:", and is asked for
    a reflection alone (the hierarchy's reflect prompt also asks for a lesson and a verdict).

        env = FeedbackEnv(attempts=3, reflector="meta_thinker")
        env.reset(seed=0, options={"task": task})        # a Task; without one, drawn from `task`'s train split
        for agent in env.agent_iter():
            obs, reward, terminated, truncated, info = env.last()
            env.step(None if terminated or truncated else policy(agent, obs, env.prefill(agent)))

    The trainer plays it with `train.env=feedback` (meta_agent.env.rollout), `train.env_args` being these
    arguments. Model text is data: the env runs only the calls it parses, quotes what imitates its own
    markers (and refuses that action), and grades answers with the task's own grader.
    """

    metadata = {"name": "meta_agent_feedback_v0", "render_modes": [], "is_parallelizable": False}

    def __init__(
        self,
        attempts: int = 3,
        solver: str = "executor",
        reflector: str | None = None,
        tools: Sequence[str] = ("calculator",),
        max_tool_calls: int = 4,
        attempt_cost: float = 0.1,
        task: str = "arith",
        registry: ToolRegistry | None = None,
        special_tokens: Sequence[str] | None = None,
    ):
        super().__init__()
        if attempts < 1:
            raise ValueError(f"FeedbackEnv needs attempts >= 1, got {attempts}")
        if reflector == solver:
            raise ValueError(f"FeedbackEnv's reflector must be another role than its solver ({solver!r})")
        self.attempts = attempts
        self.solver, self.reflector = solver, reflector
        self.max_tool_calls = max_tool_calls
        self.attempt_cost = attempt_cost
        self.task_name = task
        self.tools = list(tools)
        self.registry = registry if registry is not None or not tools else build_registry(self.tools)
        missing = [t for t in self.tools if self.registry is None or t not in self.registry]
        if missing:
            raise ValueError(f"FeedbackEnv's tools {missing} are not in its registry")
        self.grammar = Grammar()
        # what only the env writes into an observation: model text (actions, and tool output echoing
        # it) has these quoted, so it cannot close a tool result, open a chat turn or start a block
        specials = default_special_tokens() if special_tokens is None else tuple(special_tokens)
        roles = [solver] + ([reflector] if reflector else [])
        self._markers = environment_markers([self.grammar], roles, specials, FRAMING_HEADERS)
        self.possible_agents = [solver] + ([reflector] if reflector else [])
        self.observation_spaces = {a: TextSpace(MAX_OBSERVATION_CHARS) for a in self.possible_agents}
        self.action_spaces = {a: TextSpace(MAX_ACTION_CHARS) for a in self.possible_agents}
        self._pool: list[Task] | None = None
        self.task: Task | None = None
        self.history: list[Attempt] = []
        self.tool_calls = self.tool_errors = self.forged = 0

    def observation_space(self, agent: str) -> TextSpace:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> TextSpace:
        return self.action_spaces[agent]

    def tool_names(self, agent: str) -> list[str]:
        """The tools the env runs for `agent`: the role's system prompt describes only these."""
        return [] if agent == self.reflector else list(self.tools)

    def system_prompt(self, agent: str) -> None:
        """None: each agent is prompted with its role's own system prompt (meta_agent.env.rollout)."""
        return None

    def prefill(self, agent: str) -> str:
        """The start of `agent`'s reply: the solver's work so far in this attempt (its text, each tool call
        and its result), which it continues as in the hierarchy's episode; nothing for the reflector."""
        if agent == self.reflector or not self.history:
            return ""
        return self.history[-1].work

    def stops(self, agent: str) -> tuple[str, ...]:
        """Where `agent`'s generation of one action ends."""
        return (self.grammar.reflection[1],) if agent == self.reflector else self.grammar.executor_stops()

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        options = options or {}
        if not isinstance(options.get("task"), Task) and self._pool is None:
            self._pool = load_tasks(self.task_name, "train", limit=256)
        self.task = reset_task(self._pool or [], seed, options)
        self.history = [Attempt()]
        self.tool_calls = self.tool_errors = self.forged = 0  # over the episode, all attempts
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {"task": self.task.id} for a in self.agents}
        self.agent_selection = self.solver

    def observe(self, agent: str) -> TextObservation:
        """The solver: its earlier attempts, each told wrong, the reflection on the last, then the question
        (its work in this attempt is the prefill). The reflector: the question, the last attempt's work
        and its answer, told wrong. Laid out with the blocks of the hierarchy's episode."""
        if self.task is None:
            return TextObservation("")
        question = f"Question: {self.task.question}"
        if agent == self.reflector:
            done = [a for a in self.history if a.answer is not None]
            if not done or done[-1].correct:  # nothing wrong to reflect on (yet)
                return TextObservation(f"{question}\n\nNo wrong attempt to reflect on.")
            work = tail(done[-1].work.strip()) or "(no work)"
            text = (
                f"{question}\n\nThe executor's work:\n[{self.solver}]\n{work}\n\n"
                f"Its final answer: {done[-1].answer or '(no answer)'}\n\nThe answer is wrong. Write what "
                "went wrong and what to do instead inside <reflection>...</reflection>."
            )
        else:
            blocks = []
            for done in self.history[:-1]:
                blocks.append(
                    f"{PREVIOUS_HEADER}\n{tail(done.work.strip())}\nThe answer {done.answer or '(none)'} is wrong."
                )
            if len(self.history) > 1 and self.history[-2].reflection:
                blocks.append(f"{REFLECTION_HEADER}\n{self.history[-2].reflection}")
            text = "\n\n".join([*blocks, question])
        return TextObservation(text[-MAX_OBSERVATION_CHARS:])

    def step(self, action: str | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        if not isinstance(action, str):
            raise TypeError(
                f"action for {agent} must be a str (the generated text), got {type(action).__name__}"
            )
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        action, forged = neutralise(action, self._markers)
        self.forged += forged
        if agent == self.reflector:
            body = action.split(self.grammar.reflection[0])[-1].split(self.grammar.reflection[1])[0]
            self.history[-2].reflection = " ".join(body.split())[:MAX_REFLECTION_CHARS] or None
            self.agent_selection = self.solver
        else:
            forged += self._solver_step(action, forged > 0)
        # what this action did, for the trainer's counts (meta_agent.env.rollout); the last one stays
        self.infos[agent] = self.infos[agent] | {"forged": forged} | self._counts()
        self._accumulate_rewards()

    def _counts(self) -> dict[str, int]:
        return {"tool_calls": self.tool_calls, "tool_errors": self.tool_errors, "forged_total": self.forged}

    def _solver_step(self, action: str, forged: bool) -> int:
        """A tool call (run, its result shown next) or an answer (graded). An action that wrote a marker
        only the env writes is refused, as the hierarchy's episode refuses it: no call runs, and it is an
        attempt with no answer. Returns the markers the tool's output echoed (quoted and counted, as the
        hierarchy's episode counts them against the turn)."""
        attempt = self.history[-1]
        stripped = action.rstrip()
        step = parse_executor(stripped, self.grammar, final=not stripped.endswith(self.grammar.tool_call[1]))
        if step.tool_call is not None and not forged:
            attempt.work += stripped
            attempt.calls += 1
            self.tool_calls += 1
            ok = False
            if attempt.calls > self.max_tool_calls:
                output = "tool call limit reached for this attempt: give your answer now"
            else:
                result = run_call(self.registry, self.tools, step.tool_call)[1]
                output, ok = result.output, result.ok
            self.tool_errors += not ok
            output, echoed = neutralise(output, self._markers)
            self.forged += echoed
            attempt.work += self.grammar.wrap_tool_result(output)
            return echoed
        attempt.work += stripped
        attempt.answer = "" if forged else step.answer or ""
        attempt.correct = bool(attempt.answer) and grade_task(attempt.answer, self.task)
        if attempt.correct or len(self.history) >= self.attempts:
            wrong = len(self.history) - 1
            reward = max(0.0, 1.0 - self.attempt_cost * wrong) if attempt.correct else 0.0
            for a in self.agents:
                self.rewards[a] = reward
                self.terminations[a] = True
                self.infos[a] = {
                    "task": self.task.id,
                    "answer": attempt.answer,
                    "correct": attempt.correct,
                    "attempts": len(self.history),
                } | self._counts()
            return 0
        self.history.append(Attempt())
        self.agent_selection = self.reflector or self.solver
        return 0

    def close(self) -> None:
        self.task = None
