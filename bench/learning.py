"""Does it learn, over seeds? Held-out accuracy of the untrained hierarchy (where the experiment's
train.eval_base is true; the default experiment's is false), after SFT and after GRPO; the
single-agent baseline trained with GRPO at an equal budget of generated tokens; and what reflection and
the plan do before and after GRPO (the probes), for each of `--seeds`.

    python -m bench.learning --seeds 0,1,2,3                  # the default experiment, four seeds
    python -m bench.learning --seeds 4                        # one more: the seeds in the file stay
    python -m bench.learning --task reflection --seeds 0,1,2,3    # the reflection task (arith_distract)
    python -m bench.learning --seeds 0 --probe-limit 0 train.steps=6   # no probes; any config override
    python -m bench.learning --seeds 1,2,3 --no-single --probe-limit 0  # the hierarchy alone, per seed
    python -m bench.learning --seeds 0,1,2,3 --reuse-hierarchy  # add the baseline and probes to those seeds
    python -m bench.learning --seeds 0,1,2,3 --no-single --probe-limit 0 --sft-from bench/results/learning.json \\
        --out bench/results/learning_minibatches.json train.minibatches=2  # a GRPO variant from the same SFT

Per seed: the task's hierarchy experiment (`--task default`: arith_hierarchy; `reflection`:
distract_hierarchy) is trained with `seed=<s>` as `meta-agent train` does it (timed: that is the
experiment's wall time), then its single-agent experiment up to the same generated tokens, then one
`meta-agent probe` of each adapter set (sft-best: before GRPO; the last checkpoint: after it) with two
rounds allowed and the arms `no_reflection` (one round) and `no_plan`. The file is written after every
part, so a stopped run keeps what it finished; seeds run before with the same resolved settings and
code, however the overrides spelled them (`config_sha`, over the settings and `TRAINING_REVISION`: an edited experiment
yaml, or code that trains differently, is another experiment; a setting added later at the value
that trains as before, NEUTRAL, is not part of it) are kept and summarised with the new ones (others:
dropped, with a line saying so).

Writes bench/results/learning.json; the default task at its top level, the reflection task in its
`reflection_task` section (a run of one keeps the other):
- `per_seed`: each seed's accuracies, seconds, dtype, generated tokens, probe summaries and
  `grpo_per_step` (rollout accuracy, the share of turns filtered for want of signal, seconds); with
  --sft-from its `sft_from` (the file, the run whose sft-best GRPO started from, that seed's config_sha
  and its GRPO accuracy from that SFT, `grpo`),
  `seconds` None and `grpo_seconds`; with --reuse-hierarchy `added_later` (per part measured later, the
  machine and dtype it ran on);
- `seeds`, and the means over them of `base` (over the seeds that evaluated the untrained policy:
  train.eval_base), `sft`, `grpo`, `single_agent_grpo`, `single_agent_sft`; `grpo_minus_base_mean`,
  paired over the seeds with a `base` (its target is judged on it, not on the two means);
- `grpo_minus_sft_{mean,ci_low,ci_high}` and `hierarchy_minus_single_{mean,ci_low,ci_high}`: differences
  paired by seed (a seed fixes the SFT data, the task order and the held-out problems), 95% Student's t
  intervals (none for one seed); with --sft-from also `grpo_minus_source_grpo_{mean,ci_low,ci_high}`, the
  variant's GRPO minus the source's GRPO from the same SFT;
- `probes`: per stage the mean self-correction, revise recall and precision, and each arm's mean
  difference from the unmodified hierarchy with its interval over seeds;
- `hierarchy_seconds_float32` and `hierarchy_seconds_bfloat16` (the dtype the backbone computed in,
  which the CPU decides; None where no seed ran in it): the mean wall time of the experiment per seed,
  over seeds that ran a whole experiment (not --sft-from's); `hierarchy_seconds_by_cpu` the same per
  `cpu_kind`, a label such as "float32 on AMD EPYC, AVX2 kernels", "(forced)" added where the
  environment set the kernels' level: a real AVX2-only CPU apart from a newer one held to AVX2 kernels.
  `meets.hierarchy_seconds` holds only if every kind meets the target;
- `targets`, `meets` (None where the seeds cannot say), `settings`, `machine` and `wall_seconds` (the last
  call's; each seed's record keeps its own `machine`, with its `torch_cpu_kernels`, and `dtype`);
- the reflection task adds `hierarchy_minus_single`, `self_correction_before`, `self_correction_after`,
  `revise_recall_after`, `revise_precision_after` and `one_round_minus_two_{before,after}`.
A measurement, not a test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import torch
import transformers
from omegaconf import OmegaConf

from bench.common import KERNEL_LEVEL_ENV, RESULTS_DIR, machine_info, write_result
from meta_agent.analysis.report import read_jsonl
from meta_agent.analysis.stats import seed_interval
from meta_agent.cli import start_run
from meta_agent.config import as_dictconfig, load_config
from meta_agent.learning.train import train
from training.checkpoint import latest_checkpoint
from training.model_files import torch_dtype

RESULTS = RESULTS_DIR / "learning.json"
# A run from a recorded SFT (--sft-from) is fingerprinted "<its own config_sha><SFT_FROM><the source's>".
SFT_FROM = "/sft:"
CHECK_RESULTS = RESULTS_DIR / "learning_check.json"
NUMBERS_RESULTS = RESULTS_DIR / "learning_numbers.json"
# --task: the experiments trained per seed, the hierarchy's and its executor-alone baseline's
TASKS = {
    "default": ("arith_hierarchy", "arith_single_agent"),
    "reflection": ("distract_hierarchy", "distract_single_agent"),  # arith_distract, two rounds
    # the same task, the reflections of the demonstrations written as one check whatever their verdict
    "reflection_check": ("distract_check_hierarchy", "distract_single_agent"),
    # the same, the numbers the plan or the work lacks found by code and shown to the reflection
    "reflection_numbers": ("distract_numbers_hierarchy", "distract_single_agent"),
    # Countdown, two attempts, the calculator's check shown (the main job since issue 54): the `reflection`
    # section; its baseline is the executor alone with the same two attempts and the same check
    "countdown": ("countdown_hierarchy", "countdown_single_agent"),
}
# Where a task's results go in the file: None the top level, else that section (a run of one keeps the others)
SECTIONS = {
    "default": None,
    "reflection": "reflection_task",
    "reflection_check": "reflection_task",
    "reflection_numbers": "reflection_task",
    "countdown": "reflection",
}
PROBE_ARMS = ("no_reflection", "no_plan")
# The targets for the default experiment on 2 CPU cores: the RL's own gain over seeds (mean, and
# the interval's lower end above 0), and about 20 minutes a seed whatever the CPU.
TARGETS = {"grpo_minus_base": 0.30, "grpo_minus_sft": 0.10, "hierarchy_seconds": 1200.0}
# On the reflection task: the hierarchy at least the executor alone; after GRPO reflections that fix
# more answers than they break, more than before GRPO, and revise-when-wrong recall and precision.
REFLECTION_TARGETS = {
    "hierarchy_minus_single": 0.0,
    "revise_recall_after": 0.3,
    "revise_precision_after": 0.5,
}
# What the code trains, beside its settings: changed with any change to the code that alters what a seed
# learns (a reward, a loss, a sampler), so that the fingerprint keeps seeds of older code out of the means.
TRAINING_REVISION = "2026-12-07b: a broken reflection pays its own format_penalty (round credit)"
# The same for the demonstrations SFT plays, per `sft.source` (a source not named here: unchanged since
# fingerprints began), so that new demonstrations of one task keep that task's older seeds out of its
# means and leave the other task's seeds alone.
DEMONSTRATIONS_REVISION = {
    "arith_distract": "2026-12-03: a revision fixes one step (<fix>)",
    "arith_distract_check": "2026-12-05: a step left out drawn twice as often as each other mistake",
}
PROBE_KEPT = (
    "self_correction",
    "revise_recall",
    "revise_precision",
    "revision_rate",
    "accept_given_wrong",
    "revise_same_plan_rate",
    "revise_same_answer_rate",
)


def parse_seeds(text: str) -> list[int]:
    try:
        return list(dict.fromkeys(int(seed) for seed in text.split(",")))  # each seed once
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--seeds takes integers joined by commas, e.g. 0,1,2,3, not {text!r}"
        ) from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=parse_seeds, default=[0], help="seeds to run, e.g. 0,1,2,3 (0)")
    p.add_argument(
        "--task",
        choices=sorted(TASKS),
        default="default",
        help="default: arith_hierarchy against arith_single_agent (the file's top level); reflection: "
        "distract_hierarchy against distract_single_agent (its reflection_task section); reflection_check: "
        f"distract_check_hierarchy against the same (the reflection_task section of {CHECK_RESULTS}); "
        f"reflection_numbers: distract_numbers_hierarchy against the same (in {NUMBERS_RESULTS})",
    )
    p.add_argument(
        "--single",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train the executor-alone baseline per seed (--no-single: the hierarchy and probes only)",
    )
    p.add_argument("--probe-limit", type=int, default=32, help="held-out problems per probe, 0 for none (32)")
    p.add_argument(
        "--reuse-hierarchy",
        action="store_true",
        help="a seed whose record in the file has these settings, this machine's dtype and CPU kernels, and "
        "whose run folder is still here keeps its hierarchy (results, seconds, machine) instead of training "
        "it again; the baseline (unless --no-single) and probes (unless --probe-limit 0) run on its "
        "checkpoints (a seed's hierarchy trains the same every time with the same seed, settings, code, "
        "dtype and kernels). Seeds without such a record train it as usual",
    )
    p.add_argument(
        "--sft-from",
        type=Path,
        help="a results file of this task whose seeds' run folders are still here: each seed's GRPO starts "
        "from that seed's sft-best instead of training SFT again, so a variant of GRPO is paired with the "
        "same SFT and draws the same tasks (its samples are a fresh draw, not the whole run's); each seed's "
        "record then has "
        "`seconds` None (the time target counts whole runs) and `grpo_seconds`, and its fingerprint names "
        "the source's, so such seeds are summarised apart from whole runs. Not the --out file",
    )
    p.add_argument(
        "--out",
        type=Path,
        help=f"result file (default {RESULTS}; {CHECK_RESULTS} for reflection_check, "
        f"{NUMBERS_RESULTS} for reflection_numbers)",
    )
    p.add_argument("overrides", nargs="*", help="config overrides for every run, e.g. train.steps=6")
    args = p.parse_args(argv)
    if args.reuse_hierarchy and not args.single and args.probe_limit == 0:
        p.error("--reuse-hierarchy with --no-single and --probe-limit 0 has nothing to add to the seeds")
    # reflection_check and reflection_numbers have files of their own: their seeds would replace the
    # reflection task's in RESULTS
    own = {"reflection_check": CHECK_RESULTS, "reflection_numbers": NUMBERS_RESULTS}
    args.out = args.out or own.get(args.task, RESULTS)
    args.kept, args.sft_sources = [], {}  # main fills them: the file's seeds, --sft-from's records
    return args


def run(experiment: str, overrides: Sequence[str], tag: str) -> tuple[dict[str, float], float, Path]:
    """Train `experiment` as `meta-agent train` does: its final metrics, wall seconds and run folder."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    args = [f"experiment={experiment}", f"run_dir=runs/bench-learning-{tag}-{stamp}", *overrides]
    started = time.perf_counter()
    cfg, run_dir = start_run(load_config(args), args, "train")  # a train run, as solve and probe read it
    final = train(cfg, run_dir)
    return final, time.perf_counter() - started, run_dir


