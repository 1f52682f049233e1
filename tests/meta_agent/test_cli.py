"""The `meta-agent` command run as a user runs it: a subprocess, real config, real files.

The fast tests point `model.path` at a saved tiny random model (same architecture, real
tokenizer); the slow ones run the real SmolLM2 backbone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import meta_agent.cli
from meta_agent.cli import main

QUESTION = "A depot holds 728 crates with 734 bolts in each crate. A delivery brings 21,139 more bolts. How many bolts does the depot hold now?"


def run_cli(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(
        [sys.executable, "-m", "meta_agent", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_traces(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]


@pytest.mark.slow  # a subprocess run of the whole command: about 20 s on a busy 2-core machine
def test_eval_on_a_local_model_folder(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        "eval",
        f"model.path={tiny_model_dir}",
        "eval.tasks=[arith,gsm8k]",
        "eval.limit=2",
        "eval.episodes_per_batch=2",
        "roles.meta_thinker.sampling.max_new_tokens=12",
        "roles.executor.sampling.max_new_tokens=12",
        f"memory.path={tmp_path / 'memory'}",
        f"run_dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "arith" in proc.stdout and "gsm8k" in proc.stdout and "accuracy" in proc.stdout
    assert str(run_dir / "traces.jsonl") in proc.stdout.replace("\n", "")
    traces = read_traces(run_dir)
    assert sorted(t["source"] for t in traces) == ["arith", "arith", "gsm8k", "gsm8k"]
    for trace in traces:
        assert [t["role"] for t in trace["turns"]][:2] == ["meta_thinker", "executor"]
        assert set(trace["rewards"]) == {"meta_thinker", "executor"}
    assert (run_dir / "config.yaml").read_text().startswith("# meta-agent eval")


@pytest.mark.slow  # a subprocess run of the whole command: about 20 s on a busy 2-core machine
def test_single_agent_baseline_is_a_roles_override(tiny_model_dir, tmp_path):
    proc = run_cli(
        "eval",
        f"model.path={tiny_model_dir}",
        "roles=single_agent",
        "eval.limit=2",
        "protocol.max_new_tokens=32",
        "memory.enabled=false",
        f"run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    for trace in read_traces(tmp_path / "run"):
        assert {t["role"] for t in trace["turns"]} == {"executor"}


@pytest.mark.slow  # a subprocess run of the whole command: about 20 s on a busy 2-core machine
def test_solve_prints_the_episode(tiny_model_dir, tmp_path):
    proc = run_cli(
        "solve",
        QUESTION,
        f"model.path={tiny_model_dir}",
        "roles.meta_thinker.sampling.max_new_tokens=12",
        "roles.executor.sampling.max_new_tokens=12",
        f"memory.path={tmp_path / 'memory'}",
        f"run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "meta_thinker: plan" in proc.stdout and "executor: execute" in proc.stdout
    assert "answer:" in proc.stdout
    assert read_traces(tmp_path / "run")[0]["question"] == QUESTION


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.path=/no/such/model", "model.path=/no/such/model"),
        ("protocol.max_roundz=3", "max_roundz"),
        ("eval.limit=abc", "eval.limit=abc: Value 'abc' of type 'str' could not be converted to Integer"),
        ("eval.tasks=[nosuchtask]", "known tasks"),
        ("roles.executor.tools=[calculator,shell]", "shell"),
    ],
)
def test_bad_input_is_one_clear_error(override, message, tmp_path, capsys):
    # In-process: the same main() the console script calls, without paying for a new interpreter.
    rc = main(["eval", override, f"run_dir={tmp_path / 'run'}", "memory.enabled=false"])
    out = capsys.readouterr().out
    assert rc == 2
    assert "error:" in out and message in out.replace("\n", "")


def test_a_setting_the_model_cannot_take_is_one_clear_error(tiny_model_dir, tmp_path, capsys):
    args = [f"model.path={tiny_model_dir}", "roles.executor.adapter.top_layers=9", "memory.enabled=false"]
    assert main(["eval", *args, f"run_dir={tmp_path / 'run'}"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("error: adapter top_layers=9 must be between 1 and the model's 2 layers")


def test_an_internal_bug_keeps_its_traceback(monkeypatch, tmp_path):
    """Only the user's mistakes become one line: a ValueError from a bug (a zip(strict=True) that does
    not match, say) propagates with its traceback."""

    def broken(*args, **kwargs):
        return list(zip([1, 2], [3], strict=True))

    monkeypatch.setattr(meta_agent.cli, "build_system", broken)
    with pytest.raises(ValueError, match="zip"):
        main(["eval", f"run_dir={tmp_path / 'run'}", "memory.enabled=false"])


def test_vllm_refuses_nucleus_sampling_before_anything_loads(tmp_path, capsys):
    """backend.name=vllm with a role's top_p < 1 fails at start-up, naming the key and the way out."""
    overrides = ["backend.name=vllm", "roles.executor.sampling.top_p=0.9", "model.path=/no/such/model"]
    rc = main(["eval", *overrides, f"run_dir={tmp_path / 'run'}", "memory.enabled=false"])
    out = capsys.readouterr().out.replace("\n", "")
    assert rc == 2  # and before the (missing) model was looked for
    assert "roles.executor.sampling.top_p=0.9" in out and "backend.name=hf" in out


