"""A run's record: TensorBoard event files plus the same scalars as JSON lines for scripts.

    log = RunLog(run_dir)
    log.scalars({"role/executor/reward": 0.5, "rollout/tool_calls": 3}, step=10)
    log.text("traces/episode_0", markdown, step=10)
    log.close()

Open it with `tensorboard --logdir runs`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter


class RunLog:
    def __init__(self, run_dir: str | Path, *, enabled: bool = True):
        """`enabled=False` (ranks other than 0) keeps the interface and writes nothing."""
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self._writer = None
        self._jsonl = None
        if enabled:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(log_dir=str(self.run_dir))
            self._jsonl = (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8")

    def scalars(self, metrics: Mapping[str, float], step: int) -> None:
        if not self.enabled:
            return
        finite = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        for key, value in sorted(finite.items()):
            self._writer.add_scalar(key, value, step)
        self._jsonl.write(json.dumps({"step": step, **finite}) + "\n")
        self._jsonl.flush()

    def text(self, tag: str, markdown: str, step: int) -> None:
        if self.enabled:
            self._writer.add_text(tag, markdown, step)

    def config(self, resolved_yaml: str, hparams: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
        """The resolved config as text, and the flat hparams next to their final metrics."""
        if not self.enabled:
            return
        self._writer.add_text("config", f"```yaml\n{resolved_yaml}\n```", 0)
        plain = {k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in hparams.items()}
        self._writer.add_hparams(plain, dict(metrics), run_name=".")

    def flush(self) -> None:
        if self.enabled:
            self._writer.flush()
            self._jsonl.flush()

    def close(self) -> None:
        if self.enabled:
            self._writer.close()
            self._jsonl.close()
            self.enabled = False
