"""What `train.shared_prefix` saves in a step of the default experiment, on the real backbone.

    python -m bench.shared_prefix                                  # fresh adapters (an untrained rollout)
    python -m bench.shared_prefix adapters=runs/<run>/checkpoints/sft-best   # 23 minutes on 2 AVX2-only cores
    python -m bench.shared_prefix --sft-steps 1 --repeats 1 train.tasks_per_step=2 --out /tmp/sp.json  # smoke

Two kinds of step, each timed with the turns' common prefixes run once (`shared_prefix=true`) and turn
by turn (`false`), the arms alternating, `--repeats` rounds after an untimed warm-up of each:

- SFT: `--sft-steps` steps of the default demonstrations (`sft.batch_size` episodes each);
- GRPO: the update on one rollout batch of the default experiment (`train.tasks_per_step` tasks x G),
  every turn kept (no zero-variance filter: an all-equal group costs the same passes, its advantage 0).

Before each timed step the adapters are put back, so both arms train the same weights on the same turns;
each arm's gradients on the first timed step are compared (the largest difference relative to the
largest gradient). Writes bench/results/shared_prefix.json: seconds per step of each arm, the speed-up,
the share of tokens the prefixes saved (`train/prefix_tokens_saved`), settings and machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

from bench.common import RESULTS_DIR, machine_info, write_result
from meta_agent.config import load_config
from meta_agent.episode.reward import score
from meta_agent.learning.credit import assign_advantages, training_turns
from meta_agent.learning.sft import sft_turns
from meta_agent.learning.train import Stage, rollout
from meta_agent.system import build_system, policy_trainer
from training.distributed import Ranks
from training.trainer import PolicyTrainer
from training.types import Turn

RESULTS = RESULTS_DIR / "shared_prefix.json"
ARMS = (True, False)  # train.shared_prefix


def episode_batches(turns: list[Turn], size: int, steps: int) -> list[list[Turn]]:
    """The first `steps` SFT batches of `size` demonstration episodes each."""
    episodes: dict[int, list[Turn]] = {}
    for t in turns:
        episodes.setdefault(t.episode, []).append(t)
    order = sorted(episodes)
    return [[t for e in order[i * size : (i + 1) * size] for t in episodes[e]] for i in range(steps)]


def rollout_note(cfg) -> str:
    """What the timed GRPO update trained on, in the results' settings."""
    return (
        f"{cfg.train.tasks_per_step} tasks x G={cfg.train.group_size}, step 1's tasks and seed, every turn "
        "kept (no zero-variance filter)"
    )


def timed_step(
    trainer: PolicyTrainer, kind: str, turns: list[Turn], shared: bool
) -> tuple[float, dict, dict]:
    """One step from the same adapters: its seconds, its metrics and the gradients it took."""
    params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    start = [p.detach().clone() for p in params]
    trainer.update.shared_prefix = shared
    grads: dict[int, torch.Tensor] = {}
    real_step = trainer._optimizer_step

    def keep_grads():
        grads.update({i: p.grad.detach().clone() for i, p in enumerate(params) if p.grad is not None})
        return real_step()

    trainer._optimizer_step = keep_grads
    began = time.perf_counter()
    metrics = trainer.sft_step(turns) if kind == "sft" else trainer.grpo_step(turns)
    seconds = time.perf_counter() - began
    trainer._optimizer_step = real_step
    with torch.no_grad():
        for p, s in zip(params, start, strict=True):
            p.copy_(s)
    return seconds, metrics, grads


def relative_difference(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]) -> float | None:
    """The largest |a - b| over every gradient entry, relative to the largest |b|; None where every
    gradient is 0 (a rollout whose groups all scored alike: no comparison)."""
    if set(a) != set(b):
        raise AssertionError("the arms gave gradients to different parameters")
    top = max((float(g.abs().max()) for g in b.values()), default=0.0)
    if top == 0:
        return None
    return max(float((a[i] - b[i]).abs().max()) for i in b) / top


