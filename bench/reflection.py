"""What reflection does in a trained run: the reflection metrics and the counterfactual probes of the
adapters before GRPO (after SFT, `sft-best`) and after it (the latest checkpoint).

    python -m bench.reflection --run runs/arith_hierarchy-20261201-120000      # a default-experiment run
    python -m bench.reflection --run RUN --eval-limit 8 --probe-limit 8        # a smoke test

For each of the two adapter sets: `meta-agent eval` on the experiment's held-out problems with two
rounds allowed (the experiment trains with one; with two a revision can change the answer, so there are
transitions between rounds; the first round is what one round gives, greedy, so its accuracy is kept
too), and `meta-agent probe` with two rounds as well, its mixed arm taking the meta-thinker of
the other adapter set (so the difference shows what that role's training did). Writes
bench/results/reflection.json: per stage, the eval's accuracy after one and after two rounds and its
reflection metrics, and each probe arm's accuracy and paired difference; the machine, settings and wall
time. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers

from bench.common import RESULTS_DIR, machine_info, write_result

RESULTS = RESULTS_DIR / "reflection.json"
EXPERIMENT = "arith_hierarchy"
KEPT = (  # the reflection metrics a reader compares (every one is in the runs' eval.json)
    "verdicts",
    "accept_given_right",
    "accept_given_wrong",
    "revise_given_wrong",
    "revise_precision",
    "revision_rate",
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
    p.add_argument(
        "--eval-limit", type=int, default=48, help="held-out problems per eval (48, as the experiment)"
    )
    p.add_argument("--probe-limit", type=int, default=64, help="problems per probe (64)")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"result file (default {RESULTS})")
    p.add_argument("overrides", nargs="*", help="more config overrides for every eval and probe")
    return p.parse_args(argv)


def stages(run: Path) -> dict[str, Path]:
    """The adapters before GRPO (sft-best) and after it (the latest complete checkpoint)."""
    sft = run / "checkpoints" / "sft-best"
    latest = (run / "checkpoints" / "latest").read_text().strip()
    found = {"before_grpo": sft, "after_grpo": run / "checkpoints" / latest}
    missing = [str(p) for p in found.values() if not p.is_dir()]
    if missing:
        raise SystemExit(f"{run} lacks {missing}: pass a finished run of experiment={EXPERIMENT}")
    return found


def cli(command: str, args: list[str], out: Path) -> dict:
    """Run `meta-agent <command>` as a user does; returns its result file."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "meta_agent", command, *args, f"run_dir={out}"],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"meta-agent {command} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    name = "eval.json" if command == "eval" else "probe.json"
    return {"seconds": round(time.perf_counter() - started, 1), **json.loads((out / name).read_text())}


def summary_of_eval(result: dict) -> dict:
    """Accuracy, its interval and the reflection metrics of an eval.json's one seed and one task."""
    by_seed = {k: v for k, v in result.items() if k != "seconds"}
    arith = next(iter(by_seed.values()))["arith"]
    reflection = {k: arith["reflection"].get(f"reflection/{k}") for k in KEPT}
    return {
        "accuracy": arith["accuracy"],
        "interval": arith["interval"],
        "problems": arith["total"],
        **reflection,
    }


def first_round(traces: Path) -> dict:
    """The accuracy of the first round's answers: what one round, the experiment's protocol, gives."""
    rows = [json.loads(line) for line in traces.read_text().splitlines() if line.strip()]
    first = [row["rounds"][0]["correct"] for row in rows]
    return {"first_round_accuracy": sum(first) / len(first)}


def summary_of_probe(result: dict) -> dict:
    """Each arm's accuracy and paired difference from the base, of a probe.json."""
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
    return {"problems": result["problems"], "seconds": result["seconds"], "arms": arms}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    machine = machine_info(torch=torch.__version__, transformers=transformers.__version__)
    found = stages(args.run)
    work = args.run / "bench-reflection"
    common = [f"experiment={EXPERIMENT}", "memory.enabled=false", *args.overrides]
    result: dict = {"run": str(args.run), "stages": {}}
    for stage, adapters in found.items():
        other = found["after_grpo" if stage == "before_grpo" else "before_grpo"]
        out = work / f"{stage}-eval"
        eval_args = [*common, f"adapters={adapters}", "eval.tasks=[arith]", f"eval.limit={args.eval_limit}"]
        raw = cli("eval", [*eval_args, "protocol.max_rounds=2"], out)
        evals = {"seconds": raw["seconds"], **summary_of_eval(raw), **first_round(out / "traces.jsonl")}
        probe_args = [
            *common,
            f"adapters={adapters}",
            f"probe.limit={args.probe_limit}",
            f"probe.meta_thinker_from={other}",
            "protocol.max_rounds=2",  # so that no_reflection (one round) differs from the base
        ]
        probe = summary_of_probe(cli("probe", probe_args, work / f"{stage}-probe"))
        result["stages"][stage] = {"adapters": str(adapters), "eval": evals, "probe": probe}
        print(json.dumps({stage: result["stages"][stage]}, indent=1), flush=True)
    result |= {
        "wall_seconds": round(time.perf_counter() - started, 1),
        "settings": {
            "experiment": EXPERIMENT,
            "eval": f"arith test, {args.eval_limit} problems, greedy, memory off, two rounds allowed",
            "probe": f"arith test, {args.probe_limit} problems, greedy, two rounds allowed; "
            "mixed: the meta-thinker of the other stage with this stage's executors",
            "overrides": args.overrides,
        },
        "machine": machine,
    }
    return write_result(result, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
