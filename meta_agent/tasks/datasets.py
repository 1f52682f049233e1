"""Task loaders: `load_tasks(name, split)` for every task family, stored or generated.

    load_tasks("gsm8k", "test", limit=20)   # first 20 rows of data/gsm8k/test.jsonl
    load_tasks("arith", "train", seed=1)     # generated, see arith.py
    load_tasks("countdown", "train")         # generated; "countdown_tinyzero" is a stored test set (countdown.py)
    load_tasks("mine", "test", custom=cfg.custom_tasks)   # a researcher's own, see custom.py

Stored families read `<data>/<name>/<split>.jsonl` (files, sources and licences: data/README.md).
The data folder is, first found: the `data_dir` argument, the META_AGENT_DATA environment variable,
then `data/` at the repository root.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from meta_agent.errors import BadData, MissingFile, SettingError
from meta_agent.tasks.arith import make_arith_tasks
from meta_agent.tasks.arith_distract import make_distract_tasks
from meta_agent.tasks.code import load_humaneval
from meta_agent.tasks.countdown import countdown_task, make_countdown_tasks
from meta_agent.tasks.custom import CustomTask, is_task_file, load_custom
from meta_agent.tasks.grading import extract_gsm8k_answer, normalize_gold
from meta_agent.tasks.jsonl import json_lines
from meta_agent.tasks.pyfunc import make_pyfunc_tasks
from meta_agent.tasks.types import Task

T = TypeVar("T")

DATA_ENV = "META_AGENT_DATA"
REPO_DATA_DIR = Path(__file__).resolve().parents[2] / "data"

# Task family -> the splits it has. Order is the order users see in errors and help.
KNOWN_TASKS: Mapping[str, tuple[str, ...]] = {
    "gsm8k": ("train", "test"),
    "math500": ("test",),
    "aime24": ("test",),
    "amc23": ("test",),
    "arith": ("train", "test"),
    "arith_distract": ("train", "test"),  # arith with distractor quantities, see arith_distract.py
    "humaneval": ("test",),  # Python functions graded by unit tests in the sandbox, see code.py
    "pyfunc": ("train", "test"),  # generated small functions with hidden tests, see pyfunc.py
    "countdown": ("train", "test"),  # generated: reach a target from given numbers, see countdown.py
    "countdown3": ("train", "test"),  # the same, three numbers each: the default experiment's task
    "countdown_tinyzero": ("test",),  # TinyZero's Countdown test set, stored; graded as countdown
}

# How many arith (and countdown) tasks `load_tasks` generates when no limit is given: enough for a
# training run, and an eval set whose accuracy has a ~2-point standard error.
ARITH_DEFAULT_SIZE = {"train": 5000, "test": 500}
# Generated Countdown families -> how many numbers a problem gives (None: 3 or 4 at even odds).
COUNTDOWN_SIZES = {"countdown": None, "countdown3": 3}
PYFUNC_ALL = 100_000  # more than either pyfunc split holds (about 1,400 and 350): all of it


def load_tasks(
    name: str,
    split: str,
    limit: int | None = None,
    data_dir: Path | str | None = None,
    seed: int = 0,
    custom: Mapping[str, CustomTask] | None = None,
) -> list[Task]:
    """The tasks of family `name`, split `split`: the first `limit` of them, or all.

    `name` is a built-in family (KNOWN_TASKS), a name in `custom` (the config's `custom_tasks`), or a
    .jsonl file read as a custom task with the default fields. Stored files keep their order, so a
    limit always takes the same rows; `seed` only changes which problems the generated families draw
    (and what a loader makes of it). Raises ValueError for an unknown name or split,
    FileNotFoundError (naming the path) for a missing data file.
    """
    if custom and name in custom:
        return load_custom(name, custom[name], split, limit, seed)
    if is_task_file(name):
        return load_custom(name, CustomTask(path=name), split, limit, seed)
    if name not in KNOWN_TASKS:
        raise SettingError(
            f"unknown task {name!r}; known tasks: {', '.join([*KNOWN_TASKS, *(custom or {})])}, a .jsonl "
            'file, or a task of your own under custom_tasks (README, "Your own task")'
        )
    if split not in KNOWN_TASKS[name]:
        raise SettingError(f"task {name!r} has splits {KNOWN_TASKS[name]}, not {split!r}")
    if limit is not None and limit < 0:
        raise SettingError(f"limit must be >= 0 or None, got {limit}")
    if name == "arith":
        return make_arith_tasks(split, ARITH_DEFAULT_SIZE[split] if limit is None else limit, seed=seed)
    if name == "arith_distract":
        return make_distract_tasks(split, ARITH_DEFAULT_SIZE[split] if limit is None else limit, seed=seed)
    if name in COUNTDOWN_SIZES:  # the train split leaves out the problems of countdown_tinyzero's file
        n = ARITH_DEFAULT_SIZE[split] if limit is None else limit
        data = resolve_data_dir(data_dir)
        return make_countdown_tasks(split, n, seed=seed, size=COUNTDOWN_SIZES[name], data_dir=data)
    if name == "humaneval":
        return load_humaneval(limit)
    if name == "pyfunc":  # without a limit: the whole split (about 1,400 train and 350 test problems)
        return make_pyfunc_tasks(split, PYFUNC_ALL if limit is None else limit, seed=seed)
    path = resolve_data_dir(data_dir) / name / f"{split}.jsonl"
    to_task = _ROW_READERS[name]
    tasks = []
    for index, (line_no, row) in enumerate(_read_jsonl(path, f"{name}/{split}")):
        if limit is not None and index >= limit:
            break
        if not isinstance(row, dict):
            raise BadData(
                f"{path}:{line_no}: a row must be a JSON object with the task's fields, not {row!r:.60}"
            )
        try:
            tasks.append(to_task(row, f"{name}/{split}/{index}", name))
        except BadData as err:
            raise BadData(f"{path}:{line_no}: {err}") from None
    if not tasks and limit != 0:
        raise BadData(f"{path} holds no rows: {name}/{split} has nothing to evaluate or train on")
    return tasks


def resolve_data_dir(data_dir: Path | str | None = None) -> Path:
    """The data folder: `data_dir` if given, else $META_AGENT_DATA if set, else the repo's data/."""
    if data_dir is not None:
        return Path(data_dir)
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV])
    return REPO_DATA_DIR