# Settings added after fingerprints began, with the value that trains exactly as before they existed (a
# section: the setting that makes it unused). At that value they are left out of the fingerprint, so a
# new feature that a run does not use keeps its earlier seeds in the same means.
# Sections training never reads (eval and solve do): left out of every fingerprint.
UNREAD = ("planner",)
# Settings of how the same gradient is computed, not of what is trained: at any value they change only the
# order of floating-point sums (as the CPU's dtype and kernels do), so every value fingerprints alike: left
# out, or fingerprinted as the value every recorded seed had (None: left out). train.shared_prefix:
# tests/training/test_shared_prefix.py, bench/results/shared_prefix.json; train.micro_batch_size (came
# later; the recorded seeds trained one turn a pass): tests/training/test_trainer.py, bench/results/micro_batch.json.
HOW_COMPUTED = {"train.shared_prefix": None, "train.micro_batch_size": 1}
# Settings added later of what is measured beside the training, which nothing trained reads: left out of
# every fingerprint too. train.eval_base (the untrained policy's evaluation; tests/meta_agent/test_training_evaluations.py):
# a seed without it has `base` None, and the mean of `base` is over the seeds that have one.
NOT_TRAINED = ("train.eval_base", "train.drift_turns")  # drift: no-gradient passes, no sample drawn
NEUTRAL = {
    "train.algorithm": "grpo",
    "grpo.zero_variance_of": "reward",
    "grpo.kl_reference": "base",  # the KL to the backbone with adapters off, as before the setting
    "memory.internal": "truncate",  # the reflect prompts as they were
    "dpo": ("train.algorithm", "grpo"),  # the dpo: section is read only by train.algorithm=dpo
    "value": ("grpo.advantage", ("grpo", "rloo", "reinforce_pp")),  # read only by grpo.advantage=gae
    "protocol.number_check": False,  # the reflect prompts as they were
    "train.env": None,  # the hierarchy's own episode
    "train.env_args": ("train.env", None),  # read only with train.env
    "custom_tasks": {},  # a researcher's own tasks: none defined trains as before
    "protocol.final_reflection": True,  # the last round's reflection played, as before the setting
    "protocol.attempt_check": False,  # the reflect prompts as they were
    "grpo.penalty_only_groups": "scaled",  # every group's advantages scaled by its std, as before
    # The python tool's per-call memory total: it stops only programs whose processes together pass
    # 512 MB, far beyond what the default task's programs use.
    "tools.sandbox.max_total_memory_mb": 512,
    # read by round credit only; 0: credited as before the setting
    "roles.meta_thinker.reward.revise_same_plan_penalty": 0.0,
    "roles.executor.reward.revise_same_plan_penalty": 0.0,
}


