"""Assembles the hierarchy from a resolved config: backbone, backend, roles, tools, memory."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import DictConfig

from memory.embedders import SentenceEmbedder
from memory.store import FaissMemory
from memory.types import Memory
from meta_agent.chat import ChatFormat
from meta_agent.config import limits, memory_settings, plain, role_specs
from meta_agent.evaluate import TaskScore, evaluate
from meta_agent.runner import EpisodeFactory
from meta_agent.tasks import Task, grade
from meta_agent.trace import TraceWriter
from roles import RoleSpec
from tools import default_registry
from tools.registry import ToolRegistry
from training.backbone import ADAPTER_WEIGHTS, AdapterConfig, Backbone, ModelConfig
from training.checkpoint import ADAPTERS_DIR, CHECKPOINTS_DIR, latest_checkpoint
from training.distributed import Ranks
from training.generation import VLLMSettings, make_backend
from training.generation.vllm import check_top_p
from training.types import GenerationBackend, SamplingParams

ADAPTERS_HELP = (
    "pass a folder of <role>/ adapters (runs/X/checkpoints/sft-best), a checkpoint "
    "(runs/X/checkpoints/step-000020) or a run folder (runs/X)"
)


@dataclass
class System:
    backbone: Backbone
    backend: GenerationBackend
    chat: ChatFormat
    roles: list[RoleSpec]
    registry: ToolRegistry
    memory: Memory | None
    factory: EpisodeFactory

    @property
    def memory_private(self) -> bool:
        """The memory lives in this process only (memory.path=null): under several processes each rank
        keeps its own copy and writes every lesson itself."""
        return self.memory is not None and getattr(self.memory, "path", None) is None

    def sampling(self, temperature: float | None = None) -> dict[str, SamplingParams]:
        """Each role's sampling settings; `temperature` overrides them all (0 for greedy eval)."""
        return {
            r.name: SamplingParams(
                temperature=r.sampling.temperature if temperature is None else temperature,
                top_p=r.sampling.top_p,
                max_new_tokens=r.sampling.max_new_tokens,
            )
            for r in self.roles
        }

    def evaluate(
        self,
        tasks: Mapping[str, Sequence[Task]],
        cfg: DictConfig,
        *,
        traces: TraceWriter | None = None,
        on_batch: Callable[[int], None] | None = None,
        write_lessons: bool = True,
        final_reflection: bool = True,
    ) -> dict[str, TaskScore]:
        """Held-out evaluation with the `eval` settings of `cfg` (greedy by default)."""
        return evaluate(
            self.factory,
            self.backend,
            self.sampling(temperature=cfg.eval.temperature),
            tasks,
            episodes_per_batch=cfg.eval.episodes_per_batch,
            seed=cfg.seed,
            traces=traces,
            on_batch=on_batch,
            write_lessons=write_lessons,
            final_reflection=final_reflection,
        )

    def close(self) -> None:
        """Release what the run holds: the memory's files, and the backend's engine (vllm: its processes
        and temporary folders; hf holds nothing to release)."""
        close_backend = getattr(self.backend, "close", None)
        if close_backend is not None:
            close_backend()
        if self.memory is not None:
            self.memory.close()
        if self.backbone is not None:  # a sharded backbone's one-process group (training.sharding)
            self.backbone.close()


def model_config(cfg: DictConfig) -> ModelConfig:
    return ModelConfig(
        path=cfg.model.path,
        cache_dir=cfg.model.cache_dir,
        dtype=cfg.model.dtype,
        device=cfg.model.device,
        seed=cfg.seed,
        fsdp=cfg.model.fsdp,
        fsdp_offload=cfg.model.fsdp_offload,
    )


def adapter_configs(roles: list[RoleSpec]) -> dict[str, AdapterConfig]:
    return {
        r.name: AdapterConfig(
            r=r.adapter.r,
            alpha=r.adapter.alpha,
            dropout=r.adapter.dropout,
            target_modules=r.adapter.target_modules,
            top_layers=r.adapter.top_layers,
        )
        for r in roles
    }


def backend_settings(cfg: DictConfig) -> dict:
    """The constructor arguments of the backend `cfg.backend.name` names."""
    if cfg.backend.name == "hf":
        return {"batch_size": cfg.backend.batch_size, "prefix_cache_mb": cfg.backend.prefix_cache_mb}
    # vLLM loads the backbone from the folder Backbone.load read it from (the cached safetensors copy).
    return {"settings": VLLMSettings(**plain(cfg.backend.vllm))}


