"""bench/memory_peak.py: the synthetic GRPO batch, RSS readings, and the script on the real backbone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.memory_peak import ARMS, grpo_batch, ratios, reset_peak, rss_mib
from tests.bench_run import run_bench
from training.types import Turn


class FakeEpisode:
    def __init__(self, task: str):
        self.task = task

    def training_turns(self, episode: int) -> list[Turn]:
        return [Turn(role, self.task, (1, 2), (3,), (1,), (0.0,), 1.0, episode) for role in ("m", "e")]


def test_batch_repeats_each_episode_as_a_group_with_varying_rewards():
    turns = grpo_batch([FakeEpisode("a"), FakeEpisode("b")], group=4)
    assert len(turns) == 2 * 4 * 2
    assert len({t.episode for t in turns}) == 8
    for task in ("a", "b"):
        for role in ("m", "e"):
            rewards = [t.reward for t in turns if t.group == task and t.role == role]
            assert rewards == [1.0, 0.0, 1.0, 0.0]


def test_ratios_divide_the_product_by_each_alternative():
    arms = {"two_roles": {"p": 110.0}, "one_role": {"p": 100.0}, "two_copies": {"p": 210.0}}
    # the single-agent experiment's own (shorter) turns are reported beside, when measured
    with_experiment = {**arms, "one_role_experiment": {"p": 88.0}}
    assert ratios(with_experiment, "p")["two_roles_vs_single_agent_experiment"] == 1.25
    assert ratios(arms, "p") == {"two_roles_vs_one": 1.1, "two_roles_vs_two_copies": 0.524}
    assert ratios(arms, "p", floor=10.0) == {"two_roles_vs_one": 1.111, "two_roles_vs_two_copies": 0.5}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_rss_is_read_and_the_peak_can_be_reset():
    assert rss_mib() > 0
    assert reset_peak() in (True, False)


@pytest.mark.slow
def test_script_on_the_real_backbone(tmp_path):
    out = tmp_path / "memory.json"
    run = run_bench(
        "memory_peak",
        "--tasks",
        "1",
        "--group",
        "2",
        "--steps",
        "1",
        "--repeats",
        "1",
        "--out",
        str(out),
        timeout=900,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert set(result["peaks_mib"]) == set(ARMS)
    assert result["arms"]["two_copies"]["backbones"] == 2
    assert result["peaks_mib"]["two_copies"]["step"] > result["peaks_mib"]["two_roles"]["step"]
