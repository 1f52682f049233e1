"""RowAdapters: each batch row on its own adapter, matching PEFT's per-adapter forward row by row."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_model import build_tiny_backbone
from training.backbone import BASE_ADAPTER, AdapterConfig
from training.mixed_lora import RowAdapters, row_mask, stack_layer


def test_row_mask_marks_each_rows_own_columns():
    layout = (("a", 2), ("b", 1))
    mask = row_mask(layout, ["b", "a", BASE_ADAPTER], torch.float32, "cpu")
    assert mask.tolist() == [[0, 0, 1], [1, 1, 0], [0, 0, 0]]
    assert row_mask(layout, [BASE_ADAPTER, "c"], torch.float32, "cpu") is None  # no row uses this layer


@pytest.fixture
def uneven_backbone(tokenizer):
    """Roles of different ranks, one adapting only the top layer: layers hold different adapter sets."""
    adapters = {"planner": AdapterConfig(r=4, alpha=8), "solver": AdapterConfig(r=8, alpha=32, top_layers=1)}
    return build_tiny_backbone(tokenizer, adapters, lora_b_std=0.05)


def single_adapter_logits(backbone, input_ids: torch.Tensor, role: str) -> torch.Tensor:
    """PEFT's own forward with one adapter active (or none), the reference for a row."""
    with torch.no_grad():
        if role == BASE_ADAPTER:
            with backbone.disabled_adapters():
                return backbone.model(input_ids=input_ids).logits
        backbone.activate(role)
        return backbone.model(input_ids=input_ids).logits


def test_stack_layer_scales_b_and_records_each_rank(uneven_backbone):
    layers = RowAdapters(uneven_backbone.model).layers
    top = stack_layer(layers[-1])  # the last layer holds both adapters
    assert top.layout == (("planner", 4), ("solver", 8))
    assert top.a.shape == (layers[-1].in_features, 12) and top.b.shape == (12, layers[-1].out_features)
    solver = layers[-1].lora_B["solver"].weight.T * 4.0  # alpha / r = 32 / 8
    assert torch.allclose(top.b[4:], solver)
    assert stack_layer(layers[0]).layout == (("planner", 4),)  # the bottom layer: planner only


def test_every_row_gets_its_own_adapter(uneven_backbone, tokenizer):
    model = uneven_backbone.model.eval()
    prompt = tokenizer("Add 3 and 4, then double it.")["input_ids"]
    rows = ["solver", "planner", BASE_ADAPTER, "planner"]
    input_ids = torch.tensor([prompt] * len(rows))  # [B, T]
    with torch.no_grad(), RowAdapters(model) as row_adapters:
        row_adapters.set(rows)
        mixed = model(input_ids=input_ids).logits  # [B, T, V]
    references = {role: single_adapter_logits(uneven_backbone, input_ids[:1], role)[0] for role in set(rows)}
    for i, role in enumerate(rows):
        assert torch.allclose(mixed[i], references[role], atol=1e-5), role
    assert not torch.allclose(references["solver"], references["planner"], atol=1e-3)
    assert not torch.allclose(references["planner"], references[BASE_ADAPTER], atol=1e-3)
    with torch.no_grad():  # and it agrees with PEFT's own mixed-batch path
        peft_mixed = model(input_ids=input_ids, adapter_names=rows).logits
    assert torch.allclose(mixed, peft_mixed, atol=1e-5)


def test_leaving_restores_peft_and_a_wrong_batch_is_refused(uneven_backbone, tokenizer):
    model = uneven_backbone.model.eval()
    input_ids = torch.tensor([tokenizer("Hello")["input_ids"]] * 2)
    before = single_adapter_logits(uneven_backbone, input_ids, "planner")
    with torch.no_grad(), RowAdapters(model) as row_adapters:
        row_adapters.set(["solver"])
        with pytest.raises(RuntimeError, match="call set"):
            model(input_ids=input_ids)
    assert not any("forward" in layer.__dict__ for layer in row_adapters.layers)
    assert torch.equal(single_adapter_logits(uneven_backbone, input_ids, "planner"), before)


def test_disabled_adapters_win_inside(uneven_backbone, tokenizer):
    model = uneven_backbone.model.eval()
    input_ids = torch.tensor([tokenizer("Hello")["input_ids"]])
    base = single_adapter_logits(uneven_backbone, input_ids, BASE_ADAPTER)
    with torch.no_grad(), RowAdapters(model) as row_adapters, uneven_backbone.disabled_adapters():
        row_adapters.set(["solver"])
        assert torch.allclose(model(input_ids=input_ids).logits, base, atol=1e-6)
