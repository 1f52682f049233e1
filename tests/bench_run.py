"""Run a benchmark module as a user would (python -m bench.<name> from the repository root)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# One thread (tests share a busy machine), no hub access, no GPU: the CPU path is what CI checks.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}


def run_bench(name: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m bench.<name> *args`, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
