import math
from dataclasses import replace

import pytest
import torch

from tests.tiny_model import build_tiny_backbone
from tests.training.turns import chat_ids, with_advantages
from training.backbone import AdapterConfig
from training.batch import collate, completion_logits
from training.generation import HFBackend
from training.grpo import GRPOSettings, token_logprobs, trainable_turns
from training.trainer import PolicyTrainer, UpdateSettings
from training.types import GenerationRequest, SamplingParams, Turn

ROLES = ("meta_thinker", "executor")


def fresh(tokenizer):
    return build_tiny_backbone(
        tokenizer, {r: AdapterConfig(r=4, alpha=8) for r in ROLES}, seed=0, lora_b_std=0.05
    )


def rollout_turns(backbone, rewards: dict[tuple[str, int], float]) -> list[Turn]:
    """Real sampled turns from the tiny model, one per (role, episode), two task groups, each with its
    reward and the advantage the training loop gives it (normalised within its (role, task) group)."""
    backend = HFBackend(backbone)
    keys = sorted(rewards)
    prompts = [chat_ids(backbone.tokenizer, f"task {ep % 2}") for _, ep in keys]
    results = backend.generate(
        [
            GenerationRequest(role, p, SamplingParams(temperature=1.0, max_new_tokens=6), seed=ep)
            for (role, ep), p in zip(keys, prompts, strict=True)
        ]
    )
    turns = [
        Turn(
            role,
            f"task{ep % 2}",
            p,
            r.token_ids,
            (1,) * len(r.token_ids),
            r.logprobs,
            rewards[(role, ep)],
            ep,
        )
        for (role, ep), p, r in zip(keys, prompts, results, strict=True)
    ]
    return with_advantages(turns)


def logprobs_under(backbone, turns) -> torch.Tensor:
    """The trainer's per-token logprobs [B, K] of the turns' completions under the active adapter."""
    batch = collate(turns, backbone.pad_id)
    return token_logprobs(completion_logits(backbone.model, batch), batch.targets)


def test_grpo_step_trains_only_adapters_and_moves_toward_rewarded_completions(tokenizer):
    backbone = fresh(tokenizer)
    base_before = {n: p.detach().clone() for n, p in backbone.model.named_parameters() if "lora_" not in n}
    rewards = {(role, ep): float(ep % 2 == 0 and ep < 4) for role in ROLES for ep in range(8)}
    turns = rollout_turns(backbone, rewards)
    trainer = PolicyTrainer(
        backbone,
        dict.fromkeys(ROLES, 5e-3),
        temperature=dict.fromkeys(ROLES, 1.0),
        update=UpdateSettings(micro_batch_size=4),
    )

    def logprob_sum(role: str, positive: bool) -> float:
        chosen = [t for t in turns if t.role == role and (t.reward > 0) == positive]
        backbone.activate(role)
        with torch.no_grad():
            return float(logprobs_under(backbone, chosen).sum())

    before = {(r, s): logprob_sum(r, s) for r in ROLES for s in (True, False)}
    for _ in range(3):
        metrics = trainer.grpo_step(trainable_turns(turns, filter_zero_variance=True))
    after = {(r, s): logprob_sum(r, s) for r in ROLES for s in (True, False)}
    for role in ROLES:
        assert after[(role, True)] - before[(role, True)] > after[(role, False)] - before[(role, False)]
        assert metrics[f"role/{role}/grad_norm"] > 0
        assert 0.0 <= metrics[f"role/{role}/clip_fraction"] <= 1.0
    for n, p in backbone.model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base_before[n]), f"base weight {n} changed"


