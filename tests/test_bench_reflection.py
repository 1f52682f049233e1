"""bench/reflection.py: the reflection metrics and probes of a run's adapters before and after GRPO."""

from __future__ import annotations

import json

import pytest

from bench.reflection import stages, summary
from tests.bench_run import run_bench
from tests.meta_agent.test_cli import run_cli
from tests.meta_agent.test_train_cli import TINY


def test_a_folder_without_sft_best_and_a_checkpoint_is_refused(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step-000004\n")
    with pytest.raises(SystemExit, match="lacks"):
        stages(tmp_path)


def test_the_summary_keeps_the_base_arms_reflection_and_every_arms_difference():
    base = {
        "accuracy": 0.5,
        "correct": [True, False, True, False],
        "difference": None,
        "reflection": {"reflection/verdicts": 4.0},
        "note": "",
    }
    diff = {"mean": -0.25, "low": -0.5, "high": 0.0, "better": 0, "worse": 1, "p_value": 1.0}
    no_plan = {"accuracy": 0.25, "correct": [True, False, False, False], "difference": diff, "note": ""}
    result = {"problems": 4, "seconds": 2.0, "wall_seconds": 3.0, "arms": {"base": base, "no_plan": no_plan}}
    out = summary(result)
    assert out["accuracy"] == 0.5 and out["reflection"]["verdicts"] == 4.0
    assert out["reflection"]["revision_rate"] is None  # not in the arm's metrics: undefined, not 0
    assert out["interval"] == [0.1500, 0.8500]  # Wilson, 2 of 4: 0.5 -+ 0.3500 (by hand)
    assert out["arms"]["no_plan"]["difference"] == -0.25 and out["arms"]["no_plan"]["better_worse"] == [0, 1]
    assert out["arms"]["base"]["interval"] is None


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
        "--limit",
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
        measured = result["stages"][stage]
        assert 1.0 <= measured["reflection"]["rounds_used"] <= 2.0 and measured["problems"] == 2
        assert set(measured["arms"]) >= {"base", "no_plan", "no_reflection", "mixed", "executors_alone"}
        assert measured["arms"]["mixed"]["accuracy"] is not None  # the other stage's meta-thinker was loaded
    assert result["machine"]["cpu_count"] >= 1 and "measured_at" in result
