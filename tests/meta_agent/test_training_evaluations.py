"""Held-out evaluations during training leave nothing that training reads, on a saved tiny model.

train.eval_base: whether a fresh run evaluates the untrained policy before SFT. That evaluation writes no
lesson and draws no sample a later step depends on, so a run trains the same adapters either way:
bench.learning leaves the setting out of its fingerprint for that reason. And after every evaluation the
generation backend forgets the prompt states it cached, so the next rollout runs as a run started from a
checkpoint there runs it.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from meta_agent.config import load_config
from meta_agent.learning.train import train
from tests.meta_agent.test_train_cli import TINY
from training.distributed import Ranks

RUN = [
    *[o for o in TINY if not o.startswith("protocol.max_new_tokens")],
    "protocol.max_new_tokens=600",  # demonstrations are played under the protocol's limits
    "sft.enabled=true",
    "sft.examples=4",
    "sft.batch_size=2",
    "sft.max_steps=2",
    "sft.eval_every=2",
    "train.steps=1",
]


def trained(
    tiny_model_dir, run_dir, eval_base: bool
) -> tuple[dict, dict[str, torch.Tensor], list[int], list]:
    """One fresh run with its own memory: its final metrics, its last checkpoint's adapter weights, the
    steps at which it logged a held-out accuracy, and its GRPO step's episodes (their lessons retrieved,
    prompts' answers and texts) as traced."""
    cfg = load_config(
        [
            f"model.path={tiny_model_dir}",
            *RUN,
            f"train.eval_base={str(eval_base).lower()}",
            f"run_dir={run_dir}",
            f"memory.path={run_dir / 'memory'}",  # enabled: lessons the evaluation wrote would show
        ]
    )
    final = train(cfg, run_dir, Ranks())
    adapters = run_dir / "checkpoints" / "step-000001" / "adapters"
    weights = {
        f"{f.parent.name}/{k}": v
        for f in sorted(adapters.glob("*/adapter_model.safetensors"))
        for k, v in load_file(f).items()
    }
    events = EventAccumulator(str(run_dir))
    events.Reload()
    episodes = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    return final, weights, [e.step for e in events.Scalars("eval/accuracy")], episodes


@pytest.mark.slow  # two short runs on the tiny model, about 30 s on a busy 2-core machine
def test_a_run_without_the_untrained_evaluation_trains_the_same_adapters(tiny_model_dir, tmp_path):
    with_base, weights, steps, episodes = trained(tiny_model_dir, tmp_path / "with", eval_base=True)
    without, weights_without, steps_without, episodes_without = trained(
        tiny_model_dir, tmp_path / "without", eval_base=False
    )
    assert "eval/accuracy_before" in with_base and "eval/accuracy_before" not in without
    assert with_base["eval/accuracy_after_sft"] == without["eval/accuracy_after_sft"]
    assert steps == [0, 1] and steps_without == [1]  # SFT's evaluation is logged under sft/ tags
    assert weights and weights.keys() == weights_without.keys()
    assert {k.split("/")[0] for k in weights} == {"meta_thinker", "executor"}
    for k in weights:
        assert torch.equal(weights[k], weights_without[k]), k
    # The random tiny model earns one reward everywhere, so its GRPO step moves nothing: the rollout itself,
    # which a lesson written by the evaluation would change, is compared too.
    assert len(episodes) == 4 and episodes == episodes_without


@pytest.mark.slow  # one short run on the tiny model, about 15 s on a busy 2-core machine
def test_every_rollout_after_an_evaluation_starts_with_no_cached_prompt_state(
    tiny_model_dir, tmp_path, monkeypatch
):
    """The untrained evaluation and step 1's come right before a rollout, with the weights they ran with
    (the untrained one changes no weight at all): their cached states must not be reused, or the rollout's
    float sums differ from those of a run resumed there."""
    import meta_agent.learning.train as training_loop

    cached_at_rollout = []
    rollout = training_loop.rollout

    def counted(cfg, system, *args, **kwargs):
        cached_at_rollout.append(len(system.backend.prefix))
        return rollout(cfg, system, *args, **kwargs)

    monkeypatch.setattr(training_loop, "rollout", counted)
    run_dir = tmp_path / "run"
    cfg = load_config(
        [
            f"model.path={tiny_model_dir}",
            *TINY,
            "train.steps=2",
            "train.eval_every=1",
            "train.eval_base=true",
            f"run_dir={run_dir}",
            "memory.enabled=false",
        ]
    )
    train(cfg, run_dir, Ranks())
    assert cached_at_rollout == [0, 0]


@pytest.mark.slow  # one run of no step on the tiny model, a few seconds
def test_a_run_that_measured_nothing_evaluates_once_at_the_end(tiny_model_dir, tmp_path):
    """No SFT, no untrained evaluation and no GRPO step (train.steps=0): the run still reports a held-out
    accuracy, so its summary and hparams hold a number, not None."""
    run_dir = tmp_path / "run"
    cfg = load_config(
        [
            f"model.path={tiny_model_dir}",
            *TINY,
            "train.steps=0",
            "train.eval_base=false",
            f"run_dir={run_dir}",
            "memory.enabled=false",
        ]
    )
    final = train(cfg, run_dir, Ranks())
    assert isinstance(final["eval/accuracy_after"], float)
    assert "eval/accuracy_before" not in final and final["train/grpo_steps"] == 0.0
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/accuracy")] == [0]
