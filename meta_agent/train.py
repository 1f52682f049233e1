"""`meta-agent train`: SFT warm start (optional), then joint multi-agent GRPO of every role.

    meta-agent train experiment=arith_hierarchy           # configs/experiment/arith_hierarchy.yaml
    meta-agent train experiment=arith_hierarchy resume=runs/arith_hierarchy   # continue exactly
    accelerate launch --multi_gpu --num_processes 2 -m meta_agent train experiment=arith_hierarchy

One step: G episodes of the whole hierarchy per task -> rewards per role -> advantages within
(role, task) groups -> per-role clipped loss -> one optimizer step -> log -> eval -> checkpoint.

Under N processes each rank plays a contiguous share of the step's tasks (all G episodes of a task on
one rank, so advantages need no communication), the gradients are summed over ranks in the trainer,
the held-out set is split over ranks and its counts summed, and lessons are gathered and committed by
rank 0, after which every rank's memory catches up. Only rank 0 writes logs, traces and checkpoints.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from memory.types import Memory
from meta_agent.config import limits, plain
from meta_agent.demos import demo_path, make_demos, read_demos
from meta_agent.episode import Episode
from meta_agent.runner import play
from meta_agent.system import System, build_system
from meta_agent.tasks import Task, load_tasks
from meta_agent.trace import TraceWriter, episode_markdown
from training.checkpoint import load_checkpoint, resolve_resume, save_checkpoint
from training.distributed import Ranks
from training.grpo import GRPOSettings
from training.run_log import RunLog
from training.trainer import PolicyTrainer, TrainerSettings
from training.types import Turn

console = Console()


@dataclass
class Stage:
    """What a checkpoint must carry besides the weights to continue exactly."""

    step: int = 0  # optimizer steps done in this stage
    stage: str = "sft"  # sft | grpo
    data_pos: int = 0  # tasks consumed from the shuffled training pool
    generated_tokens: int = 0  # by GRPO rollouts, all roles: the budget that baselines are compared at
    best_sft_accuracy: float = -1.0
    base_accuracy: float | None = None
    sft_accuracy: float | None = None
    memory_max_id: int = 0  # newest memory entry at the checkpoint; later writes are undone on resume


def commit_lessons(
    memory: Memory | None, lessons: Sequence[tuple[str, str, float]], ranks: Ranks, *, private: bool = False
) -> None:
    """Every rank's `lessons` ((text, task, reward), see EpisodeFactory.lessons), in global episode
    order, committed once by rank 0; afterwards every rank's memory holds the same entries. A private
    (in-process) memory is written by every rank itself."""
    lessons = ranks.gather(list(lessons))
    if memory is None or not lessons:
        return
    if ranks.main or private:
        for text, task, reward in lessons:
            memory.add(text, kind="lesson", task=task, reward=reward)
    ranks.barrier()
    if not ranks.main and not private:
        memory.refresh()


def trainer_settings(cfg: DictConfig, system: System, *, sft: bool = False) -> TrainerSettings:
    scale = cfg.sft.lr_scale if sft else 1.0
    return TrainerSettings(
        lr={name: role.lr * scale for name, role in cfg.roles.items()},
        # Greedy rollouts record logprobs at temperature 1 (the backend's convention): score them there.
        temperature={
            r.name: r.sampling.temperature if r.sampling.temperature > 0 else 1.0 for r in system.roles
        },
        grpo=GRPOSettings(**plain(cfg.grpo)),
        micro_batch_size=cfg.train.micro_batch_size,
        max_grad_norm=cfg.train.max_grad_norm,
        warmup_steps=cfg.train.warmup_steps,
        gradient_checkpointing=cfg.train.gradient_checkpointing,
    )


def next_tasks(pool: Sequence[Task], pos: int, n: int, seed: int) -> list[Task]:
    """Tasks pos..pos+n of an endless stream: the pool reshuffled (seeded) every epoch."""
    out = []
    for i in range(pos, pos + n):
        epoch, j = divmod(i, len(pool))
        order = list(range(len(pool)))
        random.Random(seed * 100_003 + epoch).shuffle(order)
        out.append(pool[order[j]])
    return out


def rollout_metrics(episodes: Sequence[Episode], roles: Sequence[str], meta: str | None) -> dict[str, float]:
    n = max(len(episodes), 1)
    metrics = {
        "rollout/accuracy": sum(ep.correct for ep in episodes) / n,
        "rollout/tool_calls": sum(ep.tool_calls for ep in episodes) / n,
        "rollout/tool_errors": sum(ep.tool_errors for ep in episodes) / n,
        "rollout/memory_hits": sum(len(ep.memories) for ep in episodes) / n,
        "rollout/answer_leaks": sum(ep.leaked for ep in episodes) / n,
        "rollout/truncated": sum(ep.truncated for ep in episodes) / n,
        "rollout/rounds": sum(ep.round + 1 for ep in episodes) / n,
    }
    for role in roles:
        turns = [t for ep in episodes for t in ep.turns if t.role == role]
        if not turns:
            continue
        metrics[f"role/{role}/accuracy"] = metrics["rollout/accuracy"]
        metrics[f"role/{role}/response_length"] = sum(t.generated_tokens for t in turns) / len(turns)
        metrics[f"role/{role}/tool_calls"] = sum(len(t.tool_calls) for t in turns) / n
        metrics[f"role/{role}/tool_errors"] = sum(1 for t in turns for c in t.tool_calls if not c.ok) / n
        metrics[f"role/{role}/format_ok"] = sum(t.format_ok for t in turns) / len(turns)
    if meta is not None:
        metrics[f"role/{meta}/answer_leaks"] = metrics["rollout/answer_leaks"]
    return metrics


def held_out(
    system: System, cfg: DictConfig, tasks: dict[str, list[Task]], ranks: Ranks | None = None
) -> float:
    # No lesson writes: what the roles saw of the test set must not reach the memory they train with.
    # So the last reflection, which can only write a lesson, is skipped: the answers are the same.
    # Each rank plays its share of the problems (greedy: the same answers as one process).
    ranks = ranks or Ranks()
    mine = {name: ranks.shard(task_list) for name, task_list in tasks.items()}
    scores = system.evaluate(mine, cfg, write_lessons=False, final_reflection=False)
    system.backbone.lockstep.drain()  # a sharded backbone: until every rank's episodes are done
    correct, total = ranks.sum(
        [sum(s.correct for s in scores.values()), sum(s.total for s in scores.values())]
    )
    return correct / max(total, 1)


def sft_turns(cfg: DictConfig, system: System) -> list[Turn]:
    """The demonstration turns of `sft.source`: a .jsonl file written by `meta-agent demos`, or
    `sft.examples` episodes generated from a task's train split."""
    path = demo_path(cfg.sft.source)
    if path is not None:
        turns = read_demos(path, roles=[r.name for r in system.roles])
        console.print(f"sft: {len(turns)} demonstration turns from {path}")
        return turns
    return [turn for i, ep in enumerate(generate_demos(cfg, system)) for turn in ep.training_turns(i)]


