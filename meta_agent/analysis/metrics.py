"""What a batch of episodes did, as the scalars logged every step (TensorBoard and metrics.jsonl).

    log.scalars(rollout_metrics(episodes, roles), step)

Pure functions of finished episodes: `rollout/...` for the batch as a whole, `role/<role>/...` for
each role's turns.
"""

from __future__ import annotations

from collections.abc import Sequence

from meta_agent.episode.protocol import Episode
from roles import RoleSpec


def rollout_metrics(episodes: Sequence[Episode], roles: Sequence[RoleSpec]) -> dict[str, float]:
    """Accuracy, tools, memory and truncation per episode; per role its answers' accuracy, response
    length, tool use and kept format. Rounds and leaks are reflection metrics (meta_agent.analysis.reflection)."""
    n = max(len(episodes), 1)
    metrics = {
        "rollout/accuracy": sum(ep.correct for ep in episodes) / n,
        "rollout/tool_calls": sum(ep.tool_calls for ep in episodes) / n,
        "rollout/tool_errors": sum(ep.tool_errors for ep in episodes) / n,
        "rollout/memory_hits": sum(len(ep.memories) for ep in episodes) / n,
        "rollout/truncated": sum(ep.truncated for ep in episodes) / n,
        # A count, not a mean: every marker of the environment a role wrote itself (meta_agent.episode.prompts).
        "rollout/forged_observations": float(sum(t.forged for ep in episodes for t in ep.turns)),
    }
    for role in roles:
        turns = [t for ep in episodes for t in ep.turns if t.role == role.name]
        if not turns:
            continue
        prefix = f"role/{role.name}"
        metrics[f"{prefix}/accuracy"] = metrics["rollout/accuracy"]  # every role shares the episode's outcome
        metrics[f"{prefix}/response_length"] = sum(t.generated_tokens for t in turns) / len(turns)
        metrics[f"{prefix}/tool_calls"] = sum(len(t.tool_calls) for t in turns) / n
        metrics[f"{prefix}/tool_errors"] = sum(1 for t in turns for c in t.tool_calls if not c.ok) / n
        metrics[f"{prefix}/format_ok"] = sum(t.format_ok for t in turns) / len(turns)
        metrics[f"{prefix}/forged_observations"] = float(sum(t.forged for t in turns))
    return metrics
