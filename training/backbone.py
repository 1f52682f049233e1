"""One base model in memory with one PEFT LoRA adapter per role.

    backbone = Backbone.load(ModelConfig(), {"meta_thinker": AdapterConfig(), "executor": AdapterConfig()})
    backbone.activate("executor")            # plain forward passes now run the executor's adapter
    backbone.save_adapters("runs/x/adapters")  # PEFT's format, one folder per role

Where the weights come from (the packaged default or a local folder) is `training.model_files`; with
`model.fsdp` the frozen base weights are sharded over the processes (`training.sharding`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers.pytorch_utils import Conv1D

from training.attention import use_gqa_attention
from training.distributed import Ranks
from training.model_files import (
    ModelConfig,
    ModelMismatch,
    load_tokenizer,
    pad_token_id,
    resolve_model_dir,
    torch_dtype,
)
from training.sharding import Lockstep, Sharding, shard_model

ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_ADAPTER = "__base__"  # PEFT's name for "no adapter" in a mixed-adapter batch
UNSHARDED = Lockstep(Ranks(), empty_pass=lambda: None)  # one process: announcing and draining do nothing


@dataclass
class AdapterConfig:
    """One role's LoRA adapter (`roles.<role>.adapter`)."""

    r: int = 16  # LoRA rank
    alpha: int = 32  # scaling = alpha / r
    dropout: float = 0.0  # 0 keeps rollout and training forward passes identical
    # the layers that get LoRA matrices, by module name (q_proj, c_attn...); null: every linear layer but
    # the LM head, so any causal LM works (a Llama-family model's q/k/v/o_proj, gate/up/down_proj)
    target_modules: tuple[str, ...] | None = None
    # LoRA on the last N decoder layers only (None: all). Backward passes stop below them, so a
    # training step costs about (1 + N / layers) forward passes instead of 2.
    top_layers: int | None = None

    def __post_init__(self) -> None:
        if self.target_modules is not None:
            self.target_modules = tuple(self.target_modules)  # a list when it comes from the config
            if not self.target_modules:
                raise ValueError("adapter target_modules=[] targets nothing: name modules, or null for all")
        if self.r < 1:
            raise ValueError(f"adapter r={self.r} must be >= 1")

    def lora_config(self, model: torch.nn.Module) -> LoraConfig:
        """PEFT's config of this adapter on `model`, the bare transformers model (no adapters yet)."""
        num_layers = getattr(model.config, "num_hidden_layers", None)
        targets = self.target_modules or linear_layer_names(model)
        names = [name for name, _ in model.named_modules()]
        missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
        if missing:  # PEFT would say "no matching module" without naming the ones there are
            linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if _is_linear(m)})
            raise ModelMismatch(
                f"adapter target_modules names {missing}, which {type(model).__name__} does not have; its "
                f"linear layers are named {linear}: list some of those, or target_modules=null for all but "
                "the LM head"
            )
        layers = None
        if self.top_layers is not None:
            if num_layers is None or not 1 <= self.top_layers <= num_layers:
                raise ModelMismatch(
                    f"adapter top_layers={self.top_layers} must be between 1 and the model's {num_layers} layers"
                )
            layers = list(range(num_layers - self.top_layers, num_layers))
        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(targets),
            layers_to_transform=layers,
            # Conv1D (GPT-2) stores its weight transposed; PEFT turns this off again for nn.Linear layers
            fan_in_fan_out=any(isinstance(m, Conv1D) for m in model.modules()),
            task_type="CAUSAL_LM",
        )


def linear_layer_names(model: torch.nn.Module) -> tuple[str, ...]:
    """The names (last dotted part) of `model`'s linear layers but its LM head, in model order: PEFT's
    all-linear as names, so a saved adapter lists a few names vLLM can match, not every layer's path.
    A Llama-family model's are q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names: dict[str, None] = {}
    head_name = None
    for key, module in model.named_modules():
        if not _is_linear(module):
            continue
        if module is head:
            head_name = key.rsplit(".", 1)[-1]
        else:
            names[key.rsplit(".", 1)[-1]] = None
    if head_name in names:  # a name that would also match the LM head
        raise ModelMismatch(
            f"{type(model).__name__} has linear layers named {head_name!r} like its LM head: set "
            "roles.<role>.adapter.target_modules to the names LoRA should adapt"
        )
    if not names:
        raise ModelMismatch(
            f"{type(model).__name__} has no linear layer besides its LM head for LoRA to adapt"
        )
    return tuple(names)


def _is_linear(module: torch.nn.Module) -> bool:
    return isinstance(module, (torch.nn.Linear, Conv1D))  # GPT-2's projections are Conv1D


def first_mismatch(err: BaseException) -> str:
    """The first line that says what went wrong in loading weights: torch lists every mismatched tensor on
    a line of its own, hundreds of them for adapters of another shape."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    first = next((line for line in lines if line.startswith("size mismatch")), lines[0] if lines else "")
    return first + (" ..." if len(lines) > 2 else "")


def contiguous_head_input(model: torch.nn.Module) -> None:
    """Hand the LM head a contiguous input. transformers slices the last position for `logits_to_keep`
    ([B, 1, H], not contiguous), and torch's linear then multiplies it by B expanded copies of the
    head's weight (9 rows: a 510 MB copy, 1.6 s of a CPU prefill)."""
    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(lambda _module, args: (args[0].contiguous(), *args[1:]))


