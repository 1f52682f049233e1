"""model.fsdp: the base weights as FSDP2 shards, the adapters whole; the same tokens and the same training.

One process (a one-rank group) here; two CPU processes with uneven work (slow); one GPU with the shards
offloaded to CPU memory (gpu).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor
from transformers import LlamaConfig, LlamaForCausalLM

from tests.training.turns import chat_ids, with_advantages
from training.backbone import AdapterConfig, Backbone
from training.batch import collate, completion_logits
from training.distributed import Ranks
from training.generation import HFBackend
from training.grpo import GRPOSettings
from training.model_files import ModelConfig
from training.trainer import PolicyTrainer, UpdateSettings
from training.types import GenerationRequest, SamplingParams, Turn

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("meta_thinker", "executor")
ADAPTERS = {role: AdapterConfig(r=4, alpha=8) for role in ROLES}


def load(model_dir: Path, fsdp: bool, device: str = "cpu") -> Backbone:
    """The tiny backbone with the same nonzero adapters whether sharded or not."""
    cfg = ModelConfig(path=str(model_dir), dtype="float32", device=device, fsdp=fsdp)
    backbone = Backbone.load(cfg, ADAPTERS)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for role in ROLES:
            for p in backbone.trainable_parameters(role):
                p.add_(torch.randn(p.shape, generator=generator).to(p.device) * 0.05)
    return backbone


def requests(backbone: Backbone, lengths: list[int], first: int = 0) -> list[GenerationRequest]:
    """Greedy requests first, first+1, ...: roles alternate, request k generates up to lengths[k] tokens."""
    out = []
    for k, n in enumerate(lengths, start=first):
        prompt = chat_ids(backbone.tokenizer, f"What is {k} + {k * 7}?")
        out.append(GenerationRequest(ROLES[k % 2], prompt, SamplingParams(temperature=0.0, max_new_tokens=n)))
    return out


def turns_of(backbone: Backbone, lengths: list[int], first: int = 0) -> list[Turn]:
    """Training turns from the backbone's own greedy rollouts, one episode each, rewards 0, 1, 2, 0, ...
    GRPO groups hold 3 episodes (a rank's share of a batch holds whole groups)."""
    asked = requests(backbone, lengths, first)
    results = HFBackend(backbone).generate(asked)
    return with_advantages(
        [
            Turn(
                r.adapter,
                f"task{k // 3}",
                r.prompt_ids,
                res.token_ids,
                (1,) * len(res.token_ids),
                res.logprobs,
                reward=float(k % 3),
                episode=k,
            )
            for k, r, res in zip(range(first, first + len(asked)), asked, results, strict=True)
        ]
    )


def trainer_of(backbone: Backbone, micro_batch_size: int = 8, ranks: Ranks | None = None) -> PolicyTrainer:
    return PolicyTrainer(
        backbone,
        # Adam's first step moves a weight by about lr whatever its gradient's size: gradients equal to
        # float rounding can differ by ~lr on weights whose gradient is ~0. 1e-4 keeps that under 1e-5.
        dict.fromkeys(ROLES, 1e-4),
        grpo=GRPOSettings(beta=0.1, filter_zero_variance=False),  # beta: the reference pass runs too
        update=UpdateSettings(micro_batch_size=micro_batch_size),
        ranks=ranks,
    )


def adapter_state(backbone: Backbone) -> dict[str, torch.Tensor]:
    return {
        f"{role}/{k}": p.detach().cpu().clone()
        for role in ROLES
        for k, p in enumerate(backbone.trainable_parameters(role))
    }


def test_a_sharded_backbone_generates_and_trains_like_a_whole_one(tiny_model_dir, tmp_path):
    whole, sharded = load(tiny_model_dir, fsdp=False), load(tiny_model_dir, fsdp=True)
    try:
        assert sharded.sharded and sharded.sharding.owns_process_group
        bases = [p for n, p in sharded.model.named_parameters() if ".lora_" not in n]
        assert bases and all(isinstance(p, DTensor) for p in bases)  # the base weights are FSDP shards
        assert not any(isinstance(p, DTensor) for role in ROLES for p in sharded.trainable_parameters(role))

        lengths = [5, 9, 3, 7]
        a, b = (HFBackend(bb).generate(requests(bb, lengths)) for bb in (whole, sharded))
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        for x, y in zip(a, b, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)

        turns = turns_of(whole, lengths)
        trainers = [trainer_of(bb) for bb in (whole, sharded)]
        for trainer in trainers:
            trainer.sft_step(turns)
            trainer.grpo_step(turns)
        before, after = adapter_state(load(tiny_model_dir, fsdp=False)), adapter_state(whole)
        assert any(not torch.allclose(before[k], after[k]) for k in after)  # the steps moved them
        for name, value in adapter_state(sharded).items():
            assert torch.allclose(value, after[name], atol=1e-6), name

        # Adapters save and load as plain PEFT files.
        sharded.save_adapters(tmp_path / "saved")
        fresh = load(tiny_model_dir, fsdp=False)
        fresh.load_adapters(tmp_path / "saved")
        for name, value in adapter_state(fresh).items():
            assert torch.equal(value, adapter_state(sharded)[name])
    finally:
        sharded.close()
    assert not torch.distributed.is_initialized()


def test_offload_without_fsdp_or_without_a_gpu_is_a_clear_error(tiny_model_dir):
    with pytest.raises(ValueError, match="set model.fsdp=true"):
        Backbone.load(ModelConfig(path=str(tiny_model_dir), fsdp_offload=True), ADAPTERS)
    with pytest.raises(ValueError, match="needs model.device=cuda"):
        Backbone.load(ModelConfig(path=str(tiny_model_dir), fsdp=True, fsdp_offload=True), ADAPTERS)
    assert not torch.distributed.is_initialized()


# ---- two processes ---------------------------------------------------------------------------------

# Each rank: its own share of uneven work. Rank 0 asks for 3 long completions, rank 1 for 1 short one,
# so rank 1 serves empty passes until rank 0's generation is done (Lockstep), and the trainer pads rank
# 1's micro-batches (micro_batch_size=1).
LENGTHS = [[9, 8, 7], [2]]

WORKER = """
import json, sys
from tests.training.test_sharding import LENGTHS, load, trainer_of, turns_of, adapter_state
from training.distributed import Ranks
from pathlib import Path

ranks = Ranks.start("cpu")
model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
backbone = load(model_dir, fsdp=True)
assert backbone.lockstep.ranks.size == 2 and not backbone.sharding.owns_process_group
first = sum(len(x) for x in LENGTHS[: ranks.rank])
turns = turns_of(backbone, LENGTHS[ranks.rank], first=first)
served = backbone.lockstep.drain()
result = trainer_of(backbone, micro_batch_size=1, ranks=ranks).grpo_step(turns)
served_after_training = backbone.lockstep.drain()
state = {k: v.tolist() for k, v in adapter_state(backbone).items()}
tokens = [list(t.completion_ids) for t in turns]
metrics = ranks.combine_metrics(result)
(out / f"rank{ranks.rank}.json").write_text(json.dumps(
    {"served": served, "served_after_training": served_after_training, "tokens": tokens,
     "adapters": state, "empty_passes": metrics["train/empty_passes"]}))
ranks.close()
"""


@pytest.mark.slow
def test_two_ranks_with_uneven_work_generate_and_train_like_one_process(tiny_model_dir, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a free port of its own
        "--nproc_per_node=2",
    ]
    proc = subprocess.run(
        [*command, str(script), str(tiny_model_dir), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))

    # One process, not sharded, all of it: the same tokens and, after the step, the same adapters.
    whole = load(tiny_model_dir, fsdp=False)
    turns = turns_of(whole, sum(LENGTHS, []))
    assert rank0["tokens"] + rank1["tokens"] == [list(t.completion_ids) for t in turns]
    trainer_of(whole).grpo_step(turns)
    for name, value in adapter_state(whole).items():
        for rank in (rank0, rank1):
            assert torch.allclose(torch.tensor(rank["adapters"][name]), value, atol=1e-5), name

    # Rank 1 finished first and served rank 0's remaining passes; rank 0 served none. Training padded
    # rank 1's single micro-batch per role to rank 0's count, so no pass was left over afterwards.
    assert rank1["served"] > 0 and rank0["served"] == 0
    assert rank0["empty_passes"] == rank1["empty_passes"] > 0
    assert rank0["served_after_training"] == rank1["served_after_training"] == 0


# ---- one GPU, shards in CPU memory -----------------------------------------------------------------


@pytest.mark.gpu
def test_offloaded_shards_train_on_a_gpu_that_never_holds_the_whole_backbone(tokenizer, tmp_path):
    """model.fsdp=true model.fsdp_offload=true on one GPU process: the base weights stay in CPU memory
    and each layer is copied in for its pass, so the card holds a layer at a time; generation and a
    GRPO step run there and give the whole model's numbers."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=40,
        num_attention_heads=16,
        num_key_value_heads=4,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id or 1,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    # ~0.66 B parameters: 40 layers of 30 MB beside a 100 MB tied embedding. The card holds the gathered
    # embedding for the whole pass and a few layers at a time (each copied in from CPU, then gathered,
    # the next prefetched), so the peak hardly grows with depth: on an H200, 323 MiB with 16 layers (of
    # 560 MiB, over this bound) and 424 MiB with these 40 (of 1,256 MiB). Depth makes the claim sharp.
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    base_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    del model
    cfg = ModelConfig(
        path=str(tmp_path / "model"), dtype="bfloat16", device="cuda", fsdp=True, fsdp_offload=True
    )

    torch.cuda.reset_peak_memory_stats()
    sharded = Backbone.load(cfg, ADAPTERS)
    try:
        assert torch.cuda.memory_allocated() < 0.1 * base_bytes  # the weights stayed in CPU memory
        bases = [p for n, p in sharded.model.named_parameters() if ".lora_" not in n]
        assert all(isinstance(p, DTensor) and p.to_local().device.type == "cpu" for p in bases)
        assert all(p.device.type == "cuda" for role in ROLES for p in sharded.trainable_parameters(role))

        lengths = [6, 4]
        results = HFBackend(sharded).generate(requests(sharded, lengths))
        assert all(r.token_ids for r in results)
        turns = turns_of(sharded, lengths)
        before = adapter_state(sharded)
        trainer = trainer_of(sharded)
        trainer.sft_step(turns)  # every turn: a gradient for both roles
        after = adapter_state(sharded)
        assert any(not torch.equal(before[k], after[k]) for k in after)
        peak = torch.cuda.max_memory_allocated()
        print(
            f"offloaded shards: peak {peak / 2**20:.0f} MiB on the card, backbone {base_bytes / 2**20:.0f} MiB"
        )
        assert peak < 0.5 * base_bytes  # never the whole backbone on the card

        # The whole model on the card scores the same tokens alike (bf16 rounding).
        whole = Backbone.load(ModelConfig(path=cfg.path, dtype="bfloat16", device="cuda"), ADAPTERS)
        with torch.no_grad():
            for role in ROLES:
                for p, q in zip(
                    whole.trainable_parameters(role), sharded.trainable_parameters(role), strict=True
                ):
                    p.copy_(q)
        batch = collate(turns, tokenizer.pad_token_id, "cuda")
        for backbone in (whole, sharded):
            backbone.activate(ROLES[0])
        logits = [completion_logits(bb.model, batch).float().log_softmax(-1) for bb in (whole, sharded)]
        assert (logits[0] - logits[1]).abs().max() < 0.05
    finally:
        sharded.close()
