"""Import layers: each package below meta_agent/ imports only the layers under it.

    memory  <-  tools  <-  roles  <-  meta_agent            training never sees episodes or roles

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
    "roles": {"meta_agent", "training"},
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
        "if False:\n    from meta_agent.episode import Episode\n"
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
