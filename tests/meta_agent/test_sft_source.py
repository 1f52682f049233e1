"""`sft.source=<file.jsonl>`: SFT on demonstrations written by `meta-agent demos`, on a saved tiny model."""

from __future__ import annotations

import json

import pytest
import torch
from peft import get_peft_model_state_dict

from meta_agent.cli import main
from meta_agent.config import load_config
from meta_agent.learning.sft import run_sft, sft_turns
from meta_agent.system import build_system
from training.distributed import Ranks
from training.run_log import RunLog

SFT = [
    "memory.enabled=false",
    "protocol.max_new_tokens=600",  # demonstrations are played under the protocol's limits
    "sft.examples=4",
    "sft.batch_size=2",
    "sft.max_steps=2",
    "sft.eval_every=100",
]


def squash(text: str) -> str:
    """Text without whitespace: rich wraps long lines (paths) wherever it likes."""
    return "".join(text.split())


def adapter_state(backbone) -> dict[str, torch.Tensor]:
    return {
        f"{role}/{k}": v.detach().clone()
        for role in backbone.adapters
        for k, v in get_peft_model_state_dict(backbone.model, adapter_name=role).items()
    }


def train_sft(overrides: list[str], ckpt_root) -> tuple[dict, dict]:
    """(adapters before, adapters after) two SFT steps; no held-out tasks, so eval is free."""
    cfg = load_config(overrides)
    system = build_system(cfg)
    before = adapter_state(system.backbone)
    run_sft(
        cfg, system, sft_turns(cfg, system), RunLog(ckpt_root, enabled=False), lambda: 0.0, ckpt_root, Ranks()
    )
    return before, adapter_state(system.backbone)


def test_sft_from_a_demos_file_equals_sft_from_the_generator(tiny_model_dir, tmp_path, capsys):
    common = [f"model.path={tiny_model_dir}", *SFT, f"run_dir={tmp_path / 'run'}"]
    path = tmp_path / "demos" / "arith.jsonl"
    assert main(["demos", *common, "sft.source=arith", f"demos_out={path}"]) == 0
    out = squash(capsys.readouterr().out)
    assert squash(f"wrote 4 demonstration episodes (12 turns) to {path}") in out
    assert {json.loads(line)["episode"] for line in path.read_text().splitlines()} == {0, 1, 2, 3}

    start, generated = train_sft([*common, "sft.source=arith"], tmp_path / "a")
    _, from_file = train_sft([*common, f"sft.source={path}"], tmp_path / "b")
    assert squash(f"sft: 12 demonstration turns from {path}") in squash(capsys.readouterr().out)
    assert generated.keys() == from_file.keys()
    assert any(not torch.equal(start[k], generated[k]) for k in start), "SFT changed nothing"
    for k in generated:
        assert torch.equal(generated[k], from_file[k]), k


def demo_line(role: str = "executor") -> str:
    row = {
        "role": role,
        "group": "arith/train/0",
        "prompt_ids": [1, 2],
        "completion_ids": [3, 4],
        "loss_mask": [1, 1],
        "logprobs": [0.0, 0.0],
        "reward": 1.0,
        "episode": 0,
    }
    return json.dumps(row) + "\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "nowhere.jsonl not found: write it with `meta-agent demos"),
        ("\n", "demos.jsonl is empty"),
        (demo_line() + '{"role": "executor"\n', "demos.jsonl:2: not a demonstration turn"),
        (
            demo_line() + demo_line("solver"),
            "role 'solver' is not a configured role (meta_thinker, executor)",
        ),
        (
            demo_line().replace("[3, 4]", "[3, 10000000]", 1),
            "demos.jsonl:1: token id 10000000 is outside this model's vocabulary",
        ),
        (
            demo_line().replace("[1, 2]", json.dumps([1] * 3000), 1),
            "demos.jsonl:1: the turn is 3002 tokens, longer than the model's 2048-token context",
        ),
        (
            demo_line().replace("executor", "ex\udce9cutor"),
            "demos.jsonl:1: byte 0xe9 at column 13 is not UTF-8",
        ),
    ],
    ids=["missing", "empty", "malformed", "unknown-role", "token-out-of-range", "beyond-context", "not-utf8"],
)
def test_a_bad_demos_file_is_one_clear_error_at_start_up(
    content,
    message,
    tiny_model_dir,
    tmp_path,
    capsys,
):
    path = tmp_path / ("nowhere.jsonl" if content is None else "demos.jsonl")
    if content is not None:
        path.write_bytes(content.encode("utf-8", "surrogateescape"))
    rc = main(
        ["sft", f"model.path={tiny_model_dir}", f"sft.source={path}", f"run_dir={tmp_path / 'run'}", *SFT]
    )
    out = squash(capsys.readouterr().out)
    assert rc == 2 and "error:" in out and squash(message) in out
    assert "held-outaccuracy" not in out, "the file is read before the first evaluation"
    assert not (tmp_path / "run").exists(), "a refused sft left its run folder"
