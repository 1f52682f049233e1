"""bfloat16 linears on a CPU with weights packed once for oneDNN, while generating.

`F.linear` on a bfloat16 CPU tensor reorders the weight into oneDNN's blocked layout at every call: at a
decode step's few rows that reorder costs as much as the product (a 12 x 576 by 576 x 1536 product: 89
against 45 us on two AMX cores). `PackedLinears` reorders each frozen weight once and, while entered,
runs every plain `nn.Linear` of the model (the LoRA layers' base layers, the LM head) on its packed
weight: the same oneDNN kernel, bit for bit the same numbers. Gradients never flow through it: a call that
needs one runs `F.linear`.

    packed = PackedLinears(model)          # nothing packed yet
    with torch.inference_mode(), packed:   # packs on first entry, again only if a weight changed
        model(...)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BATCH_HINT = 32  # rows oneDNN is told to expect; measured the same numbers and speed from 1 to 2,048 rows


def supported(model: torch.nn.Module) -> bool:
    """True where packing pays: bfloat16 weights on a CPU whose oneDNN multiplies bfloat16."""
    weight = next((m.weight for m in model.modules() if type(m) is torch.nn.Linear), None)
    return (
        weight is not None
        and weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


class PackedLinears:
    """While entered, every plain bfloat16 `nn.Linear` of `model` multiplies by its packed weight. A
    no-op where `supported(model)` is false. The packed copies (the size of the weights) live as long as
    this object; a weight whose storage or version changed is packed again on the next entry."""

    def __init__(self, model: torch.nn.Module):
        self.enabled = supported(model)
        self.linears = [m for m in model.modules() if type(m) is torch.nn.Linear] if self.enabled else []
        self._packed: dict[int, tuple[tuple[int, int], torch.Tensor]] = {}

    def __enter__(self) -> PackedLinears:
        for linear in self.linears:
            if linear.weight.dtype != torch.bfloat16:
                continue
            key = (linear.weight.data_ptr(), linear.weight._version)
            known = self._packed.get(id(linear))
            if known is None or known[0] != key:
                with torch.no_grad():
                    packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), BATCH_HINT)
                self._packed[id(linear)] = (key, packed)
            linear.forward = self._forward_of(linear, self._packed[id(linear)][1])
        return self

    def __exit__(self, *exc) -> None:
        for linear in self.linears:
            linear.__dict__.pop("forward", None)

    @staticmethod
    def _forward_of(linear: torch.nn.Linear, packed: torch.Tensor):
        def forward(x: torch.Tensor) -> torch.Tensor:
            if x.dtype != torch.bfloat16 or (
                torch.is_grad_enabled() and (x.requires_grad or linear.weight.requires_grad)
            ):
                return F.linear(x, linear.weight, linear.bias)
            return torch.ops.mkldnn._linear_pointwise(x, packed, linear.bias, "none", [], "")

        return forward
