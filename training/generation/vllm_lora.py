"""LoRA matmuls for vLLM's CPU backend, installed in the engine's worker process.

VLLMBackend names `LoRAKernels` as the engine's `worker_extension_cls`, so the worker imports this module
before it builds the model, and the import replaces the six torch ops vLLM 0.32's CPU LoRA layers call.

Why: those ops gather each token's adapter weights into a [tokens, out, rank] tensor before an einsum, which
made a SmolLM2-135M decode step with two adapters 3.7x slower than without LoRA on 2 cores; and they index
the weights with the token's slot, where -1 ("no adapter") picks the last slot, so a request without an
adapter was served with another role's. Here each op is one dense matmul against every slot at once, with
each token's result masked to its own slot (-1: none). Slots are few (one per role) and the rank small, so
the extra work over one adapter is small next to the base layer's. Layers whose slots hold only zeros
(below an adapter's `top_layers`) are skipped.

Shapes, as vLLM passes them: inputs [T, in] (shrink) or [T, r] (expand); lora_a [L, 1, r, in]; lora_b
[L, 1, out, r]; indices [T] (bgmv) or one per sequence with seq_lens (sgmv).
"""

from __future__ import annotations

import torch

_zero: dict[int, tuple[int, bool]] = {}  # weights' data_ptr -> (in-place version, all zero)


def _all_zero(weights: torch.Tensor) -> bool:
    """Whether every slot's weights are zero (layers outside `top_layers`): cached until changed in place."""
    version, zero = _zero.get(weights.data_ptr(), (-1, False))
    if version != weights._version:
        zero = not bool(weights.any())
        _zero[weights.data_ptr()] = (weights._version, zero)
    return zero


def _slot_mask(indices: torch.Tensor, slots: int, dtype: torch.dtype) -> torch.Tensor:
    """[T, L]: 1 where token t uses slot l; a row of zeros for -1 (no adapter)."""
    return (indices[:, None] == torch.arange(slots, device=indices.device)).to(dtype)


def bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0) -> None:
    """output[:, :r] = scaling * inputs @ A[slot].T per token."""
    slots, rank = lora_a_weights.shape[0], lora_a_weights.shape[-2]
    if _all_zero(lora_a_weights):
        output_tensor[:, :rank] = 0
        return
    dtype = output_tensor.dtype
    weights = lora_a_weights.reshape(slots * rank, -1).to(dtype)  # [L * r, in]
    every = (inputs.to(dtype) @ weights.T).view(-1, slots, rank)  # [T, L, r]
    mask = _slot_mask(lora_indices_tensor, slots, dtype)  # [T, L]
    output_tensor[:, :rank] = scaling * torch.einsum("tlr,tl->tr", every, mask)


def _expand(inputs, lora_b_weights, indices, dtype) -> torch.Tensor:
    """[T, out]: inputs[t] @ B[slot].T per token (zero for -1)."""
    slots, out, rank = lora_b_weights.shape[0], lora_b_weights.shape[-2], lora_b_weights.shape[-1]
    mask = _slot_mask(indices, slots, dtype)  # [T, L]
    spread = (inputs.to(dtype)[:, None, :] * mask[:, :, None]).reshape(-1, slots * rank)  # [T, L * r]
    weights = lora_b_weights.reshape(slots, out, rank).to(dtype).transpose(1, 2).reshape(slots * rank, out)
    return spread @ weights


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True) -> None:
    if add_inputs and _all_zero(lora_b_weights):
        return
    outputs = _expand(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    # As vLLM's op: one row broadcasts to every output row; adapter and model may pad differently.
    limit = 1 if outputs.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    width = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :width] += outputs[:limit, :width]
    else:
        output_tensor[:, :width] = outputs[:limit, :width]


def bgmv_expand_slice(
    inputs,
    lora_b_weights,
    output_tensor,
    lora_indices_tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    if add_inputs and _all_zero(lora_b_weights):
        return
    outputs = _expand(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def _per_token(lora_indices_tensor: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(
    inputs,
    lora_a_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    scaling: float,
) -> None:
    indices = _per_token(lora_indices_tensor, seq_len_tensor)
    bgmv_shrink(inputs, lora_a_weights, output_tensor, indices, scaling)


def sgmv_expand(
    inputs,
    lora_b_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    add_inputs: bool = False,
) -> None:
    indices = _per_token(lora_indices_tensor, seq_len_tensor)
    bgmv_expand(inputs, lora_b_weights, output_tensor, indices, add_inputs)


def sgmv_expand_slice(
    inputs,
    lora_b_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = False,
) -> None:
    indices = _per_token(lora_indices_tensor, seq_len_tensor)
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, indices, slice_offset, slice_size, add_inputs)


OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")


def install() -> None:
    """Point vLLM's CPU LoRA wrapper at the ops above (it looks them up in its own module)."""
    from vllm.lora.punica_wrapper import punica_cpu

    for name in OPS:
        setattr(punica_cpu, name, globals()[name])


class LoRAKernels:
    """The worker extension: its module's import installs the ops; `lora_kernels()` tells which are live."""

    def lora_kernels(self) -> str:
        from vllm.lora.punica_wrapper import punica_cpu

        return punica_cpu.bgmv_shrink.__module__


install()
