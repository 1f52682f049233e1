"""VLLMBackend's start-up settings, without starting an engine (no vllm needed)."""

from __future__ import annotations

import pytest

from meta_agent.config import load_config
from training.generation.vllm import VLLMSettings, cpu_thread_binding, engine_environment


def test_all_cores_bind_one_engine_worker_or_split_into_one_group_per_tensor_parallel_worker():
    assert cpu_thread_binding("all", 1, cores=[0, 1, 2, 3]) == "0,1,2,3"
    assert cpu_thread_binding("all", 2, cores=[3, 0, 1, 2]) == "0,1|2,3"
    assert cpu_thread_binding("all", 2, cores=[0, 1, 2]) == "0|1,2"
    assert cpu_thread_binding("0-1", 2) == "0-1"  # a list the user wrote goes to vLLM as it is


def test_more_tensor_parallel_workers_than_cores_is_a_clear_error():
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 needs a CPU core per worker.*may use 2"):
        cpu_thread_binding("all", 3, cores=[0, 1])
    with pytest.raises(ValueError, match=r"tensor_parallel_size=0 must be >= 1"):
        VLLMSettings(tensor_parallel_size=0)


def test_engine_environment_binds_each_worker_to_its_cores():
    env = engine_environment(VLLMSettings(cpu_threads="0,1|2,3", tensor_parallel_size=2))
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0,1|2,3"
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    # On a GPU the engine's workers take one card each: no core groups, so no error for few cores.
    assert engine_environment(VLLMSettings(tensor_parallel_size=64), cpu=False) == {}


def test_tensor_parallel_size_is_a_config_key():
    cfg = load_config(["backend.name=vllm", "backend.vllm.tensor_parallel_size=2"])
    assert cfg.backend.vllm.tensor_parallel_size == 2
