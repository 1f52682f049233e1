"""A researcher's own tasks from config alone: a JSON-lines file (or a Hugging Face `datasets` folder or
file), or a Python loader, named under `custom_tasks:` and then used wherever a task is named.

    custom_tasks:
      capitals: {path: data/capitals.jsonl, question: prompt, answer: city, grader: exact, test_share: 0.2}
      mine: {loader: my_package.tasks:load}        # load(split, limit, seed) -> list[meta_agent.tasks.Task]
    train: {task: capitals, eval_task: capitals}
    eval: {tasks: [capitals, gsm8k]}

A .jsonl path given as a task name (`eval.tasks=[my/file.jsonl]`) is a file task with the defaults below.
Splits, the first that applies: a `{split}` in the path (data/mine/{split}.jsonl: one file a split); a
`split` field of the rows ("train" or "test"); `test_share` (rows go to test by a hash of their question,
so the splits are disjoint and stay so as rows are added); else the file is the test split alone.
Task ids are "<name>/<split>/<row's line number>".
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meta_agent.errors import BadData, MissingFile, SettingError
from meta_agent.tasks.countdown import read_gold
from meta_agent.tasks.grading import GRADERS, normalize_gold
from meta_agent.tasks.jsonl import json_lines
from meta_agent.tasks.types import Task

SPLITS = ("train", "test")
HF_SUFFIXES = (".parquet", ".arrow", ".csv")  # files read with the `datasets` package (as a folder is)


@dataclass
class CustomTask:
    """One entry of `custom_tasks:`: where a task's problems come from and how its answers are graded."""

    path: str | None = None  # a .jsonl file, or a `datasets` folder / .parquet / .arrow / .csv file
    loader: str | None = None  # or "module:function", called as function(split, limit, seed) -> [Task]
    question: str = "question"  # the rows' field shown to the agents
    answer: str = "answer"  # the rows' field with the gold answer (text or a number)
    # math (math-verify) | exact (the text, whitespace aside) | numeric (within 1e-6) | code (the answer
    # field is a test program, run after the model's code in the sandbox; it passes when it exits 0) |
    # countdown (the answer field is "numbers -> target", "44 19 35 -> 98"; see tasks.countdown)
    grader: str = "math"
    split: str | None = None  # the rows' field that says "train" or "test" (see the module's text)
    test_share: float | None = None  # or: this share of the rows, by a hash of the question, is test

    def __post_init__(self) -> None:
        if (self.path is None) == (self.loader is None):
            raise SettingError("a custom task needs one of path (a data file) or loader (module:function)")
        if self.grader not in GRADERS:
            raise SettingError(f"grader={self.grader!r}: use one of {', '.join(GRADERS)}")
        if self.test_share is not None and not 0 < self.test_share < 1:
            raise SettingError(
                f"test_share={self.test_share} must be between 0 and 1 (the share of rows tested)"
            )
        module, _, function = (self.loader or ":").partition(":")
        if self.loader is not None and not (module and function.isidentifier()):
            raise SettingError(f"loader={self.loader!r} must be module:function, e.g. my_package.tasks:load")
        for key in ("path", "question", "answer", "split"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise SettingError(
                    f"{key}={value!r} must be a non-empty text (a {'file' if key == 'path' else 'field name'})"
                )


def is_task_file(name: str) -> bool:
    """A task name that is a path to a JSON-lines file, read as a custom task with the defaults."""
    return name.endswith(".jsonl")


def load_custom(name: str, spec: CustomTask, split: str, limit: int | None, seed: int) -> list[Task]:
    """The tasks of the custom task `name` (spec `spec`) in `split`, the first `limit` of them or all."""
    if split not in SPLITS:
        raise SettingError(f"task {name!r} has splits {SPLITS}, not {split!r}")
    if limit is not None and limit < 0:
        raise SettingError(f"limit must be >= 0 or None, got {limit}")
    if limit == 0:
        return []
    if spec.loader is not None:
        return _from_loader(name, spec.loader, split, limit, seed)
    # the first rule that applies: one file a split, a split field, a hashed share, or a test file alone
    by_path = "{split}" in spec.path
    by_field = not by_path and spec.split is not None
    by_share = not by_path and not by_field and spec.test_share is not None
    if not (by_path or by_field or by_share) and split != "test":
        raise SettingError(
            f"task {name!r} is one file with no train split: put {{split}} in its path, name the rows' "
            f"split field (split=...), or set test_share to hold some rows out"
        )
    path = Path(spec.path.replace("{split}", split)).expanduser()
    tasks = []
    for line_no, row in _rows(path):
        where = f"{path}:{line_no}"
        if not isinstance(row, dict):
            raise BadData(f"{where}: a row must be an object with the task's fields, not {row!r:.60}")
        if by_field:
            if spec.split not in row:
                raise BadData(f"{where}: no {spec.split!r} field (the split field); fields: {sorted(row)}")
            if row[spec.split] not in SPLITS:
                raise BadData(f"{where}: field {spec.split!r} is {row[spec.split]!r}, not one of {SPLITS}")
            if row[spec.split] != split:
                continue
        question = _text_field(row, spec.question, where)
        if by_share and _in_test(question, spec.test_share) != (split == "test"):
            continue
        gold = _gold_field(row, spec.answer, where)
        if spec.grader == "countdown":
            try:
                read_gold(gold)
            except ValueError as e:
                raise BadData(f"{where}: field {spec.answer!r}: {e}") from None
        tasks.append(Task(f"{name}/{split}/{line_no}", question, gold, name, {"row": line_no}, spec.grader))
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks and limit != 0:
        raise BadData(f"{path} has no {split} rows for task {name!r}: nothing to evaluate or train on")
    return tasks


def _in_test(question: str, share: float) -> bool:
    """Whether a row is held out: a hash of its question, read as a number in [0, 1), below `share`."""
    digest = hashlib.sha256(question.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def _rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, row) of a JSON-lines file; (row number from 1, row) of a `datasets` folder or file."""
    if not path.exists():
        raise MissingFile(f"task file {path} not found: check the custom task's path")
    if path.is_dir() or path.suffix in HF_SUFFIXES:
        yield from enumerate(_hf_rows(path), start=1)
        return
    yield from json_lines(path)


def _hf_rows(path: Path) -> list[dict]:
    """The rows of a folder `datasets` saved (save_to_disk, or a DatasetDict's split folder) or of a
    .parquet / .arrow / .csv file, read offline."""
    try:
        import datasets
    except ImportError:
        raise SettingError(
            f"{path} needs the `datasets` package to read: pip install datasets (or give a .jsonl file)"
        ) from None
    if path.is_dir():
        try:
            data = datasets.load_from_disk(str(path))
        except FileNotFoundError:
            raise SettingError(f"{path} is a folder but not one `datasets` saved (save_to_disk)") from None
        if isinstance(data, datasets.DatasetDict):
            raise SettingError(
                f"{path} holds the splits {list(data)}: give one split's folder, or put {{split}} in the path"
            )
    else:
        kind = {".parquet": "parquet", ".arrow": "arrow", ".csv": "csv"}[path.suffix]
        data = datasets.load_dataset(kind, data_files=str(path), split="train")
    return list(data)


def _text_field(row: Mapping[str, Any], key: str, where: str) -> str:
    if key not in row:
        raise BadData(f"{where}: no {key!r} field (the question field); fields: {sorted(row)}")
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise BadData(f"{where}: field {key!r} must be non-empty text, not {value!r:.40}")
    return value


def _gold_field(row: Mapping[str, Any], key: str, where: str) -> str:
    if key not in row:
        raise BadData(f"{where}: no {key!r} field (the answer field); fields: {sorted(row)}")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, str | int | float) or not str(value).strip():
        raise BadData(f"{where}: field {key!r} must be a non-empty text or number, not {value!r:.40}")
    return normalize_gold(value)


def _from_loader(name: str, loader: str, split: str, limit: int | None, seed: int) -> list[Task]:
    module_name, _, function_name = loader.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as e:
        raise SettingError(f"task {name!r}: cannot load {loader!r} ({e}); is the module on the path?") from e
    tasks = list(function(split, limit, seed))
    bad = next((t for t in tasks if not isinstance(t, Task)), None)
    if bad is not None:
        raise SettingError(
            f"task {name!r}: {loader} returned {type(bad).__name__}, not meta_agent.tasks.Task"
        )
    bad = next((t for t in tasks if t.grader not in GRADERS), None)
    if bad is not None:
        raise SettingError(
            f"task {name!r}: {bad.id} has grader {bad.grader!r}, not one of {', '.join(GRADERS)}"
        )
    return tasks if limit is None else tasks[:limit]
