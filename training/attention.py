"""Attention without copying key/value heads: transformers' sdpa with `enable_gqa` under a mask.

SmolLM2 has 9 query heads and 3 key/value heads. transformers' "sdpa" path copies every key/value head
3 times (`repeat_kv`) whenever there is an attention mask and the device is not XPU/MPS, which on a CPU
decode step copies the whole cache in every layer: a third of a step. torch's kernel groups the heads
itself with `enable_gqa=True`, mask or not, at the same numbers.

    use_gqa_attention(model)   # CPU models; CUDA keeps transformers' choice
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_gqa"


def sdpa_gqa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, T, D]
    key: torch.Tensor,  # [B, Hkv, S, D]
    value: torch.Tensor,  # [B, Hkv, S, D]
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if query.shape[2] == 1 and dropout == 0.0:
        return _one_query(query, key, value, attention_mask, scaling), None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=bool(query.shape[2] > 1 and attention_mask is None and causal),
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None  # [B, T, Hq, D]


def _one_query(query, key, value, attention_mask, scaling) -> torch.Tensor:
    """A decode step's attention as two matmuls: each key/value head serves its group of query heads
    as a [group, D] block. torch's CPU flash kernel took 4x longer on one bfloat16 query."""
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    q = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # [B, Hkv, G, D]
    if key.dtype == torch.bfloat16:
        # The cache's keys are a view into room allocated ahead (training.generation.hf._RoomyLayer):
        # bfloat16 q @ K^T copied that view in every layer (3-4x the product at 600 keys on an AVX512-BF16
        # CPU); K @ q^T reads it in place. Float32 is faster the other way round. Same numbers either way.
        scores = torch.matmul(key, q.transpose(-1, -2)).transpose(-1, -2)  # [B, Hkv, G, S]
    else:
        scores = torch.matmul(q, key.transpose(-1, -2))
    scores = scores.float() * (scaling if scaling is not None else dim**-0.5)
    if attention_mask is not None:  # [B, 1, 1, S]: True (or 0.0) where a key may be seen
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1).to(value.dtype)  # [B, Hkv, G, S]
    out = torch.matmul(weights, value).reshape(batch, heads, 1, dim)  # [B, Hq, 1, D]
    return out.transpose(1, 2).contiguous()  # [B, 1, Hq, D]


AttentionInterface.register(NAME, sdpa_gqa_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_gqa_attention(model: torch.nn.Module) -> None:
    """Switch a CPU model that would use "sdpa" to the copy-free variant (a no-op elsewhere)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return
    if next(model.parameters()).device.type != "cpu":
        return
    model.set_attn_implementation(NAME)
