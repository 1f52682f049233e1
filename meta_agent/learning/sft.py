"""The SFT warm start: maximum likelihood on demonstration episodes until held-out accuracy stops rising.

    turns = sft_turns(cfg, system)             # a demonstrations file, or episodes generated from a task
    accuracy = run_sft(cfg, system, turns, log, evaluate, run_dir / "checkpoints", ranks)  # evaluate() -> accuracy

The best adapters are kept in `<checkpoints>/sft-best` and loaded back at the end, so GRPO starts from
them. Each rank trains on its share of each step's episodes (the gradients are summed in the trainer).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from meta_agent.demos.build import demo_path, make_demos, read_demos
from meta_agent.episode.protocol import Episode
from meta_agent.episode.reward import score
from meta_agent.evaluation.planning import build_planner, searched_plans, searches
from meta_agent.learning.credit import training_turns
from meta_agent.rank_protocol import load_rank0_adapters
from meta_agent.settings import Config
from meta_agent.system import System, policy_trainer
from meta_agent.tasks import next_tasks
from roles import meta_thinker
from training.distributed import Ranks
from training.model_files import context_window
from training.run_log import RunLog
from training.types import Turn

SFT_BEST = "sft-best"  # the checkpoints' folder of the best SFT adapters

console = Console()


def sft_turns(cfg: Config, system: System) -> list[Turn]:
    """The demonstration turns of `sft.source`: a .jsonl file written by `meta-agent demos`, or
    `sft.examples` episodes generated from a task's train split."""
    path = demo_path(cfg.sft.source)
    if path is not None:
        vocab = len(system.chat.tokenizer)
        context = context_window(getattr(system.backbone.model, "config", None))
        turns = read_demos(path, roles=[r.name for r in system.roles], vocab_size=vocab, context=context)
        console.print(f"sft: {len(turns)} demonstration turns from {path}")
        return turns
    return training_turns(generate_demos(cfg, system), last_reflections=True)


def generate_demos(cfg: Config, system: System) -> list[Episode]:
    """`sft.examples` demonstration episodes of the generator `sft.source`, played with the run's
    roles, tools, chat format and limits (so `meta-agent demos` files train like the generator)."""
    return make_demos(
        cfg.sft.source,
        cfg.sft.examples,
        system.roles,
        system.chat,
        system.registry,
        seed=cfg.seed,
        limits=cfg.protocol,
        internal=system.factory.internal,
    )


def search_demos(cfg: Config, system: System) -> list[Episode]:
    """Searched plans as demonstrations (`meta-agent demos planner.name=mcts|best_of_n adapters=...`): the first
    `sft.examples` problems of `train.task`'s train split (drawn by `seed`), each searched with the
    `planner:` settings by the loaded roles; the plans (and revisions) of the searches whose chosen answer
    was right, as meta_agent.evaluation.planning.searched_plans keeps them."""
    meta = meta_thinker(system.roles)
    assert meta is not None, "cmd_demos refuses a planner without a meta-thinker"
    tasks = cfg.tasks(cfg.train.task, "train", cfg.sft.examples)
    planner = build_planner(cfg.planner, system.backbone)
    assert planner is not None, "cmd_demos searches only with a planner"
    batch = cfg.eval.episodes_per_batch
    chunks = searches(planner, system.factory, system.backend, tasks, batch, seed=cfg.seed)
    results = [r for chunk in chunks for r in chunk]
    kept = searched_plans(results, meta.name)
    score(kept)  # a demonstration's turns carry their rewards, as a rollout's do
    console.print(
        f"searched {len(results)} problems: {sum(r.correct for r in results)} chosen answers right, "
        f"{len(kept)} kept as demonstrations, {sum(r.generated_tokens for r in results)} tokens generated"
    )
    return kept


def run_sft(
    cfg: Config,
    system: System,
    turns: Sequence[Turn],
    log: RunLog,
    evaluate: Callable[[], float],
    ckpt_root: Path,
    ranks: Ranks,
) -> float:
    """Train on demonstration `turns` (see sft_turns), episode by episode, evaluating (`evaluate`: the
    held-out accuracy, as the GRPO stage measures it) every
    `sft.eval_every` steps, until `sft.patience` evaluations bring no better held-out accuracy or
    `sft.max_steps` is reached. Returns the best held-out accuracy (0 if none was better than nothing)."""
    by_episode: dict[int, list[Turn]] = {}
    for t in turns:
        by_episode.setdefault(t.episode, []).append(t)
    trainer = policy_trainer(cfg, system, ranks, lr_scale=cfg.sft.lr_scale)
    episodes = list(by_episode)
    best, since_best, step = -1.0, 0, 0
    best_dir = ckpt_root / SFT_BEST
    if ranks.main:
        shutil.rmtree(best_dir, ignore_errors=True)  # never start GRPO from an earlier run's adapters
    while step < cfg.sft.max_steps:
        chosen = next_tasks(episodes, step * cfg.sft.batch_size, cfg.sft.batch_size, cfg.seed)
        metrics = trainer.sft_step([t for e in ranks.shard(chosen) for t in by_episode[e]])
        step += 1
        log.scalars({f"sft/{k}": v for k, v in ranks.combine_metrics(metrics).items()}, step)
        if step % cfg.sft.eval_every == 0 or step == cfg.sft.max_steps:
            accuracy = evaluate()
            log.scalars({"sft/eval/accuracy": accuracy}, step)
            console.print(f"sft step {step}: held-out accuracy {accuracy:.3f}")
            if accuracy > best:
                best, since_best = accuracy, 0
                if ranks.main:
                    system.backbone.save_adapters(best_dir)
            else:
                since_best += 1
                if since_best >= cfg.sft.patience:
                    break
    load_rank0_adapters(system.backbone, best_dir, ranks)  # the best SFT adapters start GRPO
    return max(best, 0.0)