@pytest.mark.slow
def test_real_backbone_eval_hierarchy(tmp_path):
    """The default hierarchy on the real SmolLM2 backbone, two generated tool problems."""
    run_dir = tmp_path / "run"
    proc = run_cli(
        "eval",
        "eval.limit=2",
        "protocol.max_new_tokens=320",
        f"memory.path={tmp_path / 'memory'}",
        f"run_dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "accuracy" in proc.stdout
    traces = read_traces(run_dir)
    assert len(traces) == 2
    for trace in traces:
        kinds = [t["kind"] for t in trace["turns"]]
        assert kinds[:2] == ["plan", "execute"]
        assert all(t["text"].strip() for t in trace["turns"]), "the real model writes something every turn"


@pytest.mark.slow
def test_real_backbone_solve_single_agent(tmp_path):
    proc = run_cli(
        "solve",
        "What is 12 + 30?",
        "roles=single_agent",
        "protocol.max_new_tokens=128",
        "memory.enabled=false",
        f"run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    trace = read_traces(tmp_path / "run")[0]
    assert trace["turns"][0]["role"] == "executor" and trace["turns"][0]["text"].strip()


SOLVE_FAST = ["roles.meta_thinker.sampling.max_new_tokens=8", "roles.executor.sampling.max_new_tokens=8"]


def test_solve_takes_any_question_and_says_the_roles_are_untrained(tiny_model_dir, tmp_path, capsys):
    question = "If 3x = 12, what is x?"  # an "=" inside a question is not an override
    args = [
        f"model.path={tiny_model_dir}",
        *SOLVE_FAST,
        "memory.enabled=false",
        f"run_dir={tmp_path / 'run'}",
    ]
    assert main(["solve", question, *args]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the roles are untrained" in out and "no trained run under" in out and "adapters=" in out
    assert read_traces(tmp_path / "run")[0]["question"] == question


@pytest.mark.parametrize(
    ("question", "message"),
    [
        ("   ", "empty question"),
        ("model.path=/x", "needs the question first"),
        ("word " * 3000, "longer than the model's 2048-token context"),
    ],
)
def test_solve_refuses_what_it_cannot_answer(tiny_model_dir, tmp_path, capsys, question, message):
    args = [
        f"model.path={tiny_model_dir}",
        *SOLVE_FAST,
        "memory.enabled=false",
        f"run_dir={tmp_path / 'run'}",
    ]
    assert main(["solve", question, *args]) == 2
    assert message in " ".join(capsys.readouterr().out.split())
