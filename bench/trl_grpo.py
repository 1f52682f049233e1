"""GRPO step throughput side by side: meta-agent's trainer and rollout backend against TRL's
GRPOTrainer with PEFT LoRA, on the same inputs.

    python -m bench.trl_grpo          # 4 prompts x G=8 x 128 tokens, 1 warm-up + 3 timed steps a side:
                                      # about 7 minutes on 2 idle CPU cores
    python -m bench.trl_grpo --prompts 2 --group-size 4 --max-new-tokens 32 --steps 1 --out /tmp/trl.json

Both sides load the same SmolLM2-135M-Instruct safetensors (the product's converted cache, offline),
in the dtype `model.dtype` resolves to, with the executor's LoRA (rank, alpha, targets, `top_layers`
as PEFT's `layers_to_transform`, float32 adapter weights) of `--experiment`. Each step samples G
completions for each of `--prompts` arith train questions, rendered as the executor's first prompt
(token-identical on both sides), at the executor's temperature and top-p. The reward is the
project's grader on the completion text. One optimizer step per batch, micro-batches of
`--micro-batch` completions, clipped token-level surrogate (eps 0.2 / 0.28), token-mean loss, group
std scaling, no KL, same AdamW and learning rate. By default EOS does not end a completion, so both
sides generate exactly prompts x G x max-new-tokens tokens per step (`--stop-at-eos` lets it).

meta-agent: `HFBackend.generate` (the product's rollout backend) -> grader -> `PolicyTrainer.grpo_step`,
as `meta_agent/learning/train.py` runs a step, but on single-segment completions: no episode protocol, stop
strings or tool calls, which TRL would not run. Zero-variance groups are kept (TRL trains on them).
TRL: `GRPOTrainer.train()` for warm-up + timed steps; a step is on_step_begin .. on_step_end.

Writes bench/results/trl.json: `speedup` (TRL step seconds / meta-agent step seconds, medians over
the timed steps), each side's step seconds, generated tokens/s and time split (`profile`), the
settings and library versions. A measurement, not a test; needs `pip install -e '.[bench]'`.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import peft
import torch
import transformers

from bench.common import RESULTS_DIR, machine_info, write_result
from meta_agent.config import load_config
from meta_agent.episode.runner import request_seed
from meta_agent.errors import SettingError
from meta_agent.settings import Config
from meta_agent.system import System, build_system, policy_trainer
from meta_agent.tasks import Task, grade
from training.distributed import Ranks
from training.generation import HFBackend
from training.grpo import group_advantages
from training.model_files import load_tokenizer, resolve_model_dir, torch_dtype
from training.types import GenerationRequest, SamplingParams, Turn

RESULTS = RESULTS_DIR / "trl.json"
ROLE = "executor"  # the one role both sides train: TRL has no second one
TARGET_SPEEDUP = 1.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=4, help="arith train questions per step (tasks_per_step)")
    p.add_argument("--group-size", type=int, default=8, help="G completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=128, help="completion length (the executor's)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per side, after --warmup steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed first steps (allocator, kernel choice)")
    p.add_argument("--micro-batch", type=int, default=8, help="completions per forward/backward")
    p.add_argument("--stop-at-eos", action="store_true", help="let EOS end a completion (unequal work)")
    p.add_argument("--experiment", default="arith_single_agent", help="configs/experiment/ the settings from")
    p.add_argument("--side", choices=("both", "meta-agent", "trl"), default="both")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"result file (default {RESULTS})")
    args = p.parse_args(argv)
    batch = args.prompts * args.group_size
    if args.group_size < 2 or args.steps < 1 or args.warmup < 0 or batch % args.micro_batch:
        p.error("need --group-size >= 2, --steps >= 1, and prompts x group-size divisible by --micro-batch")
    return args


def load_settings(args: argparse.Namespace) -> Config:
    """The experiment's config with this benchmark's sizes: the single source of both sides' settings."""
    return load_config(
        [
            f"experiment={args.experiment}",
            "roles=single_agent",
            "memory.enabled=false",  # no lessons in the prompt: TRL's prompt is fixed
            f"roles.{ROLE}.sampling.max_new_tokens={args.max_new_tokens}",
            f"backend.batch_size={args.prompts * args.group_size}",  # one decode batch, as TRL's generate
            f"train.micro_batch_size={args.micro_batch}",
            "grpo.filter_zero_variance=false",  # TRL trains on zero-advantage groups too: equal work
            "grpo.beta=0.0",
            "grpo.ratio_level=token",
            "grpo.aggregation=token-mean",
            "grpo.scale_advantages=true",
        ]
    )


