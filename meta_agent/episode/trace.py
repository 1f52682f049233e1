"""Reflection traces: what each role thought and did in an episode, as JSON and as Markdown.

The JSON form (one object per line in traces.jsonl) is for scripts; the Markdown form is what
TensorBoard's text tab and `meta-agent solve` show: plan -> tool calls -> answer -> reflection,
each turn with its reward and advantage.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from meta_agent.episode.protocol import Episode
from training.run_log import RunLog


def episode_dict(ep: Episode, **extra: Any) -> dict[str, Any]:
    return {
        "task": ep.task.id,
        "source": ep.task.source,
        "question": ep.task.question,
        "gold": ep.task.answer,
        "answer": ep.final_answer,
        "correct": ep.correct,
        "truncated": ep.truncated,
        "rounds_used": ep.round + 1,
        "rewards": dict(ep.rewards),
        "memories": [{"text": h.entry.text, "score": round(h.score, 4)} for h in ep.memories],
        "lesson": ep.lesson,
        "rounds": [
            {
                "round": r.index + 1,
                "answer": r.answer,
                "correct": r.correct,
                "verdict": r.verdict,
                "verdict_tagged": r.verdict_tagged,
                "ended": r.ended,
                "plan": r.plan,
            }
            for r in ep.rounds
        ],
        "turns": [
            {
                "role": t.role,
                "kind": t.kind,
                "round": t.round,
                "text": t.text,
                "answer": t.answer,
                "format_ok": t.format_ok,
                "forged": t.forged,
                "tool_calls": [
                    {
                        "name": c.name,
                        "arguments": c.arguments,
                        "output": c.output,
                        "ok": c.ok,
                        "error": c.error,
                    }
                    for c in t.tool_calls
                ],
                "generated_tokens": t.generated_tokens,
                "reward": t.reward,
                "advantage": t.advantage,
            }
            for t in ep.turns
        ],
        **extra,
    }


def episode_markdown(ep: Episode) -> str:
    """One episode as Markdown, readable in TensorBoard's text tab and in a terminal."""
    graded = bool(ep.task.answer)  # a `solve` question has no gold answer to grade against
    mark = ("correct" if ep.correct else "wrong") if graded else "no gold answer"
    lines = [
        f"### {ep.task.id} ({mark})",
        f"**Question.** {ep.task.question}",
        "",
        f"**Gold:** {f'`{_cell(ep.task.answer)}`' if graded else '(none)'} | **answer:** `{_cell(str(ep.final_answer))}`"
        + (" | truncated by budget" if ep.truncated else ""),
    ]
    if ep.memories:
        lines += ["", "**Memories retrieved:**"] + [
            f"- ({h.score:.2f}) {_line(h.entry.text)}" for h in ep.memories
        ]
    for t in ep.turns:
        adv = "" if t.advantage is None else f", advantage {t.advantage:+.3f}"
        head = f"#### round {t.round + 1} - {t.role}: {t.kind} (reward {t.reward:+.2f}{adv}, {t.generated_tokens} tokens)"
        lines += ["", head, "", *_fenced(t.text.strip() or "(empty)")]
        for c in t.tool_calls:
            status = "ok" if c.ok else f"error: {c.error}"
            lines.append(
                f"- tool `{_cell(c.name)}` ({status}): `{_cell(c.arguments, 200)}` -> `{_cell(c.output, 200)}`"
            )
        if t.kind == "execute":
            lines.append(f"- answer: `{_cell(str(t.answer))}` (format {'kept' if t.format_ok else 'broken'})")
        if t.forged:
            lines.append(f"- forged observations: {t.forged} (what imitated the environment is quoted above)")
    if ep.lesson:
        # Written by the reflection; stored only where the memory is on and the run writes lessons.
        lines += ["", f"**Lesson:** {_line(ep.lesson)}"]
    lines += ["", *rounds_table(ep, graded)]
    return "\n".join(lines)


def rounds_table(ep: Episode, graded: bool = True) -> list[str]:
    """Each round graded: the executors' answer, whether it is correct (n/a without a gold answer), the
    verdict, whether it ended."""
    rows = ["| round | answer | correct | verdict | ended the episode |", "| --- | --- | --- | --- | --- |"]
    for r in ep.rounds:
        answer = f"`{_cell(r.answer)}`" if r.answer is not None else "(none)"
        verdict = r.verdict or "(no reflection)"
        rows.append(
            f"| {r.index + 1} | {answer} | {('yes' if r.correct else 'no') if graded else 'n/a'} | {verdict} "
            f"| {'yes' if r.ended else 'no'} |"
        )
    return rows


class TraceWriter:
    """Appends episodes to a JSON-lines file, one object per line, flushed per batch."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, episodes: list[Episode], **extra: Any) -> None:
        # errors="replace": whatever text an episode holds, the writer writes it (a lone surrogate as "?").
        with self.path.open("a", encoding="utf-8", errors="replace") as f:
            for ep in episodes:
                f.write(json.dumps(episode_dict(ep, **extra), ensure_ascii=False) + "\n")


def write_step_traces(
    log: RunLog, traces: TraceWriter | None, episodes: list[Episode], group: int, step: int
) -> None:
    """Two episodes of the first group into TensorBoard's text tab; rank 0's episodes into traces.jsonl."""
    for k, ep in enumerate(episodes[: group : max(group // 2, 1)]):
        log.text(f"traces/episode_{k}", episode_markdown(ep), step)
    if traces is not None:
        traces.write(episodes, split="train", step=step)


def _cell(text: str, limit: int = 80) -> str:
    """Model text inside inline code or a table cell: one line, no pipes or backticks to break out."""
    return _line(text).replace("|", "\\|").replace("`", "'")[:limit]


def _line(text: str) -> str:
    """Model text on one line: a line break could start a forged table row or heading."""
    return " ".join(text.split())


def _fenced(text: str) -> list[str]:
    """Model text in a code block whose fence is longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", text, fence]
