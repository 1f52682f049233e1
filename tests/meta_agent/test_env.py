"""MetaAgentEnv passes PettingZoo's own API and seed tests, and plays a scripted episode end to end."""

from __future__ import annotations

import warnings

import pytest
from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, seed_test

from meta_agent.env.environments import MetaAgentEnv, ParallelExecutorsEnv
from meta_agent.episode.protocol import Limits
from meta_agent.episode.runner import EpisodeFactory
from meta_agent.tasks import grade_task
from tests.meta_agent.conftest import PLAN, REFLECTION, ROLE_CONFIGS, TASK, TASKS, answer, tool_call

# PettingZoo's tests act with random printable text of up to 4,000 characters. A budget this large
# lets such actions walk the whole protocol (plan -> execute -> reflect) instead of ending the
# episode on the first action.
ROOMY = Limits(max_new_tokens=1_000_000)


@pytest.fixture
def make_env(role_sets, chat, registry):
    def make(
        roles: str = "hierarchy", limits: Limits = ROOMY, render_mode: str | None = None
    ) -> MetaAgentEnv:
        factory = EpisodeFactory(role_sets[roles], chat, registry, grade_task, limits)
        return MetaAgentEnv(factory, TASKS, render_mode=render_mode)

    return make


@pytest.mark.parametrize("roles", ROLE_CONFIGS)
def test_pettingzoo_api_test(make_env, roles):
    with warnings.catch_warnings():
        # Text observations and role names: PettingZoo's style advice for array games does not apply.
        warnings.simplefilter("ignore", UserWarning)
        api_test(make_env(roles), num_cycles=8)


@pytest.mark.parametrize("roles", ["hierarchy", "single_agent"])
def test_pettingzoo_seed_test(make_env, roles):
    seed_test(lambda: make_env(roles), num_cycles=8)


def test_scripted_episode_through_agent_iter(make_env):
    env = make_env()
    env.reset(seed=0, options={"task": TASK})
    assert env.agents == ["meta_thinker", "executor"] == env.possible_agents
    script = {
        "meta_thinker": [PLAN, REFLECTION],
        "executor": [tool_call("calculator", expression=TASK.meta["expression"]), answer(TASK.answer)],
    }
    acted, finals = [], {}
    for agent in env.agent_iter(max_iter=20):
        obs, reward, terminated, truncated, info = env.last()
        assert isinstance(obs, str) and env.observation_space(agent).contains(obs)
        if terminated or truncated:
            finals[agent] = (reward, terminated, truncated, info)
            env.step(None)
            continue
        assert TASK.question in obs and obs.startswith("<|im_start|>system")
        assert reward == 0.0
        if acted[-1:] == ["executor"] and agent == "executor":
            assert "<tool_result>\n" + TASK.answer in obs  # the tool result is in its observation
        acted.append(agent)
        env.step(script[agent].pop(0))
    assert acted == ["meta_thinker", "executor", "executor", "meta_thinker"]
    assert env.agents == []
    info = {"task": TASK.id, "answer": TASK.answer, "correct": True}
    assert finals == {"meta_thinker": (1.0, True, False, info), "executor": (1.0, True, False, info)}
    assert env.episode.lesson == "use the calculator"


def test_budget_truncates_every_agent(make_env):
    env = make_env(limits=Limits(max_new_tokens=5))
    env.reset(options={"task": TASK})
    env.step("a plan far longer than five tokens, with no tags at all")
    assert env.episode.done and env.episode.truncated
    assert env.truncations == {"meta_thinker": True, "executor": True}
    assert env.terminations == {"meta_thinker": False, "executor": False}


def test_reset_seed_picks_the_task_reproducibly(make_env):
    env = make_env("single_agent")
    picks = set()
    for seed in range(8):
        env.reset(seed=seed)
        first = env.episode.task
        env.reset(seed=seed)
        assert env.episode.task == first
        picks.add(first.id)
        assert env.agent_selection == "executor" and first.question in env.observe("executor")
    assert len(picks) > 1


def test_non_text_action_is_a_type_error(make_env):
    env = make_env()
    env.reset(seed=0)
    with pytest.raises(TypeError, match="must be a str"):
        env.step(3)


def test_render_ansi_is_the_episode_markdown(make_env):
    env = make_env(render_mode="ansi")
    env.reset(options={"task": TASK})
    env.step(PLAN)
    text = env.render()
    assert text.startswith(f"### {TASK.id}") and "multiply then add" in text
    assert make_env().render() is None
    env.close()
    assert env.render() is None


def test_env_needs_tasks(role_sets, chat, registry):
    factory = EpisodeFactory(role_sets["hierarchy"], chat, registry, grade_task)
    with pytest.raises(ValueError, match="at least one task"):
        MetaAgentEnv(factory, [])


@pytest.fixture
def make_parallel(role_sets, chat, registry):
    def make(roles: str = "hierarchy", executors: int = 3, limits: Limits = ROOMY) -> ParallelExecutorsEnv:
        factory = EpisodeFactory(role_sets[roles], chat, registry, grade_task, limits)
        return ParallelExecutorsEnv(factory, TASKS, executors=executors)

    return make


@pytest.mark.parametrize("roles", ["hierarchy", "single_agent"])
def test_parallel_env_passes_pettingzoo_parallel_api_test(make_parallel, roles):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        parallel_api_test(make_parallel(roles), num_cycles=8)


def test_parallel_env_seed_test(make_parallel):
    parallel_seed_test(lambda: make_parallel("single_agent"), num_cycles=8)


def test_executors_act_at_once_on_one_plan_and_each_is_graded(make_parallel):
    env = make_parallel(executors=3)
    observations, infos = env.reset(options={"task": TASK, "plan": PLAN})
    assert env.agents == ["executor_0", "executor_1", "executor_2"]
    assert all("multiply then add" in obs and TASK.question in obs for obs in observations.values())
    call = tool_call("calculator", expression=TASK.meta["expression"])
    observations, rewards, terminations, _, infos = env.step(
        {"executor_0": answer(TASK.answer), "executor_1": call, "executor_2": answer("12")}
    )
    assert env.agents == ["executor_1"]  # the other two answered: right, and wrong
    assert rewards == {"executor_0": 1.0, "executor_1": 0.0, "executor_2": 0.0}
    assert terminations == {"executor_0": True, "executor_1": False, "executor_2": True}
    assert infos["executor_0"]["correct"] and not infos["executor_2"]["correct"]
    assert "<tool_result>\n" + TASK.answer in observations["executor_1"]  # the calculator ran
    _, rewards, terminations, _, infos = env.step({"executor_1": answer(TASK.answer)})
    assert rewards == {"executor_1": 1.0} and terminations == {"executor_1": True} and env.agents == []
    assert infos["executor_1"] == {"task": TASK.id, "answer": TASK.answer, "correct": True}


def test_parallel_env_refuses_what_it_cannot_do(make_parallel, role_sets, chat, registry):
    env = make_parallel("single_agent")
    with pytest.raises(ValueError, match="a plan needs a meta-thinker"):
        env.reset(options={"plan": PLAN})
    env = make_parallel()
    env.reset(seed=1)
    with pytest.raises(ValueError, match="no action for \\['executor_2'\\]"):
        env.step({"executor_0": "x", "executor_1": "y"})
    with pytest.raises(ValueError, match="at least one executor"):
        ParallelExecutorsEnv(
            EpisodeFactory(role_sets["hierarchy"], chat, registry, grade_task), TASKS, executors=0
        )
