"""The copy-free grouped-query attention gives transformers' sdpa numbers, forward and backward."""

from __future__ import annotations

import torch

from tests.conftest import ROLES
from training.attention import NAME, sdpa_gqa_attention


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


def test_one_query_attention_matches_sdpa_under_a_padding_mask():
    torch.manual_seed(0)
    query, key, value = torch.randn(3, 6, 1, 8), torch.randn(3, 2, 10, 8), torch.randn(3, 2, 10, 8)
    mask = torch.ones(3, 1, 1, 10, dtype=torch.bool)
    mask[0, ..., :4] = False  # a left-padded row
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, enable_gqa=True
    ).transpose(1, 2)
    for attention_mask in (mask, torch.zeros(3, 1, 1, 10).masked_fill(~mask, float("-inf"))):
        out, _ = sdpa_gqa_attention(torch.nn.Module(), query, key, value, attention_mask)
        assert out.shape == (3, 1, 6, 8)
        assert torch.allclose(out, expected, atol=1e-6)


def test_one_query_attention_in_bfloat16_reads_a_cache_view_right():
    """bfloat16 takes the K @ q^T path, on keys that are a view into a longer buffer (the decode cache)."""
    torch.manual_seed(0)
    query = torch.randn(2, 6, 1, 8).bfloat16()
    buffer = torch.randn(2, 2, 16, 8).bfloat16()  # [B, Hkv, capacity, D]
    key, value = buffer[:, :, :10], buffer.flip(-1)[:, :, :10]
    mask = torch.ones(2, 1, 1, 10, dtype=torch.bool)
    mask[1, ..., :3] = False
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), attn_mask=mask, enable_gqa=True
    ).transpose(1, 2)
    out, _ = sdpa_gqa_attention(torch.nn.Module(), query, key, value, mask)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 1, 6, 8)
    assert torch.allclose(out.float(), expected, atol=3e-2)
