"""`accelerate launch` with two CPU processes (gloo): the same adapters as one process, rank-0-only
files, exact resume, and one committed memory that every rank sees."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from meta_agent.config import load_config
from tests.meta_agent.test_cli import run_cli
from tests.meta_agent.test_train_cli import TINY
from tests.tiny_model import build_tiny_model
from training.backbone import Backbone

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("meta_thinker", "executor")
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(n: int, *args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """`accelerate launch --multi_gpu --num_processes n ...` as the README says, on CPU (gloo)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", f"--num_processes={n}"]
    command += ["--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no"]
    command += [f"--main_process_port={free_port()}", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def train_once(*args: str, cwd: Path) -> None:
    """`meta-agent train args` in one process; a failure shows its stderr."""
    proc = run_cli(*args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]


def train_twice(*args: str, cwd: Path) -> None:
    """`meta-agent train args` under two processes (accelerate launch); a failure shows its stderr."""
    proc = launch(2, "-m", "meta_agent", *args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def start_adapters(tiny_model_dir, tmp_path_factory) -> Path:
    return nonzero_adapters(tiny_model_dir, tmp_path_factory)


def nonzero_adapters(model_dir: Path, tmp_path_factory) -> Path:
    """Nonzero adapters to start from: every reward of the random tiny model is the same (advantage 0),
    so the gradient of GRPO steps comes from the KL to the adapter-free backbone (grpo.beta)."""
    cfg = load_config([f"model.path={model_dir}"])
    backbone = Backbone.load(cfg.model, cfg.role_adapters, seed=cfg.seed)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for role in ROLES:
            for p in backbone.trainable_parameters(role):
                p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    folder = tmp_path_factory.mktemp("start-adapters")
    backbone.save_adapters(folder)
    return folder


def train_args(model_dir: Path, start: Path, run_dir: Path, memory: Path, *extra: str) -> list[str]:
    return [
        "train",
        f"model.path={model_dir}",
        f"adapters={start}",
        *TINY,
        "model.dtype=float32",  # bf16 rounds differently with other batch shapes: compare in fp32
        "grpo.beta=0.5",
        "protocol.max_new_tokens=400",  # room for the demonstrations
        # Two SFT steps on generated demonstrations (4 episodes a step, 2 per rank), then GRPO.
        "sft.enabled=true",
        "sft.examples=8",
        "sft.batch_size=4",
        "sft.max_steps=2",
        "sft.eval_every=2",
        "train.tasks_per_step=4",  # two tasks (of two episodes each) per rank
        "train.eval_limit=3",  # uneven: the ranks play 2 and 1 held-out problems
        "train.steps=2",
        "train.checkpoint_every=1",
        "train.eval_every=1",
        "train.trace_every=1",
        # Adam's first steps move a weight by about lr whatever its gradient's size, so gradients that
        # agree to float rounding (1e-7) can still differ by up to ~lr on weights whose gradient is ~0:
        # the default lr (1e-4, SFT 3e-4) keeps that to a rare weight (see assert_same).
        f"run_dir={run_dir}",
        f"memory.path={memory}",
        *extra,
    ]


def adapters(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return read_adapters(run_dir / "checkpoints" / f"step-{step:06d}" / "adapters")


def grad_norms(run_dir: Path) -> dict[str, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.update({f"{k}@{row['step']}": v for k, v in row.items() if k.endswith("grad_norm")})
    return out


def read_adapters(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for role in ROLES:
        for name, value in load_file(folder / role / "adapter_model.safetensors").items():
            out[f"{role}/{name}"] = value
    return out


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    """Every weight within `atol`, but for at most one in 10,000 within 1e-4: Adam moves a weight whose
    gradient is ~0 by up to about lr whichever way float rounding tips it (on an AMD EPYC, AVX512, one
    lora_A weight of 65,536 differed by 1.5e-5 after a GRPO step, all others by under 3e-6). Gradients
    summed wrongly over ranks would move many weights, and by more."""
    assert a.keys() == b.keys()
    outside, total = 0, 0
    for name, value in a.items():
        diff = (value - b[name]).abs()
        assert float(diff.max()) <= 1e-4, (name, float(diff.max()))
        outside, total = outside + int((diff > atol).sum()), total + diff.numel()
    assert outside <= total // 10_000, f"{outside} of {total} weights differ by more than {atol}"


def test_two_processes_train_the_same_adapters_as_one_and_resume_exactly(
    tiny_model_dir,
    start_adapters,
    tmp_path,
):
    one, two, resumed = tmp_path / "one", tmp_path / "two", tmp_path / "resumed"
    args = lambda run, memory, *extra: train_args(tiny_model_dir, start_adapters, run, memory, *extra)  # noqa: E731
    train_once(*args(one, tmp_path / "mem-one"), cwd=tmp_path)
    train_twice(*args(two, tmp_path / "mem-two"), cwd=tmp_path)

    # The global batch and the seeds are the same, so the adapters are too: after SFT, after each
    # GRPO step; and every one of those steps moved them.
    folders = [
        one / "checkpoints" / "sft-best",
        *(one / "checkpoints" / f"step-{s:06d}" / "adapters" for s in (1, 2)),
    ]
    before = read_adapters(start_adapters)
    for folder in folders:
        after = read_adapters(folder)
        assert_same(after, read_adapters(two / folder.relative_to(one)))
        assert not any(torch.allclose(v, after[k], atol=1e-7) for k, v in before.items() if "lora_B" in k)
        before = after
    # The gradients agree to float rounding: every step's gradient norm, per role.
    norms = [grad_norms(run) for run in (one, two)]
    assert norms[0].keys() == norms[1].keys() and len(norms[0]) == 8  # 2 SFT + 2 GRPO steps, 2 roles
    assert norms[1] == pytest.approx(norms[0], rel=1e-5)
    # Both ranks hold identical adapters at the end (each rank's checksum, recorded by rank 0).
    ranks = json.loads((two / "ranks.json").read_text())
    assert ranks["world_size"] == 2 and ranks["adapter_checksums"][0] == ranks["adapter_checksums"][1]
    # Only rank 0 writes: one event file, one metrics line per logged step, its own traces.
    events = [list(run.glob("events.out.tfevents.*")) for run in (one, two)]
    assert len(events[1]) == len(events[0])  # (the hparams summary is a file of its own)
    assert len({path.name.split(".")[4] for path in events[1]}) == 1  # written by one process
    rows = [
        [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (one, two)
    ]
    assert [(r["step"], sorted(r)) for r in rows[1]] == [(r["step"], sorted(r)) for r in rows[0]]
    traced = [json.loads(line)["task"] for line in (two / "traces.jsonl").read_text().splitlines()]
    assert traced and len(traced) < len((one / "traces.jsonl").read_text().splitlines())
    saved = torch.load(two / "checkpoints" / "step-000001" / "trainer.pt", weights_only=True)
    assert len(saved["rng_ranks"]) == 2

    # Resume under two processes from step 1: the same step 2 as the uninterrupted run.
    train_twice(*args(resumed, tmp_path / "mem-two", f"resume={two}/checkpoints/step-000001"), cwd=tmp_path)
    assert_same(adapters(resumed, 2), adapters(two, 2))


def test_sharded_backbone_under_two_processes_trains_like_one_whole_process(
    tiny_model_dir,
    start_adapters,
    tmp_path,
):
    """model.fsdp=true: each rank holds half of every base weight. The ranks get uneven shares (3 tasks
    a step, one turn per micro-batch), so one rank serves the other's generation passes and pads its
    micro-batches; the adapters are still one process's, and a resume continues exactly."""
    uneven = ["train.tasks_per_step=3", "sft.batch_size=3", "train.micro_batch_size=1"]
    args = lambda run, memory, *extra: train_args(  # noqa: E731
        tiny_model_dir, start_adapters, run, memory, *uneven, *extra
    )
    one, two, resumed = tmp_path / "one", tmp_path / "two", tmp_path / "resumed"
    train_once(*args(one, tmp_path / "mem-one"), cwd=tmp_path)
    train_twice(*args(two, tmp_path / "mem-two", "model.fsdp=true"), cwd=tmp_path)
    assert_same(
        read_adapters(two / "checkpoints" / "sft-best"), read_adapters(one / "checkpoints" / "sft-best")
    )
    for step in (1, 2):
        assert_same(adapters(two, step), adapters(one, step))
    ranks = json.loads((two / "ranks.json").read_text())
    assert ranks["adapter_checksums"][0] == ranks["adapter_checksums"][1]
    rows = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("train/empty_passes", 0) + r.get("sft/train/empty_passes", 0) for r in rows) > 0

    train_twice(
        *args(resumed, tmp_path / "mem-two", "model.fsdp=true", f"resume={two}/checkpoints/step-000001"),
        cwd=tmp_path,
    )
    assert_same(adapters(resumed, 2), adapters(two, 2))


@pytest.mark.vllm
def test_vllm_backend_under_two_processes_trains_like_one(tokenizer, tmp_path, tmp_path_factory):
    """backend.name=vllm under `accelerate launch`: each rank starts its own engine for its share of the
    rollouts (seeded per request, so the same tokens as one process), and the adapters after SFT and two
    GRPO steps are one process's."""
    pytest.importorskip("vllm")
    model_dir = tmp_path_factory.mktemp("tiny-model-32")
    build_tiny_model(tokenizer, seed=0, head_dim=32).save_pretrained(model_dir)  # vLLM's CPU attention
    tokenizer.save_pretrained(model_dir)
    start = nonzero_adapters(model_dir, tmp_path_factory)
    engine = ["backend.name=vllm", "backend.vllm.kv_cache_gib=0.25", "backend.vllm.max_model_len=1024"]
    one, two = tmp_path / "one", tmp_path / "two"
    train_once(*train_args(model_dir, start, one, tmp_path / "mem-one", *engine), cwd=tmp_path)
    train_twice(*train_args(model_dir, start, two, tmp_path / "mem-two", *engine), cwd=tmp_path)
    before = read_adapters(start)
    for step in (1, 2):
        after = adapters(one, step)
        assert_same(after, adapters(two, step))
        assert not any(torch.allclose(v, after[k], atol=1e-7) for k, v in before.items() if "lora_B" in k)
        before = after
    ranks = json.loads((two / "ranks.json").read_text())
    assert ranks["adapter_checksums"][0] == ranks["adapter_checksums"][1]
    # The engine beside a sharded trainer (model.fsdp): rollouts never touch the shards.
    sharded = tmp_path / "sharded"
    extra = [*engine, "model.fsdp=true"]
    train_twice(*train_args(model_dir, start, sharded, tmp_path / "mem-3", *extra), cwd=tmp_path)
    assert_same(adapters(sharded, 2), adapters(one, 2))


SCRIPT = textwrap.dedent(
    """
    import json, sys
    from memory.embedders import HashingEmbedder
    from memory.store import FaissMemory
    from meta_agent.learning.train import commit_lessons
    from training.distributed import Ranks

    ranks = Ranks.start("cpu")
    folder, out = sys.argv[1], sys.argv[2]
    if not ranks.main:
        ranks.barrier()
    memory = FaissMemory(folder, HashingEmbedder(64), read_only=not ranks.main)
    if ranks.main:
        ranks.barrier()
    for step in range(2):
        mine = [(f"lesson {step}.{k} from rank {ranks.rank}", f"task/{ranks.rank}", 1.0) for k in range(ranks.rank + 1)]
        commit_lessons(memory, mine, ranks)
    entries = [[i, memory.get(i).text] for i in memory.ids()]
    hits = [h.entry.id for h in memory.search("lesson 1.1 from rank 1", k=2)]
    json.dump({"entries": entries, "size": len(memory), "hits": hits}, open(f"{out}/rank{ranks.rank}.json", "w"))
    memory.close()
    ranks.close()
    """
)


def test_lessons_of_every_rank_are_committed_once_and_every_rank_sees_them(tmp_path):
    script = tmp_path / "commit.py"
    script.write_text(SCRIPT)
    proc = launch(2, str(script), str(tmp_path / "memory"), str(tmp_path), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    texts = [text for _, text in rank0["entries"]]
    # Each step: rank 0's lesson, then rank 1's two, in rank order; written once (by rank 0).
    assert texts == [
        "lesson 0.0 from rank 0",
        "lesson 0.0 from rank 1",
        "lesson 0.1 from rank 1",
        "lesson 1.0 from rank 0",
        "lesson 1.0 from rank 1",
        "lesson 1.1 from rank 1",
    ]
    assert rank1 == rank0 and rank0["size"] == 6


def test_fewer_tasks_per_step_than_processes_is_a_clear_error(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    args = ["train", f"model.path={tiny_model_dir}", *TINY, "train.tasks_per_step=1", f"run_dir={run_dir}"]
    proc = launch(2, "-m", "meta_agent", *args, f"memory.path={tmp_path / 'memory'}", cwd=tmp_path)
    assert proc.returncode != 0
    assert "train.tasks_per_step=1" in proc.stdout and "at least 2" in proc.stdout
    assert not (run_dir / "checkpoints").exists()
