"""The guard of tests/conftest.py sees a file added anywhere in a tree, and only outside the caches."""

from __future__ import annotations

from tests.conftest import checkout_files


def test_checkout_files_sees_new_files_outside_the_caches(tmp_path):
    (tmp_path / "README.md").write_text("x")
    before = checkout_files(tmp_path)
    for cache in ("__pycache__", ".pytest_cache", "pkg.egg-info"):
        (tmp_path / cache).mkdir()
        (tmp_path / cache / "f").write_text("x")
    assert checkout_files(tmp_path) == before == {"README.md"}
    (tmp_path / "runs" / "memory").mkdir(parents=True)
    (tmp_path / "runs" / "memory" / "memory.sqlite").write_text("x")
    assert checkout_files(tmp_path) - before == {"runs/memory/memory.sqlite"}


def test_the_model_cache_inside_the_checkout_is_not_a_gained_file(tmp_path, monkeypatch):
    monkeypatch.setenv("META_AGENT_CACHE", str(tmp_path / ".cache" / "meta-agent"))
    (tmp_path / ".cache" / "meta-agent").mkdir(parents=True)
    (tmp_path / ".cache" / "meta-agent" / "model.safetensors").write_text("x")
    (tmp_path / ".cache" / "other").write_text("x")
    assert checkout_files(tmp_path) == {".cache/other"}
