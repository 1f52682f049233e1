"""From the command line to typed settings: compose the Hydra config, check it, convert it once.

    cfg = load_config(["experiment=arith_hierarchy", "grpo.beta=0.02"])   # a meta_agent.settings.Config
    print(commented_yaml(compose_config(["roles=single_agent"])))         # what `meta-agent config` shows

The schema is the dataclasses of meta_agent.settings, registered in Hydra's ConfigStore as "schema", so
a misspelt key fails at composition with its name; every such mistake is one SettingError. Only this
module handles DictConfigs; everything else takes the Config it returns.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import os
import textwrap
import tokenize
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from meta_agent.errors import MissingFile, SettingError
from meta_agent.settings import Config

CONFIG_DIR = Path(os.environ.get("META_AGENT_CONFIGS", Path(__file__).resolve().parents[1] / "configs"))

ConfigStore.instance().store(name="schema", node=Config)


def compose_config(overrides: list[str] | None = None, config_name: str = "config") -> DictConfig:
    """configs/<config_name>.yaml with command-line overrides, resolved, each role named by its key."""
    if not CONFIG_DIR.is_dir():
        raise MissingFile(
            f"config folder {CONFIG_DIR} not found; set META_AGENT_CONFIGS to the repo's configs/"
        )
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            cfg = compose(config_name=config_name, overrides=list(overrides or []))
        OmegaConf.resolve(cfg)
    except OverrideParseException as err:  # Hydra's lexer trace: three lines and a caret, no remedy
        raise SettingError(unreadable_override(err.override)) from err
    except (HydraException, OmegaConfBaseException) as err:  # a misspelt key, a value of the wrong type
        raise SettingError(setting_error_text(err)) from err
    for key, role in cfg.roles.items():
        if OmegaConf.is_missing(role, "name"):
            role.name = key
        elif role.name != key:
            raise SettingError(
                f"roles.{key}.name={role.name}: a role is named by its key under roles:; drop name"
            )
    return cfg


def unreadable_override(override: str) -> str:
    """One line for an override Hydra's grammar cannot read (a non-ASCII letter, a space, a bracket or a
    quote unquoted), with the quoted form that it reads."""
    key, _, value = override.partition("=")
    quoted = value.replace("\\", "\\\\").replace("'", "\\'")
    return (
        f"{override}: Hydra cannot read this value unquoted (it takes letters beyond ASCII, spaces and brackets "
        f"only inside quotes): quote it, as {key}='{quoted}' (in a shell: \"{key}='{quoted}'\")"
    )


def setting_error_text(err: BaseException) -> str:
    """Hydra's message, with what its cause says (the type a key wants) when it does not say it itself:
    "Error merging override eval.limit=abc" alone names the key but not that it wants an int."""
    text = str(err).strip()
    cause = err.__cause__
    if cause is not None:
        detail = str(cause).strip().splitlines()[0]
        if detail and detail not in text:
            text = f"{text.splitlines()[0]}: {detail}"
    return text


def to_config(cfg: DictConfig) -> Config:
    """The typed Config of a composed config; a value its record refuses is one SettingError."""
    for name in cfg.get("roles") or {}:
        if OmegaConf.is_missing(cfg.roles[name], "kind"):  # only an experiment's or override's keys made it
            raise SettingError(
                f"roles.{name}: settings for a role that the chosen roles= does not have; pick roles= with "
                f"{name} or an experiment written for these roles (configs/experiment/)"
            )
    unknown = _unknown_keys(cfg, "")
    if unknown:  # keys added with `+key=value`, which Hydra lets into typed nodes
        raise SettingError(f"{', '.join(unknown)}: no such setting (`meta-agent config` lists them all)")
    try:
        return OmegaConf.to_object(cfg)  # type: ignore[return-value]
    except (ValueError, OmegaConfBaseException) as err:  # a record refused a value, or one is missing
        raise SettingError(str(err)) from err


def _unknown_keys(node: DictConfig, prefix: str) -> list[str]:
    record = OmegaConf.get_type(node)
    known = {f.name for f in dataclasses.fields(record)} if dataclasses.is_dataclass(record) else None
    found = []
    for key in node:
        path = f"{prefix}{key}"
        if known is not None and key not in known:
            found.append(path)
        elif isinstance(node[key], DictConfig):
            found += _unknown_keys(node[key], f"{path}.")
    return found


def load_config(overrides: list[str] | None = None, config_name: str = "config") -> Config:
    return to_config(compose_config(overrides, config_name))


def config_of_run(saved: Path, overrides: list[str], own: tuple[str, ...]) -> Config:
    """The config a run was made with (its resolved `saved` config.yaml), with `overrides` on top; the
    dotted keys in `own` (this command's folder, say) keep the values `overrides` compose to instead.
    Group choices (experiment=, roles=) cannot apply to a resolved config: a SettingError says so."""
    groups = [
        o for o in overrides if "=" in o and "." not in o.split("=", 1)[0] and o.split("=", 1)[0] in GROUPS
    ]
    if groups or any(o.startswith(("+", "~")) for o in overrides):
        raise SettingError(
            f"{', '.join(groups) or 'a +/~ override'}: cannot apply on top of {saved}; pass adapters= with the "
            "settings the run was trained with instead"
        )
    cfg = compose_config(overrides)
    kept = {key: OmegaConf.select(cfg, key) for key in own}
    try:
        cfg.roles = {}  # the run's roles, not these merged with the default ones
        # A key the run's file has and this version lacks is let in here; to_config names it.
        OmegaConf.set_struct(cfg, False)
        cfg = OmegaConf.merge(
            cfg,
            OmegaConf.load(saved),
            OmegaConf.from_dotlist([o for o in overrides if o.split("=", 1)[0] not in own]),
        )
    except (yaml.YAMLError, OmegaConfBaseException) as err:
        raise SettingError(f"{saved}: {setting_error_text(err)}") from err
    for key, value in kept.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return to_config(cfg)


GROUPS = ("experiment", "roles", "role")  # the config groups under configs/


def as_dictconfig(cfg: Config) -> DictConfig:
    """A typed Config back as a structured DictConfig (for printing and the run's config.yaml)."""
    return OmegaConf.structured(cfg)


# ---- the config as YAML, each key with the comment of its field ------------------------------------


def commented_yaml(cfg: DictConfig | Config) -> str:
    """The resolved config as YAML, each key followed by what its field's comment says it means."""
    node = cfg if isinstance(cfg, DictConfig) else as_dictconfig(cfg)
    lines: list[str] = []
    _emit(node, Config, 0, lines)
    return "\n".join(lines) + "\n"


def _emit(node: DictConfig, record: type | None, indent: int, lines: list[str]) -> None:
    comments = field_comments(record) if record is not None else {}
    pad = " " * indent
    for key in node:
        value = node[key]
        comment = comments.get(str(key), "")
        if isinstance(value, DictConfig) and len(value) == 0:
            _line(lines, f"{pad}{key}: {{}}", comment)  # an empty mapping (custom_tasks), not null
            continue
        if isinstance(value, DictConfig):
            child = OmegaConf.get_type(value)
            _line(lines, f"{pad}{key}:", comment)
            _emit(value, child if dataclasses.is_dataclass(child) else None, indent + 2, lines)
            continue
        plain = OmegaConf.to_container(value) if isinstance(value, ListConfig) else value
        if isinstance(plain, str) and "\n" in plain:
            _line(lines, f"{pad}{key}: |-", comment)
            lines += [f"{pad}  {text}".rstrip() for text in plain.split("\n")]
        else:
            _line(lines, f"{pad}{key}: {_scalar(plain)}", comment)


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text.removesuffix("...").strip()


def _line(lines: list[str], text: str, comment: str) -> None:
    if not comment:
        lines.append(text)
    elif len(text) + len(comment) + 3 <= 110:
        lines.append(f"{text}  # {comment}")
    else:  # a long comment goes above its key
        pad = text[: len(text) - len(text.lstrip())]
        lines += [f"{pad}# {part}" for part in textwrap.wrap(comment, 108 - len(pad))]
        lines.append(text)


@functools.cache
def field_comments(record: type) -> dict[str, str]:
    """Each field of the dataclass `record` (and of the dataclasses it derives from) -> its comment: the
    comment lines right above the field and the comment at the end of its line, joined."""
    out: dict[str, str] = {}
    for klass in reversed(record.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        source = textwrap.dedent(inspect.getsource(klass))
        comments = {
            tok.start[0]: tok.string.lstrip("#").strip()
            for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT
        }
        lines = source.splitlines()
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt in body.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            above = []
            row = stmt.lineno - 1
            while row in comments and lines[row - 1].lstrip().startswith("#"):
                above.insert(0, comments[row])
                row -= 1
            after = [
                comments[r] for r in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1) if r in comments
            ]
            out[stmt.target.id] = " ".join(above + after)
    return out


def hparams(cfg: Config) -> dict:
    """The settings TensorBoard's HParams tab shows beside the final accuracies."""
    update = cfg.train.algorithm  # the settings of the update the run used: grpo or dpo
    flat = {
        f"{section}.{key}": ",".join(value) if isinstance(value, list) else value
        for section in ("train", update, "sft", "protocol")
        for key, value in dataclasses.asdict(getattr(cfg, section)).items()
    }
    for role in cfg.role_list:
        flat[f"roles.{role.name}.lr"] = role.lr
        flat[f"roles.{role.name}.temperature"] = role.sampling.temperature
    return flat
