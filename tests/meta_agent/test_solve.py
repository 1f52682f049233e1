"""`meta-agent solve` without adapters=: the newest trained run's adapters with that run's settings, or a
plain word that the roles are untrained; and a repetition stop that ends degenerate loops."""

from __future__ import annotations

import yaml

from meta_agent.cli import main
from tests.meta_agent.test_train_cli import TINY

QUESTION = "What is 12 * 34?"


def test_solve_uses_the_newest_trained_run_with_its_settings(tiny_model_dir, tmp_path, capsys):
    runs = tmp_path / "runs"
    # top_layers=1 gives adapters the default settings cannot load: solve must take the run's own.
    trained = [f"model.path={tiny_model_dir}", *TINY, "train.steps=1", "memory.path=null",
               "roles.executor.adapter.top_layers=1", "roles.meta_thinker.adapter.top_layers=1"]  # fmt: skip
    assert main(["train", *trained, f"run_dir={runs / 'older'}"]) == 0
    assert main(["train", *trained, f"run_dir={runs / 'newer'}"]) == 0
    (runs / "not-a-run").mkdir()  # a folder without a config is passed over
    capsys.readouterr()
    solve_dir = runs / "solve"
    assert (
        main(
            [
                "solve",
                QUESTION,
                f"model.path={tiny_model_dir}",
                "memory.enabled=false",
                f"run_dir={solve_dir}",
            ]
        )
        == 0
    )
    out = " ".join(capsys.readouterr().out.split())
    assert f"using the adapters of the newest trained run, {runs / 'newer'}" in out
    config = yaml.safe_load((solve_dir / "config.yaml").read_text())
    assert config["adapters"] == str(runs / "newer") and config["question"] == QUESTION
    assert config["roles"]["executor"]["adapter"]["top_layers"] == 1
    assert config["run_dir"] == str(solve_dir)
    assert all(role["sampling"]["repetition_stop"] == 64 for role in config["roles"].values())
    assert (solve_dir / "traces.jsonl").is_file()

    # adapters=null asks for the untrained roles, and is told so
    untrained = runs / "untrained"
    args = [
        f"model.path={tiny_model_dir}",
        *TINY,
        "memory.enabled=false",
        "adapters=null",
        f"run_dir={untrained}",
    ]
    assert main(["solve", QUESTION, *args]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the roles are untrained" in out and "adapters=null was given" in out
    assert f"adapters={runs / 'newer'}" in out  # the hint names the trained run there is


def test_solve_keeps_a_repetition_stop_the_command_line_sets(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    args = [f"model.path={tiny_model_dir}", *TINY, "memory.enabled=false", f"run_dir={run}",
            "roles.executor.sampling.repetition_stop=0"]  # fmt: skip
    assert main(["solve", QUESTION, *args]) == 0
    roles = yaml.safe_load((run / "config.yaml").read_text())["roles"]
    assert roles["executor"]["sampling"]["repetition_stop"] == 0
    assert roles["meta_thinker"]["sampling"]["repetition_stop"] == 64
