"""bench/sandbox.py run as a user would, with a handful of calls."""

from __future__ import annotations

import json

from tests.bench_run import run_bench


def test_script_writes_the_result_file(tmp_path):
    out = tmp_path / "sandbox.json"
    run = run_bench(
        "sandbox",
        *(
            "--calls",
            "3",
            "--warmup",
            "1",
            "--concurrency",
            "1,2",
            "--throughput-calls",
            "2",
            "--out",
            str(out),
        ),
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert result["p50_ms"] > 0 and result["p95_ms"] >= result["p50_ms"]
    assert [row["concurrency"] for row in result["throughput"]] == [1, 2]
    assert result["breakdown"]["interpreter_start_ms"]["n"] == 3


def test_a_failing_program_stops_the_run(tmp_path):
    run = run_bench(
        "sandbox",
        *("--calls", "1", "--warmup", "0", "--code", "print(2)", "--out", str(tmp_path / "sandbox.json")),
    )
    assert run.returncode != 0
    assert "sandbox call failed" in run.stderr
    assert not (tmp_path / "sandbox.json").exists()
