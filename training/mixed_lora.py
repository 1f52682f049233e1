"""Every row of a batch with its own LoRA adapter, at the cost of one adapter.

PEFT's mixed-adapter path (`model(..., adapter_names=[...])`) registers a hook on every LoRA layer at
each forward, then per layer and per adapter gathers that adapter's rows, runs its two matmuls and
scatters the result back. In a decode loop that is most of the gap between a mixed batch and the base
model (on 2 CPU cores: +26 ms on a 93 ms step, 2,000 copies per step).

Here each adapted Linear stacks every adapter's matrices once per generate call, A as [in, R] and the
scaled B as [R, out] (R = the adapters' ranks summed), and a row mask [B, 1, R] zeroes the columns of
the adapters a row does not use:

    y = base(x) + ((x @ A_stack) * mask) @ B_stack

Two matmuls per layer whatever the mix of adapters, no gather or scatter, no hooks. A row's masked
columns contribute exact zeros, so its output is its own adapter's (up to float rounding of the sums).

    with RowAdapters(backbone.model) as rows:
        rows.set(["executor", "meta_thinker", BASE_ADAPTER])
        out = backbone.model(input_ids=...)   # no adapter_names: the rows' adapters apply
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from peft.tuners.lora.layer import Linear as LoraLinear

Layout = tuple[tuple[str, int], ...]  # the (adapter, rank) column blocks of a stacked layer, in order


@dataclass(frozen=True)
class StackedLoRA:
    """One layer's adapters side by side: x @ a gives every adapter's rank columns, b maps them back."""

    a: torch.Tensor  # [in, R]
    b: torch.Tensor  # [R, out], each adapter's block already multiplied by its scaling
    layout: Layout


def stack_layer(layer: LoraLinear) -> StackedLoRA:
    """The stacked matrices of one PEFT LoRA Linear (every adapter it holds, in PEFT's order)."""
    names = list(layer.lora_A)
    if any(name in getattr(layer, "lora_variant", {}) for name in names):
        raise ValueError(
            f"per-row adapters support plain LoRA only; adapters {sorted(layer.lora_variant)} use a variant "
            "(DoRA, aLoRA): turn it off in the adapter config"
        )
    a = torch.cat([layer.lora_A[n].weight for n in names]).T.contiguous()  # [in, R]
    b = torch.cat(
        [layer.lora_B[n].weight * layer.scaling[n] for n in names], dim=1
    ).T.contiguous()  # [R, out]
    layout = tuple((n, layer.lora_A[n].weight.shape[0]) for n in names)
    return StackedLoRA(a.detach(), b.detach(), layout)


def row_mask(layout: Layout, rows: Sequence[str], dtype: torch.dtype, device) -> torch.Tensor | None:
    """[B, R] with 1 where a row's adapter owns the column; None when no row uses any of `layout`."""
    mask = torch.zeros((len(rows), sum(r for _, r in layout)), dtype=dtype)
    start, used = 0, False
    for name, rank in layout:
        for i, row in enumerate(rows):
            if row == name:
                mask[i, start : start + rank] = 1
                used = True
        start += rank
    return mask.to(device) if used else None


class RowAdapters:
    """While entered, every PEFT LoRA Linear of `model` applies each batch row's own adapter (`set`);
    a name the layer does not hold (e.g. BASE_ADAPTER) leaves the row on the base weights.

    The stacked matrices are taken on entry: build a new one after the adapters change. Inference only.
    """

    def __init__(self, model: torch.nn.Module):
        self.layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
        self.rows: tuple[str, ...] = ()
        self._stacked: dict[int, StackedLoRA] = {}
        self._masks: dict[Layout, torch.Tensor | None] = {}

    def set(self, rows: Sequence[str]) -> None:
        """The adapter of each row of the next forward passes, in batch order."""
        if tuple(rows) != self.rows:
            self.rows = tuple(rows)
            self._masks.clear()

    def __enter__(self) -> RowAdapters:
        self._stacked = {id(layer): stack_layer(layer) for layer in self.layers}
        for layer in self.layers:
            layer.forward = self._forward_of(layer)  # an instance attribute shadows the class's forward
        return self

    def __exit__(self, *exc) -> None:
        for layer in self.layers:
            if "forward" in layer.__dict__:
                del layer.forward
        self._stacked.clear()
        self._masks.clear()

    def _mask(self, stacked: StackedLoRA) -> torch.Tensor | None:
        if stacked.layout not in self._masks:
            self._masks[stacked.layout] = row_mask(
                stacked.layout, self.rows, stacked.a.dtype, stacked.a.device
            )
        return self._masks[stacked.layout]

    def _forward_of(self, layer: LoraLinear):
        stacked = self._stacked[id(layer)]

        def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            result = layer.base_layer(x, *args, **kwargs)
            if layer.disable_adapters or layer.merged:
                return result
            mask = self._mask(stacked)
            if mask is None:  # every row on the base weights
                return result
            if x.shape[0] != mask.shape[0]:
                raise RuntimeError(
                    f"batch of {x.shape[0]} rows but {mask.shape[0]} row adapters were set: call set() first"
                )
            mask = mask.view(mask.shape[0], *([1] * (x.dim() - 2)), mask.shape[1])  # [B, 1.., R]
            lora = torch.matmul(torch.matmul(x.to(stacked.a.dtype), stacked.a) * mask, stacked.b)
            return result + lora.to(result.dtype)

        return forward
