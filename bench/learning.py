"""Does it learn? Held-out accuracy of the untrained hierarchy, after SFT, after GRPO, and of the
single-agent baseline trained with GRPO at an equal budget of generated tokens.

    python bench/learning.py                          # the default experiment, about 25 minutes on 2 cores
    python bench/learning.py train.steps=6 sft.examples=128

Writes bench/results/learning.json: `base`, `sft`, `grpo`, `single_agent_grpo` (held-out accuracy of
the generated tool task, 0 to 1), `wall_seconds`, and the settings used. A measurement, not a test.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import transformers

from meta_agent.cli import start_run
from meta_agent.config import load_config
from meta_agent.train import train

RESULTS = Path(__file__).resolve().parent / "results" / "learning.json"


def run(experiment: str, overrides: list[str], tag: str) -> tuple[dict[str, float], float]:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    cfg = load_config([f"experiment={experiment}", f"run_dir=runs/bench-learning-{tag}-{stamp}", *overrides])
    started = time.perf_counter()
    final = train(cfg, start_run(cfg, f"train experiment={experiment} (bench/learning.py)"))
    return final, time.perf_counter() - started


def main(overrides: list[str]) -> dict:
    started = time.perf_counter()
    hierarchy, hierarchy_s = run("arith_hierarchy", overrides, "hierarchy")
    budget = int(hierarchy["train/generated_tokens"])
    # The baseline gets as many GRPO rollout tokens as the hierarchy used, however many steps that takes.
    single, single_s = run(
        "arith_single_agent", [*overrides, f"train.token_budget={budget}", "train.steps=1000"], "single"
    )
    result = {
        "base": hierarchy["eval/accuracy_before"],
        "sft": hierarchy.get("eval/accuracy_after_sft", hierarchy["eval/accuracy_before"]),
        "grpo": hierarchy["eval/accuracy_after"],
        "single_agent_grpo": single["eval/accuracy_after"],
        "single_agent_sft": single.get("eval/accuracy_after_sft"),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "settings": {
            "experiments": ["arith_hierarchy", "arith_single_agent"],
            "overrides": overrides,
            "generated_token_budget": budget,
            "hierarchy": {"grpo_steps": hierarchy["train/grpo_steps"], "seconds": round(hierarchy_s, 1)},
            "single_agent": {
                "grpo_steps": single["train/grpo_steps"],
                "generated_tokens": single["train/generated_tokens"],
                "seconds": round(single_s, 1),
            },
            "eval": "held-out arith test split, greedy, train.eval_limit problems",
        },
        "machine": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
        },
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