def without_neutral(settings: dict) -> dict:
    """`settings` (a resolved config as nested dicts) without the NEUTRAL ones at their neutral value."""

    def get(key: str):
        node = settings
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    out = json.loads(json.dumps(settings, default=str))
    for key in UNREAD:
        out.pop(key, None)

    def drop(key: str, value=None) -> None:
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.get(part, {})
        if value is None:
            node.pop(leaf, None)
        elif leaf in node:
            node[leaf] = value

    for key, value in HOW_COMPUTED.items():
        drop(key, value)
    for key in NOT_TRAINED:
        drop(key)
    for key, neutral in NEUTRAL.items():
        if isinstance(neutral, tuple):  # (setting, its value or values that leave `key` unread)
            setting, unread = neutral
            unused = get(setting) in unread if isinstance(unread, tuple) else get(setting) == unread
        else:
            unused = get(key) == neutral
        if unused:
            drop(key)
    return out


# roles.<role>.adapter.target_modules null (every linear layer but the LM head) names, on the default
# backbone, the modules the earlier seeds listed: fingerprinted as that list, so they stay in the means.
DEFAULT_BACKBONE_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def with_named_targets(settings: dict) -> dict:
    """`settings` with each role's null target_modules as the names it resolves to on the default backbone
    (another model.path: as it is)."""
    if settings.get("model", {}).get("path") is None:
        for role in settings.get("roles", {}).values():
            if role.get("adapter", {}).get("target_modules", []) is None:
                role["adapter"]["target_modules"] = list(DEFAULT_BACKBONE_TARGETS)
    return settings


