"""GRPO rollout speed of this checkout against an earlier commit, side by side in one run.

    python -m bench.speed --adapters runs/X/checkpoints/sft-best                 # the default experiment
    python -m bench.speed --baseline e0fe577 --experiment arith_hierarchy       # fresh adapters
    python -m bench.speed --tasks 1 --group 2 --rounds 1 --out /tmp/speed.json  # smoke test

Each arm is one subprocess in its own source tree (the checkout, and `--baseline` extracted with `git
archive` into a temporary folder) that builds the experiment's system as training does (memory off),
plays one untimed warm-up rollout, then `--rounds` rollouts of `--tasks` train problems x `--group`
episodes each, sampled at the roles' temperatures with fixed seeds, as a GRPO step's rollout; then one
greedy rollout. The arms alternate round by round (baseline first), so load drifts hit both.

Reported: generated tokens/s per arm (median of the rounds) and `rollout_speedup` (this / baseline);
whether the outputs agree: the greedy rollouts' token ids and, for the sampled rollouts, the tokens up to
the first that differs and the largest logprob difference before it. Writes bench/results/speed.json
with the machine. A measurement, not a test: run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(args: argparse.Namespace) -> None:
    """One arm, in the source tree it was started in: print one JSON line per rollout."""
    import torch

    from meta_agent.config import load_config
    from meta_agent.system import build_system
    from meta_agent.tasks import load_tasks

    try:
        from meta_agent.episode.runner import play
    except ImportError:  # before the sub-packages (issue 53)
        from meta_agent.runner import play

    overrides = [f"experiment={args.experiment}", "memory.enabled=false", f"run_dir={args.run_dir}"]
    if args.adapters:
        overrides.append(f"adapters={args.adapters}")
    cfg = load_config([*overrides, *args.overrides])
    system = build_system(cfg)
    need = args.tasks * (args.rounds + 2)
    pool = load_tasks(cfg.train.task, "train", limit=need, seed=cfg.seed)

    def rollout(index: int, temperature: float | None) -> dict:
        tasks = pool[index * args.tasks : (index + 1) * args.tasks]
        episodes = [system.factory.new(t) for t in tasks for _ in range(args.group)]
        generated = 0
        generate = system.backend.generate

        def counted(requests):
            nonlocal generated
            results = generate(requests)
            generated += sum(len(r.token_ids) for r in results)
            return results

        system.backend.generate = counted
        started = time.perf_counter()
        play(episodes, system.backend, seed=1000 + index, temperature=temperature)
        seconds = time.perf_counter() - started
        system.backend.generate = generate
        turns = [
            [[list(t.completion_ids), [round(x, 5) for x in t.logprobs]] for t in ep.turns] for ep in episodes
        ]
        return {"index": index, "seconds": round(seconds, 3), "generated": generated, "turns": turns}

    print(json.dumps({"ready": True, "threads": torch.get_num_threads()}), flush=True)
    for line in sys.stdin:  # the parent says when to run each round, so the arms alternate
        command = json.loads(line)
        if command == "quit":
            break
        print(json.dumps(rollout(command["index"], command["temperature"])), flush=True)
    system.close()


class Arm:
    """A worker subprocess in `tree`, driven a round at a time."""

    def __init__(self, name: str, tree: Path, args: argparse.Namespace, run_dir: Path):
        self.name = name
        # This file's worker, importing the arm's tree (PYTHONPATH comes before the editable install).
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--experiment", args.experiment]
        cmd += ["--tasks", str(args.tasks), "--group", str(args.group), "--rounds", str(args.rounds)]
        cmd += ["--run-dir", str(run_dir)] + (["--adapters", args.adapters] if args.adapters else [])
        cmd += ["--", *args.overrides]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.ready = self._read()

    def _read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the {self.name} arm exited ({self.proc.wait()}) before answering")
            if line.startswith("{"):
                return json.loads(line)

    def run(self, index: int, temperature: float | None) -> dict:
        self.proc.stdin.write(json.dumps({"index": index, "temperature": temperature}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write('"quit"\n')
            self.proc.stdin.flush()
            self.proc.wait(timeout=120)


def agreement(ours: dict, theirs: dict) -> dict:
    """How far two arms' rollouts of the same problems and seeds agree: each episode's turns in order,
    up to the first token that differs (after it the prompts differ too)."""
    episodes = same_episodes = tokens = 0
    max_diff = 0.0
    for ours_turns, theirs_turns in zip(ours["turns"], theirs["turns"], strict=True):
        episodes += 1
        for (a_ids, a_lp), (b_ids, b_lp) in zip(ours_turns, theirs_turns, strict=False):
            pairs = zip(a_ids, b_ids, strict=False)
            n = next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(a_ids), len(b_ids)))
            tokens += n
            max_diff = max([max_diff, *(abs(x - y) for x, y in zip(a_lp[:n], b_lp[:n], strict=False))])
            if a_ids != b_ids:
                break
        else:
            same_episodes += len(ours_turns) == len(theirs_turns)
    return {
        "episodes": episodes,
        "identical_episodes": same_episodes,
        "tokens_before_first_difference": tokens,
        "max_abs_logprob_diff_before_it": round(max_diff, 5),
    }


def extract(rev: str, into: Path) -> Path:
    """The tree of commit `rev` of this repository, unpacked under `into`."""
    archive = into / "tree.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), rev], check=True)
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", default="e0fe577", help="the commit to compare with (e0fe577)")
    p.add_argument("--experiment", default="countdown_hierarchy")
    p.add_argument("--adapters", default=None, help="role adapters both arms load (default: fresh, seeded)")
    p.add_argument("--tasks", type=int, default=3, help="problems a rollout (3, as the default's GRPO step)")
    p.add_argument("--group", type=int, default=4, help="episodes a problem (4)")
    p.add_argument("--rounds", type=int, default=3, help="timed sampled rollouts an arm (3)")
    p.add_argument("--out", type=Path, default=None, help="default: bench/results/speed.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="config overrides both arms get")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    # The parent only: a worker imports the tree it measures, which may predate these helpers.
    from bench.common import RESULTS_DIR, machine_info, write_result

    started = time.perf_counter()
    import torch

    # Before the runs: the load they start under, and the kernels torch picks on this CPU.
    machine = machine_info(torch=torch.__version__, cpu_capability=torch.backends.cpu.get_cpu_capability())
    with tempfile.TemporaryDirectory(prefix="bench-speed-") as tmp:
        tmp = Path(tmp)
        baseline_tree = extract(args.baseline, tmp)
        arms = {
            "baseline": Arm("baseline", baseline_tree, args, tmp / "run-baseline"),
            "this": Arm("this", ROOT, args, tmp / "run-this"),
        }
        rounds: dict[str, list[dict]] = {name: [] for name in arms}
        greedy: dict[str, dict] = {}
        try:
            for arm in arms.values():  # an untimed warm-up, one arm at a time
                arm.run(args.rounds + 1, None)
            for index in range(args.rounds):
                for name, arm in arms.items():
                    rounds[name].append(arm.run(index, None))
                    r = rounds[name][-1]
                    print(f"{name} round {index}: {r['generated']} tokens in {r['seconds']} s", flush=True)
            for name, arm in arms.items():
                greedy[name] = arm.run(args.rounds, 0.0)
        finally:
            for arm in arms.values():
                arm.close()
    rates = {
        name: statistics.median(r["generated"] / r["seconds"] for r in rs) for name, rs in rounds.items()
    }
    result = {
        "baseline": args.baseline,
        "experiment": args.experiment,
        "adapters": args.adapters or "fresh (seeded)",
        "overrides": list(args.overrides),
        "episodes_per_rollout": args.tasks * args.group,
        "rounds": args.rounds,
        "arms": {
            name: {
                "tokens_per_s_median": round(rates[name], 1),
                "seconds": [r["seconds"] for r in rs],
                "generated_tokens": [r["generated"] for r in rs],
                "greedy_seconds": greedy[name]["seconds"],
                "threads": arms[name].ready["threads"],
            }
            for name, rs in rounds.items()
        },
        "rollout_speedup": round(rates["this"] / rates["baseline"], 3),
        "greedy_agreement": agreement(greedy["this"], greedy["baseline"]),
        "sampled_agreement": [
            agreement(a, b) for a, b in zip(rounds["this"], rounds["baseline"], strict=True)
        ],
        # Measured elsewhere (bench.trl_grpo, make run): this bench times rollouts only.
        "update_speedup": None,
        "main_job_seconds_bfloat16": None,
        "main_job_seconds_float32": None,
        "seconds": round(time.perf_counter() - started, 1),
        "machine": machine,
    }
    print(json.dumps({k: result[k] for k in ("rollout_speedup", "greedy_agreement")}))
    write_result(result, args.out or RESULTS_DIR / "speed.json")
    return result


if __name__ == "__main__":
    if "--worker" in sys.argv:
        sys.path.remove(str(Path(__file__).resolve().parent))  # run as a script: bench/ must not shadow
    main(sys.argv[1:])
