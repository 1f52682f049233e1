"""Import layers: each package below meta_agent/ imports only the layers under it, and so does each
sub-package of meta_agent/.

    memory  <-  tools  <-  meta_agent  ->  roles, training    roles and training import no project package

    inside meta_agent/:  errors <- tasks <- episode <- analysis, env, demos <- evaluation <- learning <- cli
    (settings, config, system and rank_protocol compose the rest: only evaluation, learning and cli use them)

Read from the source with `ast`, so an import inside a function or under TYPE_CHECKING counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("memory", "tools", "roles", "meta_agent", "training")

FORBIDDEN = {
    "memory": {"tools", "roles", "meta_agent", "training"},
    "tools": {"roles", "meta_agent", "training"},
    "roles": {"meta_agent", "training", "tools", "memory"},
    "training": {"meta_agent", "roles", "tools", "memory"},
}


def imported_packages(path: Path, package: str) -> set[str]:
    """The top-level project packages a module imports (relative imports resolve to its own package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add(package if node.level else (node.module or "").split(".")[0])
    return found & set(PACKAGES)


def test_imported_packages_sees_every_import_form(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import os, memory.types\n"
        "from tools import registry\n"
        "from . import sibling\n"
        "def f():\n    import training.types as t\n"
        "if False:\n    from meta_agent.episode.protocol import Episode\n"
    )
    assert imported_packages(source, "roles") == {"memory", "tools", "roles", "training", "meta_agent"}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    offences = {
        str(path.relative_to(ROOT)): sorted(imported & FORBIDDEN[package])
        for path in files
        if (imported := imported_packages(path, package)) & FORBIDDEN[package]
    }
    assert not offences, f"{package}/ may not import {sorted(FORBIDDEN[package])}: {offences}"


# Inside meta_agent/: what each unit (a sub-package or a top-level module) may not import.
SHELL = {"cli", "config", "settings", "system", "rank_protocol"}
ABOVE_EPISODE = {"analysis", "env", "demos", "evaluation", "learning"} | SHELL
INNER_FORBIDDEN = {
    "errors": {"tasks", "episode"} | ABOVE_EPISODE,
    "tasks": {"episode"} | ABOVE_EPISODE,
    "episode": ABOVE_EPISODE,
    "analysis": ABOVE_EPISODE - {"analysis"},
    "env": ABOVE_EPISODE - {"env"},
    "demos": ABOVE_EPISODE - {"demos"},
    "evaluation": {"learning", "cli"},
    "learning": {"cli"},
}


def meta_agent_units(path: Path) -> set[str]:
    """The units of meta_agent/ (its first name below meta_agent) that a module imports."""
    parts = path.relative_to(ROOT).with_suffix("").parts  # ("meta_agent", "episode", "runner")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[: len(parts) - node.level]
                names = [".".join([*base, *(node.module or "").split(".")]).rstrip(".")]
            elif node.module == "meta_agent":
                names = [f"meta_agent.{alias.name}" for alias in node.names]
            else:
                names = [node.module or ""]
        else:
            continue
        found.update(name.split(".")[1] for name in names if name.startswith("meta_agent.") and "." in name)
    return found


def test_meta_agent_units_resolve_every_import_form(tmp_path, monkeypatch):
    folder = tmp_path / "meta_agent" / "episode"
    folder.mkdir(parents=True)
    source = folder / "m.py"
    source.write_text(
        "import meta_agent.tasks.types\n"
        "from meta_agent import settings\n"
        "from meta_agent.learning.train import train\n"
        "from . import runner\n"
        "from ..analysis import stats\n"
    )
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert meta_agent_units(source) == {"tasks", "settings", "learning", "episode", "analysis"}


@pytest.mark.parametrize("unit", sorted(INNER_FORBIDDEN))
def test_meta_agent_unit_imports_nothing_above_it(unit):
    folder = ROOT / "meta_agent" / unit
    files = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]
    assert all(f.exists() for f in files) and files, f"meta_agent/{unit} is missing"
    offences = {
        str(path.relative_to(ROOT)): sorted(imported & INNER_FORBIDDEN[unit])
        for path in files
        if (imported := meta_agent_units(path)) & INNER_FORBIDDEN[unit]
    }
    assert not offences, f"meta_agent/{unit} may not import {sorted(INNER_FORBIDDEN[unit])}: {offences}"


def test_every_meta_agent_unit_has_a_layer():
    units = {p.stem for p in (ROOT / "meta_agent").glob("*.py")} | {
        p.name for p in (ROOT / "meta_agent").iterdir() if p.is_dir() and (p / "__init__.py").exists()
    }
    unplaced = units - set(INNER_FORBIDDEN) - SHELL - {"__init__", "__main__"}
    assert not unplaced, f"give meta_agent/{sorted(unplaced)} a layer in INNER_FORBIDDEN"