@dataclass(frozen=True)
class Workload:
    tasks: list[Task]
    prompt_ids: list[tuple[int, ...]]  # the executor's first prompt per task, chat template applied
    prompt_texts: list[str]  # the same prompts as text, for TRL (tokenizes back to prompt_ids)


def reward(completion: str, answer: str) -> float:
    """1 for a correct final answer by the project's grader, else 0: the same function on both sides."""
    return 1.0 if grade(completion, answer) else 0.0


@dataclass(frozen=True)
class SideResult:
    step_seconds: list[float]  # timed steps only
    rollout_seconds: list[float]
    reward_seconds: list[float]
    generated_tokens: list[int]  # per timed step
    trainable_parameters: int  # LoRA weights the optimizer updates: equal on both sides

    def summary(self) -> dict:
        step = statistics.median(self.step_seconds)
        rollout = statistics.median(self.rollout_seconds)
        rewards = statistics.median(self.reward_seconds)
        tokens = statistics.median(self.generated_tokens)
        return {
            "step_seconds": round(step, 3),
            "step_seconds_each": [round(s, 3) for s in self.step_seconds],
            "generated_tokens_per_step": tokens,
            "tokens_per_s": round(tokens / step, 2),
            "rollout_seconds": round(rollout, 3),
            "reward_seconds": round(rewards, 3),
            "update_seconds": round(step - rollout - rewards, 3),  # logprobs, loss, backward, optimizer
            "trainable_parameters": self.trainable_parameters,
        }


def workload(cfg: Config, system: System, prompts: int) -> Workload:
    """The first `prompts` arith train questions as the executor's first prompt of an episode."""
    tasks = cfg.tasks(cfg.train.task, "train", prompts)
    if any(t.grader != "math" for t in tasks):  # the TRL side gets the gold text alone, no grader
        raise SettingError(
            f"train.task={cfg.train.task}: this comparison grades with math-verify; pick a math task"
        )
    prompt_ids = [system.factory.new(task).request().prompt_ids for task in tasks]
    return Workload(tasks, prompt_ids, [system.chat.decode_raw(ids) for ids in prompt_ids])


