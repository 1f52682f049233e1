"""One definition per setting: the typed records are the Hydra schema, every key documented, every YAML valid."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from meta_agent.config import (
    CONFIG_DIR,
    commented_yaml,
    compose_config,
    field_comments,
    load_config,
    to_config,
)
from meta_agent.errors import SettingError
from meta_agent.settings import Config, RoleConfig
from training.grpo import GRPOSettings
from training.trainer import UpdateSettings

EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
ROLE_SETS = sorted(p.stem for p in (CONFIG_DIR / "roles").glob("*.yaml"))


def records(record: type = Config, seen: set | None = None) -> set[type]:
    """Every settings dataclass reachable from `record` through its fields' defaults, and RoleConfig
    (the values of roles:, an empty dict by default) with everything under it."""
    seen = set() if seen is None else seen
    seen.add(record)
    for f in dataclasses.fields(record):
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
            if dataclasses.is_dataclass(default) and type(default) not in seen:
                records(type(default), seen)
    if record is Config:
        records(RoleConfig, seen)
    return seen


def test_the_records_checked_cover_every_section():
    names = {r.__name__ for r in records()}
    assert {"SamplingSpec", "RewardSpec", "AdapterConfig", "VLLMSettings", "SandboxLimits", "Limits"} <= names


def test_the_library_records_are_the_schema():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert isinstance(cfg.grpo, GRPOSettings) and isinstance(cfg.train, UpdateSettings)
    assert all(isinstance(role, RoleConfig) for role in cfg.role_list)
    assert [r.name for r in cfg.role_list] == ["meta_thinker", "executor"]  # each named by its key
    assert cfg.roles["executor"].tools == ("calculator", "python", "memory_search")  # tuples, as typed


@pytest.mark.parametrize("record", sorted(records(), key=lambda r: r.__name__), ids=lambda r: r.__name__)
def test_every_field_says_what_it_means(record):
    """`meta-agent config` prints each key with its field's comment: none may be missing."""
    comments = field_comments(record)
    undocumented = [f.name for f in dataclasses.fields(record) if not comments.get(f.name)]
    assert not undocumented, f"{record.__name__} fields without a comment: {undocumented}"


def test_field_comments_are_read_above_and_beside_each_field():
    comments = field_comments(GRPOSettings)
    assert comments["eps_low"] == "ratio clipped below at 1 - eps_low (PPO's epsilon)"
    assert comments["tis_cap"].startswith("Truncated importance sampling against the rollout backend's")
    assert "None: the ratio is taken against the rollout's logprobs" in comments["tis_cap"]


@pytest.mark.parametrize(
    "overrides", [[f"roles={r}"] for r in ROLE_SETS] + [[f"experiment={e}"] for e in EXPERIMENTS]
)
def test_every_yaml_file_holds_only_keys_the_schema_knows(overrides):
    assert load_config(overrides).role_list


def test_every_experiment_starts_with_the_command_that_runs_it():
    for name in EXPERIMENTS:
        text = (CONFIG_DIR / "experiment" / f"{name}.yaml").read_text()
        if not name.endswith("_base"):
            assert f"meta-agent train experiment={name}" in text.splitlines()[1], name


def test_a_misspelt_key_fails_at_start_up_with_its_name():
    with pytest.raises(SettingError, match="max_roundz"):
        load_config(["protocol.max_roundz=3"])
    with pytest.raises(SettingError, match="roles.executor.samplng: no such setting"):
        load_config(["+roles.executor.samplng.temperature=0.1"])  # `+` adds the key past Hydra's check


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.micro_batch_size=0", "train.micro_batch_size must be >= 1"),
        ("grpo.ratio_level=word", "grpo.ratio_level must be one of"),
        ("memory.index=tree", "unknown index kind 'tree'"),
        ("backend.name=onnx", "backend.name='onnx' is not a generation backend"),
        ("roles.executor.kind=solver", "roles.executor.kind='solver'"),
        ("roles.executor.name=other", "a role is named by its key"),
        ("model.dtype=int8", "model.dtype=int8 is not"),
        ("tools.sandbox.timeout_s=0", "tools.sandbox.timeout_s must be positive"),
        ("roles.executor.lr=0", "roles.executor.lr=0.0 must be > 0"),
        ("train.keep_checkpoints=0", "train.keep_checkpoints must be >= 1"),
        ("sft.examples=-1", "sft.examples must be >= 0"),
        ("model.fsdp_offload=true", "set model.fsdp=true with it"),
        ("eval.episodes_per_batch=0", "eval.episodes_per_batch must be >= 1"),
    ],
)
def test_a_bad_value_is_one_setting_error_naming_the_key(override, message):
    with pytest.raises(SettingError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config([override])


def test_the_printed_config_is_the_config():
    """commented_yaml: valid YAML that loads back into the same settings, and says what each key means."""
    composed = compose_config(["experiment=arith_hierarchy", "run_dir=runs/x"])
    text = commented_yaml(composed)
    assert yaml.safe_load(text) == OmegaConf.to_container(composed)
    assert to_config(OmegaConf.merge(OmegaConf.structured(Config), yaml.safe_load(text))) == to_config(
        composed
    )
    assert "  eps_high: 0.28  # ratio clipped above at 1 + eps_high" in text
    assert "system_prompt: |-" in text  # prompts stay readable blocks
    typed = commented_yaml(to_config(composed))
    assert typed == text  # from the typed Config, the same text


def test_configs_yaml_picks_the_roles_and_sets_no_default(tmp_path):
    config = yaml.safe_load((CONFIG_DIR / "config.yaml").read_text())
    assert set(config) == {"defaults"}, "a default belongs in its settings record, not in config.yaml"


DOC_NAME = re.compile(r"\b([A-Z][A-Z_]+\.md)\b")


def test_every_document_code_and_configs_point_to_is_in_the_repository():
    """A comment naming ARCHITECTURE.md (or any UPPER-CASE .md file) names a file the repository holds."""
    root = Path(__file__).resolve().parents[2]
    files = [
        p
        for folder in ("meta_agent", "roles", "training", "memory", "tools", "configs", "bench", "tests")
        for p in (root / folder).rglob("*")
        if p.suffix in (".py", ".yaml", ".sh")
    ]
    present = {p.name for p in root.rglob("*.md") if ".venv" not in p.parts}
    named = {
        (str(p.relative_to(root)), doc)
        for p in files
        for doc in DOC_NAME.findall(p.read_text(encoding="utf-8"))
    }
    assert {"ARCHITECTURE.md", "README.md"} <= present
    assert not [(where, doc) for where, doc in named if doc not in present]
