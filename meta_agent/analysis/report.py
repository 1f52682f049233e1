"""`meta-agent report RUN_DIR`: a self-contained HTML report of a run, with its figures as PNG files.

    meta-agent report runs/arith_hierarchy-20261201-120000   # -> runs/.../report/report.html, figures/*.png

Drawn with matplotlib from the run's metrics.jsonl and traces.jsonl: reward and accuracy per role over
the steps, held-out accuracy, the transition rates and the verdict calibration over the steps, plan
adherence and leaks, and a few episodes shown round by round, side by side, with what changed between
rounds. A figure with nothing to draw says so (one round per episode has no transitions).
"""

from __future__ import annotations

import base64
import difflib
import html
import json
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from meta_agent.errors import BadData, MissingFile  # noqa: E402
from meta_agent.tasks.jsonl import decoded  # noqa: E402

FIGURES = {
    "reward": ("Reward per role", [("role/{role}/reward", "{role}")]),
    "accuracy": (
        "Accuracy over GRPO steps (held-out at step 0: before any training, where train.eval_base)",
        [("rollout/accuracy", "rollout"), ("eval/accuracy", "held-out")],
    ),
    "sft": ("Held-out accuracy over SFT steps (the warm start)", [("sft/eval/accuracy", "held-out")]),
    "transitions": (
        "Transitions between consecutive rounds (share of transitions)",
        [
            ("reflection/wrong_to_right_rate", "wrong -> right"),
            ("reflection/right_to_wrong_rate", "right -> wrong"),
            ("reflection/wrong_to_wrong_rate", "wrong -> wrong"),
            ("reflection/right_to_right_rate", "right -> right"),
            ("reflection/self_correction", "self-correction per episode"),
        ],
    ),
    "calibration": (
        "Verdict calibration",
        [
            ("reflection/accept_given_right", "P(accept | right)"),
            ("reflection/accept_given_wrong", "P(accept | wrong)"),
            ("reflection/revise_given_wrong", "P(revise | wrong) (recall)"),
            ("reflection/revise_precision", "P(wrong | revise) (precision)"),
            ("reflection/revision_rate", "revision rate"),
            ("reflection/revise_same_plan_rate", "revised, next plan the same"),
            ("reflection/revise_same_answer_rate", "revised, next answer the same"),
        ],
    ),
    "plans": (
        "Plans",
        [("reflection/plan_adherence", "plan adherence"), ("reflection/answer_leaks", "answer leaks")],
    ),
}


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise MissingFile(f"{path} not found: report reads a run folder written by meta-agent train or eval")
    rows = []
    for n, raw in enumerate(path.read_bytes().splitlines(), start=1):
        line = decoded(raw, path, n)
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise BadData(f"{path}:{n}: not JSON ({err.msg}); is the run still writing it?") from err
            if not isinstance(row, dict):
                raise BadData(
                    f"{path}:{n}: a row must be a JSON object, not {row!r:.40}: was it written by a run?"
                )
            rows.append(row)
    return rows


def check_metrics(rows: Sequence[dict], path: Path) -> None:
    """Every metrics row has its whole-number step (what the figures are drawn against)."""
    for n, row in enumerate(rows, start=1):
        if not isinstance(row.get("step"), int):
            raise BadData(f"{path}: row {n} has no whole-number 'step': was it written by meta-agent train?")


