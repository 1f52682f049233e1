"""Generation backends behind one protocol (`training.types.GenerationBackend`).

    backend = make_backend("hf", backbone, batch_size=16)
    backend = make_backend("vllm", backbone, settings=VLLMSettings())   # needs pip install 'meta-agent[vllm]'

Every backend passes the shared suite in `training.generation.conformance`.
"""

from __future__ import annotations

from training.backbone import Backbone
from training.generation.hf import HFBackend
from training.generation.vllm import VLLMBackend, VLLMSettings
from training.types import GenerationBackend, GenerationRequest, GenerationResult, SamplingParams

BACKENDS = ("hf", "vllm")


def make_backend(name: str, backbone: Backbone, **settings) -> GenerationBackend:
    """The backend called `name` ("hf" or "vllm") on `backbone`; `settings` go to its constructor."""
    if name == "hf":
        return HFBackend(backbone, **settings)
    if name in ("vllm", "vllm-cpu"):
        # Raises an ImportError naming the extra when vLLM is not installed.
        return VLLMBackend(backbone, **settings)
    raise ValueError(f"unknown generation backend {name!r}: choose one of {BACKENDS}")


__all__ = [
    "BACKENDS",
    "GenerationBackend",
    "GenerationRequest",
    "GenerationResult",
    "HFBackend",
    "SamplingParams",
    "VLLMBackend",
    "VLLMSettings",
    "make_backend",
]
