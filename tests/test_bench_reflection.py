"""bench/reflection.py: the reflection metrics and probes of a run's adapters before and after GRPO."""

from __future__ import annotations

import json

import pytest

from bench.reflection import stages, summary_of_eval, summary_of_probe
from tests.bench_run import run_bench
from tests.meta_agent.test_cli import run_cli
from tests.meta_agent.test_train_cli import TINY


def test_a_folder_without_sft_best_and_a_checkpoint_is_refused(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step-000004\n")
    with pytest.raises(SystemExit, match="lacks"):
        stages(tmp_path)


def test_summaries_keep_accuracy_differences_and_reflection():
    arith = {"accuracy": 0.5, "interval": [0.2, 0.8], "total": 4, "reflection": {"reflection/verdicts": 4.0}}
    summary = summary_of_eval({"seconds": 1.0, "0": {"arith": arith}})
    assert summary["accuracy"] == 0.5 and summary["verdicts"] == 4.0 and summary["revision_rate"] is None
    diff = {"mean": -0.25, "low": -0.5, "high": 0.0, "better": 0, "worse": 1, "p_value": 1.0}
    probe = {
        "problems": 4,
        "seconds": 2.0,
        "arms": {"base": {"accuracy": 0.5, "difference": None, "note": ""}},
    }
    probe["arms"]["no_plan"] = {"accuracy": 0.25, "difference": diff, "note": ""}
    arms = summary_of_probe(probe)["arms"]
    assert arms["no_plan"]["difference"] == -0.25 and arms["no_plan"]["better_worse"] == [0, 1]
    assert arms["base"]["interval"] is None


@pytest.mark.slow
def test_smoke_run_on_a_tiny_trained_run(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    args = [f"model.path={tiny_model_dir}", *[o for o in TINY if "max_new_tokens=40" not in o]]
    args += ["protocol.max_new_tokens=600", "sft.enabled=true", "sft.examples=4", "sft.batch_size=2"]
    args += [
        "sft.max_steps=2",
        "sft.eval_every=2",
        "train.steps=1",
        f"run_dir={run}",
        "memory.path=${run_dir}/memory",
    ]
    assert run_cli("train", *args, cwd=tmp_path).returncode == 0
    out = tmp_path / "reflection.json"
    proc = run_bench(
        "reflection",
        "--run",
        str(run),
        "--eval-limit",
        "2",
        "--probe-limit",
        "2",
        "--out",
        str(out),
        f"model.path={tiny_model_dir}",
        "roles.meta_thinker.sampling.max_new_tokens=8",
        "roles.executor.sampling.max_new_tokens=8",
        "probe.resamples=100",
        "roles.meta_thinker.adapter.top_layers=null",  # the tiny model has 2 layers, the experiment's 15
        "roles.executor.adapter.top_layers=null",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    for stage in ("before_grpo", "after_grpo"):
        evals = result["stages"][stage]["eval"]
        assert 1.0 <= evals["rounds_used"] <= 2.0 and 0 <= evals["first_round_accuracy"] <= 1
        assert set(result["stages"][stage]["probe"]["arms"]) >= {
            "base",
            "no_plan",
            "mixed",
            "executors_alone",
        }
    assert result["machine"]["cpu_count"] >= 1 and "measured_at" in result
