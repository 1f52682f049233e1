"""Shared pieces of the benchmarks: percentiles, latency summaries, machine description, result files.

Each benchmark writes bench/results/<name>.json through `write_result`, so every result carries the
machine it ran on and when (`measured_at`, UTC).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent / "results"
_SIZE_SUFFIXES = {"k": 1_000, "m": 1_000_000}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of values, interpolating linearly between ranks (numpy's default).

    The sorted values sit at ranks 0..n-1; percentile q lies at rank q/100 * (n-1).
    """
    if len(values) == 0:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


def summarize_ms(seconds: Sequence[float]) -> dict[str, float | int]:
    """Latency summary in milliseconds of per-call times given in seconds: n, p50, p95, mean, min, max."""
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 4),
        "p95_ms": round(percentile(ms, 95), 4),
        "mean_ms": round(sum(ms) / len(ms), 4),
        "min_ms": round(min(ms), 4),
        "max_ms": round(max(ms), 4),
    }


def parse_sizes(text: str) -> list[int]:
    """'10k,100k,1M' -> [10000, 100000, 1000000]; plain integers pass through."""
    sizes = []
    for item in text.split(","):
        item = item.strip().lower()
        scale = _SIZE_SUFFIXES.get(item[-1:], 1)
        digits = item[:-1] if scale != 1 else item
        if not digits.isdigit() or int(digits) * scale <= 0:
            raise ValueError(f"bad size {item!r} in {text!r}: use positive integers like 1000, 10k or 1M")
        sizes.append(int(digits) * scale)
    return sizes


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """(fn(*args, **kwargs), its wall time in seconds)."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


KERNEL_LEVEL_ENV = (
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
)


def machine_info(**versions: str) -> dict[str, Any]:
    """Where a measurement ran: interpreter, numpy, CPUs and load, plus the library versions given."""
    return {
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        **versions,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        # The benchmark machines are shared: a busy machine explains slow numbers.
        "load_average_1m_at_start": round(os.getloadavg()[0], 2),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        # set, these make torch, MKL and oneDNN run the kernels of an older CPU (an AVX2-only one, say)
        **{f"{name.lower()}_env": os.environ[name] for name in KERNEL_LEVEL_ENV if name in os.environ},
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": _cpu_model(),
    }


def _cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (platform.processor() often says only 'x86_64')."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else None


def write_result(result: dict[str, Any], path: Path) -> dict[str, Any]:
    """Write `result` plus `measured_at` (UTC) to `path` as indented JSON; returns what was written."""
    stamped = {**result, "measured_at": datetime.now(UTC).isoformat(timespec="seconds")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stamped, indent=2) + "\n")
    return stamped