def adapters_after(
    tokenizer,
    micro: int,
    grpo: GRPOSettings,
    *,
    steps: int = 1,
    two_turns: bool = False,
    metrics=None,
    checkpointing: bool = False,
    layer_calls: list | None = None,
    shared_prefix: bool = True,
) -> dict:
    """LoRA weights after `steps` GRPO steps on fresh rollouts with the given micro-batch size."""
    rewards = {(role, ep): float(ep % 3 == 0) for role in ROLES for ep in range(6)}
    backbone = fresh(tokenizer)
    turns = rollout_turns(backbone, rewards)
    if two_turns:  # a second, shorter-prompt turn per (role, episode), like a plan and a reflection
        turns += [replace(t, prompt_ids=t.prompt_ids[:-1]) for t in turns]
    update = UpdateSettings(
        micro_batch_size=micro,
        max_grad_norm=1e9,
        gradient_checkpointing=checkpointing,
        shared_prefix=shared_prefix,
    )
    trainer = PolicyTrainer(backbone, dict.fromkeys(ROLES, 1e-2), grpo=grpo, update=update)
    if layer_calls is not None:  # count the top decoder layer's MLP runs (hooks do not see recomputation)
        mlp = backbone.model.base_model.model.model.layers[-1].mlp
        forward = mlp.forward
        mlp.forward = lambda *a, **k: layer_calls.append(1) or forward(*a, **k)
    for _ in range(steps):
        step = trainer.grpo_step(trainable_turns(turns, filter_zero_variance=grpo.filter_zero_variance))
    if metrics is not None:
        metrics.update(step)
    return {n: p.detach().clone() for n, p in backbone.model.named_parameters() if "lora_" in n}


def test_gradient_accumulation_matches_one_big_batch(tokenizer):
    grpo = GRPOSettings(filter_zero_variance=False)
    norms: dict[int, dict] = {}
    small = adapters_after(tokenizer, 1, grpo, metrics=norms.setdefault(1, {}))
    big = adapters_after(tokenizer, 16, grpo, metrics=norms.setdefault(16, {}))
    # The accumulated gradients: their norms catch a mis-weighted micro-batch, which Adam's first
    # step (about lr * sign(g) per weight) would hide.
    for role in ROLES:
        key = f"role/{role}/grad_norm"
        assert norms[1][key] == pytest.approx(norms[16][key], rel=1e-4)
    # Adam divides by |g|: float noise in near-zero gradients (kernels differ with padding and thread
    # count) moves such a weight by a few percent of lr = 1e-2.
    for name, value in small.items():
        assert torch.allclose(value, big[name], atol=1e-3), name


def test_gradient_checkpointing_recomputes_and_changes_nothing(tokenizer):
    grpo = GRPOSettings(filter_zero_variance=False)
    calls: dict[bool, list] = {False: [], True: []}
    norms: dict[bool, dict] = {False: {}, True: {}}
    # Checkpointing runs turn by turn (train.shared_prefix does not apply to it): compared with that path.
    after = {
        on: adapters_after(
            tokenizer,
            4,
            grpo,
            metrics=norms[on],
            checkpointing=on,
            layer_calls=calls[on],
            shared_prefix=False,
        )
        for on in (False, True)
    }
    # Per role 6 turns in micro-batches of 4: two forward passes, and with checkpointing two recomputations.
    assert (len(calls[False]), len(calls[True])) == (2 * 2, 2 * 2 * 2)
    for role in ROLES:
        key = f"role/{role}/grad_norm"
        assert norms[True][key] == pytest.approx(norms[False][key], rel=1e-5)
    for name, value in after[False].items():
        assert torch.allclose(value, after[True][name], atol=1e-6), name


def test_sft_step_lowers_the_demonstrations_nll(tokenizer):
    backbone = fresh(tokenizer)
    prompt = chat_ids(tokenizer, "What is 2+2?")
    answer = tuple(tokenizer.encode("<answer>4</answer>", add_special_tokens=False))
    demo = [Turn("executor", "d", prompt, answer, (1,) * len(answer), (0.0,) * len(answer))]
    trainer = PolicyTrainer(backbone, dict.fromkeys(ROLES, 1e-2))
    first = trainer.sft_step(demo)["role/executor/sft_nll"]
    for _ in range(5):
        last = trainer.sft_step(demo)["role/executor/sft_nll"]
    assert last < first


def test_missing_learning_rate_is_a_clear_error(tokenizer):
    with pytest.raises(ValueError, match="meta_thinker"):
        PolicyTrainer(fresh(tokenizer), {"executor": 1e-3})