def _read_jsonl(path: Path, what: str):
    if not path.is_file():
        raise MissingFile(
            f"{what}: data file {path} not found. Put {path.parent.name}/{path.name} there "
            f"(sources in data/README.md of the repository), or point {DATA_ENV} or data_dir "
            f"at a folder that holds it."
        )
    yield from json_lines(path)


def _field(row: dict[str, Any], key: str, task_id: str) -> Any:
    if key not in row:
        raise BadData(f"{task_id}: row has no {key!r} field (fields: {sorted(row)})")
    if row[key] is None or (isinstance(row[key], str) and not row[key].strip()):
        raise BadData(f"{task_id}: field {key!r} is empty")
    return row[key]


def _text(row: dict[str, Any], key: str, task_id: str) -> str:
    value = _field(row, key, task_id)
    if not isinstance(value, str):
        raise BadData(f"{task_id}: field {key!r} must be text, not {type(value).__name__} {value!r:.40}")
    return value


def _gsm8k(row: dict[str, Any], task_id: str, source: str) -> Task:
    solution = _text(row, "answer", task_id)
    answer = extract_gsm8k_answer(solution)
    if answer is None:
        raise BadData(f"{task_id}: answer has no '#### <number>' line: {solution[-80:]!r}")
    return Task(task_id, _text(row, "question", task_id), answer, source, {"solution": solution})


def _math500(row: dict[str, Any], task_id: str, source: str) -> Task:
    meta = {
        "solution": _field(row, "solution", task_id),
        "subject": row.get("subject", ""),
        "level": row.get("level", 0),
        "unique_id": row.get("unique_id", ""),
    }
    answer = normalize_gold(_field(row, "answer", task_id))
    return Task(task_id, _text(row, "problem", task_id), answer, source, meta)


def _competition(row: dict[str, Any], task_id: str, source: str) -> Task:
    # AIME and AMC rows (Qwen2.5-Math eval format): `problem` and `question` hold the same text.
    meta = {"url": row.get("url", ""), "original_id": row.get("id", "")}
    if "solution" in row:
        meta["solution"] = row["solution"]
    answer = normalize_gold(_field(row, "answer", task_id))
    return Task(task_id, _text(row, "problem", task_id), answer, source, meta)


def _countdown(row: dict[str, Any], task_id: str, source: str) -> Task:
    # TinyZero's rows: `target` and `nums` (the numbers, 3 or 4, in the order the question shows them).
    target, numbers = _field(row, "target", task_id), _field(row, "nums", task_id)
    if not _whole(target) or not isinstance(numbers, list) or not numbers or not all(map(_whole, numbers)):
        raise BadData(
            f"{task_id}: 'target' must be a whole number and 'nums' a list of them, not {target!r:.20} "
            f"and {numbers!r:.40}"
        )
    return countdown_task(task_id, numbers, target, source)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_ROW_READERS: dict[str, Callable[[dict[str, Any], str, str], Task]] = {
    "gsm8k": _gsm8k,
    "math500": _math500,
    "aime24": _competition,
    "amc23": _competition,
    "countdown_tinyzero": _countdown,
}


def next_tasks(pool: Sequence[T], pos: int, n: int, seed: int) -> list[T]:
    """Items pos..pos+n of an endless stream over `pool`: the pool reshuffled (seeded) every epoch, so a
    run that stops at position pos continues exactly where it left off."""
    out = []
    for i in range(pos, pos + n):
        epoch, j = divmod(i, len(pool))
        order = list(range(len(pool)))
        random.Random(seed * 100_003 + epoch).shuffle(order)
        out.append(pool[order[j]])
    return out
