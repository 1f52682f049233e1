"""The reward step: what each role did in a finished episode (its roles.Outcome, recorded as the episode
ends) becomes that role's reward, by roles.rewards.role_reward with the role's RewardSpec.

    play(episodes, backend)   # meta_agent.episode.runner: each episode records `outcomes` as it ends
    score(episodes)           # episode.rewards[role] and every turn's `reward`

A step of its own, so a reader of the training loop sees where rewards come from, and a new reward is
a change to roles/rewards.py alone. An episode whose rewards come from elsewhere records no outcome
(meta_agent.env.rollout.EnvEpisode: its env hands them out), and score leaves its rewards as they are.
"""

from __future__ import annotations

from collections.abc import Iterable

from meta_agent.episode.records import PlayedEpisode
from roles import role_reward


def score(episodes: Iterable[PlayedEpisode]) -> None:
    """Set each finished episode's `rewards[role]`, and the `reward` of every turn of that role, from the
    outcome it recorded for the role. Scoring an episode again gives it the same rewards."""
    for episode in episodes:
        if not episode.done:
            raise RuntimeError("score() before the episode finished")
        for name, outcome in episode.outcomes.items():
            role = episode.roles[name]
            reward = role_reward(role.kind, role.reward, outcome)
            episode.rewards[name] = reward
            for turn in episode.turns:
                if turn.role == name:
                    turn.reward = reward
