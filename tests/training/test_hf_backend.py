"""HFBackend on the tiny backbone: mixed-adapter batches, logprobs, stop strings, limits, seeds."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.conftest import ROLES
from training.generation import BackendSettings, HFBackend, make_backend
from training.generation.hf import _sample_top_p
from training.types import GenerationRequest, SamplingParams

from .sampling import surprise_z

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)
HOT = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=10)


def ids(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.fixture
def prompts(tokenizer):
    texts = (
        "Hello",
        "The weather today is sunny and",
        "Q: 3 * 7 = ?\nA:",
        "A much longer prompt that pads the rest",
    )
    return [ids(tokenizer, t) for t in texts]


def assert_same(a, b, what=""):
    assert a.token_ids == b.token_ids, what
    assert a.finish_reason == b.finish_reason, what
    assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4), what


def test_mixed_adapter_batch_equals_each_adapter_alone(tiny_backbone, prompts):
    adapters = [None, *ROLES]
    # Different limits make rows finish at different steps, so finished rows get dropped mid-batch.
    requests = [
        GenerationRequest(
            adapters[i % 3],
            prompts[i % 4],
            SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=3 + 2 * i) if i % 2 else HOT,
            seed=i,
        )
        for i in range(9)
    ]
    backend = HFBackend(tiny_backbone, batch_size=16)
    mixed = backend.generate(requests)
    for adapter in adapters:
        mine = [i for i, r in enumerate(requests) if r.adapter == adapter]
        alone = backend.generate([requests[i] for i in mine])
        for i, result in zip(mine, alone, strict=True):
            assert_same(mixed[i], result, f"request {i} adapter {adapter}")
    # The perturbed adapters really change what the model says.
    outputs = {backend.generate([GenerationRequest(a, prompts[1], GREEDY)])[0].token_ids for a in adapters}
    assert len(outputs) == 3


def test_batch_size_does_not_change_results(tiny_backbone, prompts):
    requests = [
        GenerationRequest(ROLES[i % 2], prompts[i % 4], GREEDY if i % 2 else HOT, seed=i) for i in range(7)
    ]
    big = HFBackend(tiny_backbone, batch_size=16).generate(requests)
    small = HFBackend(tiny_backbone, batch_size=2).generate(requests)
    for i, (a, b) in enumerate(zip(big, small, strict=True)):
        assert_same(a, b, f"request {i}")


@pytest.mark.parametrize("sampling", [GREEDY, HOT, SamplingParams(temperature=1.3, max_new_tokens=10)])
def test_logprobs_equal_teacher_forced_forward(tiny_backbone, prompts, sampling):
    role = ROLES[1]
    request = GenerationRequest(role, prompts[2], sampling, seed=5)
    (result,) = HFBackend(tiny_backbone).generate([request])
    full = torch.tensor([request.prompt_ids + result.token_ids])  # [1, P + C]
    tiny_backbone.activate(role)
    with torch.no_grad():
        logits = tiny_backbone.model(input_ids=full).logits[0].float()  # [P + C, V]
    completion_logits = logits[len(request.prompt_ids) - 1 : -1]  # [C, V] predicts each completion token
    logprobs = torch.log_softmax(completion_logits / (sampling.temperature or 1.0), dim=-1)
    expected = logprobs.gather(1, torch.tensor(result.token_ids)[:, None])[:, 0]  # [C]
    assert torch.allclose(torch.tensor(result.logprobs), expected, atol=1e-4)
    if sampling.temperature == 0:
        assert list(result.token_ids) == completion_logits.argmax(-1).tolist()


def test_max_new_tokens_gives_length_finish(tiny_backbone, prompts):
    requests = [
        GenerationRequest(None, prompts[0], SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=n))
        for n in (1, 4, 9)
    ]
    results = HFBackend(tiny_backbone).generate(requests)
    assert [len(r.token_ids) for r in results] == [1, 4, 9]
    assert {r.finish_reason for r in results} == {"length"}
    # The short runs are prefixes of the long one: stopping early changes nothing before it.
    assert results[2].token_ids[:4] == results[1].token_ids


def test_zero_max_new_tokens_returns_empty(tiny_backbone, prompts):
    request = GenerationRequest(
        None, prompts[0], SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=0)
    )
    (result,) = HFBackend(tiny_backbone).generate([request])
    assert result.token_ids == () and result.finish_reason == "length"


def test_stop_string_ends_generation_after_completing_token(tiny_backbone, tokenizer, prompts):
    backend = HFBackend(tiny_backbone)
    (full,) = backend.generate(
        [
            GenerationRequest(
                ROLES[0], prompts[1], SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=12)
            )
        ]
    )
    stop_at = 5
    stop = tokenizer.decode(full.token_ids[stop_at : stop_at + 1]).strip()[:3]
    assert stop
    sampling = SamplingParams(
        temperature=0.0, top_p=1.0, max_new_tokens=12, stop=("no such stop string", stop)
    )
    (result,) = backend.generate([GenerationRequest(ROLES[0], prompts[1], sampling)])
    assert result.finish_reason == "stop" and result.stop == stop
    assert result.text.endswith(stop)
    assert len(result.token_ids) <= stop_at + 1
    assert result.token_ids == full.token_ids[: len(result.token_ids)]
    assert stop in tokenizer.decode(result.token_ids) and stop not in tokenizer.decode(result.token_ids[:-1])


def test_eos_token_finishes_and_is_kept(tiny_backbone, prompts):
    (full,) = HFBackend(tiny_backbone).generate([GenerationRequest(None, prompts[3], GREEDY)])
    end_token = full.token_ids[3]
    backend = HFBackend(tiny_backbone, eos_token_ids={end_token})
    (result,) = backend.generate([GenerationRequest(None, prompts[3], GREEDY)])
    first = full.token_ids.index(end_token)
    assert result.finish_reason == "eos"
    assert result.token_ids == full.token_ids[: first + 1]  # the eos token is kept so training learns to stop


def test_default_eos_is_im_end(tiny_backbone, tokenizer):
    assert HFBackend(tiny_backbone).eos_ids == {tokenizer.convert_tokens_to_ids("<|im_end|>")}


def test_seeded_sampling_independent_of_batch(tiny_backbone, prompts):
    backend = HFBackend(tiny_backbone, batch_size=3)
    target = GenerationRequest(
        ROLES[0], prompts[2], SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=10), seed=42
    )
    (alone,) = backend.generate([target])
    crowd = [GenerationRequest(a, p, HOT) for a in (None, ROLES[1]) for p in prompts]
    for position in (0, 3, len(crowd)):
        batch = [*crowd[:position], target, *crowd[position:]]
        assert_same(backend.generate(batch)[position], alone, f"position {position}")
    other = backend.generate([GenerationRequest(ROLES[0], prompts[2], target.sampling, seed=43)])[0]
    assert other.token_ids != alone.token_ids


@pytest.mark.slow
def test_samples_follow_the_trainers_policy(tiny_backbone, tokenizer):
    """HFBackend samples from log_softmax(logits / T) (tests/training/sampling.py): over 200 seeded
    requests the mean surprise is within 4 standard errors of 0 at T and far from it at another T."""
    sampling = SamplingParams(temperature=0.3, max_new_tokens=12)
    prompt = ids(tokenizer, "Once upon a time, in a land far away, there lived a")
    requests = [GenerationRequest((None, *ROLES)[i % 3], prompt, sampling, seed=i) for i in range(200)]
    results = HFBackend(tiny_backbone, batch_size=64).generate(requests)
    assert abs(surprise_z(tiny_backbone, requests, results, 0.3)) < 4
    assert abs(surprise_z(tiny_backbone, requests, results, 0.5)) > 6


def test_unseeded_sampling_follows_torch_seed(tiny_backbone, prompts):
    backend = HFBackend(tiny_backbone)
    requests = [GenerationRequest(None, p, HOT) for p in prompts]
    torch.manual_seed(3)
    first = backend.generate(requests)
    torch.manual_seed(3)
    assert [r.token_ids for r in backend.generate(requests)] == [r.token_ids for r in first]


def test_training_mode_is_restored(tiny_backbone, prompts):
    tiny_backbone.model.train()
    HFBackend(tiny_backbone).generate([GenerationRequest(ROLES[0], prompts[0], GREEDY)])
    assert tiny_backbone.model.training


def test_bad_requests_raise(tiny_backbone, prompts):
    backend = HFBackend(tiny_backbone)
    with pytest.raises(ValueError, match="not one of"):
        backend.generate([GenerationRequest("no_such_role", prompts[0], GREEDY)])
    with pytest.raises(ValueError, match="at least one prompt token"):
        backend.generate([GenerationRequest(None, (), GREEDY)])
    with pytest.raises(ValueError, match="top_p"):
        backend.generate(
            [
                GenerationRequest(
                    None, prompts[0], SamplingParams(temperature=0.7, top_p=0.0, max_new_tokens=4)
                )
            ]
        )


def test_make_backend(tiny_backbone, monkeypatch):
    backend = make_backend(tiny_backbone, BackendSettings(batch_size=4, prefix_cache_mb=0))
    assert isinstance(backend, HFBackend) and backend.batch_size == 4
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if the vllm extra were not installed
    with pytest.raises(ImportError, match=r"pip install 'meta-agent\[vllm\]'"):
        make_backend(tiny_backbone, BackendSettings(name="vllm"))
    with pytest.raises(ValueError, match="backend.name='nope' is not a generation backend"):
        BackendSettings(name="nope")


def _draws(logprobs: torch.Tensor, top_p: float, candidates: int, n: int = 4000) -> torch.Tensor:
    picks = [
        _sample_top_p(logprobs, top_p, torch.Generator().manual_seed(seed), candidates) for seed in range(n)
    ]
    return torch.tensor(picks)


def test_sampling_over_the_candidates_stays_exact_when_the_rest_holds_mass():
    """Top 100 of 3000 tokens hold half the mass (each 0.005; the other 2900 share the rest): a quarter
    of 4000 draws landing on tokens 0-49 and half on 100-2999, within 4 standard errors."""
    probs = torch.cat([torch.full((100,), 0.5 / 100), torch.full((2900,), 0.5 / 2900)])
    picks = _draws(probs.log(), 1.0, candidates=100)
    for share, expected in (((picks < 50).float().mean(), 0.25), ((picks >= 100).float().mean(), 0.5)):
        se = (expected * (1 - expected) / len(picks)) ** 0.5
        assert abs(float(share) - expected) < 4 * se


@pytest.mark.parametrize("candidates", [100, 2])  # the nucleus inside the candidates, and beyond them
def test_nucleus_sampling_never_leaves_the_nucleus(candidates):
    """0.2, 0.15, 0.1, 0.05, 0.04, then 460 tokens of 0.001: top_p=0.4 keeps the first three (0.35 before
    the third, 0.45 before the fourth), drawn in proportion 4:3:2."""
    probs = torch.cat([torch.tensor([0.2, 0.15, 0.1, 0.05, 0.04]), torch.full((460,), 0.001)])
    picks = _draws(probs.log(), 0.4, candidates=candidates, n=3000)
    assert int(picks.max()) <= 2
    counts = torch.bincount(picks, minlength=3).float() / len(picks)
    for share, expected in zip(counts.tolist(), (4 / 9, 3 / 9, 2 / 9), strict=True):
        assert abs(share - expected) < 4 * (expected * (1 - expected) / len(picks)) ** 0.5


@pytest.mark.parametrize("candidates", [4, 1])  # the fast path, and the whole-vocabulary fallback
def test_nucleus_keeps_exactly_as_many_tokens_on_both_paths_when_tied(candidates):
    """0.3, 0.3, 0.3, 0.1 at top_p=0.5: 0.3 lies before the second, 0.6 before the third, so the nucleus
    is two tokens, even though a third ties with them; each drawn half the time."""
    probs = torch.tensor([0.3, 0.3, 0.3, 0.1])
    picks = _draws(probs.log(), 0.5, candidates=candidates, n=2000)
    counts = torch.bincount(picks, minlength=4)
    assert int((counts > 0).sum()) == 2 and int(counts[3]) == 0
    for share in (counts[counts > 0].float() / len(picks)).tolist():
        assert abs(share - 0.5) < 4 * (0.25 / len(picks)) ** 0.5
