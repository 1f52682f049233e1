"""Roofline of this machine for the backbone: what its cores can multiply, and how near a GRPO step gets.

    python -m bench.roofline                         # rates only: about 2 minutes on 2 cores
    python -m bench.roofline --run runs/arith_hierarchy-X  # and the ideal time of that run's GRPO steps

Measured, for bfloat16 and float32, 1 and 2 threads, on an idle machine and with one core kept busy by
another process (a spinning Python loop: what a tool subprocess or a second test worker does):

- the matrix-product rate (GFLOP/s) of `F.linear` at the backbone's own shapes, for the three row counts
  a step uses: a decode step (`--decode-rows`, one row per live episode), a prefill (`--prefill-rows`) and
  an update micro-batch (`--update-rows`, forward and the backward to the input, as LoRA training on a
  frozen base needs), each summed over every product of one forward pass of the model;
- the memory bandwidth (GB/s) of copying a large tensor (read plus write), with 2 threads.

With `--run`, the run's own token counts per GRPO step (generated tokens, trained tokens) give the ideal
time of its rollout (every generated token decoded at the best decode rate, batches of
`--decode-rows`; each decode step at least one read of the weights) and of its update (every trained
token forward and backward at the best update rate), against the step times it measured:
`default_step_fraction_of_ideal` = ideal / measured. The prompts' prefill and the no-gradient passes are
not in the run's counts, so the ideal is a lower bound and the fraction an upper bound.

Writes bench/results/roofline.json. A measurement, not a test: run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import RESULTS_DIR, machine_info, write_result

RESULTS = RESULTS_DIR / "roofline.json"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def model_shapes(config) -> list[tuple[int, int, int]]:
    """(in_features, out_features, count) of every matrix product of one forward pass: the decoder
    layers' attention and MLP projections and the LM head (Llama-family names)."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q_out, kv_out = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    layers = config.num_hidden_layers
    products = [
        (hidden, q_out, layers),  # q
        (hidden, kv_out, 2 * layers),  # k, v
        (q_out, hidden, layers),  # o
        (hidden, inter, 2 * layers),  # gate, up
        (inter, hidden, layers),  # down
        (hidden, config.vocab_size, 1),  # LM head
    ]
    shapes: dict[tuple[int, int], int] = {}
    for in_f, out_f, count in products:  # equal shapes (q and o where heads fill the width) time once
        shapes[(in_f, out_f)] = shapes.get((in_f, out_f), 0) + count
    return [(i, o, n) for (i, o), n in shapes.items()]


def flops_per_token(shapes: list[tuple[int, int, int]]) -> int:
    """Multiply-adds x 2 of one token's forward pass through every product."""
    return sum(2 * i * o * n for i, o, n in shapes)


def weight_bytes(shapes: list[tuple[int, int, int]], dtype: torch.dtype) -> int:
    return sum(i * o * n for i, o, n in shapes) * torch.finfo(dtype).bits // 8


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: oneDNN picks and packs its kernel on the first call
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def pass_seconds(shapes, rows: int, dtype: torch.dtype, *, backward: bool, repeats: int) -> float:
    """The median time of every product of one forward pass over `rows` rows (and, with `backward`, the
    gradient to each product's input), summed over the shapes with their counts."""
    total = 0.0
    gen = torch.Generator().manual_seed(0)
    for in_f, out_f, count in shapes:
        weight = (torch.randn(out_f, in_f, generator=gen) * 0.02).to(dtype)
        x = torch.randn(rows, in_f, generator=gen).to(dtype)
        if backward:
            grad = torch.randn(rows, out_f, generator=gen).to(dtype)
            x.requires_grad_(True)

            def step(x=x, weight=weight, grad=grad):
                x.grad = None
                F.linear(x, weight).backward(grad)

        else:

            def step(x=x, weight=weight):
                with torch.inference_mode():
                    F.linear(x, weight)

        total += count * _median_seconds(step, repeats)
    return total


def memory_bandwidth(dtype: torch.dtype, megabytes: int = 512, repeats: int = 5) -> float:
    """GB/s moved by copying a tensor far larger than the caches (bytes read plus bytes written: a
    reduction over bf16 is slower than the memory, a copy is not)."""
    elements = megabytes * 2**20 * 8 // torch.finfo(dtype).bits
    source, target = torch.ones(elements, dtype=dtype), torch.empty(elements, dtype=dtype)
    seconds = _median_seconds(lambda: target.copy_(source), repeats)
    return 2 * source.numel() * source.element_size() / seconds / 1e9