def settings_of(experiment: str, overrides: Sequence[str]) -> tuple[str, str]:
    """The dtype the backbone computes in under these overrides (model.dtype=auto: the CPU decides),
    and a fingerprint of every setting a seed's hierarchy trains with but its seed and run folder, and of
    TRAINING_REVISION (and DEMONSTRATIONS_REVISION of its demonstrations' source): seeds are summarised
    together only when they ran the same experiment with the same training code and demonstrations,
    however its yaml changed."""
    cfg = load_config([f"experiment={experiment}", *overrides, "run_dir=runs/fingerprint", "seed=0"])
    dtype = str(torch_dtype(cfg.model.dtype, cfg.model.device)).removeprefix("torch.")
    settings = without_neutral(with_named_targets(OmegaConf.to_container(as_dictconfig(cfg), resolve=True)))
    fingerprinted = {"settings": settings, "training_revision": TRAINING_REVISION}
    if cfg.sft.source in DEMONSTRATIONS_REVISION:
        fingerprinted["demonstrations_revision"] = DEMONSTRATIONS_REVISION[cfg.sft.source]
    sha = hashlib.sha256(json.dumps(fingerprinted, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return dtype, sha


def probe_stage(experiment: str, adapters: Path, limit: int, overrides: Sequence[str], out: Path) -> dict:
    """One `meta-agent probe` of `adapters` on the experiment's held-out task, two rounds allowed."""
    from bench.reflection import probe, summary

    args = [
        f"experiment={experiment}",
        *overrides,
        "memory.enabled=false",
        f"adapters={adapters}",
        f"probe.limit={limit}",
        f"probe.arms=[{','.join(PROBE_ARMS)}]",
        "protocol.max_rounds=2",  # so that a reflection can revise, and no_reflection differs from the base
    ]
    found = summary(probe(args, out))
    return {
        "accuracy": found["accuracy"],
        "reflection": {k: found["reflection"].get(k) for k in PROBE_KEPT},
        "arms": {arm: found["arms"][arm]["difference"] for arm in PROBE_ARMS if arm in found["arms"]},
        "seconds": found["wall_seconds"],
    }


def seed_run(seed: int, args: argparse.Namespace, record: dict, save) -> dict:
    """Every part of one seed, `save()` after each: hierarchy, single agent at its budget (unless
    --no-single), probes (unless --probe-limit 0)."""
    overrides = [*args.overrides, f"seed={seed}"]
    experiment = TASKS[args.task][0]
    earlier = reusable(seed, args)
    if earlier is not None:
        print(f"seed {seed}: the hierarchy of {earlier['run']} is reused (--reuse-hierarchy)", flush=True)
        # the record's `machine` is its hierarchy's; each part measured now names this call's
        now = {"machine": args.machine, "dtype": args.dtype}
        added = dict(earlier.get("added_later", {}))
        added |= {"single_agent": now} if args.single else {}
        added |= {"probes": now} if args.probe_limit > 0 else {}
        record |= {**earlier, "added_later": added}
        if args.probe_limit > 0:
            record.pop("probes", None)  # probed again: never an older probe beside a newer one
        return later_parts(seed, args, record, save)
    source = args.sft_sources.get(seed)
    if source is not None:  # GRPO from the source seed's SFT: its held-out accuracy "before" is SFT's,
        # so that evaluation runs whatever the experiment's train.eval_base
        overrides = [
            *overrides,
            f"adapters={sft_best_of(source)}",
            "sft.enabled=false",
            "train.eval_base=true",
        ]
    hierarchy, seconds, run_dir = run(experiment, overrides, f"{args.task}-hierarchy-seed{seed}")
    record |= {
        "seed": seed,
        "overrides": list(args.overrides),
        "config_sha": args.config_sha,
        "run": str(run_dir),
        "base": hierarchy.get("eval/accuracy_before"),  # None where the experiment has train.eval_base false
        "sft": hierarchy.get("eval/accuracy_after_sft", hierarchy.get("eval/accuracy_before")),
        "grpo": hierarchy["eval/accuracy_after"],
        "grpo_steps": hierarchy["train/grpo_steps"],
        "generated_tokens": hierarchy["train/generated_tokens"],
        "seconds": round(seconds, 1),
        "dtype": args.dtype,  # what the seconds mean: float32 CPUs take several times longer
        # the call's: a file's seeds may come from several machines; its torch_cpu_kernels AVX2 computes as an
        # AVX2-only CPU does
        "machine": args.machine,
        "grpo_per_step": grpo_timeline(run_dir),
    }
    if source is not None:
        record |= {
            "base": source["base"],
            "sft_from": {
                "file": str(args.sft_from),
                "run": str(sft_best_of(source).parents[1]),  # the run that trained it (a chain's first)
                "config_sha": source["config_sha"],
                # the source's own GRPO from this SFT: what the variant is paired with
                "grpo": source["grpo"],
            },
            "seconds": None,  # not the experiment's time: it had no SFT stage
            "grpo_seconds": round(seconds, 1),
        }
        if record["sft"] != source["sft"]:
            print(
                f"note: seed {seed}'s sft-best scored {record['sft']} on the held-out problems here and "
                f"{source['sft']} in {args.sft_from}: the two are not the same SFT",
                flush=True,
            )
    save()
    return later_parts(seed, args, record, save)


def reusable(seed: int, args: argparse.Namespace) -> dict | None:
    """With --reuse-hierarchy, the file's record of `seed` at these settings whose run folder still holds
    its sft-best and last checkpoints (what the baseline's budget and the probes need); else None."""
    record = {r["seed"]: r for r in latest_per_seed(args.kept)}.get(seed) if args.reuse_hierarchy else None
    if record is None or "run" not in record or "generated_tokens" not in record:
        return None
    kernels = (record.get("machine") or {}).get("torch_cpu_kernels")
    if (record.get("dtype"), kernels) != (args.dtype, args.machine.get("torch_cpu_kernels")):
        why = f"it computed in {record.get('dtype')} with {kernels} kernels, this machine does not"
    elif not sft_best_of(record).is_dir() or latest_checkpoint(Path(record["run"]) / "checkpoints") is None:
        why = f"its run {record['run']} has no sft-best or no complete checkpoint here"
    else:
        return record
    print(f"note: seed {seed}'s hierarchy is trained again: {why}", flush=True)
    return None


def sft_best_of(record: dict) -> Path:
    """The sft-best adapters a seed's record started GRPO from: its own run's, or its --sft-from source's."""
    run_dir = record["sft_from"]["run"] if "sft_from" in record else record["run"]
    return Path(run_dir) / "checkpoints" / "sft-best"


def sft_sources(args: argparse.Namespace) -> tuple[dict[int, dict], str | None]:
    """With --sft-from, that file's record of each seed (the task's section; a seed of --seeds starts GRPO
    from its sft-best, a kept record takes its GRPO score) and --seeds' config_sha; without it ({}, None).
    A file that is not this task's, a seed it lacks or whose sft-best is not here, or seeds of several
    settings stop the bench with one line, before any run."""
    if args.sft_from is None:
        return {}, None
    if args.sft_from.resolve() == args.out.resolve():
        raise SystemExit(
            f"--sft-from {args.sft_from} is also the file this run writes: give another --out "
            "(its seeds would be replaced by GRPO-only records)"
        )
    try:
        found = json.loads(args.sft_from.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"--sft-from {args.sft_from}: not a readable results file ({e})") from None
    section = found if SECTIONS[args.task] is None else found.get(SECTIONS[args.task]) or {}
    experiment = TASKS[args.task][0]
    held = (section.get("settings") or {}).get("experiments", [experiment])[0]
    if held != experiment:
        raise SystemExit(
            f"--sft-from {args.sft_from}: its seeds trained {held}, not --task {args.task}'s {experiment}"
        )
    by_seed = {r["seed"]: r for r in latest_per_seed(section.get("per_seed", []))}
    for seed in args.seeds:
        if seed not in by_seed or not sft_best_of(by_seed[seed]).is_dir():
            where = sft_best_of(by_seed[seed]) if seed in by_seed else "the file has no such seed"
            raise SystemExit(
                f"--sft-from {args.sft_from}: no record of seed {seed} whose sft-best is here ({where}); run "
                "from the folder its runs are in, or leave the seed out"
            )
    shas = sorted({str(by_seed[seed].get("config_sha")) for seed in args.seeds})
    if len(shas) > 1:
        raise SystemExit(
            f"--sft-from {args.sft_from}: seeds {args.seeds} ran with several settings ({shas}); take seeds of one"
        )
    return by_seed, shas[0]


def later_parts(seed: int, args: argparse.Namespace, record: dict, save) -> dict:
    """A seed's parts after its hierarchy (`record`: its run and generated tokens): the single agent at its
    budget (unless --no-single) and the probes of its sft-best and last checkpoint (unless --probe-limit 0),
    `save()` after each."""
    overrides = [*args.overrides, f"seed={seed}"]  # the hierarchy's, without an --sft-from start
    experiment = TASKS[args.task][0]
    run_dir = Path(record["run"])
    if args.single:
        single_agent(seed, args, record, overrides, budget=int(record["generated_tokens"]))
        save()
    if args.probe_limit > 0:
        latest = latest_checkpoint(run_dir / "checkpoints")
        record["probes"] = {}
        for stage, adapters in (("before_grpo", sft_best_of(record)), ("after_grpo", latest)):
            record["probes"][stage] = probe_stage(
                experiment,
                adapters,
                args.probe_limit,
                overrides,
                run_dir / "bench-learning-probe" / stage,
            )
            save()
    return record


def grpo_timeline(run_dir: Path) -> dict[str, list]:
    """Per GRPO step of a run, from its metrics.jsonl: rollout accuracy (of the policy before the step's
    update), the share of turns no update learnt from (their group's episodes all scored the same) and
    the step's seconds. Where a seed's gain or loss happened; empty lists without the file."""
    path = run_dir / "metrics.jsonl"
    rows = [r for r in read_jsonl(path) if "rollout/accuracy" in r] if path.is_file() else []
    return {
        "rollout_accuracy": [round(r["rollout/accuracy"], 4) for r in rows],
        "filtered_share": [
            round(r["train/filtered_turns"] / r["train/turns"], 4) if r.get("train/turns") else None
            for r in rows
        ],
        "step_seconds": [round(r["time/step_s"], 1) for r in rows],
    }


def single_agent(
    seed: int, args: argparse.Namespace, record: dict, overrides: list[str], budget: int
) -> None:
    """The executor-alone baseline of one seed, with as many GRPO rollout tokens as the hierarchy used,
    however many steps that takes."""
    single, single_s, _ = run(
        TASKS[args.task][1],
        [*overrides, f"train.token_budget={budget}", "train.steps=1000"],
        f"{args.task}-single-seed{seed}",
    )
    record |= {
        "single_agent_grpo": single["eval/accuracy_after"],
        "single_agent_sft": single.get("eval/accuracy_after_sft"),
        "single_agent_generated_tokens": single["train/generated_tokens"],
        "single_agent_seconds": round(single_s, 1),
    }


def interval_keys(name: str, diffs: Sequence[float]) -> dict[str, float | None]:
    """`<name>_mean`, `<name>_ci_low`, `<name>_ci_high` of per-seed differences (None: no seeds / one)."""
    if not diffs:
        return {f"{name}_mean": None, f"{name}_ci_low": None, f"{name}_ci_high": None}
    got = seed_interval(diffs)
    return {
        f"{name}_{k}": None if v is None else round(v, 4)
        for k, v in (("mean", got.mean), ("ci_low", got.low), ("ci_high", got.high))
    }


def mean_of(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 4) if known else None


def summarize(per_seed: Sequence[dict]) -> dict:
    """The means and seed-paired intervals of finished per-seed records (see the module doc)."""
    trained = [r for r in per_seed if "grpo" in r]
    both = [r for r in trained if "single_agent_grpo" in r]
    out: dict = {"seeds": [r["seed"] for r in trained]}
    for key in ("base", "sft", "grpo"):
        out[key] = mean_of([r[key] for r in trained])
    for key in ("single_agent_grpo", "single_agent_sft"):
        out[key] = mean_of([r.get(key) for r in both])
    # Paired by seed: the untrained policy's score over the seeds that measured it (train.eval_base).
    out["grpo_minus_base_mean"] = mean_of(
        [r["grpo"] - r["base"] for r in trained if r.get("base") is not None]
    )
    out |= interval_keys("grpo_minus_sft", [r["grpo"] - r["sft"] for r in trained])
    out |= interval_keys("hierarchy_minus_single", [r["grpo"] - r["single_agent_grpo"] for r in both])
    # A GRPO variant from recorded SFT (--sft-from) against the source's own GRPO from the same SFT.
    paired = [r for r in trained if (r.get("sft_from") or {}).get("grpo") is not None]
    if paired:
        out |= interval_keys("grpo_minus_source_grpo", [r["grpo"] - r["sft_from"]["grpo"] for r in paired])
    # Seeds may come from CPUs of both kinds; a kind none ran on is None, so the file says it is missing.
    for dtype in sorted({"bfloat16", "float32"} | {r["dtype"] for r in trained}):
        out[f"hierarchy_seconds_{dtype}"] = mean_of([r["seconds"] for r in trained if r["dtype"] == dtype])
    # ...and from CPUs of one dtype but other speeds: an AVX2-only CPU is not an AVX512 one held to AVX2 kernels.
    timed = [r for r in trained if r.get("seconds") is not None]
    out["hierarchy_seconds_by_cpu"] = {
        kind: mean_of([r["seconds"] for r in timed if cpu_kind(r) == kind])
        for kind in sorted({cpu_kind(r) for r in timed})
    }
    probes: dict = {}
    for stage in ("before_grpo", "after_grpo"):
        found = [r["probes"][stage] for r in trained if stage in r.get("probes", {})]
        if not found:
            continue
        probes[stage] = {
            "seeds": len(found),
            "accuracy": mean_of([p["accuracy"] for p in found]),
            **{k: mean_of([p["reflection"].get(k) for p in found]) for k in PROBE_KEPT},
        }
        for arm in PROBE_ARMS:
            diffs = [p["arms"][arm] for p in found if p["arms"].get(arm) is not None]
            probes[stage] |= interval_keys(f"{arm}_minus_base", diffs)
    out["probes"] = probes
    return out


def cpu_kind(record: dict) -> str:
    """What computed a seed, as its record says: the dtype, the CPU's model and torch's kernels, and
    "(forced)" where a variable that sets the kernels' level (KERNEL_LEVEL_ENV) was set, e.g. "float32 on
    AMD EPYC, AVX2 kernels (forced)". Unforced AVX2 kernels mean the CPU has no AVX512."""
    machine = record.get("machine") or {}
    forced = any(machine.get(f"{name.lower()}_env") for name in KERNEL_LEVEL_ENV)
    model = machine.get("cpu_model") or "an unknown CPU"
    kernels = machine.get("torch_cpu_kernels") or "unknown"
    return f"{record['dtype']} on {model}, {kernels} kernels" + (" (forced)" if forced else "")


def meets(summary: dict) -> dict[str, bool | None]:
    """Which targets the summary meets (see TARGETS); None where it cannot say (no interval, no run).
    The time target holds on every kind of CPU the seeds ran on (`hierarchy_seconds_by_cpu`: no dtype's
    mean is above its slowest kind's)."""
    gain, low = summary["grpo_minus_sft_mean"], summary["grpo_minus_sft_ci_low"]
    over_base = summary["grpo_minus_base_mean"]
    seconds = max(summary["hierarchy_seconds_by_cpu"].values(), default=None)
    return {
        "grpo_minus_base": None if over_base is None else over_base >= TARGETS["grpo_minus_base"],
        "grpo_minus_sft": None if low is None else gain >= TARGETS["grpo_minus_sft"] and low > 0,
        "hierarchy_seconds": None if seconds is None else seconds <= TARGETS["hierarchy_seconds"],
    }


def reflection_task(summary: dict) -> dict:
    """The reflection task's named results (the issue's keys) beside its summary, and their targets."""
    before = summary["probes"].get("before_grpo", {})
    after = summary["probes"].get("after_grpo", {})
    named = {
        "hierarchy_minus_single": summary["hierarchy_minus_single_mean"],
        "self_correction_before": before.get("self_correction"),
        "self_correction_after": after.get("self_correction"),
        "revise_recall_after": after.get("revise_recall"),
        "revise_precision_after": after.get("revise_precision"),
        "one_round_minus_two_before": before.get("no_reflection_minus_base_mean"),
        "one_round_minus_two_after": after.get("no_reflection_minus_base_mean"),
    }
    low = summary["hierarchy_minus_single_ci_low"]

    def at_least(key: str) -> bool | None:
        return None if named[key] is None else named[key] >= REFLECTION_TARGETS[key]

    gain = (named["self_correction_before"], named["self_correction_after"])
    corrects = None if None in gain else gain[1] > 0 and gain[1] > gain[0]

    def with_corrections(key: str) -> bool | None:
        # Recall and precision count only beside a self-correction gain: a policy that revises every
        # answer when none is right reads as recall 1 at precision 1 and fixes nothing.
        met = at_least(key)
        return None if met is None or corrects is None else met and corrects

    targets = {
        "hierarchy_minus_single": None if low is None else at_least("hierarchy_minus_single"),
        "self_correction_after": corrects,
        "revise_recall_after": with_corrections("revise_recall_after"),
        "revise_precision_after": with_corrections("revise_precision_after"),
    }
    return {**named, **summary, "targets": REFLECTION_TARGETS, "meets": targets}


# Issue 54's targets on the main job (Countdown, two attempts): reflection pays after GRPO, and GRPO pays.
COUNTDOWN_TARGETS = {
    "two_minus_one_round": 0.0,  # interval above it
    "revise_recall_after": 0.5,  # at precision at least revise_precision_after
    "revise_precision_after": 0.7,
    "grpo_minus_sft": 0.0,  # interval above it
    "hierarchy_minus_executor_alone": 0.0,
    "main_job_seconds_bfloat16": 1200.0,
}


def countdown_reflection(summary: dict) -> dict:
    """The `reflection` section: the issue's named results first (two rounds minus one after GRPO from the
    probe's no_reflection arm, negated; revise recall and precision after GRPO; self-correction after SFT
    and after GRPO; GRPO minus SFT; the hierarchy minus the executor alone at the same attempts and
    generated tokens; the main job's seconds in bfloat16), their targets and which are met, then the
    summary they come from."""
    before = summary["probes"].get("before_grpo", {})
    after = summary["probes"].get("after_grpo", {})

    def negated(key: str) -> float | None:
        value = after.get(key)
        return None if value is None else round(-value, 4)

    named = {
        "seeds": summary["seeds"],
        "two_minus_one_round_mean": negated("no_reflection_minus_base_mean"),
        "two_minus_one_round_ci_low": negated("no_reflection_minus_base_ci_high"),
        "revise_recall_after": after.get("revise_recall"),
        "revise_precision_after": after.get("revise_precision"),
        "self_correction_after_sft": before.get("self_correction"),
        "self_correction_after_grpo": after.get("self_correction"),
        "grpo_minus_sft_mean": summary["grpo_minus_sft_mean"],
        "grpo_minus_sft_ci_low": summary["grpo_minus_sft_ci_low"],
        "hierarchy_minus_executor_alone_mean": summary["hierarchy_minus_single_mean"],
        "main_job_seconds_bfloat16": summary.get("hierarchy_seconds_bfloat16"),
    }
    t = COUNTDOWN_TARGETS

    def above(value: float | None, target: float) -> bool | None:
        return None if value is None else value > target

    recall, precision = named["revise_recall_after"], named["revise_precision_after"]
    corrections = (named["self_correction_after_sft"], named["self_correction_after_grpo"])
    seconds = named["main_job_seconds_bfloat16"]
    meets_ = {
        "two_minus_one_round": above(named["two_minus_one_round_ci_low"], t["two_minus_one_round"]),
        "revise_recall_and_precision": None
        if recall is None or precision is None
        else recall >= t["revise_recall_after"] and precision >= t["revise_precision_after"],
        "self_correction": None
        if None in corrections
        else corrections[1] > 0 and corrections[1] > corrections[0],
        "grpo_minus_sft": above(named["grpo_minus_sft_ci_low"], t["grpo_minus_sft"]),
        "hierarchy_minus_executor_alone": None
        if named["hierarchy_minus_executor_alone_mean"] is None
        else named["hierarchy_minus_executor_alone_mean"] >= t["hierarchy_minus_executor_alone"],
        "main_job_seconds_bfloat16": None if seconds is None else seconds <= t["main_job_seconds_bfloat16"],
    }
    return {**named, "targets": COUNTDOWN_TARGETS, "meets": meets_, **summary}


def kept_seeds(old: dict, args: argparse.Namespace) -> list[dict]:
    """The section's per-seed records worth keeping: those trained with the same settings, whatever the
    overrides' spelling (their `config_sha`, the fingerprint of the resolved settings: an override that
    sets a default's own value, or one the fingerprint leaves out, keeps the seeds; a record from before
    fingerprints cannot show it matches and is dropped). A seed about to be rerun keeps its old record
    until the new one has its hierarchy's results (see latest_per_seed)."""
    kept, dropped = [], []
    for record in old.get("per_seed", []):
        (kept if record.get("config_sha") == args.config_sha else dropped).append(record)
    if dropped:
        print(
            f"note: dropping {args.task} seeds {[r.get('seed') for r in dropped]} of {args.out}: they ran "
            f"with other settings than {args.config_sha} (other overrides than {list(args.overrides)} in "
            "effect, the experiment's yaml or training code changed, or they ran before fingerprints)",
            flush=True,
        )
    return kept


def with_source_grpo(records: Sequence[dict], sources: dict[int, dict]) -> None:
    """Records made from recorded SFT before they kept their source's GRPO score (`sft_from.grpo`) take it
    from the source's record of their seed, where that record's SFT is the one they started from."""
    for record in records:
        source, made_from = sources.get(record.get("seed")), record.get("sft_from")
        if made_from is None or "grpo" in made_from or source is None or "grpo" not in source:
            continue
        if str(sft_best_of(source).parents[1]) == made_from["run"]:
            made_from["grpo"] = source["grpo"]


def latest_per_seed(records: Sequence[dict]) -> list[dict]:
    """One record per seed, the last one that has results (an empty record: its run has not got far)."""
    by_seed: dict[int, dict] = {}
    for record in records:
        if record:
            by_seed.pop(record["seed"], None)  # the newer record takes the older one's place, at the end
            by_seed[record["seed"]] = record
    return list(by_seed.values())


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    old = json.loads(args.out.read_text()) if args.out.is_file() else {}
    machine = machine_info(  # before the runs: the load average says whether the machine was free
        torch=torch.__version__,
        transformers=transformers.__version__,
        torch_threads=str(torch.get_num_threads()),
        torch_cpu_kernels=torch.backends.cpu.get_cpu_capability(),
    )
    args.machine = {k: v for k, v in machine.items() if k != "load_average_1m_now"}
    experiments = TASKS[args.task]
    args.dtype, args.config_sha = settings_of(experiments[0], args.overrides)
    # The default task is the file's top level, the others their SECTIONS: a run of one keeps the others.
    name = SECTIONS[args.task]
    sections = {v for v in SECTIONS.values() if v is not None}
    if name is None:
        section_old, other = (
            {k: v for k, v in old.items() if k not in sections},
            {k: v for k, v in old.items() if k in sections},
        )
    else:
        section_old, other = old.get(name) or {}, {k: v for k, v in old.items() if k != name}
    args.sft_sources, source_sha = sft_sources(args)  # a seed it lacks stops the bench here, before any run
    if source_sha is not None:  # GRPO from another experiment's SFT: summarised apart from whole runs
        args.config_sha = f"{args.config_sha}{SFT_FROM}{source_sha}"
    per_seed = kept_seeds(section_old, args)
    with_source_grpo(per_seed, args.sft_sources)
    args.kept = list(per_seed)
    result: dict = {}

    def save() -> None:
        nonlocal result
        records = latest_per_seed(per_seed)
        summary = summarize(records)
        machine["load_average_1m_now"] = round(os.getloadavg()[0], 2)
        section = {
            **summary,
            "per_seed": records,
            "wall_seconds": round(time.perf_counter() - started, 1),
            "settings": {
                "experiments": list(experiments),
                "overrides": list(args.overrides),
                "config_sha": args.config_sha,
                "dtypes": sorted({r["dtype"] for r in records if "dtype" in r}),  # each seed's is its own
                "single_agent": "GRPO until it has generated as many tokens as the hierarchy's GRPO did",
                "eval": "held-out test split of the experiment's task (drawn with the seed), greedy, "
                "train.eval_limit problems",
                "probes": f"meta-agent probe, {args.probe_limit} held-out problems, greedy, memory off, "
                f"two rounds allowed, arms {list(PROBE_ARMS)}; sft-best (before) and the last checkpoint",
                "intervals": "95% Student's t over seeds of per-seed paired differences",
            },
            "machine": machine,  # this call's; each seed's record has the machine it ran on
        }
        if name is None:
            result = {**section, "targets": TARGETS, "meets": meets(summary), **other}
        elif name == "reflection":
            result = {**other, name: countdown_reflection(section)}
        else:
            result = {**other, name: reflection_task(section)}
        result = write_result(result, args.out)

    for seed in args.seeds:
        record: dict = {}
        per_seed.append(record)
        seed_run(seed, args, record, save)
        print(json.dumps(record, indent=1), flush=True)
    save()
    print(json.dumps({k: v for k, v in result.items() if k != "per_seed"}, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
