"""Every bad input the hostile-input issue lists, in one table: one line naming the key, file, row or value
and what to do, exit 2, and no run folder made for a start that cannot go on.

Cases that need a trained run or two racing processes live beside the behaviour they guard:
`resume=<run> model.path=/bad` and same-second runs in test_run_folders.py, a demonstration file with a
token id outside the vocabulary in test_sft_source.py, a question too long for the context in test_cli.py.
"""

from __future__ import annotations

import pytest

from meta_agent.cli import main

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
    ("solve-empty-question", ["solve", "   "], None, "empty question"),
    ("solve-override-first", ["solve", "model.path=/x"], None, "needs the question first"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "rows", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_line_and_exit_2(argv, rows, message, tmp_path, monkeypatch, capsys):
    if rows is not None:
        (tmp_path / "data" / "gsm8k").mkdir(parents=True)
        (tmp_path / "data" / "gsm8k" / "test.jsonl").write_text(rows, encoding="utf-8")
        monkeypatch.setenv("META_AGENT_DATA", str(tmp_path / "data"))
    run_dir = tmp_path / "run"
    command, *rest = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    args = (
        [*rest, f"run_dir={run_dir}", "memory.path=null"] if command != "solve" or rest[0].strip() else rest
    )
    assert main([command, *args]) == 2
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert message.replace("{tmp}", str(tmp_path)) in lines[0]
    assert not run_dir.exists(), "a start that could not go on made its run folder"
