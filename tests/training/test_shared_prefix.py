"""train.shared_prefix: which turns share what, and the same gradient as turn by turn."""

from dataclasses import replace

import pytest
import torch

import training.trainer as trainer_module
from tests.tiny_model import build_tiny_backbone
from tests.training.turns import chat_ids, with_advantages
from training.backbone import AdapterConfig
from training.grpo import GRPOSettings
from training.shared_prefix import SharedPrefix, prefix_groups
from training.trainer import PolicyTrainer, UpdateSettings
from training.types import Turn

ROLES = ("meta_thinker", "executor")


# ---- which prompts share what (worked by hand) ----------------------------------------------------


def test_prompts_with_a_common_beginning_form_one_group():
    # three prompts share their first 20 ids: saving 2 * 20 - 8 = 32 tokens
    base = list(range(100, 120))
    prompts = [base + [1, 2], base + [3], base + [4, 5, 6]]
    assert prefix_groups(prompts, min_shared=16, overhead=8) == [(20, [0, 1, 2])]


def test_a_prefix_keeps_one_prompt_token_in_every_tail():
    # identical prompts of 30 ids share 29: the last prompt token's logits predict the completion
    prompts = [list(range(30))] * 3
    assert prefix_groups(prompts, min_shared=16, overhead=8) == [(29, [0, 1, 2])]


def test_short_common_beginnings_and_lone_prompts_are_left_unshared():
    base = list(range(100, 120))
    prompts = [list(range(10)) + [1], base + [7], list(range(10)) + [2], base + [8], [5, 6]]
    # prompts 0 and 2 share 10 < 16; prompts 1 and 3 share 20: (2 - 1) * 20 - 8 = 12 saved
    assert prefix_groups(prompts, min_shared=16, overhead=8) == [(20, [1, 3]), (0, [0, 2, 4])]


def test_nested_prefixes_split_where_the_most_is_saved():
    # all four share 20 ids, two pairs 60: one group saves 3 * 20 - 8 = 52, two pairs 2 * (60 - 8) = 104
    system = list(range(100, 120))
    a, b = system + list(range(200, 240)), system + list(range(300, 340))
    prompts = [a + [1], b + [2], a + [3], b + [4]]
    assert prefix_groups(prompts, min_shared=16, overhead=8) == [(60, [0, 2]), (60, [1, 3])]
    # all four share 40, two pairs 50: one group saves 3 * 40 - 8 = 112, two pairs 2 * (50 - 8) = 84
    system = list(range(100, 140))
    a, b = system + list(range(200, 210)), system + list(range(300, 310))
    prompts = [a + [1], b + [2], a + [3], b + [4]]
    assert prefix_groups(prompts, min_shared=16, overhead=8) == [(40, [0, 2, 1, 3])]


def test_no_prompts_no_groups():
    assert prefix_groups([]) == []
    assert prefix_groups([[1, 2, 3]]) == [(0, [0])]


# ---- the same gradient --------------------------------------------------------------------------


def fresh(tokenizer):
    return build_tiny_backbone(
        tokenizer, {r: AdapterConfig(r=4, alpha=8) for r in ROLES}, seed=0, lora_b_std=0.05
    )


SYSTEM = "You are a careful assistant who plans each step, checks every number twice and answers briefly. "


def turns_with_shared_prompts(tokenizer) -> list[Turn]:
    """Two roles, two tasks, three episodes a task: prompts that share the system text (both tasks) and the
    question (one task's episodes), completions of different lengths, one observation token."""
    turns = []
    for role in ROLES:
        for task in range(2):
            prompt = chat_ids(tokenizer, f"{SYSTEM}Task {task}: what is {task + 12} times 7?")
            for ep in range(3):
                completion = tuple(range(300 + ep, 305 + 2 * ep + task))
                mask = tuple(0 if i == 2 else 1 for i in range(len(completion)))
                logprobs = tuple(-0.5 * m for m in mask)
                turns.append(
                    Turn(role, f"t{task}", prompt, completion, mask, logprobs, float(ep % 2), 3 * task + ep)
                )
    return with_advantages(turns)


