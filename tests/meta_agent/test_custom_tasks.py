"""A researcher's own tasks from config alone: files, loaders, splits, graders and their errors."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from meta_agent.cli import main
from meta_agent.config import load_config
from meta_agent.errors import BadData, MissingFile, SettingError
from meta_agent.tasks import GRADERS, Task, grade_task, load_tasks
from meta_agent.tasks.custom import CustomTask
from meta_agent.tasks.grading import grade_exact, grade_numeric, last_number
from tests.meta_agent.test_train_cli import TINY

ROWS = [
    {"prompt": "What is the capital of France?", "city": "Paris", "fold": "train"},
    {"prompt": "What is the capital of Peru?", "city": "Lima", "fold": "test"},
    {"prompt": "What is the capital of Chad?", "city": "N'Djamena", "fold": "train"},
]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_exact_grader_ignores_only_whitespace():
    assert grade_exact("  New   York ", "New York")
    assert not grade_exact("new york", "New York")  # case counts
    assert not grade_exact("New York City", "New York")
    assert not grade_exact("", " ")  # an empty gold answer is never matched


def test_numeric_grader_reads_the_last_number_within_a_relative_tolerance():
    assert last_number("about $1,234.50 in all") == 1234.5
    assert last_number("-3e2 then 7") == 7.0
    assert last_number("no number") is None
    assert (
        last_number("due 2023-10-05") == 5.0 and last_number("x = -5") == -5.0 and last_number("+.5") == 0.5
    )
    assert last_number("1e-3") == 0.001 and last_number("3-4") == 4.0
    assert grade_numeric("about $1,234.50", "1234.5")
    assert grade_numeric("x = 3.0000029", "3")  # |3.0000029 - 3| / 3 = 9.7e-7 < 1e-6
    assert not grade_numeric("3.1416", "3.14159")  # (3.1416 - 3.14159) / 3.14159 = 3.2e-6
    assert grade_numeric("0", "0") and not grade_numeric("1e-12", "0")  # a gold 0 is matched exactly
    assert not grade_numeric("twelve", "12")


def test_a_task_is_graded_by_its_own_grader():
    exact = Task("t/test/1", "Capital of Peru?", "Lima", "t", grader="exact")
    assert grade_task("Lima", exact) and not grade_task("lima", exact)
    math = Task("t/test/2", "1/2?", "\\frac{1}{2}", "t")
    assert grade_task("0.5", math)
    assert set(GRADERS) == {"math", "exact", "numeric", "code", "countdown"}


def test_file_task_reads_named_fields_and_the_split_field(tmp_path):
    path = write_jsonl(tmp_path / "caps.jsonl", ROWS)
    spec = CustomTask(path=str(path), question="prompt", answer="city", grader="exact", split="fold")
    train = load_tasks("caps", "train", custom={"caps": spec})
    test = load_tasks("caps", "test", custom={"caps": spec})
    assert [(t.id, t.answer, t.grader, t.source) for t in train] == [
        ("caps/train/1", "Paris", "exact", "caps"),
        ("caps/train/3", "N'Djamena", "exact", "caps"),
    ]
    assert [t.question for t in test] == ["What is the capital of Peru?"]
    assert load_tasks("caps", "train", limit=1, custom={"caps": spec}) == train[:1]


def test_test_share_splits_by_a_hash_of_the_question_disjointly(tmp_path):
    rows = [{"question": f"What is {i} + {i}?", "answer": 2 * i} for i in range(200)]
    spec = CustomTask(path=str(write_jsonl(tmp_path / "sums.jsonl", rows)), grader="numeric", test_share=0.25)
    train = load_tasks("sums", "train", custom={"sums": spec})
    test = load_tasks("sums", "test", custom={"sums": spec})
    assert len(train) + len(test) == 200
    assert not {t.question for t in train} & {t.question for t in test}
    assert 30 <= len(test) <= 70  # about a quarter
    assert test[0].answer == str(2 * int(test[0].question.split()[2]))  # a number answer becomes text
    # the same rows go to test when rows are added or shuffled
    more = write_jsonl(
        tmp_path / "more.jsonl", [*reversed(rows), {"question": "What is 1000 + 1000?", "answer": 2000}]
    )
    again = load_tasks("more", "test", custom={"more": CustomTask(path=str(more), test_share=0.25)})
    assert {t.question for t in test} <= {t.question for t in again}


def test_the_first_split_rule_that_applies_is_the_only_one(tmp_path):
    rows = [{"question": f"Q{i}?", "answer": i, "fold": "test"} for i in range(40)]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    both = CustomTask(path=str(path), split="fold", test_share=0.5)  # the split field wins
    assert len(load_tasks("both", "test", custom={"both": both})) == 40


def test_split_in_the_path_and_a_bare_jsonl_name(tmp_path):
    (tmp_path / "d").mkdir()
    write_jsonl(tmp_path / "d" / "train.jsonl", [{"question": "1+1?", "answer": "2"}])
    write_jsonl(tmp_path / "d" / "test.jsonl", [{"question": "2+2?", "answer": "4"}])
    spec = CustomTask(path=str(tmp_path / "d" / "{split}.jsonl"))
    assert [t.answer for t in load_tasks("d", "train", custom={"d": spec})] == ["2"]
    assert [t.answer for t in load_tasks("d", "test", custom={"d": spec})] == ["4"]
    bare = str(tmp_path / "d" / "test.jsonl")
    assert [(t.question, t.grader) for t in load_tasks(bare, "test")] == [("2+2?", "math")]
    with pytest.raises(SettingError, match="no train split: put \\{split\\} in its path"):
        load_tasks(bare, "train")


def test_bad_rows_name_file_line_and_field(tmp_path):
    spec = CustomTask(path=str(tmp_path / "bad.jsonl"), question="prompt", answer="city", split="fold")
    custom = {"bad": spec}
    cases = [
        (
            '{"prompt": "Q?", "city": "A", "fold": "train"}\n{"prompt": "Q2?", "fold": "train"}\n',
            ":2: no 'city' field",
        ),
        ('{"prompt": "Q?", "city": "A", "fold": "dev"}\n', ":1: field 'fold' is 'dev', not one of"),
        ('{"prompt": "", "city": "A", "fold": "train"}\n', ":1: field 'prompt' must be non-empty text"),
        (
            '{"prompt": "Q?", "city": [1], "fold": "train"}\n',
            ":1: field 'city' must be a non-empty text or number",
        ),
        ('{"prompt": "Q?", "city": "A", "fold": "train"}\n{"prompt": \n', ":2: not valid JSON"),
        ("[1, 2]\n", ":1: a row must be an object"),
    ]
    for text, message in cases:
        (tmp_path / "bad.jsonl").write_text(text, encoding="utf-8")
        with pytest.raises(BadData, match=f"bad.jsonl{message}"):
            load_tasks("bad", "train", custom=custom)
    assert load_tasks("bad", "train", limit=0, custom=custom) == []
    with pytest.raises(SettingError, match="limit must be >= 0"):
        load_tasks("bad", "train", limit=-1, custom=custom)
    with pytest.raises(MissingFile, match="task file .*nowhere.jsonl not found"):
        load_tasks("x", "test", custom={"x": CustomTask(path=str(tmp_path / "nowhere.jsonl"))})


def test_a_loader_is_a_task_class_from_config(tmp_path, monkeypatch):
    (tmp_path / "my_tasks.py").write_text(
        "from meta_agent.tasks import Task\n"
        "def load(split, limit, seed):\n"
        "    return [Task(f'mine/{split}/{i}', f'{i} + {seed}?', str(i + seed), 'mine', grader='numeric')\n"
        "            for i in range(5)]\n"
        "def broken(split, limit, seed):\n"
        "    return ['not a task']\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    tasks = load_tasks("mine", "test", limit=2, seed=3, custom={"mine": CustomTask(loader="my_tasks:load")})
    assert [(t.question, t.answer) for t in tasks] == [("0 + 3?", "3"), ("1 + 3?", "4")]
    with pytest.raises(SettingError, match="returned str, not meta_agent.tasks.Task"):
        load_tasks("b", "test", custom={"b": CustomTask(loader="my_tasks:broken")})
    with pytest.raises(SettingError, match="cannot load 'my_tasks:nothing'"):
        load_tasks("n", "test", custom={"n": CustomTask(loader="my_tasks:nothing")})
    sys.modules.pop("my_tasks", None)


def test_custom_tasks_from_the_command_line_and_their_mistakes(tmp_path):
    path = write_jsonl(tmp_path / "caps.jsonl", ROWS)
    cfg = load_config(
        [
            f"+custom_tasks.caps={{path:{path},question:prompt,answer:city,grader:exact,split:fold}}",
            "train.task=caps",
            "eval.tasks=[caps,arith]",
        ]
    )
    assert cfg.custom_tasks["caps"] == CustomTask(str(path), None, "prompt", "city", "exact", "fold", None)
    found = load_tasks(cfg.train.task, "train", custom=cfg.custom_tasks)
    assert [t.answer for t in found] == ["Paris", "N'Djamena"]
    mistakes = {
        "+custom_tasks.caps={path:a.jsonl,grade:exact}": "custom_tasks.caps.grade: no such key",
        "+custom_tasks.caps={path:a.jsonl,grader:fuzzy}": "custom_tasks.caps: grader='fuzzy': use one of math",
        "+custom_tasks.caps={question:q}": "custom_tasks.caps: a custom task needs one of path",
        "+custom_tasks.gsm8k={path:a.jsonl}": "custom_tasks.gsm8k: a built-in task has that name",
        "+custom_tasks.caps={path:a.jsonl,test_share:1.5}": "test_share=1.5 must be between 0 and 1",
        "+custom_tasks.caps={loader:':f'}": "loader=':f' must be module:function",
        "+custom_tasks.caps={path:a.jsonl,question:[q]}": "question=\\['q'\\] must be a non-empty text",
    }
    for override, message in mistakes.items():
        with pytest.raises(SettingError, match=message):
            load_config([override])
    with pytest.raises(SettingError, match="unknown task 'capz'.*custom_tasks"):
        load_tasks("capz", "test", custom=cfg.custom_tasks)


def test_a_folder_that_datasets_did_not_save_is_named(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "folder").mkdir()
    with pytest.raises(SettingError, match="not one `datasets` saved"):
        load_tasks("f", "test", custom={"f": CustomTask(path=str(tmp_path / "folder"))})


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="datasets is installed")
def test_a_folder_without_datasets_installed_says_what_to_install(tmp_path):
    """`make test` alone does not install datasets (the bench extra brings it): the line says so."""
    (tmp_path / "folder").mkdir()
    with pytest.raises(SettingError, match="needs the `datasets` package to read: pip install datasets"):
        load_tasks("f", "test", custom={"f": CustomTask(path=str(tmp_path / "folder"))})


def test_a_datasets_folder_or_parquet_file_loads_offline(tmp_path):
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_list([{"q": "2 * 21?", "a": 42}, {"q": "Half of 9?", "a": 4.5}])
    data.save_to_disk(str(tmp_path / "saved"))
    data.to_parquet(str(tmp_path / "rows.parquet"))
    for path in (tmp_path / "saved", tmp_path / "rows.parquet"):
        spec = CustomTask(path=str(path), question="q", answer="a", grader="numeric")
        tasks = load_tasks("hf", "test", custom={"hf": spec})
        assert [(t.id, t.question, t.answer) for t in tasks] == [
            ("hf/test/1", "2 * 21?", "42"),
            ("hf/test/2", "Half of 9?", "4.5"),
        ]
        assert grade_task("The answer is 4.50", tasks[1])
    datasets.DatasetDict({"train": data, "test": data}).save_to_disk(str(tmp_path / "both"))
    with pytest.raises(SettingError, match="holds the splits \\['train', 'test'\\]"):
        load_tasks("both", "test", custom={"both": CustomTask(path=str(tmp_path / "both"))})


def test_train_eval_and_probe_take_a_file_task_unchanged(tiny_model_dir, tmp_path):
    """The commands as a user runs them (in-process), on a custom task named from the command line: each
    reads its problems from the file, grades with its grader and writes them to its traces."""
    rows = [
        {"q": f"What is {i} times 3?", "a": 3 * i, "fold": "test" if i % 3 == 0 else "train"}
        for i in range(12)
    ]
    path = write_jsonl(tmp_path / "times.jsonl", rows)
    task = f"+custom_tasks.times={{path:{path},question:q,answer:a,grader:numeric,split:fold}}"
    common = [f"model.path={tiny_model_dir}", task, *TINY, "memory.enabled=false"]
    assert (
        main(
            [
                "train",
                *common,
                "train.task=times",
                "train.eval_task=times",
                "train.steps=1",
                f"run_dir={tmp_path / 'train'}",
            ]
        )
        == 0
    )
    assert main(["eval", *common, "eval.tasks=[times]", "eval.limit=2", f"run_dir={tmp_path / 'eval'}"]) == 0
    probe = ["probe.task=times", "probe.limit=2", "probe.arms=[no_plan]", "probe.resamples=50"]
    assert main(["probe", *common, *probe, f"run_dir={tmp_path / 'probe'}"]) == 0
    test_ids = {f"times/test/{i + 1}" for i in range(0, 12, 3)}
    for run, ids in (("train", None), ("eval", test_ids), ("probe", test_ids)):
        traces = [json.loads(line) for line in (tmp_path / run / "traces.jsonl").read_text().splitlines()]
        assert traces and {t["source"] for t in traces} == {"times"}
        if ids is not None:
            assert {t["task"] for t in traces} <= ids
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["0"]["times"]["total"] == 2
