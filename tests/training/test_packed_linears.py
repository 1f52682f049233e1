"""Packed bfloat16 linears give F.linear's numbers bit for bit, fall back where gradients flow, repack a
changed weight, and leave a bfloat16 backend's generations as they were."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import ROLES
from tests.tiny_model import build_tiny_backbone
from training.backbone import AdapterConfig
from training.generation import HFBackend
from training.generation.packed import PackedLinears, supported
from training.types import GenerationRequest, SamplingParams

needs_bf16 = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU's oneDNN does not multiply bfloat16",
)


def layers() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.Linear(40, 16, bias=False)).bfloat16()


@needs_bf16
def test_packed_linears_give_the_same_bits():
    model = layers()
    packed = PackedLinears(model)
    assert packed.enabled
    for shape in ((3, 24), (5, 1, 24), (2, 7, 24)):
        x = torch.randn(*shape).bfloat16()
        with torch.inference_mode():
            expected = model(x)
            with packed:
                assert "forward" in model[0].__dict__
                got = model(x)
        assert torch.equal(got, expected)
    assert "forward" not in model[0].__dict__  # put back on exit


@needs_bf16
def test_gradients_flow_through_plain_linear():
    model = layers()
    model[0].weight.requires_grad_(True)
    x = torch.randn(4, 24).bfloat16()
    with PackedLinears(model):
        y = model[0](x)
    assert y.grad_fn is not None
    assert torch.equal(y, F.linear(x, model[0].weight, model[0].bias))


@needs_bf16
def test_a_changed_weight_is_packed_again():
    model = layers()
    packed = PackedLinears(model)
    x = torch.randn(2, 24).bfloat16()
    with torch.inference_mode(), packed:
        before = model[0](x)
    with torch.no_grad():
        model[0].weight.mul_(2)  # in place: its version moves
    with torch.inference_mode(), packed:
        after = model[0](x)
    with torch.inference_mode():
        assert torch.equal(after, model[0](x))
    assert not torch.equal(before, after)


def test_float32_models_are_left_alone():
    model = layers().float()
    assert not supported(model)
    with PackedLinears(model) as packed:
        assert packed.linears == [] and "forward" not in model[0].__dict__


@needs_bf16
def test_a_bfloat16_backend_generates_the_same_with_packed_weights(tokenizer):
    backbone = build_tiny_backbone(
        tokenizer, {r: AdapterConfig(r=4, alpha=8) for r in ROLES}, lora_b_std=0.05
    )
    backbone.model.to(torch.bfloat16)
    texts = ("Hello", "The weather today is sunny and", "Q: 3 * 7 = ?\nA:")
    requests = [
        GenerationRequest(
            ROLES[i % len(ROLES)],
            tuple(tokenizer(t, add_special_tokens=False)["input_ids"]),
            SamplingParams(temperature=temperature, max_new_tokens=12),
            seed=i,
        )
        for i, t in enumerate(texts)
        for temperature in (0.0, 1.0)
    ]
    packed = HFBackend(backbone, prefix_cache_mb=0)
    assert packed._packed.enabled
    plain = HFBackend(backbone, prefix_cache_mb=0)
    plain._packed = nullcontext()
    for a, b in zip(packed.generate(requests), plain.generate(requests), strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == b.logprobs
