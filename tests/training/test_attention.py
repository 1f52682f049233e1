"""The copy-free grouped-query attention gives transformers' sdpa numbers, forward and backward."""

from __future__ import annotations

import torch

from tests.conftest import ROLES
from training.attention import NAME


def forward_backward(backbone, impl: str, ids, mask):
    model = backbone.model.base_model.model
    model.set_attn_implementation(impl)
    params = backbone.trainable_parameters(ROLES[0])
    for p in params:
        p.grad = None
    backbone.activate(ROLES[0])
    logits = backbone.model(input_ids=ids, attention_mask=mask).logits  # [B, T, V]
    logits[:, -3:].logsumexp(-1).mean().backward()
    return logits.detach(), torch.cat([p.grad.flatten() for p in params])


def test_gqa_attention_matches_sdpa_with_padding(tiny_backbone):
    model = tiny_backbone.model.base_model.model
    assert model.config._attn_implementation == NAME  # CPU backbones switch to it
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    ids = torch.randint(3, 200, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding
    try:
        ours = forward_backward(tiny_backbone, NAME, ids, mask)
        theirs = forward_backward(tiny_backbone, "sdpa", ids, mask)
    finally:
        model.set_attn_implementation(NAME)
    assert torch.allclose(ours[0][mask.bool()], theirs[0][mask.bool()], atol=1e-5)
    assert torch.allclose(ours[1], theirs[1], atol=1e-5)
