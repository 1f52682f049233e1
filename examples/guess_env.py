"""A researcher's own env, written against PettingZoo, that `meta-agent train` plays unchanged:

    PYTHONPATH=. meta-agent train experiment=arith_single_agent sft.enabled=false \
        train.env=examples.guess_env:GuessNumber +train.env_args.guesses=5

The env draws a whole number from 1 to `high` with the reset's seed (the G rollouts of a group share
it); the agent guesses, is told "higher" or "lower", and is paid 1 when it finds the number within
`guesses` tries. Its one agent is named after the role that plays it (`executor`). Nothing here knows
the trainer: `system_prompt` and `stops` are the optional hooks the trainer reads (meta_agent.env.rollout).
"""

from __future__ import annotations

import re

import numpy as np
from pettingzoo import AECEnv

# Text spaces of any string, and a str with the dtype PettingZoo's api_test compares
from meta_agent.env.environments import TextObservation, TextSpace


class GuessNumber(AECEnv):
    metadata = {"name": "guess_number_v0", "render_modes": [], "is_parallelizable": False}

    def __init__(self, high: int = 100, guesses: int = 7, agent: str = "executor"):
        super().__init__()
        self.high, self.guesses = high, guesses
        self.possible_agents = [agent]
        self._spaces = {agent: TextSpace(2_000)}
        self.log: list[str] = []

    def observation_space(self, agent: str) -> TextSpace:
        return self._spaces[agent]

    def action_space(self, agent: str) -> TextSpace:
        return self._spaces[agent]

    def system_prompt(self, agent: str) -> str:
        return f"Find a hidden whole number from 1 to {self.high}. Answer with one guess inside <answer>...</answer>."

    def stops(self, agent: str) -> tuple[str, ...]:
        return ("</answer>",)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.secret = int(np.random.default_rng(seed).integers(1, self.high + 1))
        self.agents = list(self.possible_agents)
        self.agent_selection = self.agents[0]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.log = []

    def observe(self, agent: str) -> TextObservation:
        told = "\n".join(self.log) or "No guesses yet."
        return TextObservation(f"{told}\nGuesses left: {self.guesses - len(self.log)}.")

    def step(self, action: str | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        found = re.findall(r"-?\d+", action.split("<answer>")[-1])
        guess = int(found[0]) if found else None
        if guess == self.secret:
            self.rewards[agent] = 1.0
            self.terminations[agent] = True
        else:
            hint = "no number" if guess is None else ("higher" if guess < self.secret else "lower")
            self.log.append(f"Guess {len(self.log) + 1}: {guess}, {hint}.")
            self.rewards[agent] = 0.0
            self.truncations[agent] = len(self.log) >= self.guesses
        self.infos[agent] = {"correct": guess == self.secret, "answer": guess}
        self._accumulate_rewards()
