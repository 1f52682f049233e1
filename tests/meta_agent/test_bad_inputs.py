"""Every bad input the hostile-input issue lists, in one table: one line naming the key, file, row or value
and what to do, exit 2, and no run folder made for a start that cannot go on.

Refusals that must leave a trained run as it was: test_refusals.py. Cases that need a trained run or
two racing processes live beside the behaviour they guard:
`resume=<run> model.path=/bad` and same-second runs in test_run_folders.py, a demonstration file with a
token id outside the vocabulary in test_sft_source.py, a question too long for the context in test_cli.py.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import sqlite3
from contextlib import contextmanager
from pathlib import Path

import pytest

from memory import store
from memory.store import SQLITE_FILE
from meta_agent.cli import main
from meta_agent.tasks.grading import grade, grade_numeric
from tests.meta_agent.test_saved_adapters import FAST, save_changed_adapters
from training.backbone import ADAPTER_WEIGHTS

GSM8K_ROW = '{"question": "q", "answer": "#### 3"}\n'

# (id, command and arguments, a gsm8k test file to read instead of the real one, what the line says)
CASES = [
    ("empty-train-pool", ["train", "train.pool=0"], None, "train.pool=0: the training pool is empty"),
    ("train-split-missing", ["train", "train.task=aime24"], None, "task 'aime24' has splits ('test',), not 'train'"),
    ("group-size-0", ["train", "train.group_size=0"], None, "train.group_size must be >= 1, got 0"),
    ("negative-steps", ["train", "train.steps=-3"], None, "train.steps must be >= 0, got -3"),
    ("resume-typo", ["train", "resume={tmp}/rnu"], None, "resume={tmp}/rnu does not exist"),
    ("limit-not-int", ["eval", "eval.limit=abc"], None, "eval.limit=abc: Value 'abc' of type 'str' could not be converted to Integer"),
    ("unknown-key", ["eval", "protocol.max_roundz=3"], None, "max_roundz"),
    ("experiment-for-other-roles", ["train", "experiment=arith_hierarchy", "roles=single_agent"], None,
     "roles.meta_thinker: settings for a role that the chosen roles= does not have"),
    ("unknown-task", ["eval", "eval.tasks=[nosuchtask]"], None, "known tasks"),
    ("row-a-bare-number", ["eval", "eval.tasks=[gsm8k]"], "7\n", "test.jsonl:1: a row must be a JSON object"),
    ("question-null", ["eval", "eval.tasks=[gsm8k]"], '{"question": null, "answer": "#### 3"}\n',
     "test.jsonl:1: gsm8k/test/0: field 'question' is empty"),
    ("answer-not-text", ["eval", "eval.tasks=[gsm8k]"], '{"question": "q", "answer": 5}\n',
     "field 'answer' must be text, not int 5"),
    ("row-not-json", ["eval", "eval.tasks=[gsm8k]"], GSM8K_ROW + '{"question": "q"\n', "test.jsonl:2: not valid JSON"),
    ("empty-test-file", ["eval", "eval.tasks=[gsm8k]"], "\n", "holds no rows: gsm8k/test has nothing to evaluate"),
    ("model-path-missing", ["eval", "model.path=/no/such/model"], None, "model.path=/no/such/model"),
    ("unknown-tool", ["eval", "roles.executor.tools=[calculator,shell]"], None, "shell"),
    ("sandbox-level", ["eval", "tools.sandbox.isolation=none"], None,
     "tools.sandbox.isolation must be one of namespaces, landlock, got 'none'"),
    ("repetition-stop-too-short", ["eval", "roles.executor.sampling.repetition_stop=3"], None,
     "roles.executor.sampling.repetition_stop must be 0 (off) or at least 8 tokens"),
    ("row-not-utf8", ["eval", "eval.tasks=[gsm8k]"], b'{"question": "caf\xe9", "answer": "#### 3"}\n',
     "test.jsonl:1: byte 0xe9 at column 18 is not UTF-8: save the file as UTF-8"),
    ("row-too-long", ["eval", "eval.tasks=[gsm8k]"], '{"question": "' + "x " * 600_000 + '", "answer": "#### 3"}\n',
     "test.jsonl:1: the row is longer than 1,000,000 bytes"),
    ("eval-no-tasks", ["eval", "eval.tasks=[]"], None, "eval.tasks=[] evaluates nothing: name at least one task, e.g. eval.tasks=[arith]"),
    ("eval-limit-negative", ["eval", "eval.limit=-1"], None, "eval.limit=-1: give a number of problems per task >= 1"),
    ("group-of-one", ["train", "train.group_size=1"], None, "train.group_size=1 with grpo.advantage=grpo"),
    ("non-ascii-unquoted", ["eval", "run_dir={tmp}/caf\u00e9"], None, "quote it, as run_dir='{tmp}/caf\u00e9'"),
    ("solve-empty-question", ["solve", "   "], None, "empty question"),
    ("solve-override-first", ["solve", "model.path=/x"], None, "needs the question first"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "rows", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_line_and_exit_2(argv, rows, message, tmp_path, monkeypatch, capsys):
    if rows is not None:
        (tmp_path / "data" / "gsm8k").mkdir(parents=True)
        data = rows if isinstance(rows, bytes) else rows.encode("utf-8")
        (tmp_path / "data" / "gsm8k" / "test.jsonl").write_bytes(data)
        monkeypatch.setenv("META_AGENT_DATA", str(tmp_path / "data"))
    run_dir = tmp_path / "run"
    command, *rest = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    args = (
        [*rest, f"run_dir={run_dir}", "memory.path=null"] if command != "solve" or rest[0].strip() else rest
    )
    assert main([command, *args]) == 2
    assert_one_line(capsys, message.replace("{tmp}", str(tmp_path)))
    assert not run_dir.exists(), "a start that could not go on made its run folder"


def assert_one_line(capsys, message: str) -> None:
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert message in lines[0], lines[0]


# Cases on the tiny model: (id, command, a setup of tmp_path returning the arguments, what the line says)
def no_weights(tmp, model, monkeypatch):
    folder = tmp / "model"
    folder.mkdir()
    shutil.copy(model / "config.json", folder)
    return f"model.path={folder}"


def truncated_adapters(tmp, model, monkeypatch):
    folder = tmp / "adapters"
    save_changed_adapters(model, folder, seed=1)
    weights = folder / "executor" / ADAPTER_WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-100])
    return f"adapters={folder}"


def corrupt_memory(tmp, model, monkeypatch):
    (tmp / "memory").mkdir()
    (tmp / "memory" / SQLITE_FILE).write_bytes(b"not a database, " * 100)
    return f"memory.enabled=true memory.path={tmp / 'memory'}"


def read_only_memory(tmp, model, monkeypatch):
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o500)
    return f"memory.enabled=true memory.path={tmp / 'ro' / 'memory'}"


def run_dir_a_file(tmp, model, monkeypatch):
    (tmp / "taken").write_text("a file")
    return f"run_dir={tmp / 'taken'}"


def long_question(tmp, model, monkeypatch):
    (tmp / "data" / "gsm8k").mkdir(parents=True)
    row = json.dumps({"question": "word " * 3000, "answer": "#### 3"})
    (tmp / "data" / "gsm8k" / "test.jsonl").write_text(row + "\n", encoding="utf-8")
    monkeypatch.setenv("META_AGENT_DATA", str(tmp / "data"))
    return "eval.tasks=[gsm8k]"


def missing_second_checkpoint(tmp, model, monkeypatch):
    save_changed_adapters(model, tmp / "first", seed=1)
    return f"adapters={tmp / 'first'} probe.meta_thinker_from={tmp / 'nothing'}"


MODEL_CASES = [
    ("model-without-weights", "eval", no_weights, "has a config.json but no weights"),
    ("truncated-adapters", "eval", truncated_adapters, "executor/adapter_model.safetensors cannot be read"),
    ("corrupt-memory", "eval", corrupt_memory, "memory.sqlite aside"),
    ("read-only-memory", "eval", read_only_memory, "cannot be opened as a memory"),
    ("run-dir-a-file", "eval", run_dir_a_file, "taken is a file, not a folder: pass another run_dir"),
    ("question-beyond-context", "eval", long_question, "gsm8k/test/0: the question is 3001 tokens, longer than the model's 2048-token context"),
    ("probe-second-checkpoint", "probe", missing_second_checkpoint, "probe.meta_thinker_from="),
]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "setup", "message"), [c[1:] for c in MODEL_CASES], ids=[c[0] for c in MODEL_CASES]
)
def test_a_bad_file_or_folder_is_one_line_and_leaves_nothing(
    command, setup, message, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    if setup is read_only_memory and os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder")
    given = setup(tmp_path, tiny_model_dir, monkeypatch).split()
    args = [
        f"model.path={tiny_model_dir}",
        *FAST,
        "probe.limit=2",
        "memory.path=null",
        f"run_dir={tmp_path / 'run'}",
    ]
    before = snapshot(tmp_path)
    assert main([command, *args, *given]) == 2
    assert_one_line(capsys, message)
    assert snapshot(tmp_path) == before, "a refused command changed or left a file"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("why", ["database or disk is full", "attempt to write a readonly database"])
def test_a_memory_on_a_full_or_read_only_disk_is_one_line(why, tiny_model_dir, tmp_path, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise sqlite3.OperationalError(why)

    monkeypatch.setattr(store, "enable_wal", full)
    args = [
        f"model.path={tiny_model_dir}",
        *FAST,
        f"memory.path={tmp_path / 'memory'}",
        "memory.enabled=true",
        f"run_dir={tmp_path / 'run'}",
    ]
    assert main(["eval", *args]) == 2
    assert_one_line(
        capsys, f"memory.path={tmp_path / 'memory'}: {tmp_path / 'memory'} cannot be opened as a memory"
    )
    assert not list(tmp_path.iterdir())  # neither the memory folder nor the run folder


@contextmanager
def files_of_at_most(size: int):
    """Writes beyond `size` bytes of any file fail with EFBIG in this process, as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error, not the signal that kills
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_run_dir_on_a_full_disk_is_one_line_and_leaves_no_claimed_folder(tiny_model_dir, tmp_path, capsys):
    args = [f"model.path={tiny_model_dir}", *FAST, f"run_dir={tmp_path / 'runs' / 'run'}"]
    with files_of_at_most(1000):  # config.yaml is longer
        assert main(["eval", *args]) == 2
    assert_one_line(
        capsys, "cannot write there (File too large): free some space, or pass a writable run_dir"
    )
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("written", ["#### 1e3", "1e3", "1.0E+3", "the answer is 1e3 bolts"])
def test_an_answer_in_e_notation_is_graded_right(written):
    assert grade(written, "1000") and grade_numeric(written, "1000")
    assert not grade(written, "1001")
