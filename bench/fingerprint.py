"""Behaviour fingerprint: the adapters of short real-backbone GRPO runs, hashed, one run per choice.

A change that claims to train the same runs this before and after, in the same --work folder (the SFT
is made once there and every arm starts its GRPO from it), and compares the hashes:

    python -m bench.fingerprint --work /tmp/fp --out /tmp/before.json     # on the old commit
    python -m bench.fingerprint --work /tmp/fp --out /tmp/after.json      # on the new one
    python -m bench.fingerprint --compare /tmp/before.json /tmp/after.json

Each run is the `meta-agent` command in a subprocess, one thread, the default experiment's settings on
the real backbone. The arms cover every advantage estimator, loss aggregation and reflection credit
and the single agent; `advantage_abs` (0: the steps had nothing to learn) says the hashes can differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# GRPO from one real SFT result (so groups differ in reward and the steps move the adapters), kept short.
SFT = [
    "experiment=arith_hierarchy",
    "sft.max_steps=20",
    "sft.eval_every=100",
    "train.eval_limit=4",
    "seed=0",
]
COMMON = [
    "sft.enabled=false",
    "train.tasks_per_step=4",
    "train.group_size=4",
    "train.steps=2",
    "train.eval_limit=2",
    "train.eval_every=100",
    "train.checkpoint_every=2",
    "seed=0",
]

# Each arm's first override names its experiment (arith_hierarchy where it does not).
ARMS: dict[str, list[str]] = {
    "hierarchy": [],
    "single_agent": ["experiment=arith_single_agent"],
    "rloo": ["grpo.advantage=rloo"],
    "reinforce_pp": ["grpo.advantage=reinforce_pp", "grpo.filter_zero_variance=false"],
    "gae": ["grpo.advantage=gae", "grpo.filter_zero_variance=false"],
    "unscaled_seq_mean": ["grpo.scale_advantages=false", "grpo.aggregation=seq-mean-token-mean"],
    "dr_grpo_outcome": ["grpo.aggregation=dr-grpo", "grpo.max_tokens=256", "grpo.zero_variance_of=outcome"],
    "two_rounds_round_credit": [
        "protocol.max_rounds=2",
        "grpo.reflection_credit=round",
        "roles.meta_thinker.reward.improvement_bonus=1",
    ],
    "two_rounds_credit_none": ["protocol.max_rounds=2", "grpo.reflection_credit=none"],
}


def canonical_bytes(path: Path) -> bytes:
    """A file's bytes; a JSON file's as sorted JSON (PEFT keeps target_modules as a set, so their order in
    adapter_config.json changes from one process to the next)."""
    if path.suffix != ".json":
        return path.read_bytes()
    data = json.loads(path.read_text())
    if isinstance(data.get("target_modules"), list):
        data["target_modules"] = sorted(data["target_modules"])
    return json.dumps(data, sort_keys=True).encode()


def adapter_hashes(run_dir: Path) -> dict[str, str]:
    """sha256 of every file under the run's latest checkpoint's adapters folder, by relative path."""
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    folder = run_dir / "checkpoints" / latest / "adapters"
    return {
        str(path.relative_to(folder)): hashlib.sha256(canonical_bytes(path)).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def mean_abs_advantage(run_dir: Path) -> float:
    """The mean over the run's GRPO steps and roles of role/<role>/advantage_abs (0: nothing to learn)."""
    values = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        values += [v for k, v in record.items() if k.endswith("/advantage_abs") and isinstance(v, float)]
    return sum(values) / len(values) if values else 0.0


def meta_agent(command: str, args: list[str], work: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "meta_agent", command, *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"{command} {args} failed (rc {proc.returncode}):\n{proc.stdout[-1500:]}{proc.stderr[-3000:]}"
        )


def fingerprint(arms: list[str], work: Path) -> dict:
    """SFT once into `work`/sft (kept: a later fingerprint with the same `work` starts from it), then
    each arm's GRPO steps from its sft-best adapters."""
    sft_best = work / "sft" / "checkpoints" / "sft-best"
    if not sft_best.exists():
        meta_agent("sft", [*SFT, f"run_dir={work / 'sft'}", f"memory.path={work / 'sft-memory'}"], work)
    results = {}
    for name in arms:
        run_dir = work / name
        shutil.rmtree(run_dir, ignore_errors=True)
        experiment = [] if ARMS[name][:1] and ARMS[name][0].startswith("experiment=") else SFT[:1]
        args = [*experiment, *ARMS[name], *COMMON, f"adapters={sft_best}", f"run_dir={run_dir}"]
        meta_agent("train", [*args, f"memory.path={work / (name + '-memory')}"], work)
        results[name] = {
            "overrides": ARMS[name],
            "adapters": adapter_hashes(run_dir),
            "advantage_abs": mean_abs_advantage(run_dir),
        }
        print(f"{name}: advantage_abs {results[name]['advantage_abs']:.4f}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"commit": commit, "sft": SFT, "common": COMMON, "arms": results}


def compare(before: dict, after: dict) -> list[str]:
    """The arms whose adapter hashes differ (or that only one side ran)."""
    names = sorted(set(before["arms"]) | set(after["arms"]))
    return [
        name
        for name in names
        if before["arms"].get(name, {}).get("adapters") != after["arms"].get(name, {}).get("adapters")
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the fingerprint here")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated arm names")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument(
        "--work", type=Path, default=Path("runs/fingerprint"), help="runs and the SFT go here"
    )
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        differ = compare(before, after)
        print("identical" if not differ else f"differ: {', '.join(differ)}")
        raise SystemExit(1 if differ else 0)
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; known: {', '.join(ARMS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    result = fingerprint(args.arms.split(","), args.work.resolve())
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