def build_memory(cfg: DictConfig, *, read_only: bool = False) -> Memory | None:
    """The memory `cfg.memory` describes; `read_only` for a process that shares its folder with the
    one that writes it (the ranks after the first of a multi-process run)."""
    if not cfg.memory.enabled:
        return None
    path = Path(cfg.memory.path) if cfg.memory.path else None
    return FaissMemory(
        path,
        SentenceEmbedder(),
        index=cfg.memory.index,
        ef_search=cfg.memory.hnsw_ef_search,
        nprobe=cfg.memory.ivf_nprobe,
        read_only=read_only and path is not None,
    )


def build_registry(cfg: DictConfig, memory: Memory | None) -> ToolRegistry:
    """Every tool, memory search only with a memory; each role sees the ones its config names."""
    return default_registry(memory, sandbox=plain(cfg.tools.sandbox), memory_k=cfg.tools.memory_search_k)


def adapters_folder(value: str, roles: Sequence[str]) -> Path:
    """The folder of `<role>/` adapters that `adapters=value` names, holding one for every role.

    `value` is such a folder (runs/X/checkpoints/sft-best), a checkpoint (its adapters/), a
    checkpoints folder or a run folder (the newest complete checkpoint's adapters/).
    """
    path = Path(value).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"adapters={value} does not exist: {ADAPTERS_HELP}")
    folder = _find_adapters(path)
    if folder is None:
        raise FileNotFoundError(f"adapters={value} holds no saved role adapters: {ADAPTERS_HELP}")
    found = sorted(p.name for p in folder.iterdir() if (p / ADAPTER_WEIGHTS).is_file())
    missing = [role for role in roles if role not in found]
    if missing:
        raise FileNotFoundError(
            f"adapters={value}: {folder} has no adapter for role(s) {', '.join(missing)} (it has "
            f"{', '.join(found) or 'none'}): use adapters saved by a run with the same roles, or pick those roles=..."
        )
    return folder


def _find_adapters(path: Path) -> Path | None:
    if any((p / ADAPTER_WEIGHTS).is_file() for p in path.iterdir()):
        return path
    if (path / ADAPTERS_DIR).is_dir():
        return path / ADAPTERS_DIR
    for root in (path, path / CHECKPOINTS_DIR):
        checkpoint = latest_checkpoint(root)
        if checkpoint is not None:
            return checkpoint / ADAPTERS_DIR
    return None


def load_saved_adapters(backbone: Backbone, folder: Path) -> None:
    """Copy the saved adapters of `folder` into `backbone`; a shape mismatch names its fix."""
    try:
        backbone.load_adapters(folder)
    except RuntimeError as err:  # size mismatch: saved with another rank or other target modules
        raise ValueError(
            f"the adapters in {folder} do not fit the configured ones ({err}): use the roles.<role>.adapter "
            "settings (r, target_modules) of the run that saved them"
        ) from err


def build_system(
    cfg: DictConfig,
    backbone: Backbone | None = None,
    *,
    memory_read_only: bool = False,
    ranks: Ranks | None = None,
) -> System:
    """Everything a run needs, the role adapters of `adapters=` loaded if set.

    Pass `backbone` to reuse one already loaded (tests, notebooks). `memory_read_only`: another process
    writes the memory folder (see build_memory). `ranks`: the processes a sharded backbone
    (model.fsdp) is split over; default this one.
    """
    roles = role_specs(cfg)
    if cfg.backend.name in ("vllm", "vllm-cpu"):  # before anything loads, as below
        for role in roles:
            check_top_p(role.sampling.temperature, role.sampling.top_p, f"roles.{role.name}.sampling.top_p")
    # Checked before anything loads, so a wrong adapters= fails in a second.
    saved = adapters_folder(cfg.adapters, [r.name for r in roles]) if cfg.adapters else None
    memory = build_memory(cfg, read_only=memory_read_only)
    if memory is None:
        # memory.enabled=false switches memory off everywhere, the memory_search tool included.
        roles = [replace(r, tools=tuple(t for t in r.tools if t != "memory_search")) for r in roles]
    registry = build_registry(cfg, memory)
    for role in roles:
        missing = [t for t in role.tools if t not in registry.names()]
        if missing:
            known = ", ".join(registry.names())
            raise ValueError(f"roles.{role.name}.tools names {missing}, not registered; known: {known}")
    if backbone is None:
        backbone = Backbone.load(model_config(cfg), adapter_configs(roles), ranks)
    if saved is not None:
        load_saved_adapters(backbone, saved)
    backend = make_backend(cfg.backend.name, backbone, **backend_settings(cfg))
    chat = ChatFormat(backbone.tokenizer)
    factory = EpisodeFactory(roles, chat, registry, grade, limits(cfg), memory, memory_settings(cfg))
    return System(backbone, backend, chat, roles, registry, memory, factory)
