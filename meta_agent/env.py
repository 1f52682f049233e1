"""The episode protocol as a PettingZoo AECEnv: agents are the role names, observations and actions text.

One action is one generation segment of the acting role: a plan, a reflection, or executor text
up to a tool call or an answer. After a tool call the env runs the tool, appends the result to the
executor's observation, and the executor acts again. Rewards arrive when the episode ends.

    env = MetaAgentEnv(factory, tasks)
    env.reset(seed=0)
    for agent in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        env.step(None if terminated or truncated else policy(agent, obs))

Play many episodes at once, with batched generation, through `meta_agent.runner.play` instead.
`ParallelExecutorsEnv` (below) is the ParallelEnv beside it: several executors on one plan at once.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from gymnasium.spaces import Text
from pettingzoo import AECEnv, ParallelEnv

from meta_agent.episode import Episode
from meta_agent.runner import EpisodeFactory
from meta_agent.tasks import Task
from roles import executors as executor_specs
from roles import meta_thinker

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
        from meta_agent.trace import episode_markdown

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
