"""`meta-agent train` and `meta-agent sft` as a user runs them, on a saved tiny model."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.meta_agent.test_cli import run_cli
from tests.tiny_model import build_tiny_model

TINY = [
    "roles.meta_thinker.sampling.max_new_tokens=8",
    "roles.executor.sampling.max_new_tokens=8",
    "protocol.max_new_tokens=40",
    "train.tasks_per_step=2",
    "train.group_size=2",
    "train.eval_limit=2",
    "eval.episodes_per_batch=2",
    # A random tiny model earns the same reward in every episode: keep its flat groups so the
    # update (and its metrics) still runs.
    "grpo.filter_zero_variance=false",
]


def scalar_tags(run_dir) -> set[str]:
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return set(acc.Tags()["scalars"])


@pytest.mark.slow  # a subprocess run of the whole command: about 20 s on a busy 2-core machine
def test_train_two_steps_writes_tensorboard_traces_and_checkpoints(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        "train",
        f"model.path={tiny_model_dir}",
        *TINY,
        "train.steps=2",
        "train.eval_every=1",
        "train.trace_every=1",
        "train.checkpoint_every=1",
        f"run_dir={run_dir}",
        f"memory.path={tmp_path / 'memory'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "tensorboard --logdir" in proc.stdout
    tags = scalar_tags(run_dir)
    for role in ("meta_thinker", "executor"):
        for metric in (
            "reward",
            "accuracy",
            "advantage",
            "kl",
            "entropy",
            "clip_fraction",
            "response_length",
            "tool_calls",
            "tool_errors",
            "lr",
            "kl_to_start",  # training.drift: on the first rollout's turns, each step
            "update_norm",
            "update_cosine",  # from the second step
        ):
            assert f"role/{role}/{metric}" in tags, f"role/{role}/{metric} missing"
    for tag in (
        "eval/accuracy",
        "rollout/memory_hits",
        "reflection/answer_leaks",
        "reflection/rounds_used",
        "reflection/verdicts",
        "time/step_s",
        "time/tokens_per_s",
    ):
        assert tag in tags
    traces = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    assert traces and all(t["split"] == "train" for t in traces)
    assert any(turn["advantage"] is not None for t in traces for turn in t["turns"])
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-000002"
    assert (
        run_dir / "checkpoints" / "step-000002" / "adapters" / "executor" / "adapter_config.json"
    ).exists()


@pytest.mark.slow  # one short run, about 15 s
def test_train_runs_on_a_gpt2_backbone(tokenizer, tmp_path):
    """model.path= any causal LM: a GPT-2 folder's adapters go on its linear layers (c_attn, c_proj, c_fc)."""
    model_dir = tmp_path / "gpt2"
    build_tiny_model(tokenizer, arch="gpt2").save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    run_dir = tmp_path / "run"
    proc = run_cli(
        "train",
        f"model.path={model_dir}",
        *TINY,
        "train.steps=1",
        f"run_dir={run_dir}",
        f"memory.path={tmp_path / 'memory'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    adapters = run_dir / "checkpoints" / "step-000001" / "adapters"
    saved = json.loads((adapters / "executor" / "adapter_config.json").read_text())
    assert sorted(saved["target_modules"]) == ["c_attn", "c_fc", "c_proj"]
    assert {"role/executor/grad_norm", "role/meta_thinker/grad_norm"} <= scalar_tags(run_dir)


@pytest.mark.slow  # four short runs, about 90 s
def test_dpo_trains_on_pairs_of_each_rollout_and_resumes_against_its_reference(tiny_model_dir, tmp_path):
    """The wiring of `meta-agent dpo` on the tiny model (whose episodes are all wrong, so it mines no pair:
    the mining and the loss are tested by hand in tests/meta_agent/test_preference.py and
    tests/training/test_preference.py)."""
    run_dir = tmp_path / "run"
    common = [f"model.path={tiny_model_dir}", *TINY, "memory.enabled=false", "train.checkpoint_every=1"]
    proc = run_cli("dpo", *common, "train.steps=1", f"run_dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    tags = scalar_tags(run_dir)
    assert {"dpo/pairs_plan", "dpo/pairs_execute", "dpo/pairs_reflection", "train/pairs"} <= tags
    assert "role/executor/advantage" not in tags  # no GRPO credit in a DPO run
    assert (run_dir / "checkpoints" / "dpo-reference.pt").is_file()
    resumed = run_cli("dpo", *common, "train.steps=2", f"resume={run_dir}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-000002"
    as_grpo = run_cli("train", *common, "train.steps=3", f"resume={run_dir}", cwd=tmp_path)
    assert as_grpo.returncode == 2 and "was trained with train.algorithm=dpo" in as_grpo.stdout
    # A GRPO run resumed as DPO (it has no reference either): one line says so
    grpo_dir = tmp_path / "grpo"
    assert run_cli("train", *common, "train.steps=1", f"run_dir={grpo_dir}", cwd=tmp_path).returncode == 0
    wrong = run_cli("dpo", *common, "train.steps=2", f"resume={grpo_dir}", cwd=tmp_path)
    assert wrong.returncode == 2 and "was trained with train.algorithm=grpo" in wrong.stdout


@pytest.mark.slow  # three short runs, about 60 s
def test_grpo_with_a_kl_to_its_start_keeps_the_start_and_resumes_against_it(tiny_model_dir, tmp_path):
    """grpo.kl_reference=start: the first step's KL is 0 (the policy is the reference), the adapters the
    stage began with are kept in the checkpoints folder, a resumed run reads them back, and a run that
    never kept them is refused on resume with one line."""
    run_dir = tmp_path / "run"
    common = [f"model.path={tiny_model_dir}", *TINY, "memory.enabled=false", "train.checkpoint_every=1"]
    kl = ["grpo.beta=0.1", "grpo.kl_reference=start"]
    proc = run_cli("train", *common, *kl, "train.steps=1", f"run_dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert (run_dir / "checkpoints" / "kl-reference.pt").is_file()
    resumed = run_cli("train", *common, *kl, "train.steps=2", f"resume={run_dir}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kls = {r["step"]: r["role/executor/kl"] for r in rows if "role/executor/kl" in r}
    assert kls[1] == pytest.approx(0.0, abs=1e-6) and set(kls) == {1, 2}
    plain = tmp_path / "plain"
    assert run_cli("train", *common, "train.steps=1", f"run_dir={plain}", cwd=tmp_path).returncode == 0
    wrong = run_cli("train", *common, *kl, "train.steps=2", f"resume={plain}", cwd=tmp_path)
    assert wrong.returncode == 2 and "grpo.kl_reference=start resumes against" in wrong.stdout


@pytest.mark.slow
def test_sft_stage_runs_from_generated_demonstrations(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        "sft",
        f"model.path={tiny_model_dir}",
        # Demonstrations are played under the protocol's limits: give them room.
        *[o for o in TINY if not o.startswith("protocol.max_new_tokens")],
        "protocol.max_new_tokens=600",
        "sft.examples=8",
        "sft.batch_size=4",
        "sft.max_steps=4",
        "sft.eval_every=2",
        f"run_dir={run_dir}",
        "memory.enabled=false",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    tags = scalar_tags(run_dir)
    assert "sft/role/executor/sft_nll" in tags and "sft/eval/accuracy" in tags


def adapter_tensors(checkpoint):
    from safetensors.torch import load_file

    return {
        f"{role.name}/{k}": v
        for role in sorted((checkpoint / "adapters").iterdir())
        for k, v in load_file(role / "adapter_model.safetensors").items()
    }


@pytest.mark.slow  # three training runs: 24 s of the fast suite's 2 minutes (CI runs it)
def test_interrupted_and_resumed_run_ends_with_the_same_adapters(tiny_model_dir, tmp_path):
    """SFT, then GRPO with a KL term (so every step moves the adapters), stopped after 2 of 3 steps."""
    common = [
        f"model.path={tiny_model_dir}",
        *[o for o in TINY if not o.startswith("protocol.max_new_tokens")],
        "protocol.max_new_tokens=600",
        "sft.enabled=true",
        "sft.examples=4",
        "sft.batch_size=2",
        "sft.max_steps=2",
        "sft.eval_every=100",
        "grpo.beta=0.5",
        "train.eval_every=100",
        "train.checkpoint_every=1",
        "memory.path=${run_dir}/memory",
    ]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert run_cli("train", *common, "train.steps=3", f"run_dir={whole}", cwd=tmp_path).returncode == 0
    first = run_cli("train", *common, "train.steps=2", f"run_dir={parts}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr + first.stdout
    # No run_dir: a resumed run goes on in the folder it resumes.
    resumed = run_cli("train", *common, "train.steps=3", f"resume={parts}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    assert "resumed" in resumed.stdout
    a = adapter_tensors(whole / "checkpoints" / "step-000003")
    b = adapter_tensors(parts / "checkpoints" / "step-000003")
    start = adapter_tensors(parts / "checkpoints" / "step-000002")
    assert a.keys() == b.keys()
    assert any(not (a[k] == start[k]).all() for k in a), (
        "the last step changed nothing: the test would prove nothing"
    )
    for k in a:
        assert (a[k] == b[k]).all(), k


def test_a_failed_run_closes_and_keeps_what_it_wrote(tiny_model_dir, tmp_path, monkeypatch):
    """An error in a GRPO step reaches the caller, after the system is closed (a vLLM engine stops) and
    the logs of the steps before it are flushed to their files."""
    from meta_agent.config import load_config
    from meta_agent.learning import train as train_module
    from meta_agent.system import System
    from training.trainer import PolicyTrainer

    run_dir = tmp_path / "run"
    cfg = load_config(
        [f"model.path={tiny_model_dir}", *TINY, "train.steps=2", f"run_dir={run_dir}", "memory.path=null"]
    )
    closed = []
    close = System.close
    monkeypatch.setattr(System, "close", lambda self: (closed.append(self), close(self))[1])

    def fail(self, turns, reference=None):
        raise RuntimeError("a step that fails")

    monkeypatch.setattr(PolicyTrainer, "grpo_step", fail)
    with pytest.raises(RuntimeError, match="a step that fails"):
        train_module.train(cfg, run_dir)
    assert len(closed) == 1
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and "eval/accuracy" in rows[0]
    assert "eval/accuracy" in scalar_tags(run_dir)


def test_gae_trains_value_heads_beside_the_adapters_and_checkpoints_them(tiny_model_dir, tmp_path):
    """grpo.advantage=gae: each step values every turn's state, takes GAE, fits the heads (their metrics
    logged) and keeps them in its checkpoints."""
    import torch

    from meta_agent.config import load_config
    from meta_agent.learning import train as train_module

    run_dir = tmp_path / "run"
    overrides = [f"model.path={tiny_model_dir}", *TINY, "train.steps=2", "train.checkpoint_every=1"]
    overrides += ["grpo.advantage=gae", "value.lam=0.9", f"run_dir={run_dir}", "memory.path=null"]
    train_module.train(load_config(overrides), run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "value/executor/loss_after" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for role in ("meta_thinker", "executor"):
        assert all(r[f"value/{role}/loss_after"] <= r[f"value/{role}/loss_before"] for r in steps)
        assert steps[0][f"value/{role}/mean"] == 0.0  # the heads start at zero
        assert steps[1][f"value/{role}/mean"] != 0.0  # and the second step reads the fitted ones
    saved = torch.load(run_dir / "checkpoints" / "step-000002" / "trainer.pt", weights_only=True)
    assert set(saved["values"]["heads"]) == {
        f"{role}.{p}" for role in ("meta_thinker", "executor") for p in ("weight", "bias")
    }
    traces = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    advantages = {turn["advantage"] for t in traces for turn in t["turns"] if turn["advantage"] is not None}
    assert len(advantages) > 2  # turn by turn, not one value per (role, group) sign
