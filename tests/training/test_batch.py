import pytest
import torch

from tests.training.turns import chat_ids
from training.batch import collate, completion_logits, micro_batches
from training.generation import HFBackend
from training.grpo import token_logprobs
from training.types import GenerationRequest, SamplingParams, Turn


def test_collate_left_pads_and_aligns_completions():
    a = Turn("r", "g", (5, 6, 7), (8, 9), (1, 1), (-0.5, -0.25))
    b = Turn("r", "g", (5,), (8, 9, 10), (1, 0, 1), (-1.0, 0.0, -2.0), episode=3)
    batch = collate([a, b], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [0, 5, 8, 9, 10]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 0, 1, 2, 3]]
    assert batch.targets.tolist() == [[0, 8, 9], [8, 9, 10]]
    assert batch.loss_mask.tolist() == [[0, 1, 1], [1, 0, 1]]
    assert batch.old_logprobs.tolist() == [[0.0, -0.5, -0.25], [-1.0, 0.0, -2.0]]
    assert batch.episode_ids.tolist() == [-1, 3]


def test_collate_rejects_inconsistent_turns():
    with pytest.raises(ValueError, match="inconsistent"):
        collate([Turn("r", "g", (1,), (2, 3), (1,), (0.0, 0.0))], pad_id=0)


def test_micro_batches_cover_every_turn_once():
    turns = [Turn("r", "g", tuple(range(n)), (1,), (1,), (0.0,)) for n in (5, 1, 3, 4, 2)]
    chunks = micro_batches(turns, 2)
    assert [len(c) for c in chunks] == [2, 2, 1]
    assert sorted(len(t.prompt_ids) for c in chunks for t in c) == [1, 2, 3, 4, 5]


def test_trainer_logprobs_match_rollout_logprobs(tiny_backbone, tokenizer):
    """The trainer's forward over a left-padded batch reproduces what generation sampled."""
    backend = HFBackend(tiny_backbone)
    prompts = [chat_ids(tokenizer, q) for q in ("Hi", "What is 12 * 34?")]
    requests = [
        GenerationRequest("executor", tuple(p), SamplingParams(temperature=0.7, max_new_tokens=12), seed=i)
        for i, p in enumerate(prompts)
    ]
    results = backend.generate(requests)
    turns = [
        Turn("executor", "g", tuple(p), r.token_ids, (1,) * len(r.token_ids), r.logprobs)
        for p, r in zip(prompts, results, strict=True)
    ]
    batch = collate(turns, pad_id=tokenizer.pad_token_id)
    tiny_backbone.activate("executor")
    with torch.no_grad():
        logprobs = token_logprobs(
            completion_logits(tiny_backbone.model, batch), batch.targets, temperature=0.7
        )
    mask = batch.loss_mask.bool()
    assert torch.allclose(logprobs[mask], batch.old_logprobs[mask], atol=1e-4)


def test_micro_batches_keep_episodes_whole_when_asked():
    turns = [
        Turn("r", "g", tuple(range(n)), (1,), (1,), (0.0,), episode=ep)
        for n, ep in [(9, 0), (1, 0), (5, 1), (2, 2), (3, 1)]
    ]
    chunks = micro_batches(turns, 2, whole_episodes=True)
    for chunk in chunks:
        for ep in {t.episode for t in chunk}:
            assert sum(t.episode == ep for t in turns) == sum(t.episode == ep for t in chunk)
    assert sorted(len(t.prompt_ids) for c in chunks for t in c) == [1, 2, 3, 5, 9]
