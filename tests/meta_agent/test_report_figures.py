"""The report's figures show their whole titles, labels and legends: every text lies inside the image."""

from __future__ import annotations

import random

import pytest
from matplotlib.figure import Figure

from meta_agent.analysis.report import FIGURES, draw

ROLES = ("meta_thinker", "executor")


def metric_rows(steps: int = 20) -> list[dict]:
    """A run's metrics.jsonl rows with every metric FIGURES draws, each step."""
    rng = random.Random(0)
    keys = [
        pattern.format(role=role) for _, lines in FIGURES.values() for pattern, _ in lines for role in ROLES
    ]
    return [{"step": step, **{key: rng.random() for key in keys}} for step in range(steps + 1)]


def texts_outside(fig: Figure) -> list[str]:
    """What of `fig` reaches past its edges: a title, a legend, a note, or an axis with its drawn tick
    labels and label."""
    renderer = fig.canvas.get_renderer()
    edge = fig.bbox
    parts = []
    for ax in fig.axes:
        parts += [(text.get_text(), text) for text in (ax.title, *ax.texts) if text.get_text()]
        parts += [("x axis", ax.xaxis), ("y axis", ax.yaxis)]
        if ax.get_legend() is not None:
            parts.append(("legend", ax.get_legend()))
    outside = []
    for name, part in parts:
        box = (
            part.get_tightbbox(renderer)
            if hasattr(part, "get_ticklabels")
            else part.get_window_extent(renderer)
        )
        if box.x0 < edge.x0 - 1 or box.x1 > edge.x1 + 1 or box.y0 < edge.y0 - 1 or box.y1 > edge.y1 + 1:
            outside.append(name)
    return outside


@pytest.mark.parametrize("rows", [metric_rows(), []], ids=["every metric", "nothing to draw"])
def test_every_figure_shows_its_whole_title_and_labels(rows, tmp_path, monkeypatch):
    seen: dict[str, list[str]] = {}
    save = Figure.savefig

    def measured(fig, path, *args, **kwargs):  # what the PNG shows: the figure as it is saved
        fig.canvas.draw()
        seen[str(path)] = texts_outside(fig)
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", measured)
    for name in FIGURES:
        path, drawn = draw(rows, name, tmp_path)
        assert drawn == bool(rows) and path.is_file()
        assert seen[str(path)] == [], f"{name}.png cuts {seen[str(path)]}"
