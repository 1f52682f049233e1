"""Generation backends behind one protocol (`training.types.GenerationBackend`).

    backend = make_backend(backbone, BackendSettings(name="hf", batch_size=16))
    backend = make_backend(backbone, BackendSettings(name="vllm"))   # needs pip install 'meta-agent[vllm]'

Every backend passes the shared suite in `training.generation.conformance`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from training.backbone import Backbone
from training.generation.hf import BATCH_SIZE, PREFIX_CACHE_MB, HFBackend
from training.generation.vllm import VLLMBackend, VLLMSettings
from training.types import GenerationBackend, GenerationRequest, GenerationResult, SamplingParams

BACKENDS = ("hf", "vllm")


@dataclass
class BackendSettings:
    """The `backend:` settings: which generation backend, and its own settings."""

    name: str = "hf"  # hf: transformers, mixed adapters in one batch | vllm: pip install 'meta-agent[vllm]'
    batch_size: int = BATCH_SIZE  # hf: rows per forward pass; lower it if memory is short
    # hf: key/value states of prompts an episode extends (after a tool result, plan -> reflection); 0 = off
    prefix_cache_mb: float = PREFIX_CACHE_MB
    # vllm: one engine, one LoRA slot per role, adapters synced after every update
    vllm: VLLMSettings = field(default_factory=VLLMSettings)

    def __post_init__(self) -> None:
        if self.name not in (*BACKENDS, "vllm-cpu"):
            raise ValueError(
                f"backend.name={self.name!r} is not a generation backend: choose one of {BACKENDS}"
            )
        if self.batch_size < 1:
            raise ValueError(f"backend.batch_size={self.batch_size} must be >= 1")


def make_backend(backbone: Backbone, settings: BackendSettings | None = None) -> GenerationBackend:
    """The backend `settings.name` names ("hf" or "vllm"; "vllm-cpu" is vllm) on `backbone`."""
    settings = settings or BackendSettings()
    if settings.name == "hf":
        return HFBackend(backbone, batch_size=settings.batch_size, prefix_cache_mb=settings.prefix_cache_mb)
    # vLLM loads the backbone from the folder Backbone.load read it from (the cached safetensors copy).
    # Raises an ImportError naming the extra when vLLM is not installed.
    return VLLMBackend(backbone, settings=settings.vllm)


__all__ = [
    "BACKENDS",
    "BackendSettings",
    "GenerationBackend",
    "GenerationRequest",
    "GenerationResult",
    "HFBackend",
    "SamplingParams",
    "VLLMBackend",
    "VLLMSettings",
    "make_backend",
]