def series(rows: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, in step order; the last value of a step wins."""
    points = {row["step"]: row[key] for row in rows if key in row}
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def roles_in(rows: Sequence[dict]) -> list[str]:
    return sorted(
        {k.split("/")[1] for row in rows for k in row if k.startswith("role/") and k.endswith("/reward")}
    )


TITLE_CHARS = 64  # a title line's characters: a 12 pt line of 64 fits the 7-inch figure's width


def draw(rows: Sequence[dict], name: str, folder: Path) -> tuple[Path, bool]:
    """One figure as a PNG; returns its path and whether it had anything to draw."""
    fig, drawn = figure(rows, name)
    path = folder / f"{name}.png"
    fig.savefig(path)
    plt.close(fig)
    return path, drawn


def figure(rows: Sequence[dict], name: str) -> tuple[Figure, bool]:
    """One figure of FIGURES, its title wrapped and laid out to fit; and whether it drew anything."""
    title, lines = FIGURES[name]
    # constrained layout makes room for a wrapped title and the legend; tight_layout cut long titles
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110, layout="constrained")
    drawn = False
    styles = iter([("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--")] * 4)
    for pattern, label in lines:
        for role in roles_in(rows) if "{role}" in pattern else [None]:
            steps, values = series(rows, pattern.format(role=role))
            if steps:
                marker, dash = next(styles)  # lines that coincide stay distinguishable
                ax.plot(
                    steps, values, marker=marker, linestyle=dash, markersize=4, label=label.format(role=role)
                )
                drawn = True
    _, sft = series(rows, "sft/eval/accuracy")
    if name == "accuracy" and sft:  # where GRPO starts: the best SFT adapters (what GRPO starts from)
        ax.plot(
            [0], [max(sft)], marker="*", markersize=11, linestyle="none", label="held-out after SFT (best)"
        )
    ax.set_title(textwrap.fill(title, TITLE_CHARS))
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if name != "reward":  # rates and accuracies; self-correction runs from -1 to 1
        ax.set_ylim(-1.05 if name == "transitions" else -0.05, 1.05)
    ax.grid(alpha=0.3)
    if drawn and len(ax.get_lines()) > 3:  # a long legend beside the axes, where it hides no line
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    elif drawn:
        ax.legend(fontsize=8, loc="best")
    else:
        why = {"transitions": "no transitions: one round per episode", "sft": "no SFT stage in this run"}.get(
            name, "nothing to draw: no reflected rounds"
        )
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="gray")
    return fig, drawn


def pick_episodes(traces: Sequence[dict], n: int = 4) -> list[dict]:
    """A few episodes worth reading, latest step first: revised ones, wrong answers accepted, right ones."""
    latest = sorted(traces, key=lambda t: -t.get("step", 0))

    def kind(t: dict) -> int:
        rounds = graded_rounds(t)
        if len(rounds) > 1:
            return 0
        if rounds and not rounds[-1]["correct"] and rounds[-1]["verdict"] == "accept":
            return 1
        return 2

    chosen, seen = [], set()
    for wanted in (0, 1, 2):
        for t in latest:
            if kind(t) == wanted and t["task"] not in seen and len(chosen) < n:
                chosen.append(t)
                seen.add(t["task"])
    return chosen


def graded_rounds(trace: dict) -> list[dict]:
    """The trace's graded rounds; none for a trace written before rounds were graded (there "rounds"
    was the number of rounds played)."""
    rounds = trace.get("rounds")
    return rounds if isinstance(rounds, list) else []


def round_columns(trace: dict) -> list[dict]:
    """Per round: the plan, the executors' work, the answer and verdict (from the trace's turns)."""
    columns = []
    for r in graded_rounds(trace):
        index = r["round"] - 1
        turns = [t for t in trace["turns"] if t["round"] == index]
        plan = r.get("plan") or ""  # what this round's executors were shown
        work = "\n\n".join(f"[{t['role']}]\n{t['text'].strip()}" for t in turns if t["kind"] == "execute")
        reflection = next((t["text"].strip() for t in turns if t["kind"] == "reflect"), "")
        columns.append({**r, "plan": plan, "work": work, "reflection": reflection})
    return columns


def changes(before: dict, after: dict) -> str:
    """What changed from one round to the next: the answer, and the plan line by line."""
    diff = difflib.unified_diff(before["plan"].splitlines(), after["plan"].splitlines(), lineterm="", n=0)
    plan = "\n".join(line for line in diff if not line.startswith(("---", "+++", "@@")))
    answer = f"answer {before['answer']} -> {after['answer']} ({'right' if after['correct'] else 'wrong'})"
    return answer + ("\nplan:\n" + plan if plan else "\nplan unchanged")


def episode_html(trace: dict) -> str:
    columns = round_columns(trace)
    head = "".join(f"<th>round {c['round']}</th>" for c in columns)
    rows = []
    for field, label in (("plan", "plan"), ("work", "executors"), ("reflection", "reflection")):
        cells = "".join(f"<td><pre>{html.escape(c[field]) or '(none)'}</pre></td>" for c in columns)
        rows.append(f"<tr><th>{label}</th>{cells}</tr>")
    verdicts = "".join(
        f"<td>answer <code>{html.escape(str(c['answer']))}</code> {'right' if c['correct'] else 'wrong'}; "
        f"verdict {html.escape(str(c['verdict'] or '(no reflection)'))}{'; ended' if c['ended'] else ''}</td>"
        for c in columns
    )
    rows.append(f"<tr><th>outcome</th>{verdicts}</tr>")
    if len(columns) > 1:
        moved = "".join(
            f"<td><pre>{html.escape(changes(a, b))}</pre></td>"
            for a, b in zip(columns, columns[1:], strict=False)
        )
        rows.append(f"<tr><th>what changed</th><td></td>{moved}</tr>")
    step = html.escape(str(trace.get("step", "-")))
    title = f"{html.escape(str(trace['task']))} (step {step}, gold <code>{html.escape(str(trace['gold']))}</code>)"
    question = html.escape(str(trace["question"]))
    return (
        f"<h3>{title}</h3><p>{question}</p><table class='ep'><tr><th></th>{head}</tr>{''.join(rows)}</table>"
    )


def write_report(run_dir: Path) -> Path:
    """report/report.html (images embedded) and report/figures/*.png in `run_dir`."""
    run_dir = Path(run_dir)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    check_metrics(rows, run_dir / "metrics.jsonl")
    traces = read_jsonl(run_dir / "traces.jsonl") if (run_dir / "traces.jsonl").is_file() else []
    figures = run_dir / "report" / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    parts = [
        f"<h1>Run {html.escape(run_dir.name)}</h1>",
        f"<p>{len({r['step'] for r in rows})} logged steps, {len(traces)} traced episodes. "
        "Rates of the reflection metrics are over the rounds or transitions they name (meta_agent/analysis/reflection.py).</p>",
    ]
    for name in FIGURES:
        path, _ = draw(rows, name, figures)
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(f"<h2>{FIGURES[name][0]}</h2><img alt='{name}' src='data:image/png;base64,{data}'>")
    chosen = [t for t in pick_episodes(traces) if graded_rounds(t)]
    parts.append("<h2>Episodes, round by round</h2>")
    none = "<p>(no episode with graded rounds: the traces predate them, or the run wrote none)</p>"
    parts += [episode_html(t) for t in chosen] or [none]
    style = (
        "body{font-family:sans-serif;max-width:1200px;margin:auto} pre{white-space:pre-wrap;font-size:12px}"
        "table.ep{border-collapse:collapse} table.ep td,table.ep th{border:1px solid #ccc;vertical-align:top;padding:4px}"
    )
    out = run_dir / "report" / "report.html"
    out.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head><body>{''.join(parts)}</body></html>",
        encoding="utf-8",
    )
    return out
