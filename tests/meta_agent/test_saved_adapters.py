"""`adapters=`: solve, eval and train start from saved role adapters, on a saved tiny model."""

from __future__ import annotations

import shutil

import pytest
import torch

import meta_agent.cli
from meta_agent.cli import main
from meta_agent.config import load_config
from meta_agent.system import build_system
from tests.meta_agent.test_cli import QUESTION
from tests.meta_agent.test_sft_source import adapter_state, squash
from training.backbone import Backbone

FAST = [
    "memory.enabled=false",
    "roles.meta_thinker.sampling.max_new_tokens=8",
    "roles.executor.sampling.max_new_tokens=8",
    "eval.limit=1",
]


def save_changed_adapters(model_dir, folder, seed: int) -> dict[str, torch.Tensor]:
    """Adapters of the configured roles with every weight redrawn, saved to `folder`; returns them."""
    cfg = load_config([f"model.path={model_dir}"])
    backbone = Backbone.load(cfg.model, cfg.role_adapters, seed=cfg.seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for role in backbone.adapters:
            for param in backbone.trainable_parameters(role):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    backbone.save_adapters(folder)
    return adapter_state(backbone)


def fake_checkpoint(root, step: int) -> None:
    """The files training/checkpoint.py's is_complete looks for; only adapters/ is read here."""
    (root / f"step-{step:06d}" / "trainer.pt").touch()
    (root / f"step-{step:06d}" / "state.json").write_text("{}")


@pytest.fixture(scope="module")
def saved(tiny_model_dir, tmp_path_factory):
    """A run folder whose latest checkpoint (step 2) holds changed adapters, step 1 other ones."""
    run = tmp_path_factory.mktemp("run")
    root = run / "checkpoints"
    save_changed_adapters(tiny_model_dir, root / "step-000001" / "adapters", seed=1)
    weights = save_changed_adapters(tiny_model_dir, root / "step-000002" / "adapters", seed=2)
    fake_checkpoint(root, 1)
    fake_checkpoint(root, 2)
    (root / "latest").write_text("step-000002\n")
    return run, weights


@pytest.mark.parametrize(
    "where", ["", "checkpoints", "checkpoints/step-000002", "checkpoints/step-000002/adapters"]
)
def test_build_system_loads_the_adapters_of_a_run_checkpoint_or_adapters_folder(saved, where, tiny_model_dir):
    run, weights = saved
    cfg = load_config([f"model.path={tiny_model_dir}", "memory.enabled=false", f"adapters={run / where}"])
    loaded = adapter_state(build_system(cfg).backbone)
    assert loaded.keys() == weights.keys()
    assert all(torch.equal(loaded[k], weights[k]) for k in weights)
    fresh = adapter_state(
        build_system(load_config([f"model.path={tiny_model_dir}", "memory.enabled=false"])).backbone
    )
    assert not all(torch.equal(fresh[k], weights[k]) for k in weights)


@pytest.mark.parametrize("command", [["solve", QUESTION], ["eval"]])
def test_solve_and_eval_play_with_the_saved_adapters(command, saved, tiny_model_dir, tmp_path, monkeypatch):
    run, weights = saved
    systems = []

    def recording_build_system(cfg):
        systems.append(build_system(cfg))
        return systems[-1]

    monkeypatch.setattr(meta_agent.cli, "build_system", recording_build_system)
    args = [f"model.path={tiny_model_dir}", *FAST, f"adapters={run}", f"run_dir={tmp_path / 'out'}"]
    assert main([*command, *args]) == 0
    (system,) = systems
    loaded = adapter_state(system.backbone)
    assert all(torch.equal(loaded[k], weights[k]) for k in weights)
    assert (tmp_path / "out" / "traces.jsonl").is_file()


def test_bad_adapters_are_one_clear_error(saved, tiny_model_dir, tmp_path, capsys):
    run, _ = saved
    partial = tmp_path / "partial"
    shutil.copytree(run / "checkpoints" / "step-000002" / "adapters", partial)
    shutil.rmtree(partial / "executor")
    cases = [
        (f"adapters={tmp_path / 'nowhere'}", f"adapters={tmp_path / 'nowhere'} does not exist"),
        (f"adapters={tmp_path}", "holds no saved role adapters"),
        (f"adapters={partial}", f"{partial} has no adapter for role(s) executor (it has meta_thinker)"),
        (f"adapters={run}", "do not fit the configured ones"),
    ]
    for i, (override, message) in enumerate(cases):
        rank = ["roles.executor.adapter.r=8"] if i == len(cases) - 1 else []
        rc = main(
            ["eval", f"model.path={tiny_model_dir}", *FAST, *rank, override, f"run_dir={tmp_path / 'out'}"]
        )
        out = squash(capsys.readouterr().out)
        assert rc == 2 and "error:" in out and squash(message) in out, (override, out)