def generate_demos(cfg: DictConfig, system: System) -> list[Episode]:
    """`sft.examples` demonstration episodes of the generator `sft.source`, played with the run's
    roles, tools, chat format and limits (so `meta-agent demos` files train like the generator)."""
    return make_demos(
        cfg.sft.source,
        cfg.sft.examples,
        system.roles,
        system.chat,
        system.registry,
        seed=cfg.seed,
        limits=limits(cfg),
    )


def run_sft(
    cfg,
    system,
    turns: Sequence[Turn],
    log,
    eval_tasks,
    state: Stage,
    ckpt_root: Path,
    ranks: Ranks | None = None,
) -> None:
    """Train on demonstration `turns` (see sft_turns), episode by episode, until held-out accuracy
    stops rising. Each rank trains on its share of each step's episodes."""
    ranks = ranks or Ranks()
    by_episode: dict[int, list] = {}
    for t in turns:
        by_episode.setdefault(t.episode, []).append(t)
    trainer = PolicyTrainer(system.backbone, trainer_settings(cfg, system, sft=True), ranks=ranks)
    episodes = list(by_episode)
    since_best = 0
    best_dir = ckpt_root / "sft-best"
    if ranks.main:
        shutil.rmtree(best_dir, ignore_errors=True)  # never start GRPO from an earlier run's adapters
    while state.step < cfg.sft.max_steps:
        chosen = next_tasks(episodes, state.step * cfg.sft.batch_size, cfg.sft.batch_size, cfg.seed)
        result = trainer.sft_step([t for e in ranks.shard(chosen) for t in by_episode[e]])
        state.step += 1
        metrics = ranks.combine_metrics(result.metrics)
        log.scalars({f"sft/{k}": v for k, v in metrics.items()}, state.step)
        if state.step % cfg.sft.eval_every == 0 or state.step == cfg.sft.max_steps:
            acc = held_out(system, cfg, eval_tasks, ranks)
            log.scalars({"sft/eval/accuracy": acc}, state.step)
            console.print(f"sft step {state.step}: held-out accuracy {acc:.3f}")
            if acc > state.best_sft_accuracy:
                state.best_sft_accuracy, since_best = acc, 0
                if ranks.main:
                    system.backbone.save_adapters(best_dir)
            else:
                since_best += 1
                if since_best >= cfg.sft.patience:
                    break
    ranks.barrier()  # rank 0 has written sft-best
    if best_dir.exists():
        system.backbone.load_adapters(best_dir)  # the best SFT adapters start GRPO
    state.sft_accuracy = max(state.best_sft_accuracy, 0.0)
    state.stage, state.step = "grpo", 0


