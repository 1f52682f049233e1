"""Does it learn? Held-out accuracy of the untrained hierarchy, after SFT, after GRPO, and of the
single-agent baseline trained with GRPO at an equal budget of generated tokens.

    python -m bench.learning                          # the default experiments, about 30 minutes on 2 cores
    python -m bench.learning train.steps=6 sft.examples=128

Writes bench/results/learning.json: `base`, `sft`, `grpo`, `single_agent_grpo` (held-out accuracy of
the generated tool task, 0 to 1), `wall_seconds`, and the settings used. A measurement, not a test.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime

import torch
import transformers

from bench.common import RESULTS_DIR, machine_info, write_result
from meta_agent.cli import start_run
from meta_agent.config import load_config
from meta_agent.train import train

RESULTS = RESULTS_DIR / "learning.json"
# The targets for the hierarchy on 2 CPU cores: the RL's own gain, within 20 minutes in all.
TARGETS = {"grpo_minus_base": 0.30, "grpo_minus_sft": 0.10, "hierarchy_seconds": 1200.0}


def meets(base: float, sft: float, grpo: float, seconds: float) -> dict[str, bool]:
    """Which targets a measurement meets (see TARGETS)."""
    return {
        "grpo_minus_base": grpo - base >= TARGETS["grpo_minus_base"],
        "grpo_minus_sft": grpo - sft >= TARGETS["grpo_minus_sft"],
        "hierarchy_seconds": seconds <= TARGETS["hierarchy_seconds"],
    }


def run(experiment: str, overrides: list[str], tag: str) -> tuple[dict[str, float], float]:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    cfg = load_config([f"experiment={experiment}", f"run_dir=runs/bench-learning-{tag}-{stamp}", *overrides])
    started = time.perf_counter()
    final = train(cfg, start_run(cfg, f"train experiment={experiment} (bench/learning.py)"))
    return final, time.perf_counter() - started


def main(overrides: list[str]) -> dict:
    started = time.perf_counter()
    machine = machine_info(  # before the runs: the load average says whether the machine was free
        torch=torch.__version__,
        transformers=transformers.__version__,
        torch_threads=str(torch.get_num_threads()),
    )
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
        "targets": TARGETS,
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
        "machine": machine,
    }
    result["meets"] = meets(result["base"], result["sft"], result["grpo"], hierarchy_s)
    result = write_result(result, RESULTS)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
