"""The distractor family: arith problems plus quantities the answer does not use, splits disjoint."""

from __future__ import annotations

import re

import pytest

from meta_agent.tasks import grade, load_tasks
from meta_agent.tasks.arith_distract import DISTRACTORS, make_distract_tasks


def numbers_in(text: str) -> list[int]:
    return [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", text)]


def test_each_problem_is_an_arith_problem_with_distractors_the_answer_ignores():
    tasks = make_distract_tasks("train", 60, seed=3, distractors=2)
    assert len({t.id for t in tasks}) == 60
    for t in tasks:
        distractors = t.meta["distractors"]
        assert len(distractors) == 2
        operands = [int(x) for x in re.findall(r"\d+", t.meta["expression"])]
        assert not set(distractors) & set(operands)
        # the question states every operand and every distractor, and nothing else
        assert sorted(numbers_in(t.question)) == sorted(operands + distractors)
        assert eval(t.meta["expression"]) == int(t.answer)  # noqa: S307 - our own generated expression
        assert grade(t.answer, t.answer) and not grade(str(int(t.answer) + distractors[0]), t.answer)
        assert t.question.endswith("?") and t.question.count("?") == 1
        theme = t.meta["template"].split(".")[1]
        stated = [
            max(s.split("{x}"), key=len).strip(" .") for s in DISTRACTORS[theme]
        ]  # the words around the number
        assert sum(any(s in sentence for s in stated) for sentence in t.question.split(". ")) == 2


def test_splits_are_disjoint_and_generation_is_deterministic():
    train = make_distract_tasks("train", 400, seed=0)
    test = make_distract_tasks("test", 100, seed=0)
    assert not {t.question for t in train} & {t.question for t in test}
    assert not {t.id for t in train} & {t.id for t in test}
    assert make_distract_tasks("test", 100, seed=0) == test
    assert make_distract_tasks("test", 10, seed=0) == test[:10]  # a smaller n is a prefix
    assert make_distract_tasks("test", 10, seed=1) != test[:10]


def test_load_tasks_knows_the_family_and_bad_arguments_name_themselves():
    tasks = load_tasks("arith_distract", "test", limit=5, seed=0)
    assert [t.source for t in tasks] == ["arith_distract"] * 5
    assert all(t.id.startswith("arith_distract/test/") for t in tasks)
    with pytest.raises(ValueError, match="distractors must be 1..2"):
        make_distract_tasks("test", 1, distractors=3)
    with pytest.raises(ValueError, match="splits"):
        make_distract_tasks("validation", 1)
