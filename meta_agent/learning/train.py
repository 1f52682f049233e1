"""`meta-agent train`: SFT warm start (optional), then joint multi-agent GRPO of every role.

    meta-agent train experiment=arith_hierarchy           # configs/experiment/arith_hierarchy.yaml
    meta-agent train experiment=arith_hierarchy resume=runs/arith_hierarchy   # continue exactly
    accelerate launch --multi_gpu --num_processes 2 -m meta_agent train experiment=arith_hierarchy

One GRPO step, as the default run (experiment=arith_hierarchy, 8 tasks x G=4 a step) takes it:
  rollout     G episodes of the whole hierarchy per task (the hf backend, every role sampling at 1.0)
  score       each role's reward from what it did in its episode (meta_agent.episode.reward, roles.rewards)
  advantages  reward minus its (role, task) group's mean, over the group's std (grpo.advantage=grpo); the
              meta-thinker's reflections share its episode's (grpo.reflection_credit=episode)
              groups whose episodes all ended alike keep their penalties' own size (grpo.penalty_only_groups)
  filter      groups whose rewards are all equal are dropped, having no signal (grpo.filter_zero_variance);
              a reflection with no round left after it is never trained (it cannot change the outcome)
  update      one optimizer step per rollout (train.updates_per_rollout=1, minibatches=1): token-level ratio
              clipped to [1 - 0.2, 1 + 0.28] against the trainer's own logprobs (so 1 in a single step),
              each token weighted by min(pi_trainer / pi_rollout, 2) against the rollout backend (TIS), the
              loss a mean over all trained tokens (token-mean), no KL (grpo.beta=0)
then log (with training.drift's KL to the start policy and cosine of consecutive updates) -> held-out
eval -> checkpoint. Under N processes each rank plays a contiguous share of the
step's tasks, all G episodes of a task on one rank, so advantages need no communication; what the ranks
agree on is meta_agent.rank_protocol. Only rank 0 writes logs, traces and checkpoints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
from pettingzoo import AECEnv
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from meta_agent.analysis.metrics import rollout_metrics
from meta_agent.analysis.reflection import defined, reflected, reflection_metrics
from meta_agent.config import commented_yaml, hparams
from meta_agent.demos.build import demo_path
from meta_agent.env.rollout import check_env_settings, env_accuracy, env_episodes, env_maker
from meta_agent.episode.protocol import Episode
from meta_agent.episode.reward import score
from meta_agent.episode.runner import play
from meta_agent.episode.trace import TraceWriter, write_step_traces
from meta_agent.errors import SettingError
from meta_agent.evaluation.evaluate import held_out_accuracy
from meta_agent.learning.credit import assign_advantages, assign_gae, credit_metrics, training_turns
from meta_agent.learning.preference import mine_pairs, pair_metrics
from meta_agent.learning.sft import run_sft, sft_turns
from meta_agent.rank_protocol import check_ranks_agree, commit_lessons, join, rank0_first, rollback_memory
from meta_agent.settings import Config
from meta_agent.system import System, build_system, policy_trainer
from meta_agent.tasks import Task, next_tasks
from roles import executors
from training.checkpoint import CHECKPOINTS_DIR, load_checkpoint, resolve_resume, save_checkpoint
from training.distributed import Ranks
from training.drift import Drift
from training.grpo import GAE, trainable_turns
from training.preference import PreferencePair, PreferenceSettings
from training.run_log import RunLog
from training.trainer import PolicyTrainer
from training.types import Turn

console = Console()
# In the checkpoints folder: the adapters the stage began with, its loss's reference (DPO's; GRPO's KL with
# grpo.kl_reference=start).
REFERENCE_FILES = {"dpo": "dpo-reference.pt", "grpo": "kl-reference.pt"}


@dataclass
class Stage:
    """What a checkpoint must carry besides the weights to continue exactly."""

    step: int = 0  # optimizer steps done in this stage
    stage: str = "sft"  # sft | grpo | dpo
    data_pos: int = 0  # tasks consumed from the shuffled training pool
    generated_tokens: int = 0  # by GRPO rollouts, all roles: the budget that baselines are compared at
    best_sft_accuracy: float = -1.0  # equals sft_accuracy once SFT ran; kept so older checkpoints load
    base_accuracy: float | None = None
    sft_accuracy: float | None = None
    memory_max_id: int = 0  # newest memory entry at the checkpoint; later writes are undone on resume


def train(
    cfg: Config, run_dir: Path, ranks: Ranks | None = None, on_start: Callable[[], None] | None = None
) -> dict[str, float]:
    """Train as `cfg` says, writing into `run_dir`; returns the held-out accuracies and the budget used.

    Every check (the env's settings, a resumed checkpoint that must fit these settings) passes before the
    run writes anything: `on_start` is called then, once (`meta-agent train` writes the resumed run's
    config.yaml there), and only then the event files, logs and traces."""
    if ranks is None:  # as `meta-agent train` does: this process's rank, on its own device
        cfg, ranks = join(cfg)
    if ranks.size > 1 and cfg.train.tasks_per_step < ranks.size:
        raise SettingError(
            f"train.tasks_per_step={cfg.train.tasks_per_step} gives some of the {ranks.size} processes no "
            f"task: set train.tasks_per_step to at least {ranks.size} (a multiple of it splits evenly)"
        )
    if cfg.train.env:
        check_env_settings(cfg.train.algorithm, cfg.grpo.reflection_credit)
    with rank0_first(ranks):  # rank 0 converts the backbone's cache and creates the memory folder
        system = build_system(cfg, memory_read_only=not ranks.main, ranks=ranks)
    log = None
    try:
        make_env = None
        if cfg.train.env:  # the env gets the run's own registry and special tokens
            provided = {"registry": system.registry, "special_tokens": system.chat.special_tokens}
            make_env = env_maker(cfg.train.env, cfg.train.env_args, provided)
        resumed = resume_state(cfg, system, ranks) if cfg.resume else None
        # a demonstrations file is read before the run starts too (a generator's are played after)
        from_file = resumed is None and cfg.sft.enabled and demo_path(cfg.sft.source) is not None
        demos = sft_turns(cfg, system) if from_file else None
        if on_start is not None:
            on_start()
        log = RunLog(run_dir, enabled=ranks.main)
        return grpo(cfg, run_dir, ranks, system, log, make_env, resumed, demos)
    finally:  # also when the run raises: the event files keep what was logged, the vLLM engine stops
        if log is not None:
            log.close()
        system.close()


def resume_state(cfg: Config, system: System, ranks: Ranks) -> tuple[PolicyTrainer, Stage]:
    """The trainer and stage of `cfg.resume`'s checkpoint, loaded: adapters, optimizer, scheduler, RNG, data
    position, step. A checkpoint these settings cannot continue is refused here, before anything is written."""
    trainer = policy_trainer(cfg, system, ranks)
    state = Stage(**load_checkpoint(resolve_resume(cfg.resume), trainer)[1]["stage"])
    if state.stage not in ("sft", cfg.train.algorithm):
        raise SettingError(
            f"{cfg.resume} was trained with train.algorithm={state.stage}: resume it with that (meta-agent "
            f"{'dpo' if state.stage == 'dpo' else 'train'}), or start a new run from its adapters with adapters=..."
        )
    return trainer, state


def grpo(
    cfg: Config,
    run_dir: Path,
    ranks: Ranks,
    system: System,
    log: RunLog,
    make_env: Callable[[], AECEnv] | None = None,
    resumed: tuple[PolicyTrainer, Stage] | None = None,
    demos: list[Turn] | None = None,
) -> dict[str, float]:
    """SFT (if enabled and not resuming), then the GRPO loop, on a built system; `resumed`: the trainer and
    stage resume_state loaded; `demos`: SFT's turns where already read (else sft_turns reads them)."""
    traces = TraceWriter(run_dir / "traces.jsonl") if ranks.main else None
    ckpt_root = run_dir / CHECKPOINTS_DIR
    pool = cfg.tasks(cfg.train.task, "train", cfg.train.pool)
    test = {cfg.train.eval_task: cfg.tasks(cfg.train.eval_task, "test", cfg.train.eval_limit)}
    if make_env is None:
        evaluate = partial(held_out_accuracy, system, test, cfg.eval, cfg.seed, ranks)
    else:  # the rollouts and the test tasks played through the env
        drain = system.backbone.lockstep.drain
        evaluate = partial(
            env_accuracy, make_env, system.factory, system.backend, test, cfg.seed, ranks, drain
        )
    evaluate = forgetting(evaluate, system.backend)
    if resumed is not None:
        trainer, state = resumed
        # Lessons committed after the checkpoint belong to steps that will be played again.
        rollback_memory(system.memory, state.memory_max_id, ranks, private=system.memory_private)
        console.print(f"resumed from {cfg.resume} at step {state.step}")
    else:
        state = warm_start(cfg, system, log, evaluate, ckpt_root, ranks, demos)
        trainer = policy_trainer(cfg, system, ranks)
    accuracy = state.sft_accuracy if state.sft_accuracy is not None else state.base_accuracy
    executor = executors(system.roles)[0].name
    reference = stage_reference(cfg, trainer, ckpt_root, ranks)
    # Whether the steps climb: KL to the start policy, update cosines. Not on a sharded backbone, whose
    # ranks must run the same passes: each rank's fixed turns differ.
    drift = Drift(trainer, 0 if system.backbone.sharded else cfg.train.drift_turns)
    with progress(ranks, cfg.train.steps, state.step) as advance:
        while state.step < cfg.train.steps and within_budget(cfg, state):
            started = time.perf_counter()
            episodes, empty_passes = rollout(cfg, system, pool, state, ranks, make_env)
            rollout_s = time.perf_counter() - started
            score(episodes)  # each role's reward from its outcome; an env episode keeps its env's
            if cfg.train.algorithm == "grpo":  # advantages within (role, task) groups, or against value heads
                value_update = assign_credit(cfg, trainer, episodes)
                turns = training_turns(episodes)
                # grpo.reflection_credit=none: the same turns but the meta-thinker's reflections
                left_out = cfg.grpo.reflection_credit == "none"
                trained = trainable_turns(
                    training_turns(episodes, reflections=False) if left_out else turns,
                    filter_zero_variance=cfg.grpo.filter_zero_variance,
                    by=cfg.grpo.zero_variance_of,
                )
                drift.fix(turns)  # the first step's turns, sampled from the policy the stage began with
                before = drift.snapshot()
                update = trainer.grpo_step(trained, reference)
                update |= drift.measure(before)
                update |= credit_metrics(turns, trained, system.backbone.adapters)
                update |= value_update
            else:  # DPO: pairs of the rollout's groups, against the adapters the stage began with
                pairs = reference_scored(trainer, mine_pairs(episodes, cfg.dpo.pairs), reference, cfg.dpo)
                update = trainer.preference_step(pairs, cfg.dpo) | pair_metrics(pairs)
            state.step += 1
            state.data_pos += cfg.train.tasks_per_step
            elapsed = time.perf_counter() - started
            tokens = sum(t.generated_tokens for ep in episodes for t in ep.turns)
            state.generated_tokens += int(ranks.sum([tokens])[0])  # the budget is global: same on every rank
            metrics = dict(update)
            metrics.update(rollout_metrics(episodes, system.roles))
            # Over every rank's episodes: the rates are of the whole batch, the same on every rank.
            metrics.update(defined(reflection_metrics(ranks.gather([reflected(ep) for ep in episodes]))))
            if system.backbone.sharded:  # forward passes this rank ran for the others' rollouts
                metrics["rollout/empty_passes"] = float(empty_passes)
            metrics.update(
                {"time/step_s": elapsed, "time/rollout_s": rollout_s, "time/tokens_per_s": tokens / elapsed}
            )
            metrics = ranks.combine_metrics(metrics)
            log.scalars(metrics, state.step)
            if state.step % cfg.train.trace_every == 0 or state.step == 1:
                write_step_traces(log, traces, episodes, cfg.train.group_size, state.step)
            if state.step % cfg.train.eval_every == 0 or state.step == cfg.train.steps:
                accuracy = evaluate()
                log.scalars({"eval/accuracy": accuracy}, state.step)
            if state.step % cfg.train.checkpoint_every == 0 or state.step == cfg.train.steps:
                checkpoint(system, trainer, state, ckpt_root, cfg.train.keep_checkpoints)
            reward = metrics.get(f"role/{executor}/reward", 0.0)  # the first executor's, as logged
            advance(
                f"reward {reward:+.2f}  acc {metrics['rollout/accuracy']:.2f}  eval {shown(accuracy)}  {elapsed:.1f} s/step"
            )
    stopped_early = state.step % cfg.train.eval_every != 0 and state.step != cfg.train.steps
    if stopped_early or accuracy is None:
        # Stopped early by the token budget, or nothing measured yet (no SFT, train.eval_base=false and no
        # step): evaluate what the run reached.
        accuracy = evaluate()
        log.scalars({"eval/accuracy": accuracy}, state.step)
    if stopped_early:
        checkpoint(system, trainer, state, ckpt_root, cfg.train.keep_checkpoints)
    check_ranks_agree(system.backbone, ranks, run_dir)
    final = {"eval/accuracy_before": state.base_accuracy, "eval/accuracy_after_sft": state.sft_accuracy}
    final = {k: v for k, v in final.items() if v is not None} | {"eval/accuracy_after": accuracy}
    final |= {"train/grpo_steps": float(state.step), "train/generated_tokens": float(state.generated_tokens)}
    log.config(commented_yaml(cfg), hparams(cfg), final)
    return final


def assign_credit(cfg: Config, trainer: PolicyTrainer, episodes: list[Episode]) -> dict[str, float]:
    """Advantages onto the rollout's turns as grpo.advantage says. gae: the value heads' estimates of
    every turn's state first, then GAE, then the heads fitted on the returns (their metrics returned)."""
    if cfg.grpo.advantage != GAE:
        assign_advantages(
            episodes,
            scale=cfg.grpo.scale_advantages,
            kind=cfg.grpo.advantage,
            reflection_credit=cfg.grpo.reflection_credit,
            penalty_only=cfg.grpo.penalty_only_groups,
        )
        return {}
    turns = training_turns(episodes)
    estimator = trainer.value_estimator()
    returns = assign_gae(
        episodes,
        estimator.estimate(turns),
        gamma=cfg.value.gamma,
        lam=cfg.value.lam,
        scale=cfg.grpo.scale_advantages,
    )
    return estimator.learn(turns, returns)


def warm_start(
    cfg: Config,
    system: System,
    log: RunLog,
    evaluate: Callable[[], float],
    ckpt_root: Path,
    ranks: Ranks,
    demos: list[Turn] | None = None,
) -> Stage:
    """A fresh run's start: held-out accuracy untrained (when `train.eval_base`), then the SFT stage when
    `sft.enabled`, on `demos` where given."""
    state = Stage(stage="sft" if cfg.sft.enabled else cfg.train.algorithm)
    if demos is None:  # before evaluating: a generator that makes none fails at once
        demos = sft_turns(cfg, system) if cfg.sft.enabled else []
    if cfg.train.eval_base:
        state.base_accuracy = evaluate()
        log.scalars({"eval/accuracy": state.base_accuracy}, 0)
        console.print(f"held-out accuracy before training: {state.base_accuracy:.3f}")
    if cfg.sft.enabled:
        state.best_sft_accuracy = state.sft_accuracy = run_sft(
            cfg, system, demos, log, evaluate, ckpt_root, ranks
        )
        console.print(f"held-out accuracy after SFT: {state.sft_accuracy:.3f}")
        state.stage = cfg.train.algorithm
    return state


def rollout(
    cfg: Config,
    system: System,
    pool: list[Task],
    state: Stage,
    ranks: Ranks,
    make_env: Callable[[], AECEnv] | None = None,
) -> tuple[list[Episode], int]:
    """This step's episodes, played to the end (this rank's share of the tasks, G episodes each), their
    lessons committed; and the empty passes this rank ran for the others' (sharded backbone). With
    `make_env` (train.env) each episode is a fresh env's, the G of a task reset with one seed."""
    tasks = next_tasks(pool, state.data_pos, cfg.train.tasks_per_step, cfg.seed)
    first_task, _ = ranks.shard_bounds(len(tasks))
    G = cfg.train.group_size
    if make_env is None:
        episodes = [system.factory.new(t) for t in ranks.shard(tasks) for _ in range(G)]
    else:
        first = state.data_pos + first_task
        episodes = env_episodes(make_env, ranks.shard(tasks), G, cfg.seed, first, system.factory)
    seed = cfg.seed * 1_000_003 + state.step
    play(episodes, system.backend, seed=seed, first_index=first_task * cfg.train.group_size)
    empty_passes = system.backbone.lockstep.drain()
    commit_lessons(system.memory, system.factory.lessons(episodes), ranks, private=system.memory_private)
    return episodes, empty_passes


def stage_reference(
    cfg: Config, trainer: PolicyTrainer, ckpt_root: Path, ranks: Ranks
) -> dict[str, list[torch.Tensor]] | None:
    """Every role's adapter weights as the stage began, where its loss is taken against them (DPO's
    reference; with grpo.beta > 0 and grpo.kl_reference=start, GRPO's KL): taken now and kept in the run's
    checkpoints folder, or, on resume, read back from there. None where the stage needs none."""
    algorithm = cfg.train.algorithm
    if algorithm == "grpo" and not (cfg.grpo.beta > 0 and cfg.grpo.kl_reference == "start"):
        return None
    setting = "train.algorithm=dpo" if algorithm == "dpo" else "grpo.kl_reference=start"
    path = ckpt_root / REFERENCE_FILES[algorithm]
    if cfg.resume:
        if not path.is_file():
            raise SettingError(
                f"{setting} resumes against the adapters its stage began with, and {path} is missing: "
                f"resume a run that trained with {setting}, or start a new run with adapters=<that checkpoint>"
            )
        reference = torch.load(path, map_location=trainer.accelerator.device, weights_only=True)
        if set(reference) != set(trainer.backbone.adapters):
            raise SettingError(
                f"{path} holds the adapters of roles {sorted(reference)}, and this run trains "
                f"{sorted(trainer.backbone.adapters)}: resume with the roles the run began with"
            )
        return reference
    reference = {role: trainer.snapshot(role) for role in trainer.backbone.adapters}
    if ranks.main:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        torch.save(reference, path)
    return reference


def reference_scored(
    trainer: PolicyTrainer, pairs: list[PreferencePair], reference: dict, settings: PreferenceSettings
) -> list[PreferencePair]:
    """`pairs` with their turns' summed logprobs under `reference` (none when the loss needs none)."""
    if not settings.needs_reference or not pairs:
        return pairs
    turns = [t for pair in pairs for t in (pair.chosen, pair.rejected)]
    with trainer.all_weights(reference):
        logps = trainer.sequence_logprobs(turns)
    return [
        replace(pair, ref_chosen=logps[2 * k], ref_rejected=logps[2 * k + 1]) for k, pair in enumerate(pairs)
    ]


def forgetting(evaluate: Callable[[], float], backend: object) -> Callable[[], float]:
    """`evaluate`, after which the backend forgets the prompt states it cached (HFBackend.clear_cache).

    A rollout after an evaluation with unchanged weights would start from states the evaluation computed
    in its own batches, which round differently in their last bits from states computed afresh; a run
    resumed or started from a checkpoint there has no such states, and drew other samples than the whole
    run (docs/results/learning.md). Forgetting them makes both run the same prompts the same
    way. The vllm backend has no clear_cache: its own prefix cache is not bit-reproducible either way."""
    clear = getattr(backend, "clear_cache", None)

    def evaluate_and_forget() -> float:
        accuracy = evaluate()
        if clear is not None:
            clear()
        return accuracy

    return evaluate_and_forget


def shown(accuracy: float | None) -> str:
    """A held-out accuracy for the progress line: "-" before any was measured (train.eval_base=false
    and no SFT stage)."""
    return "-" if accuracy is None else f"{accuracy:.2f}"


def within_budget(cfg: Config, state: Stage) -> bool:
    return cfg.train.token_budget is None or state.generated_tokens < cfg.train.token_budget


def checkpoint(system: System, trainer: PolicyTrainer, state: Stage, root: Path, keep: int) -> None:
    if system.memory is not None:
        state.memory_max_id = max(system.memory.ids(), default=0)
    save_checkpoint(root, state.step, trainer, {"stage": vars(state)}, keep=keep)


@contextmanager
def progress(ranks: Ranks, total: int, done: int) -> Iterator[Callable[[str], None]]:
    """A progress bar on rank 0; yields advance(info), which moves it one step and shows `info`."""
    columns = [
        TextColumn("grpo"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    ]
    with Progress(*columns, console=console, disable=not ranks.main) as bar:
        task = bar.add_task("grpo", total=total, completed=done, info="")
        yield lambda info: bar.update(task, advance=1, info=info)