def train(cfg: DictConfig, run_dir: Path, ranks: Ranks | None = None) -> dict[str, float]:
    ranks = ranks or start_ranks(cfg)
    if ranks.size > 1 and cfg.train.tasks_per_step < ranks.size:
        raise ValueError(
            f"train.tasks_per_step={cfg.train.tasks_per_step} gives some of the {ranks.size} processes no "
            f"task: set train.tasks_per_step to at least {ranks.size} (a multiple of it splits evenly)"
        )
    # Rank 0 first: it converts the backbone's cache and creates the memory folder the others open.
    if not ranks.main:
        ranks.barrier()
    system = build_system(cfg, memory_read_only=not ranks.main, ranks=ranks)
    if ranks.main:
        ranks.barrier()
    log = RunLog(run_dir, enabled=ranks.main)
    try:
        return _train(cfg, run_dir, ranks, system, log)
    finally:
        # Also when the run raises: the event files keep what was logged, the vLLM engine stops.
        log.close()
        system.close()


def _train(cfg: DictConfig, run_dir: Path, ranks: Ranks, system: System, log: RunLog) -> dict[str, float]:
    """SFT (if enabled) then GRPO, on a built system: what `train` runs between set-up and clean-up."""
    traces = TraceWriter(run_dir / "traces.jsonl") if ranks.main else None
    ckpt_root = run_dir / "checkpoints"
    role_names = [r.name for r in system.roles]
    meta_name = next((r.name for r in system.roles if r.kind == "meta_thinker"), None)
    pool = load_tasks(cfg.train.task, "train", limit=cfg.train.pool, seed=cfg.seed)
    eval_tasks = {
        cfg.train.eval_task: load_tasks(
            cfg.train.eval_task, "test", limit=cfg.train.eval_limit, seed=cfg.seed
        )
    }
    if cfg.resume:
        # GRPO resumes exactly: adapters, optimizer, scheduler, RNG, data position, step.
        trainer = PolicyTrainer(system.backbone, trainer_settings(cfg, system), ranks=ranks)
        _, saved = load_checkpoint(resolve_resume(cfg.resume), trainer)
        state = Stage(**saved["stage"])
        if system.memory is not None:
            # Lessons committed after the checkpoint belong to steps that will be replayed.
            if ranks.main or system.memory_private:
                system.memory.delete([i for i in system.memory.ids() if i > state.memory_max_id])
            ranks.barrier()
            if not ranks.main and not system.memory_private:
                system.memory.refresh()
        console.print(f"resumed from {cfg.resume} at step {state.step}")
    else:
        state = Stage(stage="sft" if cfg.sft.enabled else "grpo")
        # Before the first evaluation, so a bad demonstration file fails at start-up.
        demos = sft_turns(cfg, system) if state.stage == "sft" else []
        state.base_accuracy = held_out(system, cfg, eval_tasks, ranks)
        log.scalars({"eval/accuracy": state.base_accuracy}, 0)
        console.print(f"held-out accuracy before training: {state.base_accuracy:.3f}")
        if state.stage == "sft":
            run_sft(cfg, system, demos, log, eval_tasks, state, ckpt_root, ranks)
            console.print(f"held-out accuracy after SFT: {state.sft_accuracy:.3f}")
        trainer = PolicyTrainer(system.backbone, trainer_settings(cfg, system), ranks=ranks)
    sampling = system.sampling()
    columns = [
        TextColumn("grpo"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    ]
    accuracy = state.sft_accuracy if state.sft_accuracy is not None else state.base_accuracy
    with Progress(*columns, console=console, disable=not ranks.main) as progress:
        bar = progress.add_task("grpo", total=cfg.train.steps, completed=state.step, info="")
        budget = cfg.train.token_budget
        while state.step < cfg.train.steps and (budget is None or state.generated_tokens < budget):
            started = time.perf_counter()
            tasks = next_tasks(pool, state.data_pos, cfg.train.tasks_per_step, cfg.seed)
            first_task, _ = ranks.shard_bounds(len(tasks))
            episodes = [
                system.factory.new(t) for t in ranks.shard(tasks) for _ in range(cfg.train.group_size)
            ]
            seed = cfg.seed * 1_000_003 + state.step
            play(episodes, system.backend, sampling, seed=seed, first_index=first_task * cfg.train.group_size)
            empty_passes = system.backbone.lockstep.drain()
            lessons = system.factory.lessons(episodes)
            commit_lessons(system.memory, lessons, ranks, private=system.memory_private)
            turns = [turn for i, ep in enumerate(episodes) for turn in ep.training_turns(i)]
            rollout_s = time.perf_counter() - started
            result = trainer.grpo_step(turns)
            _attach_advantages(episodes, result.advantages)
            state.step += 1
            state.data_pos += len(tasks)
            elapsed = time.perf_counter() - started
            tokens = sum(t.generated_tokens for ep in episodes for t in ep.turns)
            state.generated_tokens += int(ranks.sum([tokens])[0])  # the budget is global: same on every rank
            metrics = {**result.metrics, **rollout_metrics(episodes, role_names, meta_name)}
            if system.backbone.sharded:  # forward passes this rank ran for the others' rollouts
                metrics["rollout/empty_passes"] = float(empty_passes)
            metrics.update(
                {"time/step_s": elapsed, "time/rollout_s": rollout_s, "time/tokens_per_s": tokens / elapsed}
            )
            metrics = ranks.combine_metrics(metrics)
            log.scalars(metrics, state.step)
            if state.step % cfg.train.trace_every == 0 or state.step == 1:
                for k, ep in enumerate(episodes[: cfg.train.group_size : max(cfg.train.group_size // 2, 1)]):
                    log.text(f"traces/episode_{k}", episode_markdown(ep), state.step)
                if traces is not None:  # rank 0's episodes: a sample of the step
                    traces.write(episodes, split="train", step=state.step)
            if state.step % cfg.train.eval_every == 0 or state.step == cfg.train.steps:
                accuracy = held_out(system, cfg, eval_tasks, ranks)
                log.scalars({"eval/accuracy": accuracy}, state.step)
            if state.step % cfg.train.checkpoint_every == 0 or state.step == cfg.train.steps:
                checkpoint(system, trainer, state, ckpt_root, cfg.train.keep_checkpoints)
            reward = sum(ep.rewards.get(role_names[-1], 0.0) for ep in episodes) / len(episodes)
            info = f"reward {reward:+.2f}  acc {metrics['rollout/accuracy']:.2f}  eval {accuracy:.2f}  {elapsed:.1f} s/step"
            progress.update(bar, advance=1, info=info)
    if state.step % cfg.train.eval_every != 0 and state.step != cfg.train.steps:
        # Stopped early by the token budget: evaluate and keep what the run reached.
        accuracy = held_out(system, cfg, eval_tasks, ranks)
        log.scalars({"eval/accuracy": accuracy}, state.step)
        checkpoint(system, trainer, state, ckpt_root, cfg.train.keep_checkpoints)
    if ranks.size > 1:
        check_ranks_agree(system, ranks, run_dir)
    final = {"eval/accuracy_before": state.base_accuracy}
    if state.sft_accuracy is not None:
        final["eval/accuracy_after_sft"] = state.sft_accuracy
    final["eval/accuracy_after"] = accuracy
    final["train/grpo_steps"] = float(state.step)
    final["train/generated_tokens"] = float(state.generated_tokens)
    log.config(OmegaConf.to_yaml(cfg), _flat_hparams(cfg), final)
    return final


def start_ranks(cfg: DictConfig) -> Ranks:
    """This process's rank; under several processes `model.device` becomes its own device."""
    ranks = Ranks.start(cfg.model.device)
    if ranks.size > 1:
        cfg.model.device = ranks.device
        if not ranks.main:
            console.quiet = True
    return ranks


def check_ranks_agree(system: System, ranks: Ranks, run_dir: Path) -> None:
    """Every rank must end with the same adapters; rank 0 records their checksums in ranks.json."""
    adapters = {
        role: torch.cat([p.detach().reshape(-1).double() for p in system.backbone.trainable_parameters(role)])
        for role in system.backbone.adapters
    }
    sums = ranks.checksums(adapters)
    if ranks.main:
        (run_dir / "ranks.json").write_text(
            json.dumps({"world_size": ranks.size, "adapter_checksums": sums}, indent=2)
        )
    if any(
        abs(a - b) > 1e-9 * max(1.0, abs(b))
        for s in sums
        for a, b in zip(s.values(), sums[0].values(), strict=True)
    ):
        raise RuntimeError(
            f"the {ranks.size} processes ended with different adapters (checksums {sums}): gradients were "
            "not synchronised; report this with the run's config"
        )


def checkpoint(system: System, trainer: PolicyTrainer, state: Stage, root: Path, keep: int) -> None:
    if system.memory is not None:
        state.memory_max_id = max(system.memory.ids(), default=0)
    save_checkpoint(root, state.step, trainer, {"stage": vars(state)}, keep=keep)


def _attach_advantages(episodes: Sequence[Episode], advantages: Sequence[float]) -> None:
    """Put each turn's advantage on its episode record, for the traces."""
    it = iter(advantages)
    for ep in episodes:
        for t in ep.turns:
            if t.completion_ids:
                t.advantage = next(it)


def _flat_hparams(cfg: DictConfig) -> dict:
    flat = {}
    for section in ("train", "grpo", "sft", "protocol"):
        for key, value in plain(cfg[section]).items():
            flat[f"{section}.{key}"] = value
    for name, role in cfg.roles.items():
        flat[f"roles.{name}.lr"] = role.lr
        flat[f"roles.{name}.temperature"] = role.sampling.temperature
    return flat