class BusyCore:
    """Another process spinning on one core while the block runs."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def measure_rates(shapes, rows: dict[str, int], repeats: int) -> list[dict]:
    flops = flops_per_token(shapes)
    records = []
    for load in ("idle", "one_busy_core"):
        for dtype_name, dtype in DTYPES.items():
            for threads in (1, 2):
                torch.set_num_threads(threads)
                with BusyCore() if load == "one_busy_core" else _Nothing():
                    for phase, n in rows.items():
                        backward = phase == "update"
                        seconds = pass_seconds(shapes, n, dtype, backward=backward, repeats=repeats)
                        work = flops * n * (2 if backward else 1)
                        records.append(
                            {
                                "phase": phase,
                                "rows": n,
                                "dtype": dtype_name,
                                "threads": threads,
                                "load": load,
                                "pass_ms": round(seconds * 1000, 3),
                                "gflops_per_s": round(work / seconds / 1e9, 1),
                            }
                        )
                        print(json.dumps(records[-1]), flush=True)
    return records


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def run_steps(run: Path) -> list[dict]:
    """Per GRPO step of a run's metrics.jsonl: generated tokens, trained tokens, rollout and step seconds."""
    steps = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "time/step_s" not in record:
            continue
        step_s = record["time/step_s"]
        steps.append(
            {
                "step": record.get("step"),
                "generated_tokens": round(record["time/tokens_per_s"] * step_s),
                "trained_tokens": sum(
                    v for k, v in record.items() if k.startswith("role/") and k.endswith("/trained_tokens")
                ),
                "rollout_s": record["time/rollout_s"],
                "step_s": step_s,
            }
        )
    if not steps:
        raise SystemExit(f"--run {run}: its metrics.jsonl has no GRPO step (time/step_s)")
    return steps


def run_dtype(run: Path) -> str:
    """The dtype the run computed in: its model.dtype, with auto resolved as the run resolved it here."""
    from omegaconf import OmegaConf

    from training.model_files import torch_dtype

    name = OmegaConf.load(run / "config.yaml").model.dtype
    return {torch.bfloat16: "bfloat16", torch.float32: "float32"}[torch_dtype(name)]


def ideal_step(
    step: dict, best: dict, decode_rows: int, flops: int, bytes_read: int, bandwidth: float
) -> dict:
    """The ideal seconds of one GRPO step's rollout and update at the machine's best measured rates."""
    decode_steps = step["generated_tokens"] / decode_rows
    compute_s = decode_rows * flops / (best["decode"] * 1e9)
    memory_s = bytes_read / (bandwidth * 1e9)
    rollout = decode_steps * max(compute_s, memory_s)
    update = step["trained_tokens"] * 2 * flops / (best["update"] * 1e9)
    ideal = rollout + update
    return {
        **step,
        "ideal_rollout_s": round(rollout, 2),
        "ideal_update_s": round(update, 2),
        "ideal_step_s": round(ideal, 2),
        "fraction_of_ideal": round(ideal / step["step_s"], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a finished training run: its GRPO steps against the ideal")
    parser.add_argument("--decode-rows", type=int, default=32, help="rows of a decode step (live episodes)")
    parser.add_argument("--prefill-rows", type=int, default=512)
    parser.add_argument("--update-rows", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    from transformers import AutoConfig

    from training.model_files import ModelConfig, resolve_model_dir

    config = AutoConfig.from_pretrained(resolve_model_dir(ModelConfig()))
    shapes = model_shapes(config)
    flops = flops_per_token(shapes)
    rows = {"decode": args.decode_rows, "prefill": args.prefill_rows, "update": args.update_rows}
    rates = measure_rates(shapes, rows, args.repeats)
    torch.set_num_threads(2)
    bandwidth = {name: round(memory_bandwidth(dtype), 1) for name, dtype in DTYPES.items()}
    idle = [r for r in rates if r["load"] == "idle"]
    best = {
        dtype: {
            phase: max(r["gflops_per_s"] for r in idle if r["dtype"] == dtype and r["phase"] == phase)
            for phase in rows
        }
        for dtype in DTYPES
    }
    result = {
        "model": {
            "flops_per_token": flops,
            "shapes": shapes,
            "weight_bytes_bfloat16": weight_bytes(shapes, torch.bfloat16),
        },
        "rows": rows,
        "rates": rates,
        "best_idle_gflops_per_s": best,
        "memory_bandwidth_gb_per_s": bandwidth,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": machine_info(torch=torch.__version__),
    }
    if args.run:
        dtype = run_dtype(args.run)
        steps = [
            ideal_step(
                s, best[dtype], args.decode_rows, flops, weight_bytes(shapes, DTYPES[dtype]), bandwidth[dtype]
            )
            for s in run_steps(args.run)
        ]
        result["run"] = {"folder": str(args.run), "dtype": dtype, "steps": steps}
        result["default_step_fraction_of_ideal"] = round(
            sum(s["ideal_step_s"] for s in steps) / sum(s["step_s"] for s in steps), 4
        )
    write_result(result, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
