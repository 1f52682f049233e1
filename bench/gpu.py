"""Speed on a GPU: rollout tokens/s and training-step MFU, through the product's own code paths.

    python -m bench.gpu                                  # ~0.5B random Llama, bf16, one CUDA card
    python -m bench.gpu --rows 64 --peak-tflops 312      # fewer rows; a card missing from the table
    python -m bench.gpu --tiny --device cpu --out /tmp/gpu_smoke.json   # smoke test, seconds on a CPU
    python -m bench.gpu --fsdp-offload --out bench/results/gpu_fsdp_offload.json   # base weights in CPU memory

The backbone is a random-initialised Llama-architecture model built from a config (nothing is
downloaded), wrapped by `Backbone.from_model` with one LoRA adapter per role. The rollout is one
`HFBackend.generate` call over `--rows` requests whose adapters alternate between the two roles (one
mixed-adapter batch), at a fixed length: EOS never stops a row. The training step is
`PolicyTrainer.grpo_step` on the rollout's own turns, with rewards that vary within every
(role, task) group so no group is filtered and every advantage is nonzero.

Writes bench/results/gpu.json: `rollout_tokens_per_s`, `train_mfu` (6N formula), `train_mfu_4n`, the
device, versions, model config, parameter counts and settings. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig

from bench.common import RESULTS_DIR, machine_info, write_result
from training.backbone import AdapterConfig, Backbone
from training.distributed import Ranks
from training.generation import HFBackend
from training.grpo import GRPOSettings
from training.trainer import PolicyTrainer, UpdateSettings
from training.types import GenerationRequest, SamplingParams, Turn

RESULTS = RESULTS_DIR / "gpu.json"
ROLES = ("meta_thinker", "executor")
GROUP = 4  # episodes per task (train.group_size); each episode has one turn per role
EOS_ID, PAD_ID = 2, 2  # SmolLM2's ids; EOS never ends a row here (HFBackend gets no eos ids)

# Dense bf16 tensor-core peak per card, first substring match of torch.cuda.get_device_name() wins
# (so "H100 PCIe" before "H100", "A100" before "A10"). Vendor datasheets, without sparsity.
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H200", 989e12),
    ("H800", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
)


@dataclass(frozen=True)
class Shape:
    """The backbone's architecture: Llama with grouped-query attention and tied embeddings."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int

    def llama_config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=4096,
            rope_theta=100000.0,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
        )


# ~0.49B: SmolLM2's vocabulary, 24 layers of width 1280, 20 query heads sharing 4 key/value heads.
FULL = Shape(vocab=49152, hidden=1280, intermediate=3584, layers=24, heads=20, kv_heads=4)
# ~5M: runs in seconds on a CPU.
TINY = Shape(vocab=8192, hidden=256, intermediate=768, layers=4, heads=4, kv_heads=2)


