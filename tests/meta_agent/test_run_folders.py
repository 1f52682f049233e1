"""Run folders are never shared or damaged: a new run claims a folder of its own, and a start that fails
changes nothing in an existing one and creates no folder for a typo."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import yaml

from meta_agent.cli import claim_folder, main
from tests.meta_agent.test_saved_adapters import FAST
from tests.meta_agent.test_train_cli import TINY


def test_claim_folder_takes_the_name_or_the_next_free_one(tmp_path):
    wanted = tmp_path / "runs" / "arith-20261201-120000"
    ready = tmp_path / "ready"
    ready.mkdir()
    assert claim_folder(ready) == ready  # a folder made ready for a run, without one in it
    assert claim_folder(wanted) == wanted and (wanted / "config.yaml").is_file()  # created, parents too
    assert claim_folder(wanted) == wanted.with_name("arith-20261201-120000-2")
    assert claim_folder(wanted) == wanted.with_name("arith-20261201-120000-3")


def test_processes_racing_for_one_name_get_distinct_folders(tmp_path):
    wanted = tmp_path / "arith-20261201-120000"
    with ProcessPoolExecutor(4) as pool:
        claimed = list(pool.map(claim_folder, [wanted] * 8))
    assert len(set(claimed)) == 8


def test_a_second_run_into_the_same_folder_gets_its_own_and_its_memory_follows(
    tiny_model_dir, tmp_path, capsys
):
    run = tmp_path / "run"
    args = [f"model.path={tiny_model_dir}", *FAST, "eval.limit=1", f"run_dir={run}"]
    args.append("memory.path=${run_dir}/memory")
    assert main(["eval", *args]) == 0
    first = (run / "config.yaml").read_text()
    assert main(["eval", *args]) == 0
    out = " ".join(capsys.readouterr().out.split())
    second = tmp_path / "run-2"
    assert f"{run} holds another run: this one writes to {second}" in out
    assert (run / "config.yaml").read_text() == first  # the first run's folder as it was
    config = yaml.safe_load((second / "config.yaml").read_text())
    assert config["run_dir"] == str(second) and config["memory"]["path"] == f"{second}/memory"
    assert (second / "eval.json").is_file()


def test_a_failed_resume_changes_nothing_and_a_typo_creates_nothing(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    args = [f"model.path={tiny_model_dir}", *TINY, "train.steps=1", "memory.path=null", f"run_dir={run}"]
    assert main(["train", *args]) == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["train", f"resume={run}", "model.path=/no/such/model"]) == 2
    assert "model.path=/no/such/model" in " ".join(capsys.readouterr().out.split())
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # nothing changed
    typo = tmp_path / "rnu"
    assert main(["train", f"resume={typo}"]) == 2
    assert f"resume={typo} does not exist" in " ".join(capsys.readouterr().out.split())
    assert not typo.exists()
