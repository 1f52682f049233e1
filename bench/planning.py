"""Planning by tree search against best-of-N and plain sampling, at equal generated tokens.

    python -m bench.planning --adapters runs/RUN/checkpoints/sft-best --experiment distract_hierarchy
    python -m bench.planning --adapters RUN --budgets 2,4 --limit 16 --seeds 0,1

For each budget N and seed, on the experiment's held-out problems (the seed draws them and seeds the
sampling), with the trained roles of --adapters and memory off:
- sampling: N episodes per problem at the roles' own temperatures (or --temperature); its accuracy is
  their mean (what one sampled episode gets), its tokens all N episodes';
- best_of_n: the majority answer of those same N episodes (the N plans' self-consistency): the same
  tokens;
- mcts: `planner.name=mcts` (meta_agent/evaluation/planning.py), its token budget per problem the sampling arm's
  mean tokens per problem, so both spend the same (a last wave may go a little past it);
- greedy: one greedy episode per problem, the reference without search (its own, smaller, tokens).
Writes bench/results/planning.json (other keys of the file, such as dpo_minus_grpo, are kept): per
budget and seed every arm's accuracy and generated tokens; at the top level the largest budget's
`mcts_accuracy`, `best_of_n_accuracy`, `sampling_accuracy` and `generated_tokens` per arm (means over
seeds), `mcts_minus_best_of_n` paired over problems and seeds with its 95% interval; and a figure of
accuracy against generated tokens per problem (bench/results/planning.png). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import transformers

from bench.common import RESULTS_DIR, machine_info, write_result
from meta_agent.analysis.stats import majority, mean_interval, normal_answer, paired_difference
from meta_agent.config import load_config
from meta_agent.evaluation.evaluate import evaluate
from meta_agent.evaluation.planning import build_planner
from meta_agent.settings import Config
from meta_agent.system import build_system
from meta_agent.tasks import load_tasks

RESULTS = RESULTS_DIR / "planning.json"
FIGURE = RESULTS_DIR / "planning.png"
ARMS = ("greedy", "sampling", "best_of_n", "mcts")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--adapters",
        default=None,
        help="trained roles: a run, checkpoint or adapters folder (default: fresh)",
    )
    p.add_argument("--experiment", default="arith_hierarchy", help="the experiment they were trained with")
    p.add_argument("--budgets", default="2,4", help="episodes per problem of the sampling arms, e.g. 2,4,8")
    p.add_argument("--seeds", default="0", help="seeds, e.g. 0,1: each draws its problems and samples")
    p.add_argument("--limit", type=int, default=16, help="held-out problems per seed")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="every role's temperature in the sampled arms and the search (default: each role's own)",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. planner.c_puct=2")
    return p.parse_args(argv)


def per_problem(episodes, samples: int) -> tuple[list[float], list[float], list[int]]:
    """Per problem of `samples` consecutive episodes: the mean accuracy, the majority answer's
    correctness and the generated tokens."""
    mean, chosen, tokens = [], [], []
    for k in range(0, len(episodes), samples):
        group = episodes[k : k + samples]
        mean.append(sum(ep.correct for ep in group) / len(group))
        first = majority([normal_answer(ep.final_answer) for ep in group])  # ties: the first sampled
        chosen.append(float(group[first].correct) if first is not None else 0.0)
        tokens.append(sum(t.generated_tokens for ep in group for t in ep.turns))
    return mean, chosen, tokens


class Recorder:
    """A TraceWriter stand-in that keeps the episodes evaluate() played, in order, and the searches."""

    def __init__(self):
        self.episodes, self.extra = [], []

    def write(self, episodes, **extra) -> None:
        self.episodes += list(episodes)
        self.extra += [extra] * len(episodes)


def greedy_episodes(
    cfg: Config, system, tasks: dict, seed: int, *, final_reflection: bool
) -> tuple[Recorder, dict, float]:
    """One greedy episode per problem of `tasks`, writing no lessons: the episodes played (in a Recorder),
    the scores by task and the seconds it took."""
    played = Recorder()
    started = time.perf_counter()
    scores = evaluate(
        system,
        tasks,
        replace(cfg.eval, samples=1, temperature=0.0),
        seed=seed,
        traces=played,
        write_lessons=False,
        final_reflection=final_reflection,
    )
    return played, scores, time.perf_counter() - started


def run_seed(
    cfg: Config, system, seed: int, budgets: list[int], limit: int, temperature: float | None = None
) -> dict:
    task = cfg.train.eval_task
    tasks = {task: load_tasks(task, "test", limit=limit, seed=seed, custom=cfg.custom_tasks)}
    out = {}
    # The last round's reflection can change no answer: every arm skips it, as the search does with votes.
    last = cfg.planner.value == "verdict"
    greedy, _, greedy_s = greedy_episodes(cfg, system, tasks, seed, final_reflection=last)
    for n in budgets:
        sampled = Recorder()
        started = time.perf_counter()
        sampling = replace(cfg.eval, samples=n, temperature=temperature or 0.0)  # 0: the roles' own
        evaluate(system, tasks, sampling, seed=seed, traces=sampled, final_reflection=last)
        sampling_s = time.perf_counter() - started
        mean, voted, tokens = per_problem(sampled.episodes, n)
        budget = max(1, round(sum(tokens) / len(tokens)))
        planner = build_planner(
            replace(
                cfg.planner,
                name="mcts",
                simulations=max(n * 4, 8),
                max_tokens=budget,
                temperature=temperature,
            ),
            system.backbone,
        )
        searched = Recorder()
        started = time.perf_counter()
        scores = evaluate(
            system, tasks, replace(cfg.eval, samples=1), seed=seed, traces=searched, planner=planner
        )
        mcts_s = time.perf_counter() - started
        mcts = [float(ep.correct) for ep in searched.episodes]
        out[str(n)] = {
            "greedy": arm([float(ep.correct) for ep in greedy.episodes], greedy.episodes, greedy_s),
            "sampling": {**arm(mean, None, sampling_s), "generated_tokens": sum(tokens)},
            "best_of_n": {**arm(voted, None, sampling_s), "generated_tokens": sum(tokens)},
            "mcts": {
                **arm(mcts, None, mcts_s),
                "generated_tokens": scores[task].generated_tokens,
                "simulations_mean": sum(e["simulations"] for e in searched.extra) / len(searched.extra),
                "token_budget_per_problem": budget,
            },
            "per_problem": {"mcts": mcts, "best_of_n": voted, "sampling": mean},
        }
    return out


def arm(per_problem_scores: list[float], episodes, seconds: float) -> dict:
    result = {"accuracy": sum(per_problem_scores) / len(per_problem_scores), "seconds": round(seconds, 1)}
    if episodes is not None:
        result["generated_tokens"] = sum(t.generated_tokens for ep in episodes for t in ep.turns)
    return result


def summarise(per_seed: dict[int, dict], budgets: list[int]) -> dict:
    """Means over seeds per budget and arm; the top-level keys of the largest budget."""
    by_budget = {}
    for n in budgets:
        rows = [per_seed[s][str(n)] for s in per_seed]
        by_budget[str(n)] = {
            name: {
                "accuracy": sum(r[name]["accuracy"] for r in rows) / len(rows),
                "generated_tokens_per_problem": sum(r[name]["generated_tokens"] for r in rows)
                / sum(len(r["per_problem"]["mcts"]) for r in rows),
            }
            for name in ARMS
        }
    top = str(max(budgets))
    mcts = [x for s in per_seed for x in per_seed[s][top]["per_problem"]["mcts"]]
    best = [x for s in per_seed for x in per_seed[s][top]["per_problem"]["best_of_n"]]
    diff = paired_difference(mcts, best)
    return {
        "budgets": by_budget,
        "mcts_accuracy": by_budget[top]["mcts"]["accuracy"],
        "best_of_n_accuracy": by_budget[top]["best_of_n"]["accuracy"],
        "sampling_accuracy": by_budget[top]["sampling"]["accuracy"],
        "greedy_accuracy": by_budget[top]["greedy"]["accuracy"],
        "generated_tokens": {name: by_budget[top][name]["generated_tokens_per_problem"] for name in ARMS},
        "mcts_minus_best_of_n": asdict(diff),
        "mcts_interval": mean_interval(mcts),
    }


def figure(summary: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    budgets = summary["budgets"]
    for name, marker in (("sampling", "o"), ("best_of_n", "s"), ("mcts", "^")):
        xs = [budgets[n][name]["generated_tokens_per_problem"] for n in budgets]
        ys = [budgets[n][name]["accuracy"] for n in budgets]
        ax.plot(xs, ys, marker=marker, label=name.replace("_", "-"))
    g = next(iter(budgets.values()))["greedy"]
    ax.scatter([g["generated_tokens_per_problem"]], [g["accuracy"]], color="black", label="greedy", zorder=3)
    ax.set_xlabel("generated tokens per problem")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    budgets = sorted({int(x) for x in args.budgets.split(",")})
    if budgets[0] < 2:
        raise SystemExit(
            f"--budgets {args.budgets}: give 2 or more episodes per problem (one is not sampled)"
        )
    if args.temperature is not None and not args.temperature > 0:
        raise SystemExit(f"--temperature {args.temperature}: give a temperature above 0, or leave it out")
    seeds = [int(x) for x in args.seeds.split(",")]
    overrides = [f"experiment={args.experiment}", "memory.path=null", *args.overrides]
    if args.adapters is not None:
        overrides.append(f"adapters={args.adapters}")
    cfg = load_config(overrides)
    started = time.perf_counter()
    system = build_system(cfg)
    try:
        per_seed = {
            seed: run_seed(cfg, system, seed, budgets, args.limit, args.temperature) for seed in seeds
        }
    finally:
        system.close()
    summary = summarise(per_seed, budgets)
    kept = json.loads(args.out.read_text()) if args.out.exists() else {}
    result = {
        **{k: v for k, v in kept.items() if k in ("dpo_minus_grpo", "summary_minus_truncate")},
        **summary,
        "per_seed": {str(s): v for s, v in per_seed.items()},
        "settings": {
            "experiment": args.experiment,
            "adapters": str(args.adapters),
            "overrides": args.overrides,
            "seeds": seeds,
            "problems_per_seed": args.limit,
            "planner": {
                **vars(replace(cfg.planner, name="mcts", temperature=args.temperature)),
                "simulations": "max(4 N, 8) at budget N",
                "max_tokens": "the sampling arm's mean generated tokens per problem at budget N",
            },
            "temperature": args.temperature or "each role's own",
            "dtype": str(system.backbone.model.dtype).removeprefix("torch."),
            "memory": "off",
        },
        "machine": machine_info(torch=torch.__version__, transformers=transformers.__version__),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    written = write_result(result, args.out)
    figure(
        summary,
        args.out.with_suffix(".png"),
        f"{args.experiment}, {len(seeds)} seed(s) x {args.limit} problems",
    )
    print(
        json.dumps(
            {
                k: written[k]
                for k in (
                    "mcts_accuracy",
                    "best_of_n_accuracy",
                    "sampling_accuracy",
                    "greedy_accuracy",
                    "generated_tokens",
                    "mcts_minus_best_of_n",
                )
            },
            indent=1,
        )
    )
    return written


if __name__ == "__main__":
    main()