def run_meta_agent(cfg: Config, args: argparse.Namespace, system: System, work: Workload) -> SideResult:
    """Rollout -> rewards -> grpo_step through the product's backend and trainer."""
    backbone = system.backbone
    tasks, prompt_ids = work.tasks, work.prompt_ids
    backend = HFBackend(
        backbone,
        batch_size=cfg.backend.batch_size,
        eos_token_ids=None if args.stop_at_eos else (),  # () : EOS never ends a row
        prefix_cache_mb=cfg.backend.prefix_cache_mb,
    )
    trainer = policy_trainer(cfg, system, Ranks())
    role = next(r for r in system.roles if r.name == ROLE)
    sampling = SamplingParams(
        temperature=role.sampling.temperature, top_p=role.sampling.top_p, max_new_tokens=args.max_new_tokens
    )
    timings: dict[str, list] = {"step": [], "rollout": [], "reward": [], "tokens": []}
    for step in range(args.warmup + args.steps):
        started = time.perf_counter()
        seed = cfg.seed * 1_000_003 + step  # as train.py seeds a step's rollout
        requests = [
            GenerationRequest(ROLE, prompt_ids[i // args.group_size], sampling, seed=request_seed(seed, i, 0))
            for i in range(args.prompts * args.group_size)
        ]
        results = backend.generate(requests)
        rolled = time.perf_counter()
        turns = [
            Turn(
                role=ROLE,
                group=tasks[i // args.group_size].id,
                prompt_ids=req.prompt_ids,
                completion_ids=res.token_ids,
                loss_mask=(1,) * len(res.token_ids),
                logprobs=res.logprobs,
                reward=reward(res.text, tasks[i // args.group_size].answer),
                episode=i,
            )
            for i, (req, res) in enumerate(zip(requests, results, strict=True))
        ]
        # One turn per episode: each reward normalised within its task's group, as the training loop does.
        advantages = group_advantages(
            [t.reward for t in turns], [(t.role, t.group) for t in turns], scale=cfg.grpo.scale_advantages
        )
        turns = [replace(t, advantage=a) for t, a in zip(turns, advantages, strict=True)]
        scored = time.perf_counter()
        trainer.grpo_step(turns)
        if step >= args.warmup:
            timings["step"].append(time.perf_counter() - started)
            timings["rollout"].append(rolled - started)
            timings["reward"].append(scored - rolled)
            timings["tokens"].append(sum(len(r.token_ids) for r in results))
    trainable = sum(p.numel() for p in backbone.trainable_parameters(ROLE))
    return SideResult(timings["step"], timings["rollout"], timings["reward"], timings["tokens"], trainable)


def trl_config(cfg: Config, args: argparse.Namespace, output_dir: str):
    """TRL's GRPOConfig with every setting that changes a step's work taken from `cfg`."""
    from trl import GRPOConfig

    role = cfg.roles[ROLE]
    batch = args.prompts * args.group_size
    generation = None if args.stop_at_eos else {"min_new_tokens": args.max_new_tokens}
    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=cfg.model.device == "cpu",
        max_steps=args.warmup + args.steps,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=batch // args.micro_batch,  # one optimizer step per generation batch
        num_generations=args.group_size,
        max_completion_length=args.max_new_tokens,
        generation_kwargs=generation,  # no EOS before max_new_tokens: the same token count as meta-agent
        temperature=role.sampling.temperature,
        top_p=role.sampling.top_p,
        top_k=0,
        learning_rate=role.lr,
        lr_scheduler_type="constant",
        warmup_steps=cfg.train.warmup_steps,
        optim="adamw_torch",  # torch.optim.AdamW, as PolicyTrainer
        weight_decay=cfg.train.weight_decay,
        max_grad_norm=cfg.train.max_grad_norm,
        beta=cfg.grpo.beta,
        num_iterations=1,
        epsilon=cfg.grpo.eps_low,
        epsilon_high=cfg.grpo.eps_high,
        importance_sampling_level="token",
        loss_type="dapo",  # token-mean over the whole generation batch
        scale_rewards="group",
        # TRL defaults that meta-agent does not do: checkpointing recomputes the forward, bf16 autocasts.
        # The weights are loaded in the dtype meta-agent uses instead.
        gradient_checkpointing=False,
        bf16=False,
        shuffle_dataset=False,
        seed=cfg.seed,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )


def run_trl(cfg: Config, args: argparse.Namespace, work: Workload) -> SideResult:
    """The same steps through TRL's GRPOTrainer on the same weights, prompts and reward."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        """Records each rollout's seconds and generated tokens; the training step itself is TRL's."""

        rollouts: list[tuple[float, int]]

        def _generate_single_turn(self, *a, **kw):
            started = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(*a, **kw)
            self.rollouts.append((time.perf_counter() - started, sum(len(c) for c in completion_ids)))
            return completion_ids, logprobs

    class StepClock(TrainerCallback):
        def __init__(self):
            self.seconds: list[float] = []
            self._started = 0.0

        def on_step_begin(self, *_, **__):
            self._started = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.seconds.append(time.perf_counter() - self._started)

    reward_seconds: list[float] = []

    def grader_reward(completions: list[str], answer: list[str], **_) -> list[float]:
        started = time.perf_counter()
        out = [reward(c, a) for c, a in zip(completions, answer, strict=True)]
        reward_seconds.append(time.perf_counter() - started)
        return out

    settings = cfg.model
    tokenizer = load_tokenizer(settings)
    for text, ids in zip(work.prompt_texts, work.prompt_ids, strict=True):
        if tuple(tokenizer(text)["input_ids"]) != ids:  # what TRL does with a text prompt
            raise RuntimeError("TRL would tokenize the prompt differently from meta-agent: not a fair test")
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_dir(settings), dtype=torch_dtype(settings.dtype, settings.device), local_files_only=True
    )
    layers = model.config.num_hidden_layers
    lora = cfg.roles[ROLE].adapter.lora_config(layers)
    rows = zip(work.prompt_texts, work.tasks, strict=True)
    dataset = Dataset.from_list([{"prompt": p, "answer": t.answer} for p, t in rows])
    clock = StepClock()
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as out:
        trainer = TimedGRPOTrainer(
            model=model,
            reward_funcs=grader_reward,
            args=trl_config(cfg, args, out),
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=[clock],
        )
        trainer.rollouts = []
        trainer.train()
    timed = slice(args.warmup, None)
    rollouts = trainer.rollouts[timed]
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    if any(p.dtype != torch.float32 for p in trained):
        raise RuntimeError("TRL's LoRA weights are not float32 as meta-agent's: not a fair test")
    return SideResult(
        clock.seconds[timed],
        [s for s, _ in rollouts],
        reward_seconds[timed],
        [n for _, n in rollouts],
        sum(p.numel() for p in trained),
    )


def shared_settings(cfg: Config, args: argparse.Namespace, work: Workload) -> dict:
    role = cfg.roles[ROLE]
    adapter = cfg.roles[ROLE].adapter
    return {
        "experiment": args.experiment,
        "prompts": args.prompts,
        "group_size": args.group_size,
        "completions_per_step": args.prompts * args.group_size,
        "max_new_tokens": args.max_new_tokens,
        "eos_ends_completion": args.stop_at_eos,
        "prompt_tokens": [len(ids) for ids in work.prompt_ids],
        "tasks": [t.id for t in work.tasks],
        "warmup_steps": args.warmup,
        "timed_steps": args.steps,
        "micro_batch": args.micro_batch,
        "optimizer_steps_per_batch": 1,
        "temperature": role.sampling.temperature,
        "top_p": role.sampling.top_p,
        "lr": role.lr,
        "lora": asdict(adapter) | {"target_modules": list(adapter.target_modules)},
        "dtype": str(torch_dtype(cfg.model.dtype, cfg.model.device)).removeprefix("torch."),
        "lora_dtype": "float32",
        "grpo": {"beta": 0.0, "eps_low": cfg.grpo.eps_low, "eps_high": cfg.grpo.eps_high, "ratio": "token"},
        "reward": "meta_agent.tasks.grade(completion, answer): 1 or 0",
        "backbone": str(resolve_model_dir(cfg.model)),
        "torch_threads": torch.get_num_threads(),
    }


def compare(meta: dict | None, trl: dict | None) -> dict:
    if meta is None or trl is None:
        return {"speedup": None}
    speedup = trl["step_seconds"] / meta["step_seconds"]
    return {
        "speedup": round(speedup, 3),
        "tokens_per_s_ratio": round(meta["tokens_per_s"] / trl["tokens_per_s"], 3),
        "equal_tokens": meta["generated_tokens_per_step"] == trl["generated_tokens_per_step"],
        "target_speedup": TARGET_SPEEDUP,
        "meets_target": speedup >= TARGET_SPEEDUP,
    }


def profile(side: dict | None) -> dict | None:
    """Where a step's time goes, as fractions of the step."""
    if side is None:
        return None
    step = side["step_seconds"]
    return {part: round(side[f"{part}_seconds"] / step, 3) for part in ("rollout", "reward", "update")} | {
        "rollout_tokens_per_s": round(side["generated_tokens_per_step"] / side["rollout_seconds"], 1)
    }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    machine = machine_info(
        torch=torch.__version__,
        transformers=transformers.__version__,
        peft=peft.__version__,
        trl=_version("trl"),
    )
    cfg = load_settings(args)
    system = build_system(cfg)
    work = workload(cfg, system, args.prompts)
    meta = None
    if args.side in ("both", "meta-agent"):
        meta = run_meta_agent(cfg, args, system, work).summary()
        print(
            f"meta-agent: {meta['step_seconds']:.1f} s/step, {meta['tokens_per_s']:.0f} tokens/s", flush=True
        )
    del system  # TRL loads its own copy of the weights
    gc.collect()
    trl = None
    if args.side in ("both", "trl"):
        trl = run_trl(cfg, args, work).summary()
        print(f"trl: {trl['step_seconds']:.1f} s/step, {trl['tokens_per_s']:.0f} tokens/s", flush=True)
    result = {
        **compare(meta, trl),
        "headline": "speedup at equal work: both sides generate and train on exactly prompts x G x "
        "max_new_tokens tokens per step"
        if not args.stop_at_eos
        else "tokens_per_s_ratio: EOS ends completions, so the sides' token counts differ",
        "meta_agent": meta,
        "trl": trl,
        "profile": {
            "meta_agent": profile(meta),
            "trl": profile(trl),
            "parts": "fractions of the median step: rollout = generation, reward = grading, update = "
            "logprobs, loss, backward and optimizer step",
        },
        "settings": shared_settings(cfg, args, work),
        # The machine may be shared: a 1-minute load well above 2 (this run's own threads) at either
        # end means another job ran alongside and the seconds are inflated.
        "machine": machine | {"load_average_1m_at_end": round(os.getloadavg()[0], 2)},
    }
    result = write_result(result, args.out)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