def adapter_grads(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {
        n: p.grad.clone()
        for n, p in trainer.backbone.model.named_parameters()
        if p.requires_grad and p.grad is not None
    }


def step_grads(tokenizer, turns, step: str, **update) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The gradients one step of a fresh trainer leaves (taken just before the optimizer step), its metrics."""
    trainer = PolicyTrainer(
        fresh(tokenizer), {r: 1e-3 for r in ROLES}, grpo=GRPOSettings(), update=UpdateSettings(**update)
    )
    return grads_of(trainer, step, turns)


def grads_of(
    trainer: PolicyTrainer, step: str, turns: list[Turn]
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """`trainer`'s step on `turns`: the gradients it leaves just before its optimizer step, its metrics."""
    seen = {}
    real_step = trainer._optimizer_step

    def capture():
        seen.update(adapter_grads(trainer))
        return real_step()

    trainer._optimizer_step = capture
    metrics = getattr(trainer, step)(turns)
    return seen, metrics


@pytest.mark.parametrize("step", ["sft_step", "grpo_step"])
@pytest.mark.parametrize("micro_batch_size", [1, 2])
def test_shared_prefixes_give_the_turn_by_turn_gradient(tokenizer, step, micro_batch_size):
    turns = turns_with_shared_prompts(tokenizer)
    whole, whole_metrics = step_grads(
        tokenizer, turns, step, micro_batch_size=micro_batch_size, shared_prefix=False
    )
    shared, metrics = step_grads(
        tokenizer, turns, step, micro_batch_size=micro_batch_size, shared_prefix=True
    )
    assert whole and set(shared) == set(whole)
    # the top layer's LoRA weights get gradient through the prefix's keys and values too
    for name, grad in whole.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(shared[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # each role's 6 turns are one group of two tasks' shared system text, or two groups of 3 sharing the
    # question too: either way a share of the tokens was not rerun, and the loss is the same
    assert 0.3 < metrics["train/prefix_tokens_saved"] < 1.0
    assert "train/prefix_tokens_saved" not in whole_metrics
    for key in whole_metrics:
        if key.endswith(("/loss", "/sft_nll")):
            assert metrics[key] == pytest.approx(whole_metrics[key], rel=1e-4, abs=1e-6), key


def test_the_no_grad_passes_share_prefixes_and_give_the_turn_by_turn_logprobs(tokenizer, monkeypatch):
    """The old policy's logprobs (train.minibatches above 1) run each group's common prefix once, as the
    update does, and give what whole turns give, in the turns' order, with no gradient and nothing counted
    in train/prefix_tokens_saved (that is the update's)."""
    built = []

    class Counted(SharedPrefix):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self.length)

    monkeypatch.setattr(trainer_module, "SharedPrefix", Counted)
    turns = turns_with_shared_prompts(tokenizer)[::-1]  # not in role order: the order must come back
    scored = {}
    for shared in (False, True):
        built.clear()
        trainer = PolicyTrainer(
            fresh(tokenizer), {r: 1e-3 for r in ROLES}, update=UpdateSettings(shared_prefix=shared)
        )
        scored[shared] = trainer._with_policy_logprobs(turns)
        assert all(p.grad is None for p in trainer.backbone.model.parameters())
        assert trainer._prefix_tokens == {"saved": 0, "total": 0}
        assert bool(built) == shared  # prefixes ran only where they are on
    for whole, prefixed, turn in zip(scored[False], scored[True], turns, strict=True):
        assert whole.episode == prefixed.episode == turn.episode and whole.role == prefixed.role == turn.role
        assert len(prefixed.policy_logprobs) == len(turn.completion_ids)
        assert prefixed.policy_logprobs[2] == 0.0  # the observation token, masked
        assert prefixed.policy_logprobs == pytest.approx(whole.policy_logprobs, rel=1e-5, abs=1e-6)
        assert min(whole.policy_logprobs) < -1.0  # real logprobs, not the zeros of a mask


def test_a_prefix_without_shared_tails_leaves_the_gradient_to_the_tails(tokenizer):
    """Only the prefix's forward pass runs until backward(): nothing reaches the adapters before it, and a
    second backward() is an error rather than a gradient counted twice."""
    backbone = fresh(tokenizer)
    backbone.activate("executor")
    backbone.model.train()
    prefix = SharedPrefix(backbone.model, chat_ids(tokenizer, SYSTEM))
    assert all(p.grad is None for p in backbone.model.parameters())
    prefix.backward()  # no tail ran: nothing to send back
    assert all(p.grad is None for p in backbone.model.parameters())
    with pytest.raises(RuntimeError, match="already"):
        prefix.backward()
    with pytest.raises(RuntimeError, match="already"):
        prefix.cache(1)


def test_sequence_level_ratio_keeps_turn_by_turn_passes(tokenizer):
    turns = turns_with_shared_prompts(tokenizer)
    trainer = PolicyTrainer(
        fresh(tokenizer),
        {r: 1e-3 for r in ROLES},
        grpo=GRPOSettings(ratio_level="sequence"),
        update=UpdateSettings(),
    )
    metrics = trainer.grpo_step([replace(t) for t in turns])
    assert "train/prefix_tokens_saved" not in metrics


def test_bfloat16_prefixes_train_near_the_turn_by_turn_gradient(tokenizer):
    """In bfloat16 (a CPU with AVX512-BF16, a GPU) the prefix's states and the gradients sent back through
    them are bfloat16, summed over the tails in float32: the step runs and lands near the turn-by-turn
    gradient, as far as bfloat16's rounding allows."""
    turns = turns_with_shared_prompts(tokenizer)
    grads = {}
    for shared in (False, True):
        backbone = fresh(tokenizer)
        backbone.model.to(torch.bfloat16)
        trainer = PolicyTrainer(
            backbone, {r: 1e-3 for r in ROLES}, update=UpdateSettings(shared_prefix=shared)
        )
        grads[shared] = grads_of(trainer, "sft_step", turns)[0]
    assert set(grads[True]) == set(grads[False])
    for name, grad in grads[False].items():
        scale = float(grad.float().abs().max())
        assert float((grads[True][name].float() - grad.float()).abs().max()) <= 0.05 * scale + 1e-6, name


def test_dropout_keeps_turn_by_turn_passes(tokenizer):
    """With dropout a shared prefix would draw one mask for all its turns: the passes stay turn by turn."""
    turns = turns_with_shared_prompts(tokenizer)
    backbone = build_tiny_backbone(
        tokenizer, {r: AdapterConfig(r=4, alpha=8, dropout=0.1) for r in ROLES}, seed=0, lora_b_std=0.05
    )
    trainer = PolicyTrainer(backbone, {r: 1e-3 for r in ROLES}, update=UpdateSettings())
    assert "train/prefix_tokens_saved" not in trainer.sft_step(turns)
    assert "train/prefix_tokens_saved" in PolicyTrainer(fresh(tokenizer), {r: 1e-3 for r in ROLES}).sft_step(
        turns
    )


def test_dropout_modules_of_other_architectures_keep_turn_by_turn_passes(tokenizer):
    """GPT-2 draws dropout from modules (attn/resid/embd_pdrop), not from config.attention_dropout."""
    turns = turns_with_shared_prompts(tokenizer)
    adapters = {r: AdapterConfig(r=4, alpha=8) for r in ROLES}
    backbone = build_tiny_backbone(tokenizer, adapters, seed=0, lora_b_std=0.05, arch="gpt2")
    trainer = PolicyTrainer(backbone, {r: 1e-3 for r in ROLES}, update=UpdateSettings())
    assert "train/prefix_tokens_saved" in trainer.sft_step(turns)  # the tiny GPT-2 has no dropout
    for module in backbone.model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.1  # a real GPT-2 checkpoint's
    assert "train/prefix_tokens_saved" not in trainer.sft_step(turns)