class Backbone:
    """The base model loaded once, wrapped in a PeftModel that holds one LoRA adapter per role.

    Only adapter parameters require grad. The KL reference is the same model inside `disabled_adapters()`.
    `sharding` is set when the base weights are FSDP shards (model.fsdp): every forward pass of the model is
    then a collective that the ranks run in lockstep (`lockstep`).
    """

    def __init__(
        self, model: PeftModel, tokenizer, adapters: tuple[str, ...], sharding: Sharding | None = None
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.adapters = adapters
        self.sharding = sharding
        self.device = sharding.device if sharding is not None else next(model.parameters()).device
        self.pad_id = pad_token_id(tokenizer)

    @property
    def sharded(self) -> bool:
        return self.sharding is not None

    @property
    def lockstep(self) -> Lockstep:
        """Announces and drains forward passes across the ranks of a sharded model; a no-op otherwise."""
        return self.sharding.lockstep if self.sharding is not None else UNSHARDED

    @classmethod
    def load(
        cls,
        cfg: ModelConfig,
        adapters: Mapping[str, AdapterConfig],
        ranks: Ranks | None = None,
        *,
        seed: int = 0,
    ) -> Backbone:
        """Load the backbone named by `cfg` and attach a fresh adapter per role (seeded by `seed`, so two
        runs start from the same adapters).

        With `cfg.fsdp` the base weights are sharded over `ranks` (default: the processes `accelerate
        launch` or torchrun started, else this one alone) and never sit whole on the device."""
        folder = resolve_model_dir(cfg)
        tokenizer = load_tokenizer(cfg if cfg.path is not None else ModelConfig(path=str(folder)))
        base = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch_dtype(cfg.dtype, cfg.device), local_files_only=True
        )
        if not cfg.fsdp:
            base.to(cfg.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            backbone = cls.from_model(base, tokenizer, adapters)
        if cfg.fsdp:
            backbone = backbone.shard(ranks or Ranks.start(cfg.device), offload=cfg.fsdp_offload)
        return backbone

    def shard(self, ranks: Ranks, *, offload: bool = False) -> Backbone:
        """This backbone with its base weights sharded over `ranks` (training.sharding), before any
        optimizer holds its parameters; the adapters stay whole on every rank."""
        params = [p for role in self.adapters for p in self.trainable_parameters(role)]
        sharding = shard_model(self.model, params, ranks, pad_id=self.pad_id, offload=offload)
        return Backbone(self.model, self.tokenizer, self.adapters, sharding)

    def close(self) -> None:
        """Take down the one-process group sharding started (several processes: Ranks.close does)."""
        if (
            self.sharding is not None
            and self.sharding.owns_process_group
            and torch.distributed.is_initialized()
        ):
            torch.distributed.destroy_process_group()

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
        contiguous_head_input(model)
        configs = {name: adapters[name].lora_config(model) for name in names}  # read off the bare model
        peft_model = get_peft_model(model, configs[names[0]], adapter_name=names[0])
        for name in names[1:]:
            peft_model.add_adapter(name, configs[name])
        backbone = cls(peft_model, tokenizer, names)
        backbone.activate(names[0])
        return backbone

    def named_trainable_parameters(self, role: str) -> Iterator[tuple[str, torch.nn.Parameter]]:
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
        return [param for _, param in self.named_trainable_parameters(role)]

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

    def save_adapters(self, folder: str | Path) -> None:
        """Write each role's adapter in PEFT's format to `folder/<role>/` (loads with PeftModel.from_pretrained)."""
        folder = Path(folder)
        for role in self.adapters:
            role_dir = folder / role
            role_dir.mkdir(parents=True, exist_ok=True)
            config = copy.copy(self.model.peft_config[role])
            config.base_model_name_or_path = getattr(
                self.model.base_model.model.config, "_name_or_path", None
            )
            # PEFT holds the names as a set, in another order in every process: one adapter, one file
            config.target_modules = sorted(config.target_modules)
            config.save_pretrained(role_dir)
            state = get_peft_model_state_dict(self.model, adapter_name=role)
            save_file(
                {k: v.detach().contiguous().cpu() for k, v in state.items()}, role_dir / ADAPTER_WEIGHTS
            )

    def load_adapters(self, folder: str | Path, slots: Mapping[str, str] | None = None) -> None:
        """Load adapter weights written by `save_adapters` (a missing role folder is an error).

        `slots` maps an adapter of this backbone to the saved role whose weights it takes (e.g.
        {"meta_thinker-a": "meta_thinker"}: another run's meta-thinker beside this one); default: every
        adapter from the folder of its own name. The base model is never reloaded."""
        folder = Path(folder)
        for slot, role in (slots or {name: name for name in self.adapters}).items():
            if slot not in self.adapters:
                raise KeyError(f"unknown adapter {slot!r}; this backbone has {self.adapters}")
            weights = folder / role / ADAPTER_WEIGHTS
            if not weights.is_file():
                raise FileNotFoundError(
                    f"{weights} does not exist: no saved adapter for role {role!r} in {folder}"
                )
            state = load_file(weights, device=str(self.device))
            result = set_peft_model_state_dict(self.model, state, adapter_name=slot)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise ValueError(
                    f"{weights} does not match adapter {slot!r}: unexpected keys {unexpected[:3]}"
                )
