"""Is Countdown a task reflection can pay on? The first attempt of a trained hierarchy, and what a second
attempt after a revise adds, on held-out problems of each size.

    python -m bench.countdown_attempts --adapters runs/X/checkpoints/sft-best --problems 64
    python -m bench.countdown_attempts --adapters runs/X --sizes 3 --samples 4 protocol.max_rounds=2

Per size (3 or 4 numbers): the share of problems whose first round is right (greedy, or the mean over
`--samples` sampled episodes at the roles' temperatures), the share right after the second, and of the
first rounds that missed, the share revised and the share the second round turned right. Writes
bench/results/countdown_attempts.json (the machine, versions and settings with it). A measurement, not a
test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from bench.common import RESULTS_DIR, machine_info, write_result
from meta_agent.config import load_config
from meta_agent.episode.reward import score
from meta_agent.episode.runner import play
from meta_agent.system import build_system
from meta_agent.tasks.countdown import make_countdown_tasks
from roles import REVISE

RESULTS = RESULTS_DIR / "countdown_attempts.json"


def attempt_rates(episodes) -> dict[str, float | int]:
    """First-round and final accuracy of finished episodes; of first rounds that missed, the shares revised
    and turned right by the second round. attempt_rates of two episodes, one right at once and one
    missed, revised and then right -> first 0.5, final 1.0, missed 1, revised 1.0, fixed 1.0."""
    n = len(episodes)
    missed = [ep for ep in episodes if not ep.rounds[0].correct]
    revised = [ep for ep in missed if ep.rounds[0].verdict == REVISE]
    fixed = [ep for ep in missed if len(ep.rounds) > 1 and ep.rounds[1].correct]
    return {
        "episodes": n,
        "first_attempt": round(sum(ep.rounds[0].correct for ep in episodes) / max(n, 1), 4),
        "final": round(sum(ep.correct for ep in episodes) / max(n, 1), 4),
        "missed": len(missed),
        "revised_given_missed": round(len(revised) / len(missed), 4) if missed else None,
        "fixed_given_missed": round(len(fixed) / len(missed), 4) if missed else None,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--adapters", required=True, help="a run folder, checkpoint or adapters folder")
    p.add_argument("--experiment", default="countdown_hierarchy")
    p.add_argument("--problems", type=int, default=64, help="held-out problems per size (64)")
    p.add_argument("--sizes", default="3,4", help="how many numbers a problem gives, e.g. 3,4")
    p.add_argument("--samples", type=int, default=0, help="sampled episodes per problem; 0: greedy (0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. protocol.max_rounds=2")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    overrides = [f"experiment={args.experiment}", f"adapters={args.adapters}", "memory.enabled=false"]
    cfg = load_config([*overrides, *args.overrides, "run_dir=runs/bench-countdown-attempts"])
    system = build_system(cfg)
    temperature = 0.0 if args.samples == 0 else None
    per = max(args.samples, 1)
    sizes = {}
    for size in (int(s) for s in args.sizes.split(",")):
        tasks = make_countdown_tasks("test", args.problems, seed=args.seed, size=size)
        episodes = [system.factory.new(t) for t in tasks for _ in range(per)]
        for start in range(0, len(episodes), cfg.eval.episodes_per_batch):
            batch = episodes[start : start + cfg.eval.episodes_per_batch]
            play(batch, system.backend, seed=args.seed, temperature=temperature, first_index=start)
        score(episodes)
        sizes[str(size)] = attempt_rates(episodes)
        print(size, json.dumps(sizes[str(size)]), flush=True)
    system.close()
    result = {
        "adapters": args.adapters,
        "experiment": args.experiment,
        "overrides": list(args.overrides),
        "problems_per_size": args.problems,
        "samples": args.samples or "greedy",
        "sizes": sizes,
        "seconds": round(time.perf_counter() - started, 1),
        "machine": machine_info(torch=torch.__version__, torch_threads=str(torch.get_num_threads())),
    }
    write_result(result, args.out)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
