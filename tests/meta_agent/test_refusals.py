"""A refused command changes nothing: each command, refused after a run exists, leaves that run's files
byte for byte as they were and adds no run folder and no memory folder anywhere."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from meta_agent.cli import main
from tests.meta_agent.test_saved_adapters import FAST
from tests.meta_agent.test_train_cli import TINY


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory) -> Path:
    """A one-step run with its own memory, under runs/ of a folder of its own."""
    run = tmp_path_factory.mktemp("project") / "runs" / "trained"
    args = [f"model.path={tiny_model_dir}", *TINY, "train.steps=1", "memory.path=${run_dir}/memory"]
    assert main(["train", *args, f"run_dir={run}"]) == 0
    return run


def hashes(folder: Path) -> dict[str, str]:
    """Every file under `folder` (the folder's own and those beside it), by path, with its content's hash."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def refused(argv: list[str], project: Path, capsys, monkeypatch, message: str) -> None:
    """Run `argv` in `project` (its relative runs/memory default resolves there): exit 2, one line naming
    `message`, and no file of the project changed, added or removed."""
    monkeypatch.chdir(project)
    before = hashes(project)
    assert main(argv) == 2
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and message in lines[-1], lines
    assert hashes(project) == before


def test_a_refused_train_leaves_the_run_and_makes_no_folder(trained, tiny_model_dir, capsys, monkeypatch):
    # the same run_dir: the new run would claim runs/trained-2, and its adapters cannot be read
    args = [f"model.path={tiny_model_dir}", *TINY, f"run_dir={trained}", "adapters=runs/nothing"]
    refused(["train", *args], trained.parents[1], capsys, monkeypatch, "adapters=runs/nothing does not exist")


def test_a_refused_resume_leaves_the_run_as_it_was(trained, tiny_model_dir, capsys, monkeypatch):
    # other adapter settings than the run's: its config.yaml, events and metrics must stay as they are
    args = [f"model.path={tiny_model_dir}", *TINY, "roles.executor.adapter.r=8", f"resume={trained}"]
    refused(["train", *args], trained.parents[1], capsys, monkeypatch, "resume with the adapter settings")


def test_a_refused_eval_leaves_the_run(trained, tiny_model_dir, capsys, monkeypatch):
    args = [f"model.path={tiny_model_dir}", *FAST, f"adapters={trained}", "roles.executor.adapter.r=8"]
    args += ["memory.enabled=true", f"run_dir={trained}"]  # a memory under runs/, made and taken back
    refused(["eval", *args], trained.parents[1], capsys, monkeypatch, "do not fit the configured ones")


def test_a_refused_solve_leaves_the_run_and_makes_no_memory(trained, tiny_model_dir, capsys, monkeypatch):
    # solve picks the newest trained run under runs/, with its settings: a question too long for the model
    args = [f"model.path={tiny_model_dir}", "memory.enabled=true", "run_dir=runs/solve"]
    refused(["solve", "word " * 3000, *args], trained.parents[1], capsys, monkeypatch, "2048-token context")


def test_a_refused_probe_leaves_the_run(trained, tiny_model_dir, capsys, monkeypatch):
    args = [f"model.path={tiny_model_dir}", *FAST, f"adapters={trained}", "probe.executors_from=runs/gone"]
    args += ["memory.enabled=true", "run_dir=runs/probe"]
    refused(["probe", *args], trained.parents[1], capsys, monkeypatch, "probe.executors_from=runs/gone")


def test_a_refused_report_leaves_the_run(trained, capsys, monkeypatch):
    metrics = trained / "metrics.jsonl"
    kept = metrics.read_bytes()
    metrics.write_bytes(kept + b'{"loss": 1.0}\n')  # a row with no step: nothing to draw it against
    try:
        refused(["report", str(trained)], trained.parents[1], capsys, monkeypatch, "no whole-number 'step'")
    finally:
        metrics.write_bytes(kept)