@dataclass(frozen=True)
class IdsOnlyTokenizer:
    """What Backbone, HFBackend and PolicyTrainer read from a tokenizer: prompts are random ids, no stop
    strings are set, so generated text is never looked at."""

    pad_token_id: int = PAD_ID
    eos_token_id: int = EOS_ID

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a ~5M-parameter model and small sizes (smoke test)")
    p.add_argument("--device", default=None, help="default: cuda if available")
    p.add_argument("--dtype", default="bfloat16", help="backbone dtype; LoRA weights stay float32")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"result file (default {RESULTS})")
    p.add_argument("--rows", type=int, default=None, help="rollout requests = training turns (128; tiny 8)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens per row (256; tiny 32)")
    p.add_argument("--new-tokens", type=int, default=None, help="generated tokens per row (256; tiny 16)")
    p.add_argument("--gen-batch-size", type=int, default=None, help="rows per decode batch (default: all)")
    p.add_argument("--prefix-cache-mb", type=float, default=2048, help="HFBackend's prefix cache, as shipped")
    p.add_argument("--temperature", type=float, default=0.7, help="the roles' sampling temperature")
    p.add_argument("--micro-batch", type=int, default=8, help="turns per forward/backward (config default)")
    p.add_argument("--train-steps", type=int, default=2, help="timed GRPO steps after one warm-up step")
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank of each role (roles' default)")
    p.add_argument("--top-layers", type=int, default=None, help="LoRA on the last N layers only")
    p.add_argument("--peak-tflops", type=float, default=None, help="the card's dense bf16 peak, TFLOP/s")
    for name in ("vocab", "hidden", "intermediate", "layers", "heads", "kv-heads"):
        p.add_argument(f"--{name}", type=int, default=None, help="override the model shape")
    p.add_argument("--fsdp", action="store_true", help="the base weights as FSDP shards (model.fsdp)")
    p.add_argument(
        "--fsdp-offload",
        action="store_true",
        help="the shards in CPU memory (model.fsdp_offload; implies --fsdp)",
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    small = args.tiny
    args.rows = args.rows or (8 if small else 128)
    args.prompt_len = args.prompt_len or (32 if small else 256)
    args.new_tokens = args.new_tokens or (16 if small else 256)
    args.gen_batch_size = args.gen_batch_size or args.rows
    args.fsdp = args.fsdp or args.fsdp_offload
    return args


def shape_from(args: argparse.Namespace) -> Shape:
    base = asdict(TINY if args.tiny else FULL)
    overrides = {
        "vocab": args.vocab,
        "hidden": args.hidden,
        "intermediate": args.intermediate,
        "layers": args.layers,
        "heads": args.heads,
        "kv_heads": args.kv_heads,
    }
    return Shape(**{k: v if overrides[k] is None else overrides[k] for k, v in base.items()})


def build_backbone(shape: Shape, args: argparse.Namespace, device: torch.device) -> Backbone:
    """Random weights made directly on the device (in CPU memory for --fsdp-offload), then the
    product's adapter wrapping and, with --fsdp, its sharding."""
    dtype = getattr(torch, args.dtype)
    adapter = AdapterConfig(r=args.lora_r, alpha=2 * args.lora_r, top_layers=args.top_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        with torch.device("cpu") if args.fsdp_offload else device:
            model = AutoModelForCausalLM.from_config(shape.llama_config(), dtype=dtype)
        model.eval()
        backbone = Backbone.from_model(model, IdsOnlyTokenizer(), dict.fromkeys(ROLES, adapter))
    if args.fsdp:
        backbone = backbone.shard(Ranks(device=str(device)), offload=args.fsdp_offload)
    return backbone


def parameter_counts(backbone: Backbone) -> dict[str, int]:
    """Base parameters (tied embedding counted once) and the matmul weights a token passes through."""
    model = backbone.model
    base = {id(p): p for n, p in model.named_parameters() if "lora_" not in n}
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight  # the same tensor when embeddings are tied
    # Decoder linear weights; norms are per-element, not matmuls.
    layer_matmul = sum(
        p.numel() for p in base.values() if p.dim() == 2 and p is not embedding and p is not head
    )
    lora = {role: sum(p.numel() for p in backbone.trainable_parameters(role)) for role in backbone.adapters}
    return {
        "base_total": sum(p.numel() for p in base.values()),
        "embedding": embedding.numel(),
        "lm_head": head.numel(),
        "layer_matmul": layer_matmul,
        "lora_per_role": lora[backbone.adapters[0]],
        "lora_all_roles": sum(lora.values()),
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def requests(rows: int, prompt_len: int, new_tokens: int, vocab: int, temperature: float, seed: int):
    """Random prompts (ids 3.. so no special token), roles alternating in one batch, one seed per row."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (rows, prompt_len), generator=g).tolist()
    sampling = SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=new_tokens)
    return [
        GenerationRequest(ROLES[i % 2], tuple(p), sampling, seed=seed * 100_003 + i)
        for i, p in enumerate(prompts)
    ]


def rollout(backbone: Backbone, args: argparse.Namespace, vocab: int, device: torch.device):
    """Warm-up, prefill alone, then the timed full-length rollout; returns (metrics, its turns).

    Each call gets a fresh HFBackend (empty prefix cache) and its own random prompts, so no prompt
    state is reused from an earlier call: this is the cold-prompt case, with no G-fold prompt sharing.
    """

    def backend() -> HFBackend:
        return HFBackend(
            backbone, batch_size=args.gen_batch_size, eos_token_ids=(), prefix_cache_mb=args.prefix_cache_mb
        )

    shape = (args.rows, args.prompt_len)
    backend().generate(requests(*shape, min(8, args.new_tokens), vocab, args.temperature, seed=1))
    synchronize(device)
    started = time.perf_counter()
    backend().generate(requests(*shape, 1, vocab, args.temperature, seed=2))
    synchronize(device)
    prefill_s = time.perf_counter() - started

    timed = requests(*shape, args.new_tokens, vocab, args.temperature, seed=3)
    started = time.perf_counter()
    results = backend().generate(timed)
    synchronize(device)
    wall = time.perf_counter() - started
    generated = sum(len(r.token_ids) for r in results)
    turns = [
        Turn(
            role=req.adapter,
            group=f"task{(i // 2) // GROUP}",
            prompt_ids=req.prompt_ids,
            completion_ids=res.token_ids,
            loss_mask=(1,) * len(res.token_ids),
            logprobs=res.logprobs,
            reward=float((i // 2) % 2),  # 0, 1, 0, 1 within every group: no group is filtered
            episode=i // 2,
            advantage=1.0 if (i // 2) % 2 else -1.0,  # a gradient of the rewards' sign for every turn
        )
        for i, (req, res) in enumerate(zip(timed, results, strict=True))
    ]
    metrics = {
        "rollout_tokens_per_s": generated / wall,
        "rollout_seconds": wall,
        "rollout_generated_tokens": generated,
        "rollout_prefill_seconds": prefill_s,
        "rollout_decode_tokens_per_s": (generated - args.rows) / max(wall - prefill_s, 1e-9),
        "finish_reasons": sorted({r.finish_reason for r in results}),
    }
    return metrics, turns


def train(backbone: Backbone, turns: list[Turn], args: argparse.Namespace, device: torch.device) -> dict:
    """One warm-up GRPO step (optimizer state, kernel choice), then `--train-steps` timed ones."""
    trainer = PolicyTrainer(
        backbone,
        dict.fromkeys(ROLES, 1e-4),
        temperature=dict.fromkeys(ROLES, args.temperature),
        grpo=GRPOSettings(),
        update=UpdateSettings(micro_batch_size=args.micro_batch),
    )
    trainer.grpo_step(turns)
    seconds = []
    for _ in range(args.train_steps):
        synchronize(device)
        started = time.perf_counter()
        trainer.grpo_step(turns)
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    return {
        "train_step_seconds": statistics.median(seconds),
        "train_step_seconds_each": seconds,
        "train_turns": len(turns),
        # The trainer splits each role's turns into its own micro-batches.
        "train_micro_batches": sum(-(-sum(t.role == r for t in turns) // args.micro_batch) for r in ROLES),
    }


def model_flops(counts: dict[str, int], turns: list[Turn], per_param: int) -> float:
    """`per_param` x (matmul weights each token passes) summed over the step's tokens.

    Every prompt and completion token passes the decoder layers (and the active role's LoRA); only
    completion tokens plus one reach the lm_head (`logits_to_keep`). Attention scores and padding
    are not counted.
    """
    tokens = sum(len(t.prompt_ids) + len(t.completion_ids) for t in turns)
    scored = sum(len(t.completion_ids) + 1 for t in turns)
    per_token = counts["layer_matmul"] + counts["lora_per_role"]
    return per_param * (per_token * tokens + counts["lm_head"] * scored)


def peak_flops(device: torch.device, override_tflops: float | None) -> tuple[float | None, str]:
    if override_tflops is not None:
        return override_tflops * 1e12, "--peak-tflops"
    if device.type != "cuda":
        return None, "no table entry for a CPU: pass --peak-tflops"
    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_BF16_FLOPS:
        if key in name:
            return flops, f"table entry {key!r}"
    return None, f"{name!r} is not in the table: pass --peak-tflops"


def device_info(device: torch.device) -> dict:
    """The card (or CPU threads) the measurement ran on."""
    if device.type != "cuda":
        return {"device": str(device), "name": "cpu", "torch_threads": torch.get_num_threads()}
    return {
        "device": str(device),
        "name": torch.cuda.get_device_name(device),
        "memory_gib": round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" and not args.tiny:
        sys.exit(
            "bench/gpu.py measures a ~0.5B model on a CUDA card, and none is available: run it on a GPU "
            "machine, or pass --tiny (a few-million-parameter model) for a smoke test"
        )
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # accelerate places the trainer on the current device
    shape = shape_from(args)
    backbone = build_backbone(shape, args, device)
    counts = parameter_counts(backbone)
    print(f"backbone: {counts['base_total'] / 1e6:.1f}M parameters, {shape}", flush=True)

    roll, turns = rollout(backbone, args, shape.vocab, device)
    print(
        f"rollout: {roll['rollout_tokens_per_s']:.0f} tokens/s ({roll['rollout_seconds']:.1f} s)", flush=True
    )
    step = train(backbone, turns, args, device)
    peak, peak_source = peak_flops(device, args.peak_tflops)
    flops_6n = model_flops(counts, turns, 6)
    flops_4n = model_flops(counts, turns, 4)
    seconds = step["train_step_seconds"]
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    result = {
        "rollout_tokens_per_s": roll["rollout_tokens_per_s"],
        "train_mfu": flops_6n / seconds / peak if peak else None,
        "train_mfu_4n": flops_4n / seconds / peak if peak else None,
        "train_tokens_per_s": sum(len(t.prompt_ids) + len(t.completion_ids) for t in turns) / seconds,
        "train_tflops_6n": flops_6n / seconds / 1e12,
        "train_tflops_4n": flops_4n / seconds / 1e12,
        **roll,
        **step,
        "peak_flops": peak,
        "peak_source": peak_source,
        "max_memory_gib": memory,
        "flops_formula": (
            "train_mfu = 6 * (N_layers * tokens + N_lm_head * scored) / step_seconds / peak: N_layers = "
            "decoder matmul weights + one role's LoRA, tokens = prompt + completion tokens, N_lm_head = "
            "vocab x hidden applied to completion + 1 tokens per turn; 6 = forward 2 + activation "
            "gradients 2 + weight gradients 2 (the standard approximation). train_mfu_4n uses 4: the "
            "frozen base has no weight gradients. Attention scores and padding are not counted; with "
            "--top-layers the backward stops below the adapted layers, so both overstate the work."
        ),
        "parameters": counts,
        "model": asdict(shape)
        | {"dtype": args.dtype, "attention": backbone.model.config._attn_implementation},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "accelerator": device_info(device),
        "machine": machine_info(torch=torch.__version__, transformers=transformers.__version__),
    }
    backbone.close()
    result = write_result(result, args.out)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
