"""Internal memory against truncation: the meta-thinker's running notes (`memory.internal=summary`) against
nothing carried between reflections (`truncate`), on the reflection task with three rounds.

    python -m bench.internal_memory --seeds 0,1
    python -m bench.internal_memory --seeds 0 --grpo-steps 2 --limit 24

Per seed and internal memory: the reflection task's hierarchy (distract_hierarchy) is trained as `meta-agent
train` does it with `memory.internal=<mode>` (SFT on demonstrations whose reflections write notes under
summary and none under truncate, then --grpo-steps GRPO steps). The training run's own held-out evaluations
are cut to one problem: they choose nothing, since the task's SFT evaluates once, at its last step
(`sft.eval_every` = `sft.max_steps`; other overrides are refused), so its adapters are the last step's
whatever that problem scores, and the measurement is the evaluation below. Its adapters are then evaluated greedily on --limit
held-out problems with `protocol.max_rounds` --rounds (the task trains with two) and
`protocol.max_new_tokens` 480 a round, memory (lessons) off, the last round's reflection skipped (it can
change no answer): accuracy, prompt and generated tokens per episode, rounds per episode, and what the
reflections did.

Writes the `summary_minus_truncate` key of bench/results/planning.json (its other keys are kept): per seed
both arms; `mean` and its paired bootstrap interval over every seed's problems (summary minus truncate);
over seeds the mean difference with its Student's t interval (none for one seed); each arm's mean accuracy,
prompt tokens and generated tokens per episode. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import torch
import transformers

from bench.common import RESULTS_DIR, machine_info
from bench.learning import parse_seeds, run
from bench.planning import greedy_episodes
from meta_agent.analysis.stats import mean_interval, paired_difference, seed_interval
from meta_agent.config import load_config
from meta_agent.system import build_system
from training.model_files import torch_dtype

RESULTS = RESULTS_DIR / "planning.json"
KEY = "summary_minus_truncate"
EXPERIMENT = "distract_hierarchy"
MODES = ("truncate", "summary")
TOKENS_PER_ROUND = 480  # the task's two rounds train at 960 generated tokens (configs/experiment)
REFLECTION_KEPT = (
    "revision_rate",
    "self_correction",
    "wrong_to_right",
    "right_to_wrong",
    "revise_recall",
    "rounds_used",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=parse_seeds, default=[0], help="seeds, e.g. 0,1 (0)")
    p.add_argument("--rounds", type=int, default=3, help="rounds allowed at evaluation (3)")
    p.add_argument("--limit", type=int, default=48, help="held-out problems per seed (48)")
    p.add_argument("--grpo-steps", type=int, default=0, help="GRPO steps after SFT (0: SFT alone)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("overrides", nargs="*", help="config overrides for training and evaluation")
    args = p.parse_args(argv)
    if args.rounds < 3:
        p.error(f"--rounds {args.rounds}: internal memory is measured with three rounds or more")
    if args.limit < 1 or args.grpo_steps < 0:
        p.error("--limit must be >= 1 and --grpo-steps >= 0")
    return args


def trained(seed: int, mode: str, args: argparse.Namespace) -> tuple[Path, float]:
    """The adapters the task's hierarchy ends with under `mode`, and the training's wall seconds."""
    overrides = [
        *args.overrides,
        f"seed={seed}",
        f"memory.internal={mode}",
        f"train.steps={args.grpo_steps}",
        "train.eval_limit=1",  # chooses nothing (below); the measurement is evaluated(), on --limit problems
    ]
    sft = load_config([f"experiment={EXPERIMENT}", *overrides]).sft
    if sft.eval_every < sft.max_steps:
        raise SystemExit(
            f"sft.eval_every={sft.eval_every} below sft.max_steps={sft.max_steps} would pick SFT adapters on "
            "one held-out problem: leave sft.eval_every at the task's (its max_steps)"
        )
    _, seconds, run_dir = run(EXPERIMENT, overrides, f"memory-{mode}-seed{seed}")
    latest = (run_dir / "checkpoints" / "latest").read_text().strip() if args.grpo_steps else "sft-best"
    return run_dir / "checkpoints" / latest, seconds


def evaluated(seed: int, mode: str, adapters: Path, args: argparse.Namespace) -> dict:
    """Greedy held-out episodes of `adapters` with --rounds rounds: per problem correct, and the means."""
    cfg = load_config(
        [
            f"experiment={EXPERIMENT}",
            *args.overrides,
            f"seed={seed}",
            f"memory.internal={mode}",
            f"adapters={adapters}",
            "memory.enabled=false",
            f"protocol.max_rounds={args.rounds}",
            f"protocol.max_new_tokens={TOKENS_PER_ROUND * args.rounds}",
            f"run_dir=runs/bench-memory-eval-{mode}-seed{seed}",
        ]
    )
    tasks = {cfg.train.eval_task: cfg.tasks(cfg.train.eval_task, "test", args.limit)}
    system = build_system(cfg)
    try:
        played, scores, seconds = greedy_episodes(cfg, system, tasks, seed, final_reflection=False)
    finally:
        system.close()
    score = scores[cfg.train.eval_task]
    episodes = played.episodes
    return {
        "adapters": str(adapters),
        "accuracy": score.accuracy,
        "interval": mean_interval([float(ep.correct) for ep in episodes]),
        "correct": [int(ep.correct) for ep in episodes],
        "prompt_tokens_per_episode": score.prompt_tokens / len(episodes),
        "generated_tokens_per_episode": score.generated_tokens / len(episodes),
        "rounds_per_episode": sum(len(ep.rounds) for ep in episodes) / len(episodes),
        "episodes_with_notes": sum(
            any("<notes>" in t.text and "</notes>" in t.text for t in ep.turns) for ep in episodes
        ),
        "reflection": {k: score.reflection.get(f"reflection/{k}") for k in REFLECTION_KEPT},
        "eval_seconds": round(seconds, 1),
    }


def summarise(per_seed: dict[int, dict]) -> dict:
    """Paired over problems (all seeds') and over seeds: summary minus truncate; each arm's means."""
    both = [per_seed[s] for s in per_seed]
    arm_correct = {m: [c for r in both for c in r[m]["correct"]] for m in MODES}
    by_seed = [r["summary"]["accuracy"] - r["truncate"]["accuracy"] for r in both]
    over_seeds = seed_interval(by_seed)
    problems = paired_difference(arm_correct["summary"], arm_correct["truncate"])
    mean = {
        m: {
            key: sum(r[m][key] for r in both) / len(both)
            for key in (
                "accuracy",
                "prompt_tokens_per_episode",
                "generated_tokens_per_episode",
                "rounds_per_episode",
            )
        }
        for m in MODES
    }
    return {
        "mean": problems.mean,
        "over_problems": asdict(problems),
        "over_seeds": asdict(over_seeds),
        "arms": mean,
        "prompt_tokens_summary_minus_truncate": mean["summary"]["prompt_tokens_per_episode"]
        - mean["truncate"]["prompt_tokens_per_episode"],
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    per_seed: dict[int, dict] = {}
    for seed in args.seeds:
        per_seed[seed] = {}
        for mode in MODES:
            adapters, seconds = trained(seed, mode, args)
            per_seed[seed][mode] = evaluated(seed, mode, adapters, args) | {
                "train_seconds": round(seconds, 1)
            }
            print(json.dumps({"seed": seed, "mode": mode, "accuracy": per_seed[seed][mode]["accuracy"]}))
    cfg = load_config([f"experiment={EXPERIMENT}", *args.overrides])
    dtype = str(torch_dtype(cfg.model.dtype, cfg.model.device)).removeprefix("torch.")
    section = {
        **summarise(per_seed),
        "per_seed": {str(s): v for s, v in per_seed.items()},
        "settings": {
            "experiment": EXPERIMENT,
            "overrides": args.overrides,
            "seeds": args.seeds,
            "problems_per_seed": args.limit,
            "rounds": args.rounds,
            "max_new_tokens": TOKENS_PER_ROUND * args.rounds,
            "grpo_steps": args.grpo_steps,
            "sft_steps": cfg.sft.max_steps,
            "dtype": dtype,
            "memory": "lessons off at evaluation",
        },
        "machine": machine_info(torch=torch.__version__, transformers=transformers.__version__),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    # The file's other keys, its own measured_at among them, are another bench's: kept as they are.
    kept = json.loads(args.out.read_text()) if args.out.exists() else {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**kept, KEY: section}, indent=2) + "\n")
    print(json.dumps({k: section[k] for k in ("mean", "over_seeds", "arms")}, indent=1))
    return section


if __name__ == "__main__":
    main()
