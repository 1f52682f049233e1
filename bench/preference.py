"""DPO against GRPO from the same SFT adapters, paired by seed, each at the generated tokens its rollouts spent.

    python -m bench.learning --seeds 0,1,2,3 --no-single --probe-limit 0        # GRPO: learning.json
    python -m bench.learning --seeds 0,1,2,3 --no-single --probe-limit 0 \\
        --out bench/results/learning_dpo.json train.algorithm=dpo                 # DPO: learning_dpo.json
    python -m bench.preference                                                     # pairs them

The two learning runs train the same experiment with the same seeds: the same SFT stage (a seed fixes the
demonstrations, the task order and the held-out problems), then the same number of rollouts of the same
size, learnt from by GRPO in one and by the preference loss on pairs mined from the rollout's groups
(`train.algorithm=dpo`, the `dpo:` settings) in the other. This reads both files' per-seed records and
pairs a seed when its two runs had overrides that resolve to the same settings but train.algorithm (their
fingerprints agree, however the overrides are spelt), computed in the same dtype,
each trained with today's settings and code for its overrides (its record's `config_sha` is what
bench.learning's fingerprint gives now: a run of an older default, or of older training code, is not
today's experiment), both whole runs or both from the same recorded SFT (`--sft-from`), and reached the
same SFT accuracy (anything else is named and left out). Writes
the `dpo_minus_grpo` key of bench/results/planning.json (its other keys are kept): per seed SFT, GRPO and
DPO held-out accuracy and each arm's generated tokens and seconds; the mean difference over seeds with
its 95% Student's t interval (none for one seed); each arm's means. A summary of two measurements, not a
test.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

from omegaconf import OmegaConf

from bench.common import RESULTS_DIR
from bench.learning import RESULTS as GRPO_RESULTS
from bench.learning import SFT_FROM, settings_of
from meta_agent.analysis.stats import seed_interval

DPO_RESULTS = RESULTS_DIR / "learning_dpo.json"
OUT = RESULTS_DIR / "planning.json"
KEY = "dpo_minus_grpo"
DPO_OVERRIDE = "train.algorithm=dpo"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grpo", type=Path, default=GRPO_RESULTS, help="bench.learning's GRPO results")
    p.add_argument(
        "--dpo", type=Path, default=DPO_RESULTS, help="bench.learning's results with train.algorithm=dpo"
    )
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args(argv)


def stale(record: dict, fingerprint: Callable[[Sequence[str]], str]) -> str | None:
    """Why a record was not trained with today's settings and code for its overrides (None if it was);
    a run from a recorded SFT is judged by its own part of the fingerprint."""
    own = str(record.get("config_sha")).partition(SFT_FROM)[0]
    today = fingerprint(tuple(record.get("overrides", [])))
    if own == today:
        return None
    return f"trained with settings {own}, today's are {today}"


def sft_source(record: dict) -> str | None:
    """The fingerprint of the recorded SFT a run started from (None for a whole run)."""
    return str(record.get("config_sha")).partition(SFT_FROM)[2] or None


def pair_seeds(
    grpo: list[dict], dpo: list[dict], fingerprint: Callable[[Sequence[str]], str]
) -> tuple[list[dict], list[str]]:
    """One row per seed both files trained alike; and a line for each seed left out, saying why.
    `fingerprint(overrides)` is today's config_sha of the experiment under those overrides (a tuple)."""
    by_seed = {r["seed"]: r for r in grpo}
    rows, left_out = [], []
    for d in sorted(dpo, key=lambda r: r["seed"]):
        seed = d["seed"]
        g = by_seed.get(seed)
        own = [o for o in d.get("overrides", []) if o != DPO_OVERRIDE]
        if g is None:
            left_out.append(f"seed {seed}: no GRPO run")
        elif fingerprint(tuple(own)) != fingerprint(tuple(g.get("overrides", []))):
            # by the settings the overrides resolve to, not their spelling (as bench.learning keeps seeds)
            left_out.append(f"seed {seed}: other settings ({own} against {g.get('overrides', [])})")
        elif d.get("dtype") != g.get("dtype"):
            left_out.append(f"seed {seed}: DPO computed in {d.get('dtype')}, GRPO in {g.get('dtype')}")
        elif why := stale(d, fingerprint):
            left_out.append(f"seed {seed}: the DPO run is not today's experiment ({why}): rerun it")
        elif why := stale(g, fingerprint):
            left_out.append(f"seed {seed}: the GRPO run is not today's experiment ({why}): rerun it")
        elif sft_source(d) != sft_source(g):
            left_out.append(
                f"seed {seed}: DPO started from SFT {sft_source(d) or 'of its own run'}, "
                f"GRPO from {sft_source(g) or 'that of its own run'}"
            )
        elif d["grpo_steps"] != g["grpo_steps"]:
            left_out.append(
                f"seed {seed}: {d['grpo_steps']:g} DPO steps against {g['grpo_steps']:g} GRPO steps"
            )
        elif d["sft"] != g["sft"]:
            left_out.append(
                f"seed {seed}: SFT reached {d['sft']:.3f} before DPO and {g['sft']:.3f} before GRPO"
            )
        else:
            rows.append(
                {
                    "seed": seed,
                    "sft": g["sft"],
                    "grpo": g["grpo"],
                    "dpo": d["grpo"],  # bench.learning's key for the accuracy after the RL stage
                    "grpo_generated_tokens": g["generated_tokens"],
                    "dpo_generated_tokens": d["generated_tokens"],
                    "grpo_seconds": g["seconds"],
                    "dpo_seconds": d["seconds"],
                    "steps": d["grpo_steps"],
                    "dpo_run": d["run"],
                }
            )
    return rows, left_out


