"""The hierarchy: tasks, episode protocol, PettingZoo env, rollout orchestration, eval, CLI."""
