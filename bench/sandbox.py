"""Python sandbox latency: a trivial program through the real tool (a fresh hardened subprocess per call).

    python -m bench.sandbox                                            # 50 calls, then 1, 2, 4 callers
    python -m bench.sandbox --calls 10 --concurrency 1,2 --out /tmp/sandbox.json   # a quick look

Measures PythonSandbox()({"code": "print(1)"}) one call at a time (p50/p95), then calls per second with
1, 2 and 4 threads calling at once, and, for scale, the floor any subprocess sandbox pays: starting the
same interpreter with the same flags to run nothing. Every call's result is checked, so a failing
sandbox stops the run instead of being timed.

Writes bench/results/sandbox.json (or --out): `p50_ms`, `p95_ms`, `target_p50_ms`, `meets_target`,
`latency_ms`, `throughput` (one row per concurrency), `breakdown`, `isolation` (the default level), `other_levels` (p50/p95 of each other level, or why it is unavailable), `settings`, `machine`,
`measured_at`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import RESULTS_DIR, machine_info, parse_sizes, summarize_ms, timed, write_result
from tools.sandbox import ISOLATION_LEVELS, PythonSandbox, SandboxLimits, SandboxUnavailable

TARGET_P50_MS = 100.0
# The interpreter flags tools/sandbox.py starts the child with.
CHILD_FLAGS = ("-I", "-S", "-u", "-B")


def call_once(sandbox: PythonSandbox, code: str, expected: str) -> float:
    """Seconds one sandbox call took; RuntimeError if the program did not print `expected`."""
    result, seconds = timed(sandbox, {"code": code})
    if not result.ok or result.output != expected:
        raise RuntimeError(f"sandbox call failed, the timings would mean nothing: {result}")
    return seconds


def throughput(sandbox: PythonSandbox, code: str, expected: str, callers: int, calls: int) -> dict:
    """`calls` sandbox calls shared by `callers` threads: calls per second and per-call latency."""
    with ThreadPoolExecutor(max_workers=callers) as pool:
        seconds, wall = timed(
            lambda: list(pool.map(lambda _: call_once(sandbox, code, expected), range(calls)))
        )
    return {
        "concurrency": callers,
        "calls": calls,
        "wall_s": round(wall, 3),
        "calls_per_s": round(calls / wall, 2),
        "latency_ms": summarize_ms(seconds),
    }


def interpreter_floor(calls: int) -> list[float]:
    """Seconds to start the child's interpreter with the child's flags and run nothing, `calls` times."""
    argv = [sys.executable, *CHILD_FLAGS, "-c", "pass"]
    return [timed(subprocess.run, argv, check=True, stdin=subprocess.DEVNULL)[1] for _ in range(calls)]


def other_levels(code: str, expected: str, calls: int) -> dict[str, dict]:
    """p50/p95 of the levels other than the default that this machine offers (else why not)."""
    found = {}
    for level in ISOLATION_LEVELS[1:]:
        sandbox = PythonSandbox(SandboxLimits(isolation=level))
        try:
            sandbox.check()
        except SandboxUnavailable as err:
            found[level] = {"unavailable": str(err)}
            continue
        found[level] = summarize_ms([call_once(sandbox, code, expected) for _ in range(calls)])
    return found


def main(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    sandbox = PythonSandbox()
    sandbox.check()  # the default level, namespaces, or this bench stops with why
    for _ in range(args.warmup):  # page cache, first-time imports on this side
        call_once(sandbox, args.code, args.expected)
    latency = summarize_ms([call_once(sandbox, args.code, args.expected) for _ in range(args.calls)])
    rows = [
        throughput(sandbox, args.code, args.expected, callers, args.throughput_calls)
        for callers in args.concurrency
    ]
    floor = summarize_ms(interpreter_floor(args.calls))
    result = {
        "p50_ms": latency["p50_ms"],
        "p95_ms": latency["p95_ms"],
        "target_p50_ms": TARGET_P50_MS,
        "meets_target": latency["p50_ms"] <= TARGET_P50_MS,
        "latency_ms": latency,
        "throughput": rows,
        "breakdown": {
            "interpreter_start_ms": floor,
            # Hardening (limits, namespaces, privilege drop, guards), scratch folder, output collection.
            "sandbox_overhead_p50_ms": round(latency["p50_ms"] - floor["p50_ms"], 3),
        },
        "isolation": sandbox.limits.isolation,
        "other_levels": other_levels(args.code, args.expected, args.calls),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "settings": {
            "code": args.code,
            "calls": args.calls,
            "warmup_calls": args.warmup,
            "throughput_calls_per_level": args.throughput_calls,
            "concurrency": args.concurrency,
            "sandbox": repr(sandbox),
            "child_flags": list(CHILD_FLAGS),
            "euid": os.geteuid(),
        },
        "machine": machine_info(),
    }
    written = write_result(result, args.out)
    print(f"wrote {args.out}: p50_ms={result['p50_ms']} p95_ms={result['p95_ms']}")
    for row in rows:
        print(
            f"  {row['concurrency']} callers: {row['calls_per_s']} calls/s, p50 {row['latency_ms']['p50_ms']} ms"
        )
    return written


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50, help="timed calls, one at a time")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first")
    parser.add_argument("--concurrency", type=parse_sizes, default=[1, 2, 4], help="threads calling at once")
    parser.add_argument("--throughput-calls", type=int, default=40, help="calls per concurrency level")
    parser.add_argument("--code", default="print(1)", help="the program each call runs")
    parser.add_argument("--expected", default="1\n", help="what --code must print")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "sandbox.json")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
