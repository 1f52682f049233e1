"""What `train.micro_batch_size` costs or saves in the main job's steps, on the real backbone.

    python -m bench.micro_batch adapters=runs/<run>/checkpoints/sft-best     # about 6 minutes on 2 bf16 cores
    python -m bench.micro_batch --sizes 1,2 --sft-steps 1 --repeats 1 model.dtype=float32 adapters=...  # float32

Each micro-batch size of `--sizes` (turns per forward and backward pass, padded to the longest) is an arm,
timed on two kinds of step of `--experiment` (default: the main job's, countdown_hierarchy), with its
common prefixes run once as the trainer runs them (`train.shared_prefix`):

- SFT: `--sft-steps` steps of the experiment's demonstrations (`sft.batch_size` episodes each);
- GRPO: the update on one rollout batch (`train.tasks_per_step` tasks x G), every turn kept (no
  zero-variance filter: an all-equal group costs the same passes, its advantage 0).

The arms alternate (order reversed each round) over `--repeats` timed rounds after an untimed warm-up
round; before each step the adapters are put back, so every arm trains the same weights on the same turns.
Each arm's gradients on the first timed step are compared with the first arm's (the largest difference
relative to the largest gradient). Writes bench/results/micro_batch.json: each arm's median seconds a step,
the speed-up against the first arm, settings and machine. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
import transformers

from bench.common import RESULTS_DIR, machine_info, write_result
from bench.shared_prefix import episode_batches, relative_difference, rollout_note, timed_step
from meta_agent.config import load_config
from meta_agent.episode.reward import score
from meta_agent.learning.credit import training_turns
from meta_agent.learning.sft import sft_turns
from meta_agent.learning.train import Stage, assign_credit, rollout
from meta_agent.system import build_system, policy_trainer
from training.distributed import Ranks
from training.trainer import PolicyTrainer
from training.types import Turn

RESULTS = RESULTS_DIR / "micro_batch.json"


def measure(
    trainer: PolicyTrainer, kind: str, batches: list[list[Turn]], sizes: list[int], repeats: int
) -> dict:
    """Every arm (micro-batch size) over `batches`: `repeats` timed rounds after a warm-up round, the arms'
    order reversed each round; medians of the mean seconds a step."""
    seconds: dict[int, list[float]] = {size: [] for size in sizes}
    grads: dict[int, dict] = {}
    for round_ in range(repeats + 1):
        for size in sizes if round_ % 2 == 0 else sizes[::-1]:
            trainer.update.micro_batch_size = size
            total = 0.0
            for i, batch in enumerate(batches):
                s, _, g = timed_step(trainer, kind, batch, shared=True)
                total += s
                if round_ == 1 and i == 0:
                    grads[size] = g
            if round_ > 0:
                seconds[size].append(total / len(batches))
    first = sizes[0]
    median = {size: statistics.median(seconds[size]) for size in sizes}
    return {
        "steps_per_round": len(batches),
        "turns_per_step": round(statistics.mean(len(b) for b in batches), 1),
        "tokens_per_step": round(
            statistics.mean(sum(len(t.prompt_ids) + len(t.completion_ids) for t in b) for b in batches), 1
        ),
        "seconds_per_step": {str(size): round(median[size], 3) for size in sizes},
        "all_seconds": {str(size): [round(s, 3) for s in seconds[size]] for size in sizes},
        f"speedup_against_{first}": {str(size): round(median[first] / median[size], 3) for size in sizes},
        f"gradient_max_relative_difference_against_{first}": {
            str(size): relative_difference(grads[size], grads[first]) for size in sizes[1:]
        },
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,2,4", help="micro-batch sizes, the first the reference (1,2,4)")
    parser.add_argument("--experiment", default="countdown_hierarchy")
    parser.add_argument("--sft-steps", type=int, default=3, help="SFT steps timed per arm and round")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds after the warm-up")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) on the experiment")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: give micro-batch sizes as integers, e.g. 1,2,4")
    if len(sizes) < 2 or min(sizes) < 1:
        parser.error(f"--sizes {args.sizes!r}: give at least two sizes, each at least 1")
    machine = machine_info(
        torch=torch.__version__,
        transformers=transformers.__version__,
        torch_cpu_kernels=torch.backends.cpu.get_cpu_capability(),
    )
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config([f"experiment={args.experiment}", f"run_dir={tmp}/run", *args.overrides])
        system = build_system(cfg)
        ranks = Ranks()
        trainer = policy_trainer(cfg, system, ranks, lr_scale=cfg.sft.lr_scale)
        demos = episode_batches(sft_turns(cfg, system), cfg.sft.batch_size, args.sft_steps)
        sft = measure(trainer, "sft", demos, sizes, args.repeats)
        print(f"sft: {sft['seconds_per_step']} s a step", flush=True)
        trainer = policy_trainer(cfg, system, ranks)  # GRPO's learning rate, a fresh optimizer
        pool = cfg.tasks(cfg.train.task, "train", cfg.train.pool)
        episodes, _ = rollout(cfg, system, pool, Stage(stage="grpo"), ranks)
        score(episodes)
        assign_credit(cfg, trainer, episodes)
        grpo = measure(trainer, "grpo", [training_turns(episodes)], sizes, args.repeats)
        print(f"grpo update: {grpo['seconds_per_step']} s", flush=True)
    result = {
        "sft": sft,
        "grpo": grpo,
        "settings": {
            "experiment": args.experiment,
            "overrides": args.overrides,
            "sizes": sizes,
            "dtype": str(system.backbone.model.dtype),
            "shared_prefix": cfg.train.shared_prefix,
            "sft_batch_size": cfg.sft.batch_size,
            "grpo_rollout": rollout_note(cfg),
            "rounds": f"{args.repeats} timed after an untimed warm-up, the arms' order reversed each; medians",
        },
        "machine": machine,
    }
    write_result(result, args.out)
    speedups = {kind: result[kind][f"speedup_against_{sizes[0]}"] for kind in ("sft", "grpo")}
    print(f"speed-up against {sizes[0]} turn(s) a pass: {speedups}; wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
