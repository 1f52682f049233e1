"""`meta-agent train`: SFT warm start (optional), then joint multi-agent GRPO of every role.

    meta-agent train experiment=arith_hierarchy           # configs/experiment/arith_hierarchy.yaml
    meta-agent train experiment=arith_hierarchy resume=runs/arith_hierarchy   # continue exactly

One step: G episodes of the whole hierarchy per task -> rewards per role -> advantages within
(role, task) groups -> per-role clipped loss -> one optimizer step -> log -> eval -> checkpoint.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from meta_agent.config import limits, plain
from meta_agent.demos import demo_path, make_demos, read_demos
from meta_agent.episode import Episode
from meta_agent.runner import play
from meta_agent.system import System, build_system
from meta_agent.tasks import Task, load_tasks
from meta_agent.trace import TraceWriter, episode_markdown
from training.checkpoint import load_checkpoint, resolve_resume, save_checkpoint
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


def held_out(system: System, cfg: DictConfig, tasks: dict[str, list[Task]]) -> float:
    # No lesson writes: what the roles saw of the test set must not reach the memory they train with.
    # So the last reflection, which can only write a lesson, is skipped: the answers are the same.
    scores = system.evaluate(tasks, cfg, write_lessons=False, final_reflection=False)
    return sum(s.correct for s in scores.values()) / max(sum(s.total for s in scores.values()), 1)


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


def run_sft(cfg, system, turns: Sequence[Turn], log, eval_tasks, state: Stage, ckpt_root: Path) -> None:
    """Train on demonstration `turns` (see sft_turns), episode by episode, until held-out accuracy
    stops rising."""
    by_episode: dict[int, list] = {}
    for t in turns:
        by_episode.setdefault(t.episode, []).append(t)
    trainer = PolicyTrainer(system.backbone, trainer_settings(cfg, system, sft=True))
    episodes = list(by_episode)
    since_best = 0
    best_dir = ckpt_root / "sft-best"
    shutil.rmtree(best_dir, ignore_errors=True)  # never start GRPO from an earlier run's adapters
    while state.step < cfg.sft.max_steps:
        chosen = next_tasks(episodes, state.step * cfg.sft.batch_size, cfg.sft.batch_size, cfg.seed)
        result = trainer.sft_step([t for e in chosen for t in by_episode[e]])
        state.step += 1
        log.scalars({f"sft/{k}": v for k, v in result.metrics.items()}, state.step)
        if state.step % cfg.sft.eval_every == 0 or state.step == cfg.sft.max_steps:
            acc = held_out(system, cfg, eval_tasks)
            log.scalars({"sft/eval/accuracy": acc}, state.step)
            console.print(f"sft step {state.step}: held-out accuracy {acc:.3f}")
            if acc > state.best_sft_accuracy:
                state.best_sft_accuracy, since_best = acc, 0
                system.backbone.save_adapters(best_dir)
            else:
                since_best += 1
                if since_best >= cfg.sft.patience:
                    break
    if best_dir.exists():
        system.backbone.load_adapters(best_dir)  # the best SFT adapters start GRPO
    state.sft_accuracy = max(state.best_sft_accuracy, 0.0)
    state.stage, state.step = "grpo", 0


def train(cfg: DictConfig, run_dir: Path) -> dict[str, float]:
    system = build_system(cfg)
    log = RunLog(run_dir)
    traces = TraceWriter(run_dir / "traces.jsonl")
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
        trainer = PolicyTrainer(system.backbone, trainer_settings(cfg, system))
        _, saved = load_checkpoint(resolve_resume(cfg.resume), trainer)
        state = Stage(**saved["stage"])
        if system.memory is not None:
            # Lessons committed after the checkpoint belong to steps that will be replayed.
            system.memory.delete([i for i in system.memory.ids() if i > state.memory_max_id])
        console.print(f"resumed from {cfg.resume} at step {state.step}")
    else:
        state = Stage(stage="sft" if cfg.sft.enabled else "grpo")
        # Before the first evaluation, so a bad demonstration file fails at start-up.
        demos = sft_turns(cfg, system) if state.stage == "sft" else []
        state.base_accuracy = held_out(system, cfg, eval_tasks)
        log.scalars({"eval/accuracy": state.base_accuracy}, 0)
        console.print(f"held-out accuracy before training: {state.base_accuracy:.3f}")
        if state.stage == "sft":
            run_sft(cfg, system, demos, log, eval_tasks, state, ckpt_root)
            console.print(f"held-out accuracy after SFT: {state.sft_accuracy:.3f}")
        trainer = PolicyTrainer(system.backbone, trainer_settings(cfg, system))
    sampling = system.sampling()
    columns = [
        TextColumn("grpo"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    ]
    accuracy = state.sft_accuracy if state.sft_accuracy is not None else state.base_accuracy
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("grpo", total=cfg.train.steps, completed=state.step, info="")
        budget = cfg.train.token_budget
        while state.step < cfg.train.steps and (budget is None or state.generated_tokens < budget):
            started = time.perf_counter()
            tasks = next_tasks(pool, state.data_pos, cfg.train.tasks_per_step, cfg.seed)
            episodes = [system.factory.new(t) for t in tasks for _ in range(cfg.train.group_size)]
            play(episodes, system.backend, sampling, seed=cfg.seed * 1_000_003 + state.step)
            system.factory.commit_lessons(episodes)
            turns = [turn for i, ep in enumerate(episodes) for turn in ep.training_turns(i)]
            rollout_s = time.perf_counter() - started
            result = trainer.grpo_step(turns)
            _attach_advantages(episodes, result.advantages)
            state.step += 1
            state.data_pos += len(tasks)
            elapsed = time.perf_counter() - started
            tokens = sum(t.generated_tokens for ep in episodes for t in ep.turns)
            state.generated_tokens += tokens
            metrics = {**result.metrics, **rollout_metrics(episodes, role_names, meta_name)}
            metrics.update(
                {"time/step_s": elapsed, "time/rollout_s": rollout_s, "time/tokens_per_s": tokens / elapsed}
            )
            log.scalars(metrics, state.step)
            if state.step % cfg.train.trace_every == 0 or state.step == 1:
                for k, ep in enumerate(episodes[: cfg.train.group_size : max(cfg.train.group_size // 2, 1)]):
                    log.text(f"traces/episode_{k}", episode_markdown(ep), state.step)
                traces.write(episodes, split="train", step=state.step)
            if state.step % cfg.train.eval_every == 0 or state.step == cfg.train.steps:
                accuracy = held_out(system, cfg, eval_tasks)
                log.scalars({"eval/accuracy": accuracy}, state.step)
            if state.step % cfg.train.checkpoint_every == 0 or state.step == cfg.train.steps:
                checkpoint(system, trainer, state, ckpt_root, cfg.train.keep_checkpoints)
            reward = sum(ep.rewards.get(role_names[-1], 0.0) for ep in episodes) / len(episodes)
            info = f"reward {reward:+.2f}  acc {metrics['rollout/accuracy']:.2f}  eval {accuracy:.2f}  {elapsed:.1f} s/step"
            progress.update(bar, advance=1, info=info)
    if state.step % cfg.train.eval_every != 0 and state.step != cfg.train.steps:
        # Stopped early by the token budget: evaluate and keep what the run reached.
        accuracy = held_out(system, cfg, eval_tasks)
        log.scalars({"eval/accuracy": accuracy}, state.step)
        checkpoint(system, trainer, state, ckpt_root, cfg.train.keep_checkpoints)
    final = {"eval/accuracy_before": state.base_accuracy}
    if state.sft_accuracy is not None:
        final["eval/accuracy_after_sft"] = state.sft_accuracy
    final["eval/accuracy_after"] = accuracy
    final["train/grpo_steps"] = float(state.step)
    final["train/generated_tokens"] = float(state.generated_tokens)
    log.config(OmegaConf.to_yaml(cfg), _flat_hparams(cfg), final)
    log.close()
    system.close()
    return final


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
