"""What a training run leaves to read, read as a researcher reads it: TensorBoard's own reader on the event
files, the report's HTML and figures, the graded rounds in the traces."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from meta_agent.cli import main
from tests.meta_agent.test_cli import run_cli
from tests.meta_agent.test_train_cli import TINY

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    """Two GRPO steps of the hierarchy on the tiny model, two rounds allowed, traces every step."""
    tmp = tmp_path_factory.mktemp("outputs")
    run_dir = tmp / "run"
    proc = run_cli(
        "train",
        f"model.path={tiny_model_dir}",
        *TINY,
        "protocol.max_rounds=2",
        "train.steps=2",
        "train.trace_every=1",
        "train.eval_every=1",
        f"run_dir={run_dir}",
        "memory.path=${run_dir}/memory",
        cwd=tmp,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return run_dir


def test_tensorboard_reads_per_role_and_reflection_scalars_traces_and_hparams(run):
    acc = EventAccumulator(str(run), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    for role in ("meta_thinker", "executor"):  # at least two roles, each with its own scalars
        for metric in ("reward", "advantage", "kl", "grad_norm", "response_length"):
            assert f"role/{role}/{metric}" in scalars
    reflection = {t for t in scalars if t.startswith("reflection/")}
    assert {"reflection/verdicts", "reflection/rounds_used", "reflection/answer_leaks"} <= reflection
    assert [e.step for e in acc.Scalars("reflection/rounds_used")] == [1, 2]
    texts = acc.PluginTagToContent("text")
    assert any(tag.startswith("traces/episode_0") for tag in texts) and any(
        tag.startswith("config") for tag in texts
    )
    trace = next(t for t in acc.Tensors(next(tag for tag in texts if tag.startswith("traces/episode_0"))))
    markdown = trace.tensor_proto.string_val[0].decode()
    assert "| round | answer | correct | verdict | ended the episode |" in markdown
    hparams = acc.PluginTagToContent("hparams")
    assert hparams, "no hparams summary in the event files"
    assert any(b"train.group_size" in content for content in hparams.values())


def test_traces_grade_every_round(run):
    traces = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    assert traces
    for t in traces:
        assert t["rounds"] and t["rounds"][-1]["ended"] and not any(r["ended"] for r in t["rounds"][:-1])
        assert len(t["rounds"]) == t["rounds_used"]
        assert all(
            set(r) == {"round", "answer", "correct", "verdict", "verdict_tagged", "ended", "plan"}
            for r in t["rounds"]
        )


def test_report_renders_figures_and_episodes(run, capsys):
    assert main(["report", str(run)]) == 0
    html = (run / "report" / "report.html").read_text()
    figures = sorted((run / "report" / "figures").glob("*.png"))
    assert [f.stem for f in figures] == sorted(
        ["accuracy", "calibration", "plans", "reward", "sft", "transitions"]
    )
    assert all(f.read_bytes().startswith(PNG) and f.stat().st_size > 5000 for f in figures)
    assert html.count("src='data:image/png;base64,") == 6  # self-contained
    assert "Episodes, round by round" in html and "<table class='ep'>" in html
    assert "report.html" in capsys.readouterr().out


def test_report_of_a_folder_without_a_run_is_one_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long paths
    assert out.startswith("error:") and "metrics.jsonl not found: report reads a run folder" in out
