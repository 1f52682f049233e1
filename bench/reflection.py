"""What reflection does in a trained run: the reflection metrics and the counterfactual probes of the
adapters before GRPO (after SFT, `sft-best`) and after it (the latest checkpoint).

    python -m bench.reflection --run runs/arith_hierarchy-20261201-120000      # a default-experiment run
    python -m bench.reflection --run RUN --limit 8                              # a smoke test

For each of the two adapter sets, one `meta-agent probe` on the experiment's held-out problems with two
rounds allowed (the experiment trains with one; with two a revision can change the answer, so there are
transitions between rounds). Its base arm is the unmodified hierarchy, greedy, memory off: its
reflection metrics (self-correction, verdict calibration, plan adherence) are the stage's; its
`no_reflection` arm is the experiment's one-round protocol on the same problems; its mixed arm takes the
meta-thinker of the other adapter set (so the difference shows what that role's training did). Writes
bench/results/reflection.json: per stage, the base arm's accuracy with its interval and its reflection
metrics, and each arm's accuracy and paired difference; the machine, settings and wall time. A
measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers

from bench.common import RESULTS_DIR, machine_info, write_result
from meta_agent.analysis.stats import mean_interval

RESULTS = RESULTS_DIR / "reflection.json"
EXPERIMENT = "arith_hierarchy"
KEPT = (  # the reflection metrics a reader compares (every one is in probe.json's base arm)
    "verdicts",
    "accept_given_right",
    "accept_given_wrong",
    "revise_given_wrong",
    "revise_precision",
    "revise_recall",
    "revision_rate",
    "revise_same_plan_rate",
    "revise_same_answer_rate",
    "transitions",
    "wrong_to_right",
    "right_to_wrong",
    "self_correction",
    "rounds_used",
    "final_answer_round",
    "answer_leaks",
    "plan_adherence",
    "plan_adherence_episodes",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a run folder of the default experiment")
    p.add_argument("--limit", type=int, default=64, help="held-out problems per probe (64)")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"result file (default {RESULTS})")
    p.add_argument("overrides", nargs="*", help="more config overrides for every probe")
    return p.parse_args(argv)


def stages(run: Path) -> dict[str, Path]:
    """The adapters before GRPO (sft-best) and after it (the latest complete checkpoint)."""
    sft = run / "checkpoints" / "sft-best"
    latest_file = run / "checkpoints" / "latest"
    latest = latest_file.read_text().strip() if latest_file.is_file() else "latest"
    found = {"before_grpo": sft, "after_grpo": run / "checkpoints" / latest}
    missing = [str(p) for p in found.values() if not p.is_dir()]
    if missing:
        raise SystemExit(f"{run} lacks {missing}: pass a finished run of experiment={EXPERIMENT}")
    return found


def probe(args: list[str], out: Path) -> dict:
    """Run `meta-agent probe` as a user does; returns its probe.json and the seconds it took."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    shutil.rmtree(out, ignore_errors=True)  # this bench's own folder: a rerun measures afresh, into it
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "meta_agent", "probe", *args, f"run_dir={out}"],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"meta-agent probe failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {
        "wall_seconds": round(time.perf_counter() - started, 1),
        **json.loads((out / "probe.json").read_text()),
    }


def summary(result: dict) -> dict:
    """The base arm's accuracy, interval and reflection metrics; each arm's paired difference."""
    base = result["arms"]["base"]
    low, high = mean_interval([float(c) for c in base["correct"]])[1:]
    arms = {}
    for name, arm in result["arms"].items():
        diff = arm["difference"]
        arms[name] = {
            "accuracy": arm["accuracy"],
            "difference": None if diff is None else round(diff["mean"], 4),
            "interval": None if diff is None else [round(diff["low"], 4), round(diff["high"], 4)],
            "better_worse": None if diff is None else [diff["better"], diff["worse"]],
            "p_value": None if diff is None else round(diff["p_value"], 4),
            "note": arm["note"],
        }
    return {
        "problems": result["problems"],
        "accuracy": base["accuracy"],
        "interval": [round(low, 4), round(high, 4)],
        "reflection": {k: base["reflection"].get(f"reflection/{k}") for k in KEPT},
        "arms": arms,
        "probe_seconds": result["seconds"],
        "wall_seconds": result["wall_seconds"],
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    machine = machine_info(torch=torch.__version__, transformers=transformers.__version__)
    found = stages(args.run)
    work = args.run / "bench-reflection"
    result: dict = {"run": str(args.run), "stages": {}}
    for stage, adapters in found.items():
        other = found["after_grpo" if stage == "before_grpo" else "before_grpo"]
        probe_args = [
            f"experiment={EXPERIMENT}",
            "memory.enabled=false",
            f"adapters={adapters}",
            f"probe.limit={args.limit}",
            f"probe.meta_thinker_from={other}",
            "protocol.max_rounds=2",  # so that reflection can revise and no_reflection differs from the base
            *args.overrides,
        ]
        result["stages"][stage] = {"adapters": str(adapters), **summary(probe(probe_args, work / stage))}
        print(json.dumps({stage: result["stages"][stage]}, indent=1), flush=True)
    result |= {
        "wall_seconds": round(time.perf_counter() - started, 1),
        "settings": {
            "experiment": EXPERIMENT,
            "probe": f"arith test, {args.limit} problems, greedy, memory off, two rounds allowed; "
            "mixed: the meta-thinker of the other stage with this stage's executors",
            "overrides": args.overrides,
        },
        "machine": machine,
    }
    return write_result(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
