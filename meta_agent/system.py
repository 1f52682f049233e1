"""Assembles the hierarchy from a resolved config: backbone, backend, roles, tools, memory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from safetensors import SafetensorError, safe_open

from memory.embedders import SentenceEmbedder
from memory.settings import open_memory
from memory.types import Memory
from meta_agent.env.rollout import env_tools
from meta_agent.episode.chat import ChatFormat
from meta_agent.episode.runner import EpisodeFactory
from meta_agent.errors import BadData, MissingFile, SettingError
from meta_agent.settings import Config, RoleConfig
from meta_agent.tasks import grade_task
from tools import TOOL_NAMES, PythonSandbox, SandboxUnavailable, default_registry
from tools.registry import ToolRegistry
from training.backbone import ADAPTER_WEIGHTS, Backbone, first_mismatch
from training.checkpoint import ADAPTERS_DIR, CHECKPOINTS_DIR, latest_checkpoint
from training.distributed import Ranks
from training.generation import make_backend
from training.trainer import PolicyTrainer
from training.types import GenerationBackend

ADAPTERS_HELP = (
    "pass a folder of <role>/ adapters (runs/X/checkpoints/sft-best), a checkpoint "
    "(runs/X/checkpoints/step-000020) or a run folder (runs/X)"
)


@dataclass
class System:
    backbone: Backbone
    backend: GenerationBackend
    chat: ChatFormat
    roles: list[RoleConfig]
    registry: ToolRegistry
    memory: Memory | None
    factory: EpisodeFactory

    @property
    def memory_private(self) -> bool:
        """The memory lives in this process only (memory.path=null): under several processes each rank
        keeps its own copy and writes every lesson itself."""
        return self.memory is not None and getattr(self.memory, "path", None) is None

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


def adapters_folder(value: str, roles: Sequence[str], key: str = "adapters") -> Path:
    """The folder of `<role>/` adapters that `key=value` names, holding a readable one for every role.

    `value` is such a folder (runs/X/checkpoints/sft-best), a checkpoint (its adapters/), a
    checkpoints folder or a run folder (the newest complete checkpoint's adapters/).
    """
    path = Path(value).expanduser()
    if not path.is_dir():
        raise MissingFile(f"{key}={value} does not exist: {ADAPTERS_HELP}")
    folder = _find_adapters(path)
    if folder is None:
        raise MissingFile(f"{key}={value} holds no saved role adapters: {ADAPTERS_HELP}")
    found = sorted(p.name for p in folder.iterdir() if (p / ADAPTER_WEIGHTS).is_file())
    missing = [role for role in roles if role not in found]
    if missing:
        raise MissingFile(
            f"{key}={value}: {folder} has no adapter for role(s) {', '.join(missing)} (it has "
            f"{', '.join(found) or 'none'}): use adapters saved by a run with the same roles, or pick those roles=..."
        )
    for role in roles:
        check_weights_file(folder / role / ADAPTER_WEIGHTS, key, value)
    return folder


def check_weights_file(path: Path, key: str, value: str) -> None:
    """A safetensors file whose header and size agree (a cut-short copy fails here, before any load)."""
    try:
        with safe_open(path, "pt"):
            pass
    except (SafetensorError, OSError) as err:
        raise BadData(
            f"{key}={value}: {path} cannot be read ({err}): it is damaged or was cut short; copy it again or "
            "pass another checkpoint"
        ) from None


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


def load_saved_adapters(backbone: Backbone, folder: Path, slots: Mapping[str, str] | None = None) -> None:
    """Copy the saved adapters of `folder` into `backbone` (into `slots`, see Backbone.load_adapters); a
    shape mismatch names its fix."""
    try:
        backbone.load_adapters(folder, slots)
    except RuntimeError as err:  # size mismatch: saved with another rank or other target modules
        raise SettingError(
            f"the adapters in {folder} do not fit the configured ones ({first_mismatch(err)}): pass the experiment= the run "
            "was trained with (e.g. experiment=arith_hierarchy), or its roles.<role>.adapter settings (r, "
            "target_modules, top_layers)"
        ) from err


_SANDBOXES_CHECKED: set[str] = set()
WEAKER_LEVEL = {
    "landlock": (
        "the python tool runs without namespaces (tools.sandbox.isolation=landlock): Landlock and seccomp "
        "keep files, network and signals in; the code can tell whether a host pid exists (README "
        "'Safety and failure')"
    ),
}


def check_tools(cfg: Config) -> str | None:
    """At start-up, before anything is written: every role's tools exist, and where a role uses the
    python tool its isolation level can be had here (else one SettingError saying why and what to do).
    Returns the line to print when a weaker level than the default was chosen. The sandbox is checked
    once per setting in a process."""
    for role in cfg.role_list:
        unknown = [t for t in role.tools if t not in TOOL_NAMES]
        if unknown:
            raise SettingError(
                f"roles.{role.name}.tools names {unknown}, not registered; known: {', '.join(TOOL_NAMES)}"
            )
    # the tools an env of train.env runs from the run's registry are the run's too (meta_agent.env.rollout)
    by_env = env_tools(cfg.train.env, cfg.train.env_args, TOOL_NAMES) if cfg.train.env else ()
    unknown = [t for t in by_env if t not in TOOL_NAMES]
    if unknown:
        raise SettingError(
            f"train.env_args.tools names {unknown}, not registered; known: {', '.join(TOOL_NAMES)}"
        )
    if not any("python" in role.tools for role in cfg.role_list) and "python" not in by_env:
        return None
    limits = cfg.tools.sandbox
    if repr(limits) not in _SANDBOXES_CHECKED:
        try:
            PythonSandbox(limits).check()
        except SandboxUnavailable as err:
            raise SettingError(str(err)) from err
        _SANDBOXES_CHECKED.add(repr(limits))
    return WEAKER_LEVEL.get(limits.isolation)


def build_system(
    cfg: Config,
    backbone: Backbone | None = None,
    *,
    memory_read_only: bool = False,
    ranks: Ranks | None = None,
) -> System:
    """Everything a run needs, the role adapters of `adapters=` loaded if set.

    Pass `backbone` to reuse one already loaded (tests, notebooks). `memory_read_only`: another process
    writes the memory folder (see memory.settings.open_memory). `ranks`: the processes a sharded backbone
    (model.fsdp) is split over; default this one.
    """
    roles = cfg.role_list
    # Checked before anything loads, so a wrong adapters= fails in a second.
    saved = adapters_folder(cfg.adapters, [r.name for r in roles]) if cfg.adapters else None
    check_tools(cfg)
    # Entries are tagged with the run's folder: a resume undoes its own writes, never another run's.
    writer = str(Path(cfg.run_dir).resolve())
    memory = open_memory(cfg.memory, SentenceEmbedder, read_only=memory_read_only, writer=writer)
    if memory is None:
        # memory.enabled=false switches memory off everywhere, the memory_search tool included.
        roles = [replace(r, tools=tuple(t for t in r.tools if t != "memory_search")) for r in roles]
    registry = default_registry(memory, cfg.tools)  # every role's tool is in it: check_tools above
    if backbone is None:
        backbone = Backbone.load(cfg.model, cfg.role_adapters, ranks, seed=cfg.seed)
    if saved is not None:
        load_saved_adapters(backbone, saved, {r.name: r.name for r in roles})
    backend = make_backend(backbone, cfg.backend)
    chat = ChatFormat(backbone.tokenizer)
    factory = EpisodeFactory(roles, chat, registry, grade_task, cfg.protocol, memory, cfg.memory)
    return System(backbone, backend, chat, roles, registry, memory, factory)


def policy_trainer(
    cfg: Config, system: System, ranks: Ranks, *, lr_scale: float = 1.0, backbone: Backbone | None = None
) -> PolicyTrainer:
    """The optimizer of every role's adapter: its `lr` (times `lr_scale`: SFT's), its sampling temperature
    to score its tokens at, the `grpo` loss and the `train` update settings. `backbone`: another than the
    system's, holding some of its roles (bench/memory_peak.py compares copies)."""
    backbone = backbone or system.backbone
    roles = [r for r in system.roles if r.name in backbone.adapters]
    lr = {r.name: r.lr * lr_scale for r in roles}
    temperature = {r.name: r.sampling.temperature for r in roles}
    value = cfg.value if cfg.grpo.advantage == "gae" else None  # value heads only where GAE reads them
    return PolicyTrainer(
        backbone, lr, temperature=temperature, grpo=cfg.grpo, update=cfg.train, ranks=ranks, value=value
    )