def test_sequence_level_ratio_is_the_same_with_any_micro_batch_size(tokenizer):
    """A sequence-level ratio pools over an episode's turns: micro-batching must not split them."""
    grpo = GRPOSettings(filter_zero_variance=False, ratio_level="sequence")
    # Two steps: the second has ratios != 1, where pooling matters.
    norms: dict[int, dict] = {1: {}, 16: {}}
    small = adapters_after(tokenizer, 1, grpo, steps=2, two_turns=True, metrics=norms[1])
    big = adapters_after(tokenizer, 16, grpo, steps=2, two_turns=True, metrics=norms[16])
    for role in ROLES:  # the second step's gradients: split pooling would change them
        key = f"role/{role}/grad_norm"
        assert norms[1][key] == pytest.approx(norms[16][key], rel=1e-4)
    # As in test_gradient_accumulation_matches_one_big_batch: Adam turns float noise in near-zero
    # gradients into steps of a few percent of lr = 1e-2 (seen: 8e-5 on 5 of 16,384 weights).
    for name, value in small.items():
        assert torch.allclose(value, big[name], atol=1e-3), name


def test_logprob_mismatch_between_rollout_and_trainer_is_reported(tokenizer):
    rewards = {(role, ep): float(ep < 2) for role in ROLES for ep in range(4)}  # each task group varies
    backbone = fresh(tokenizer)
    turns = rollout_turns(backbone, rewards)
    trainer = PolicyTrainer(backbone, dict.fromkeys(ROLES, 1e-9), temperature=dict.fromkeys(ROLES, 1.0))
    same = trainer.grpo_step(turns)  # the hf backend in float32 scores what the trainer does
    # A backend whose logprobs are 0.5 too high on every generated token: the trainer sees it.
    shifted = [replace(t, logprobs=tuple(lp + 0.5 for lp in t.logprobs)) for t in turns]
    off = trainer.grpo_step(shifted)
    for role in ROLES:
        assert same[f"role/{role}/logprob_mismatch_max"] < 1e-4
        assert off[f"role/{role}/logprob_mismatch_mean"] == pytest.approx(0.5, abs=1e-3)
        assert off[f"role/{role}/logprob_mismatch_max"] == pytest.approx(0.5, abs=1e-3)


def test_truncated_importance_sampling_corrects_a_rollout_backend_mismatch(tokenizer):
    """Rollout logprobs 0.5 too high on every token (a backend that rounds differently): without the
    correction the ratio e^-0.5 = 0.61 falls outside the clip range and negative-advantage tokens lose
    their gradient; with it nothing is clipped and every token's gradient is weighted by e^-0.5."""
    rewards = {(role, ep): float(ep < 2) for role in ROLES for ep in range(4)}

    def step(tis_cap, shift):
        backbone = fresh(tokenizer)
        turns = rollout_turns(backbone, rewards)
        turns = [replace(t, logprobs=tuple(lp + shift for lp in t.logprobs)) for t in turns]
        grpo = GRPOSettings(tis_cap=tis_cap)
        update = UpdateSettings(max_grad_norm=1e9)
        return PolicyTrainer(backbone, dict.fromkeys(ROLES, 1e-3), grpo=grpo, update=update).grpo_step(turns)

    exact, corrected, uncorrected = step(2.0, 0.0), step(2.0, 0.5), step(None, 0.5)
    for role in ROLES:
        assert uncorrected[f"role/{role}/clip_fraction"] > 0.2
        assert uncorrected[f"role/{role}/tis_weight_mean"] == 1.0
        assert corrected[f"role/{role}/clip_fraction"] == 0.0
        assert corrected[f"role/{role}/tis_weight_mean"] == pytest.approx(math.exp(-0.5), rel=1e-4)
        assert exact[f"role/{role}/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
        # a uniform weight scales the whole gradient
        scaled = math.exp(-0.5) * exact[f"role/{role}/grad_norm"]
        assert corrected[f"role/{role}/grad_norm"] == pytest.approx(scaled, rel=1e-3)
