"""The pyfunc code family: seeded problems with hidden tests, disjoint splits, and demonstrations that
write, run and answer with the function through the real sandbox."""

from __future__ import annotations

import pytest

from meta_agent.config import load_config
from meta_agent.demos.build import make_demos
from meta_agent.demos.code import pyfunc_actions
from meta_agent.tasks import grade_task, load_tasks
from meta_agent.tasks.code import read_gold
from meta_agent.tasks.pyfunc import BY_KIND, TEMPLATES, make_pyfunc_tasks, problem_key, reference
from tests.meta_agent.test_demos import assert_within_budgets


def test_splits_are_disjoint_deterministic_and_prefixes():
    train = make_pyfunc_tasks("train", 100_000)
    test = make_pyfunc_tasks("test", 100_000)
    assert not {t.id for t in train} & {t.id for t in test}
    assert not {t.question for t in train} & {t.question for t in test}
    assert len(test) > 300 and len(train) > 3 * len(test)
    same = {(t.meta["template"], tuple(sorted(t.meta["params"].items()))) for t in train}
    assert not same & {
        (t.meta["template"], tuple(sorted(t.meta["params"].items()))) for t in test
    }  # any name
    assert make_pyfunc_tasks("test", 20, seed=1) == make_pyfunc_tasks("test", 40, seed=1)[:20]
    assert make_pyfunc_tasks("test", 20, seed=1) != make_pyfunc_tasks("test", 20, seed=2)
    assert {t.meta["template"] for t in make_pyfunc_tasks("train", 200)} == {t.kind for t in TEMPLATES}


def test_examples_and_hidden_tests_come_from_the_reference_solution():
    for task in load_tasks("pyfunc", "test", limit=60):
        template = BY_KIND[task.meta["template"]]
        solve = reference(template, task.meta["function"], task.meta["params"])
        for x, y in task.meta["examples"]:
            assert solve(x) == y and f"{task.meta['function']}({x!r}) == {y!r}" in task.question
        tests, setup, functions = read_gold(task.answer)
        assert task.grader == "code" and tests.count("assert ") == 6 and functions == [task.meta["function"]]
        assert len({line.split(" == ")[1] for line in tests.splitlines()}) >= 2  # no constant answer passes
        assert grade_task(task.meta["solution"], task), task.id
        assert task.meta["solution"] not in task.question  # the question never shows the code


def test_a_wrong_constant_fails_the_hidden_tests():
    task = next(t for t in load_tasks("pyfunc", "test", limit=200) if t.meta["template"] == "sum_divisible")
    k = task.meta["params"]["k"]
    wrong = task.meta["solution"].replace(f"% {k} ==", f"% {k + 1} ==")
    assert wrong != task.meta["solution"] and not grade_task(wrong, task)
    assert problem_key("clip", {"lo": 1, "hi": 20}) == "clip|hi=20,lo=1"
    assert not grade_task(f"def {task.meta['function']}(xs):\n    return 0", task)


@pytest.fixture(scope="module")
def pyfunc_config():
    return load_config(["experiment=pyfunc_hierarchy"])


@pytest.mark.slow  # 320 demonstrations, each running its function in the sandbox: about 40 s
def test_pyfunc_demos_write_run_answer_and_fit_the_budgets(pyfunc_config, chat, registry):
    """Every demonstration the experiment's SFT makes plays through the real sandbox and grader, right,
    within each role's budget; about a quarter show a wrong constant that the run reveals, a reflection
    that quotes the run against the example and adds a step, and a right second round."""
    cfg = pyfunc_config
    for seed in (0, 13):
        episodes = make_demos("pyfunc", 160, cfg.role_list, chat, registry, seed=seed, limits=cfg.protocol)
        assert_within_budgets(episodes, cfg, chat)
        assert not any(ep.leaked or ep.tool_errors for ep in episodes)
    revised = [ep for ep in episodes if len(ep.rounds) == 2]
    assert 20 <= len(revised) <= 80
    for ep in revised:
        first, reflect = ep.turns[1], ep.turns[2]
        assert not ep.rounds[0].correct and ep.rounds[1].correct and set(first.mask) == {0}
        assert "The run printed" in reflect.text and "but the example says" in reflect.text
        assert reflect.text.endswith("</fix>") and '<fix step="4">Use ' in reflect.text


def test_a_lone_executor_or_one_round_never_revises(role_sets, chat, registry):
    task = load_tasks("pyfunc", "train", limit=1)[0]
    assert pyfunc_actions(task, revise=False).revision is None
    cfg = load_config(["experiment=pyfunc_hierarchy", "protocol.max_rounds=1"])
    once = make_demos("pyfunc", 8, cfg.role_list, chat, registry, limits=cfg.protocol)
    assert all(ep.correct and len(ep.rounds) == 1 for ep in once)
