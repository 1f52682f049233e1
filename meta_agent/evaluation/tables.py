"""What `meta-agent eval` prints: accuracy per task, sampling statistics, the reflection metrics, the
spread over seeds. Values that cannot be computed print as "n/a"."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from rich.table import Table

from meta_agent.evaluation.evaluate import TaskScore

# The reflection metrics a reader looks at first, in reading order (every one is in eval.json).
REFLECTION_ROWS = (
    ("verdicts", "verdicts (reflected rounds)", "d"),
    ("accept_given_right", "P(accept | right)", "f"),
    ("accept_given_wrong", "P(accept | wrong)", "f"),
    ("revise_given_wrong", "P(revise | wrong) = recall", "f"),
    ("revise_precision", "P(wrong | revise) = precision", "f"),
    ("revision_rate", "revision rate", "f"),
    ("transitions", "transitions between rounds", "d"),
    ("wrong_to_right", "wrong -> right", "d"),
    ("right_to_wrong", "right -> wrong", "d"),
    ("self_correction", "self-correction per episode", "f"),
    ("rounds_used", "rounds used", "f"),
    ("final_answer_round", "round of the final answer", "f"),
    ("answer_leaks", "answer leaks", "f"),
    ("plan_adherence", "plan adherence", "f"),
    ("plan_adherence_episodes", "episodes with a checkable plan", "d"),
)


def fmt(value: float | None, kind: str = "f") -> str:
    if value is None:
        return "n/a"
    return f"{value:.0f}" if kind == "d" else f"{value:.3f}"


def accuracy_table(scores: Mapping[str, TaskScore], title: str) -> Table:
    table = Table(title=title)
    sampled = any(s.samples > 1 for s in scores.values())
    columns = [
        "task",
        "accuracy",
        "95% interval",
        "correct",
        "answered",
        "tool calls",
        "tool errors",
        "leaks",
        "tokens",
    ]
    if sampled:
        columns[3:3] = ["pass@k", "maj@k"]
    for col in columns:
        table.add_column(col, justify="left" if col == "task" else "right")
    for s in scores.values():
        interval = "n/a" if s.interval is None else f"[{s.interval[0]:.3f}, {s.interval[1]:.3f}]"
        row = [s.task, f"{s.accuracy:.3f}", interval]
        if sampled:
            row.append("  ".join(f"@{k} {v:.3f}" for k, v in s.pass_at.items()))
            row.append(f"@{s.samples} {fmt(s.maj_accuracy)}")
        row += [
            f"{s.correct}/{s.total}",
            str(s.answered),
            str(s.tool_calls),
            str(s.tool_errors),
            str(s.leaks),
        ]
        table.add_row(*row, str(s.generated_tokens))
    return table


def reflection_table(columns: Mapping[str, TaskScore]) -> Table:
    """One column per evaluated (task, seed): what the reflections did (meta_agent.analysis.reflection)."""
    table = Table(title="reflection (n/a: nothing to compute it from)")
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")
    for key, label, kind in REFLECTION_ROWS:
        table.add_row(label, *(fmt(s.reflection.get(f"reflection/{key}"), kind) for s in columns.values()))
    return table


def seed_table(runs: Mapping[int, Mapping[str, TaskScore]]) -> Table:
    """Accuracy per task over the seeds: mean, sample std, min and max."""
    table = Table(title=f"over {len(runs)} seeds ({', '.join(map(str, runs))})")
    for col in ("task", "mean accuracy", "std", "min", "max"):
        table.add_column(col, justify="left" if col == "task" else "right")
    tasks = next(iter(runs.values())).keys()
    for task in tasks:
        values = [scores[task].accuracy for scores in runs.values()]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        table.add_row(
            task, f"{statistics.mean(values):.3f}", f"{std:.3f}", f"{min(values):.3f}", f"{max(values):.3f}"
        )
    return table