def summarise(rows: list[dict]) -> dict:
    if not rows:
        raise SystemExit("no seed was trained alike by both runs: nothing to pair (see the lines above)")
    diff = seed_interval([r["dpo"] - r["grpo"] for r in rows])
    over_sft = seed_interval([r["dpo"] - r["sft"] for r in rows])

    def mean(key: str) -> float | None:  # seconds are None for a seed whose run had no SFT (--sft-from)
        known = [r[key] for r in rows if r[key] is not None]
        return sum(known) / len(known) if known else None

    return {
        "mean": diff.mean,
        "ci_low": diff.low,
        "ci_high": diff.high,
        "seeds": [r["seed"] for r in rows],
        "sft": mean("sft"),
        "grpo": mean("grpo"),
        "dpo": mean("dpo"),
        "dpo_minus_sft": {"mean": over_sft.mean, "ci_low": over_sft.low, "ci_high": over_sft.high},
        "generated_tokens": {"grpo": mean("grpo_generated_tokens"), "dpo": mean("dpo_generated_tokens")},
        "seconds": {"grpo": mean("grpo_seconds"), "dpo": mean("dpo_seconds")},
        "per_seed": rows,
    }


def dpo_settings(config: Path) -> dict | None:
    """The `dpo:` section a DPO run trained with, from its run folder (None once the folder is gone)."""
    if not config.is_file():
        return None
    return OmegaConf.to_container(OmegaConf.load(config), resolve=False).get("dpo")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    grpo, dpo = (json.loads(path.read_text()) for path in (args.grpo, args.dpo))
    experiment = grpo["settings"]["experiments"][0]
    if dpo["settings"]["experiments"][0] != experiment:
        raise SystemExit(
            f"{args.dpo} trained {dpo['settings']['experiments'][0]} and {args.grpo} trained {experiment}: "
            "give two runs of the same experiment"
        )
    fingerprint = cache(lambda overrides: settings_of(experiment, overrides)[1])
    rows, left_out = pair_seeds(grpo["per_seed"], dpo["per_seed"], fingerprint)
    for line in left_out:
        print(f"left out: {line}")
    section = summarise(rows) | {
        "sources": {"grpo": str(args.grpo), "dpo": str(args.dpo)},
        "dpo_settings": dpo_settings(Path(rows[0]["dpo_run"]) / "config.yaml"),
        "machine": dpo.get("machine"),
        "measured_at": dpo.get("measured_at"),
        "paired_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    kept = json.loads(args.out.read_text()) if args.out.exists() else {}
    args.out.write_text(json.dumps({**kept, KEY: section}, indent=2) + "\n")
    print(json.dumps({k: section[k] for k in ("mean", "ci_low", "ci_high", "sft", "grpo", "dpo", "seeds")}))
    return section


if __name__ == "__main__":
    main()
