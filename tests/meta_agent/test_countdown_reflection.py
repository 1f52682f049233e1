"""The Countdown experiment's reflection: the calculator's check in the reflection's prompt, demonstrations
with both verdicts played through the real episode, and the last reflection neither played nor trained."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from meta_agent.config import load_config
from meta_agent.demos.build import make_demos
from meta_agent.demos.countdown import MISTAKES, countdown_actions, first_operation, mistaken_tree
from meta_agent.episode.prompts import ATTEMPT_HEADER
from meta_agent.episode.protocol import Limits
from meta_agent.errors import SettingError
from meta_agent.learning.credit import training_turns
from meta_agent.tasks import load_tasks
from meta_agent.tasks.countdown import check_attempt, describe_attempt, format_expr, value_of_exact
from roles import ACCEPT, REVISE

NUMBERS, TARGET = [44, 19, 35], 98


def test_the_check_says_hit_or_miss_and_which_numbers_are_wrong():
    assert describe_attempt("44+19+35", NUMBERS, TARGET) == (
        "44+19+35 makes 98, the target 98: a hit. It uses each given number once."
    )
    assert describe_attempt("44+44+35", NUMBERS, TARGET) == (
        "44+44+35 makes 123, the target 98: a miss. 44 is used more often than given; 19 is not used."
    )
    assert describe_attempt("44/19+35", NUMBERS, TARGET) == (
        "44/19+35 makes 709/19, the target 98: a miss. It uses each given number once."
    )
    assert describe_attempt("44/(19-19)", NUMBERS, TARGET).startswith("44/(19-19) has no value: ")
    assert describe_attempt(None, NUMBERS, TARGET) == "There is no answer to check."


@pytest.fixture(scope="module")
def countdown_config():
    return load_config(["experiment=countdown_hierarchy"])


@pytest.fixture(scope="module")
def countdown_demos(countdown_config, chat, registry):
    cfg = countdown_config
    return make_demos("countdown", 40, cfg.role_list, chat, registry, limits=cfg.protocol)


def test_demos_show_both_verdicts_grounded_in_the_check(countdown_demos, chat):
    """Every demonstration ends right. Those that accept read a hit; those that revise read a miss, say
    what the check shows and fix the plan's start, and their second round (never reflected on: no round
    is left) is right. The missed round's plan and work are played, never learned."""
    verdicts = Counter(ep.rounds[0].verdict for ep in countdown_demos)
    assert verdicts[ACCEPT] >= 8 and verdicts[REVISE] >= 8
    for ep in countdown_demos:
        assert ep.done and ep.correct and not ep.truncated and ep.tool_errors == 0
        reflection = next(t for t in ep.turns if t.kind == "reflect")
        prompt = chat.decode(reflection.prompt_ids)
        assert ATTEMPT_HEADER in prompt
        if ep.rounds[0].verdict == ACCEPT:
            assert "a hit" in prompt and [t.kind for t in ep.turns] == ["plan", "execute", "reflect"]
            continue
        assert "a miss" in prompt and not ep.rounds[0].correct and ep.rounds[1].correct
        assert [(t.kind, t.round) for t in ep.turns] == [
            ("plan", 0),
            ("execute", 0),
            ("reflect", 0),
            ("execute", 1),
        ]
        missed = ep.rounds[0].answer
        value = check_attempt(missed, *map(list, [ep.task.meta["numbers"]]), ep.task.meta["target"]).value
        assert f"{missed} makes {value}, not {ep.task.meta['target']}." in reflection.text
        assert (
            'step="1">Start with' in reflection.text and "Start with" not in reflection.text.split("<fix")[0]
        )
        fix_start = reflection.text.split("Start with ")[1].split(".")[0]
        assert not ep.rounds[0].plan.startswith(
            f"1. Start with {fix_start}."
        )  # the second try starts elsewhere
        assert not any(ep.turns[0].mask) and not any(ep.turns[1].mask)  # the miss is not taught


def test_every_mistake_kind_misses_and_the_start_is_a_leaf_operation():
    rng = random.Random(0)
    for mistake in MISTAKES:
        for _ in range(20):
            tree = mistaken_tree(NUMBERS, TARGET, mistake, rng)
            attempt = check_attempt(format_expr(tree), NUMBERS, TARGET)
            assert not attempt.solves and value_of_exact(tree) != TARGET
            assert {"value": not attempt.missing, "repeat": bool(attempt.extra_or_repeated)}.get(
                mistake, True
            )
            assert mistake != "missing" or len(attempt.missing) == 1
        avoid = first_operation(tree)
        assert all(
            first_operation(mistaken_tree(NUMBERS, TARGET, mistake, rng, avoid)) != avoid for _ in range(20)
        )
    assert first_operation(("+", 5, ("*", 3, 4))) == ("*", 3, 4)
    assert first_operation(("-", ("+", 1, 2), 7)) == ("+", 1, 2)


def test_a_demonstration_revises_only_when_asked_and_its_plan_names_a_start(chat):
    task = load_tasks("countdown", "train", limit=1)[0]
    accepted = countdown_actions(task, revise=False)
    assert accepted.revision is None and "1. Start with " in accepted.plan
    revised = countdown_actions(task, revise=True, mistake="repeat")
    assert revised.revision is not None and "used twice" in revised.revision.reflection


def test_the_last_reflection_is_not_played_and_never_trained(make_episode, countdown_config):
    """protocol.final_reflection=false ends the episode after the last round's executors; where it is
    played (final_reflection=true) GRPO still leaves it out: it cannot change the outcome."""
    from tests.meta_agent.test_registries import two_episodes

    limits = Limits(max_rounds=2, final_reflection=False)
    task = load_tasks("countdown", "train", limit=1)[0]
    ep = make_episode(limits=limits, task=task)
    assert ep.final_reflection is False
    assert countdown_config.protocol.final_reflection is False and countdown_config.protocol.max_rounds == 2
    episodes = two_episodes(make_episode)  # both play round 2's reflection
    for ep in episodes:
        ep.rewards = {r: 0.0 for r in ep.roles}
    trained = training_turns(episodes)
    learned = training_turns(episodes, last_reflections=True)
    assert len(learned) - len(trained) == 2  # one last reflection per episode
    assert all(ep.turns[-1].kind == "reflect" and ep.turns[-1].round == 1 for ep in episodes)
    assert [len(t.completion_ids) for t in learned if t not in trained] == [
        len(ep.turns[-1].completion_ids) for ep in episodes
    ]


def test_the_attempt_check_refuses_a_task_it_cannot_check(make_episode):
    with pytest.raises(SettingError, match="protocol.attempt_check"):
        make_episode(limits=Limits(attempt_check=True))