def measure(trainer: PolicyTrainer, kind: str, batches: list[list[Turn]], repeats: int) -> dict:
    """Both arms over `batches`, `repeats` rounds after an untimed warm-up round, arms alternating."""
    seconds: dict[bool, list[float]] = {arm: [] for arm in ARMS}
    saved: list[float] = []
    difference = None
    for round_ in range(repeats + 1):
        arms = ARMS if round_ % 2 == 0 else ARMS[::-1]
        grads = {}
        for arm in arms:
            total = 0.0
            for i, batch in enumerate(batches):
                s, metrics, g = timed_step(trainer, kind, batch, arm)
                total += s
                if i == 0:
                    grads[arm] = g
                if arm and round_ > 0:
                    saved.append(metrics.get("train/prefix_tokens_saved", 0.0))
            if round_ > 0:
                seconds[arm].append(total / len(batches))
        if round_ == 1:
            difference = relative_difference(grads[True], grads[False])
    shared, whole = statistics.median(seconds[True]), statistics.median(seconds[False])
    return {
        "steps_per_round": len(batches),
        "turns_per_step": round(statistics.mean(len(b) for b in batches), 1),
        "tokens_per_step": round(
            statistics.mean(sum(len(t.prompt_ids) + len(t.completion_ids) for t in b) for b in batches), 1
        ),
        "seconds_per_step": {"shared_prefix": round(shared, 3), "turn_by_turn": round(whole, 3)},
        "all_seconds": {"shared_prefix": seconds[True], "turn_by_turn": seconds[False]},
        "speedup": round(whole / shared, 3),
        "prefix_tokens_saved": round(statistics.mean(saved), 4) if saved else None,
        "gradient_max_relative_difference": difference,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft-steps", type=int, default=3, help="SFT steps timed per arm and round")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds after the warm-up")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "overrides", nargs="*", help="config overrides (key=value) on experiment=arith_hierarchy"
    )
    args = parser.parse_args(argv)
    machine = machine_info(
        torch=torch.__version__,
        transformers=transformers.__version__,
        torch_cpu_kernels=torch.backends.cpu.get_cpu_capability(),
    )
    with tempfile.TemporaryDirectory() as tmp:
        overrides = ["experiment=arith_hierarchy", f"run_dir={tmp}/run", *args.overrides]
        cfg = load_config(overrides)
        system = build_system(cfg)
        ranks = Ranks()
        trainer = policy_trainer(cfg, system, ranks)
        demos = episode_batches(sft_turns(cfg, system), cfg.sft.batch_size, args.sft_steps)
        sft = measure(trainer, "sft", demos, args.repeats)
        print(
            f"sft: {sft['seconds_per_step']}, speed-up {sft['speedup']}, saved {sft['prefix_tokens_saved']}"
        )
        pool = cfg.tasks(cfg.train.task, "train", cfg.train.pool)
        episodes, _ = rollout(cfg, system, pool, Stage(stage="grpo"), ranks)
        score(episodes)
        assign_advantages(episodes, scale=cfg.grpo.scale_advantages, kind=cfg.grpo.advantage)
        turns = training_turns(episodes)
        grpo = measure(trainer, "grpo", [turns], args.repeats)
        print(
            f"grpo: {grpo['seconds_per_step']}, speed-up {grpo['speedup']}, saved {grpo['prefix_tokens_saved']}"
        )
    result = {
        "sft": sft,
        "grpo": grpo,
        "settings": {
            "experiment": "arith_hierarchy",
            "overrides": args.overrides,
            "dtype": str(system.backbone.model.dtype),
            "micro_batch_size": cfg.train.micro_batch_size,
            "sft_batch_size": cfg.sft.batch_size,
            "grpo_rollout": rollout_note(cfg),
            "repeats": args.repeats,
            "order": "arms alternate each round after an untimed warm-up round; medians",
        },
        "machine": machine,
    }
    write_result(result, args.out)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
