"""VLLMBackend: the conformance suite, the same tokens and logprobs as HF and the trainer, adapter sync.

Needs the vllm extra (`make vllm-setup`); skipped without it. One engine serves the whole module (start-up
takes seconds); `pytest -m vllm` selects these tests.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ROLES
from tests.tiny_model import build_tiny_backbone
from tests.training.turns import chat_ids
from training.backbone import AdapterConfig, Backbone
from training.generation import HFBackend, VLLMBackend, VLLMSettings
from training.generation.conformance import CHECKS, PROMPTS
from training.grpo import token_logprobs
from training.model_files import ModelConfig
from training.trainer import PolicyTrainer
from training.types import GenerationRequest, SamplingParams, Turn

from .sampling import policy_logits, surprise_z

# Every engine takes 15-20 s to start on 2 cores: these run with the slow tests (CI runs both tiers).
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SETTINGS = VLLMSettings(kv_cache_gib=0.25, max_model_len=1024, max_num_seqs=32)


@pytest.fixture(scope="module")
def backbone(tokenizer):
    """The tiny backbone with head_dim 32 (vLLM's CPU attention needs >= 32) and two distinct adapters."""
    return build_tiny_backbone(
        tokenizer, {role: AdapterConfig(r=4, alpha=8) for role in ROLES}, lora_b_std=0.05, head_dim=32
    )


@pytest.fixture(scope="module")
def engine(backbone):
    pytest.importorskip("vllm")
    backend = VLLMBackend(backbone, settings=SETTINGS)
    yield backend
    backend.close()


def ids(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def trainer_logprobs(
    backbone: Backbone, role: str | None, prompt, completion, temperature: float
) -> list[float]:
    """What the trainer computes for `completion` after `prompt`: log_softmax(logits / T) per token."""
    logits = policy_logits(backbone, role, prompt, completion)
    return token_logprobs(logits[None], torch.tensor([list(completion)]), temperature)[0].tolist()


def max_diff(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def assert_greedy_matches_hf(engine, backbone, tokenizer) -> None:
    """HFBackend's greedy tokens, logprobs and text for every adapter, the bare backbone (None) included."""
    requests = [
        GenerationRequest(adapter, ids(tokenizer, prompt), SamplingParams(temperature=0.0, max_new_tokens=12))
        for adapter in (None, *ROLES)
        for prompt in PROMPTS[:2]
    ]
    for request, ours, theirs in zip(
        requests, engine.generate(requests), HFBackend(backbone).generate(requests), strict=True
    ):
        assert ours.token_ids == theirs.token_ids, f"adapter {request.adapter}"
        assert max_diff(ours.logprobs, theirs.logprobs) < 1e-4, f"adapter {request.adapter}"
        assert ours.text == theirs.text


def assert_sampled_logprobs_are_the_trainers(engine, backbone, tokenizer, temperature: float, roles) -> None:
    """log_softmax(logits / T) of each sampled token, as training.batch recomputes it (fp32: 1e-4)."""
    sampling = SamplingParams(temperature=temperature, max_new_tokens=16)
    requests = [GenerationRequest(role, ids(tokenizer, PROMPTS[2]), sampling, seed=7) for role in roles]
    for request, result in zip(requests, engine.generate(requests), strict=True):
        expected = trainer_logprobs(
            backbone, request.adapter, request.prompt_ids, result.token_ids, temperature
        )
        assert max_diff(result.logprobs, expected) < 1e-4, f"adapter {request.adapter}"


def test_lora_kernels_match_vllms_and_skip_requests_without_adapter():
    """Our CPU LoRA ops give vLLM's torch ops' results, and nothing (not the last slot) for index -1."""
    pytest.importorskip("vllm")
    from vllm.lora.ops import torch_ops

    from training.generation import vllm_lora

    g = torch.Generator().manual_seed(0)
    slots, rank, d_in, d_out, tokens = 3, 8, 32, 48, 7
    lora_a = torch.randn(slots, 1, rank, d_in, generator=g)
    lora_b = torch.randn(slots, 1, d_out, rank, generator=g)
    x = torch.randn(tokens, d_in, generator=g)
    indices = torch.tensor([0, 2, 1, 1, 0, 2, -1])
    ours, theirs = torch.zeros(tokens, rank), torch.zeros(tokens, rank)
    vllm_lora.bgmv_shrink(x, lora_a, ours, indices, 0.5)
    torch_ops.bgmv_shrink(x, lora_a, theirs, indices, 0.5)
    assert torch.allclose(ours[:-1], theirs[:-1], atol=1e-5) and not ours[-1].any()
    h, y = torch.randn(tokens, rank, generator=g), torch.randn(tokens, 2 * d_out, generator=g)
    ours, theirs = y.clone(), y.clone()
    vllm_lora.bgmv_expand_slice(h, lora_b, ours, indices, d_out, d_out)
    torch_ops.bgmv_expand_slice(h, lora_b, theirs, indices, d_out, d_out)
    assert torch.allclose(ours[:-1], theirs[:-1], atol=1e-5) and torch.equal(ours[-1], y[-1])
    ours, theirs = y.clone(), y.clone()
    vllm_lora.bgmv_expand(h, lora_b, ours, indices)
    torch_ops.bgmv_expand(h, lora_b, theirs, indices)
    assert torch.allclose(ours[:-1], theirs[:-1], atol=1e-5) and torch.equal(ours[-1], y[-1])
    # Prefill: one index per sequence, expanded over its tokens.
    seq_lens, per_seq = torch.tensor([3, 4]), torch.tensor([1, -1])
    ours = torch.zeros(tokens, rank)
    vllm_lora.sgmv_shrink(x, lora_a, ours, None, seq_lens, per_seq, 2, 4, tokens, 1.0)
    assert torch.allclose(ours[:3], x[:3] @ lora_a[1, 0].T, atol=1e-5) and not ours[3:].any()


def test_engine_worker_runs_our_lora_kernels(engine):
    assert engine._llm.collective_rpc("lora_kernels") == ["training.generation.vllm_lora"]


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_vllm_backend_conformance(engine, tokenizer, check):
    check(engine, tokenizer, engine.adapters, 1e-4)


def test_greedy_matches_hf_for_every_adapter(engine, backbone, tokenizer):
    """Same greedy tokens and logprobs as HFBackend, the bare backbone (adapter None) included."""
    assert_greedy_matches_hf(engine, backbone, tokenizer)


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_sampled_logprobs_are_the_trainers(engine, backbone, tokenizer, temperature):
    """log_softmax(logits / T) of each sampled token, as training.batch recomputes it (fp32: 1e-4)."""
    assert_sampled_logprobs_are_the_trainers(engine, backbone, tokenizer, temperature, (None, *ROLES))


def test_samples_follow_the_trainers_policy(engine, backbone, tokenizer):
    """The engine samples from log_softmax(logits / T), not just reports it: over 200 seeded requests the
    mean surprise of the samples is within 4 standard errors of 0 under the trainer at T, and the same
    statistic puts them far off the policy at another temperature (it can tell)."""
    sampling = SamplingParams(temperature=0.3, max_new_tokens=12)
    prompt = ids(tokenizer, PROMPTS[2])
    requests = [GenerationRequest((None, *ROLES)[i % 3], prompt, sampling, seed=i) for i in range(200)]
    results = engine.generate(requests)
    assert abs(surprise_z(backbone, requests, results, 0.3)) < 4
    assert abs(surprise_z(backbone, requests, results, 0.5)) > 6


def test_eos_ends_a_request_and_stays_in_its_tokens(backbone, engine, tokenizer):
    """An eos id ends generation with finish_reason eos; the eos token is the last of token_ids."""
    prompt = ids(tokenizer, PROMPTS[0])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    (full,) = engine.generate([GenerationRequest(ROLES[0], prompt, greedy)])
    eos = full.token_ids[2]
    engine.eos_ids, saved = frozenset({eos}), engine.eos_ids
    try:
        (result,) = engine.generate([GenerationRequest(ROLES[0], prompt, greedy)])
    finally:
        engine.eos_ids = saved
    assert result.finish_reason == "eos"
    assert result.token_ids == full.token_ids[: full.token_ids.index(eos) + 1]


def test_seeded_batch_larger_than_one_engine_step(engine, tokenizer):
    """Seeded prompts of more tokens than one engine step takes (4096 here): no prompt is split over two
    steps (on a CPU that killed the engine), and every request samples what it samples alone."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=4)
    prompts = [tuple(range(100 + i, 100 + i + 900)) for i in range(6)]  # distinct: no prefix shared
    requests = [GenerationRequest(ROLES[i % 2], p, sampling, seed=i) for i, p in enumerate(prompts)]
    together = engine.generate(requests)
    for request, result in zip(requests[-2:], together[-2:], strict=True):
        (alone,) = engine.generate([request])
        assert alone.token_ids == result.token_ids


def test_nucleus_sampling_is_refused(engine, tokenizer):
    """top_p < 1: vLLM's logprobs would be renormalised inside the nucleus, not the trainer's quantity."""
    prompt = ids(tokenizer, PROMPTS[0])
    with pytest.raises(ValueError, match=r"top_p=0.9.*set top_p=1 or use backend.name=hf"):
        engine.generate(
            [
                GenerationRequest(
                    ROLES[0], prompt, SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=4)
                )
            ]
        )
    # Greedy ignores top_p: nothing is sampled, so nothing is renormalised.
    greedy = SamplingParams(temperature=0.0, top_p=0.9, max_new_tokens=4)
    (result,) = engine.generate([GenerationRequest(ROLES[0], prompt, greedy)])
    assert result.token_ids


def test_no_stale_adapter_after_a_trainer_update(engine, backbone, tokenizer):
    """After a PolicyTrainer step the engine's logprobs are the updated trainer's, not the old adapter's."""
    role = ROLES[1]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    request = GenerationRequest(role, ids(tokenizer, PROMPTS[1]), sampling, seed=3)
    (before,) = engine.generate([request])
    old = trainer_logprobs(backbone, role, request.prompt_ids, before.token_ids, 1.0)
    assert max_diff(before.logprobs, old) < 1e-4

    trainer = PolicyTrainer(backbone, dict.fromkeys(ROLES, 0.05))
    turn = Turn(
        role, "g", request.prompt_ids, before.token_ids, (1,) * len(before.token_ids), before.logprobs
    )
    trainer.sft_step([turn])
    new = trainer_logprobs(backbone, role, request.prompt_ids, before.token_ids, 1.0)
    # What a stale engine would still serve is now off by far more than the engine's precision ...
    assert max_diff(before.logprobs, new) > 1e-2
    # ... and the engine, synced by generate(), serves the updated adapter.
    (after,) = engine.generate([request])
    expected = trainer_logprobs(backbone, role, request.prompt_ids, after.token_ids, 1.0)
    assert max_diff(after.logprobs, expected) < 1e-4


def test_tensor_parallel_engine_serves_the_same_policy(backbone, tokenizer):
    """backend.vllm.tensor_parallel_size=2 (on a CPU: two workers, one core each): the weights and each
    role's adapter split over two workers give HF's greedy tokens and logprobs for every adapter, and the
    trainer's logprobs for sampled tokens, also after an adapter sync."""
    pytest.importorskip("vllm")  # `make test` without the vllm extra skips it, as the module says
    settings = VLLMSettings(kv_cache_gib=0.25, max_model_len=1024, max_num_seqs=32, tensor_parallel_size=2)
    with VLLMBackend(backbone, settings=settings) as split:
        assert_greedy_matches_hf(split, backbone, tokenizer)
        with torch.no_grad():  # as after an optimizer step: the engine must sync, not serve the old one
            for p in backbone.trainable_parameters(ROLES[1]):
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        assert_sampled_logprobs_are_the_trainers(split, backbone, tokenizer, 0.7, ROLES)


def test_close_ends_the_engine_processes_and_removes_its_folders(backbone):
    """What System.close() calls at the end of train, eval and solve: nothing of the engine is left."""
    pytest.importorskip("vllm")
    import psutil

    def engine_processes() -> set:
        return {p for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM")}

    before = engine_processes()  # the module's engine
    backend = VLLMBackend(backbone, settings=SETTINGS)
    started, workdir = engine_processes() - before, backend._workdir
    assert started and workdir.is_dir()
    backend.close()
    _, alive = psutil.wait_procs(list(started), timeout=30)
    assert not alive and not workdir.exists()
    backend.close()  # a second close does nothing


@pytest.mark.slow
def test_real_backbone_matches_hf(tokenizer):
    """SmolLM2-135M-Instruct with top-half adapters: the engine's greedy run is HFBackend's (fp32)."""
    pytest.importorskip("vllm")
    adapters = {role: AdapterConfig(top_layers=15) for role in ROLES}
    backbone = Backbone.load(ModelConfig(dtype="float32"), adapters)
    with torch.no_grad():  # fresh adapters equal the base model: make them differ
        generator = torch.Generator().manual_seed(0)
        for role in ROLES:
            for param in backbone.trainable_parameters(role):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    prompt = chat_ids(backbone.tokenizer, "What is 12 * 7? Answer with a number.")
    sampling = SamplingParams(temperature=0.0, max_new_tokens=24)
    requests = [GenerationRequest(role, prompt, sampling) for role in (None, *ROLES)]
    with VLLMBackend(backbone, settings=SETTINGS) as engine:
        ours = engine.generate(requests)
    for request, mine, theirs in zip(requests, ours, HFBackend(backbone).generate(requests), strict=True):
        assert mine.token_ids == theirs.token_ids, f"adapter {request.adapter}"
        assert max_diff(mine.logprobs, theirs.logprobs) < 1e-3, f"adapter {request.adapter}"
    for role_result in ours[1:]:  # the adapters (top 15 layers only) do change the output
        n = min(len(role_result.logprobs), len(ours[0].logprobs))
        assert max_diff(role_result.logprobs[:n], ours[0].logprobs[:n]) > 1e-3
