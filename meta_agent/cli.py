"""The `meta-agent` command.

    meta-agent solve "A depot holds 48,213 crates ..." [key=value ...]
    meta-agent eval [eval.tasks=[arith,gsm8k]] [eval.limit=20] [adapters=runs/X/checkpoints/sft-best] [key=value ...]
    meta-agent demos sft.source=arith sft.examples=64 demos_out=runs/demos/arith.jsonl
    meta-agent probe adapters=runs/X [probe.meta_thinker_from=runs/Y] [key=value ...]
    meta-agent report runs/X
    meta-agent train --help        (any command: its usage, main keys and an example)

Overrides are Hydra's (`meta-agent config` lists every key). Each run writes its resolved config
and its traces (JSON lines) into `run_dir`.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import sys
import textwrap
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TypeVar

import transformers
from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from memory.store import SQLITE_FILE, first_missing
from memory.types import MemoryConfigError
from meta_agent.analysis.report import write_report
from meta_agent.config import CONFIG_DIR, commented_yaml, compose_config, config_of_run, load_config
from meta_agent.demos.build import SOURCES, demo_path, read_demos, write_demos
from meta_agent.episode.reward import score
from meta_agent.episode.runner import play
from meta_agent.episode.trace import TraceWriter, episode_markdown
from meta_agent.errors import BadData, SettingError, UserError
from meta_agent.evaluation.evaluate import evaluate
from meta_agent.evaluation.planning import build_planner
from meta_agent.evaluation.probe import mixed_slots, probe, write_probe
from meta_agent.evaluation.tables import accuracy_table, reflection_table, seed_table
from meta_agent.learning.sft import generate_demos, search_demos
from meta_agent.learning.train import train
from meta_agent.rank_protocol import commit_lessons, join
from meta_agent.settings import Config
from meta_agent.system import adapters_folder, build_system, check_tools
from meta_agent.tasks import KNOWN_TASKS, Task
from roles import META_THINKER, executors, meta_thinker
from training.backbone import Backbone
from training.checkpoint import CHECKPOINTS_DIR, CheckpointError, latest_checkpoint, resolve_resume
from training.distributed import Ranks
from training.model_files import (
    BackboneNotFound,
    ModelMismatch,
    context_window,
    load_tokenizer,
    model_context,
    resolve_model_dir,
)

T = TypeVar("T")
CONFIG_FILE = "config.yaml"  # a run folder's resolved config; its existence marks the folder as taken
# Piped or captured output keeps whole table rows (a terminal's own width is used as it is).
console = Console(width=None if Console().is_terminal else 160)
transformers.utils.logging.disable_progress_bar()  # weight-loading bars would bury the episode output

USAGE = """usage: meta-agent COMMAND [ARGS] [key=value ...]

commands:
  solve "QUESTION"   play one episode of the hierarchy and print it (plan, tool calls, answer, reflection)
  eval               evaluate on benchmark tasks; prints accuracy per task, writes traces.jsonl
  train              SFT warm start (if the experiment has one), then joint multi-agent GRPO
  dpo                train with preference pairs mined from each rollout instead of GRPO (train.algorithm=dpo;
                     dpo.loss=dpo|ipo|simpo, dpo.pairs); start from trained roles with adapters=...
  sft                the SFT stage alone (train with sft.enabled=true and no GRPO steps)
  demos              write sft.examples demonstrations of sft.source (arith | arith_distract[_check] | gsm8k) to demos_out,
                     a JSON-lines file that `meta-agent sft sft.source=<file>` trains on; with planner.name=mcts
                     (or best_of_n) and adapters=RUN: the plans of the episodes the planner chose where it
                     answered right (train.task's train split), as targets for the meta-thinker
  probe              counterfactual arms (plan removed, another problem's plan, no reflection, two
                     checkpoints' roles mixed, executors alone) against the hierarchy; probe.json, probe.md
  report RUN_DIR     an HTML report of a run: figures of its metrics, episodes round by round
  config             print the resolved config, every key with what it means

overrides (Hydra): experiment=arith_hierarchy  resume=runs/arith_hierarchy  roles=single_agent  eval.tasks=[arith,gsm8k]  eval.limit=20  model.path=/my/hf/model
                   adapters=runs/X/checkpoints/sft-best (trained roles for solve, eval, train)  sft.source=runs/demos/arith.jsonl

meta-agent COMMAND --help (or -h): that command's usage, main keys and an example
"""

# Every command's --help: usage, the keys that matter for it, an example. tests/meta_agent/test_cli_help.py
# checks each key against the config, so a renamed setting cannot leave a stale line here.
RUN_KEYS = """  experiment=NAME         a preset of configs/experiment/:
{experiments}
  roles=NAME              which roles play: hierarchy | single_agent | two_executors
  model.path=DIR          any local Hugging Face causal LM folder (default: SmolLM2-135M-Instruct)
  model.device=cuda       cpu | cuda
  run_dir=runs/NAME       where the run writes config.yaml, traces.jsonl and its results
  seed=N                  seeds the adapters, the data order and sampling"""

COMMAND_HELP = {
    "solve": """usage: meta-agent solve "QUESTION" [key=value ...]

Play one episode of the hierarchy on QUESTION and print it: plan, tool calls, answer, reflection.
Uses the newest trained run under runs/ with its own settings unless adapters= says otherwise.

main keys:
  adapters=RUN            trained roles: a run folder, a checkpoint or an adapters folder; null: untrained
  planner.name=mcts       search over plans (mcts | best_of_n; none: one episode)
  planner.simulations=N   episodes the search may play
  protocol.max_new_tokens=N  generated tokens in the whole episode
{run_keys}

example:
  meta-agent solve "A depot holds 48,213 crates of 12 bolts. How many bolts?" adapters=runs/arith
""",
    "eval": """usage: meta-agent eval [key=value ...]

Evaluate the roles on benchmark tasks: accuracy per task, eval.json and traces.jsonl in run_dir.

main keys:
  eval.tasks=[arith,gsm8k]  tasks, or a custom_tasks name:
{tasks}
  eval.limit=N            problems per task (null: all)
  eval.split=test         test | train
  eval.samples=N          episodes per problem: above 1, pass@k, maj@k and an interval
  eval.seeds=[0,1,2]      the same problems sampled with each seed
  adapters=RUN            trained roles: a run folder, a checkpoint or an adapters folder
  planner.name=mcts       search over plans (mcts | best_of_n; none: one episode per sample)
{run_keys}

example:
  meta-agent eval experiment=arith_hierarchy adapters=runs/arith eval.tasks=[arith] eval.limit=20
""",
    "train": """usage: meta-agent train [key=value ...]

SFT warm start (when sft.enabled=true, as some experiments set), then joint multi-agent GRPO of every
role's adapter. run_dir gets config.yaml, TensorBoard events, traces.jsonl and checkpoints/.

main keys:
  train.steps=N           GRPO steps
  train.task=arith        the task family trained on (its train split)
  train.tasks_per_step=N  tasks per step; train.group_size=N episodes of each
  train.eval_every=N      held-out accuracy (train.eval_task, train.eval_limit problems) every N steps
  grpo.beta=0.02          weight of the KL to the reference
  grpo.advantage=rloo     the advantage estimator: grpo | rloo | reinforce_pp | gae
  roles.executor.lr=1e-4  a role's learning rate; roles.<role>.adapter.r=16 its LoRA rank
  adapters=RUN            start from trained roles (a run folder, a checkpoint or an adapters folder)
  resume=RUN              continue an interrupted run exactly, in its own folder
{run_keys}

example:
  meta-agent train experiment=arith_hierarchy train.steps=20 run_dir=runs/arith
""",
    "dpo": """usage: meta-agent dpo [key=value ...]

Train with preference pairs mined from each rollout instead of GRPO (train with train.algorithm=dpo);
writes what `meta-agent train` writes.

main keys:
  dpo.loss=dpo            dpo | ipo | simpo
  dpo.beta=0.1            how far from the reference the implied reward may pull
  dpo.pairs=[plan,execute,reflection]  which turns are paired
  train.steps=N           steps, each on one rollout's pairs
  adapters=RUN            start from trained roles (a run folder, a checkpoint or an adapters folder)
  resume=RUN              continue an interrupted run exactly
{run_keys}

example:
  meta-agent dpo experiment=arith_hierarchy adapters=runs/arith dpo.loss=ipo train.steps=10
""",
    "sft": """usage: meta-agent sft [key=value ...]

The SFT stage alone (train with sft.enabled=true and train.steps=0): supervised steps on demonstrations
until held-out accuracy stops improving; writes what `meta-agent train` writes.

main keys:
  sft.source=arith        {sources},
                          or a .jsonl file written by `meta-agent demos`
  sft.examples=N          demonstration episodes to generate (a .jsonl source is used whole)
  sft.max_steps=N         at most this many SFT steps; sft.batch_size=N episodes each
  sft.patience=N          stop after N evaluations without improvement (sft.eval_every=N steps apart)
  sft.lr_scale=3.0        SFT learning rate = each role's lr times this
{run_keys}

example:
  meta-agent sft sft.source=runs/demos/arith.jsonl run_dir=runs/sft
""",
    "demos": """usage: meta-agent demos [key=value ...]

Write demonstration episodes to a JSON-lines file that `meta-agent sft sft.source=<file>` trains on:
sft.examples scripted demonstrations of sft.source, or, with planner.name=mcts (or best_of_n) and
adapters=RUN, the plans of the searched episodes that answered train.task's problems right.

main keys:
  sft.source=arith        {sources}
  sft.examples=N          demonstration episodes (problems searched, with a planner)
  demos_out=FILE.jsonl    where they go (default: run_dir/demos.jsonl)
  planner.name=mcts       search for plans with trained roles instead (needs adapters=RUN)
  adapters=RUN            the trained roles a planner searches with
{run_keys}

example:
  meta-agent demos sft.source=arith sft.examples=64 demos_out=runs/demos/arith.jsonl
""",
    "probe": """usage: meta-agent probe [key=value ...]

Counterfactual arms against the hierarchy on the same problems (plan removed, another problem's plan,
no reflection, two runs' roles mixed, executors alone): probe.json and probe.md in run_dir.

main keys:
  adapters=RUN            the trained roles probed (a run folder, a checkpoint or an adapters folder)
  probe.arms=[no_plan,other_plan,no_reflection,mixed,executors_alone]
  probe.task=arith        the problems' task; probe.split=test, probe.limit=N problems
  probe.meta_thinker_from=RUN  arm mixed: another run's meta-thinker (probe.executors_from: executors)
  eval.temperature=0.0    0: greedy episodes
{run_keys}

example:
  meta-agent probe experiment=arith_hierarchy adapters=runs/arith probe.limit=32
""",
    "report": """usage: meta-agent report RUN_DIR

An HTML report of a run folder: figures of its metrics (PNG, in RUN_DIR/figures/) and its episodes
round by round. Takes the folder alone, no key=value settings.

example:
  meta-agent report runs/arith
""",
    "config": """usage: meta-agent config [key=value ...]

Print the resolved config with these overrides, every key with what it means; the values are checked
as a run would check them at start-up.

main keys: any, e.g.
  experiment=NAME         a preset of configs/experiment/:
{experiments}
  roles=NAME              hierarchy | single_agent | two_executors

example:
  meta-agent config experiment=arith_hierarchy grpo.beta=0.02
""",
}


def command_help(command: str) -> str:
    """COMMAND_HELP[command] with the run keys, the experiments of the config folder, the known tasks and
    the SFT sources."""
    experiments = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
    text = (
        COMMAND_HELP[command].replace("{run_keys}", RUN_KEYS).replace("{experiments}", _listed(experiments))
    )
    return text.replace("{tasks}", _listed(KNOWN_TASKS)).replace("{sources}", " | ".join(SOURCES))


def _listed(names) -> str:
    """Names as an indented paragraph under a key's column of a help text."""
    return textwrap.fill(", ".join(names), 104, initial_indent=" " * 26, subsequent_indent=" " * 26)


def start_run(
    cfg: Config, overrides: list[str], command: str, *, resume: bool = False
) -> tuple[Config, Path]:
    """Check what a start needs, claim the run folder and write the resolved config (each key with its
    comment) as config.yaml; returns the config the run goes on with and its folder.

    Nothing is created or changed before the checks pass (a bad model.path leaves an existing run
    folder as it was). A new run never shares a folder: when `run_dir` holds another run (two started in
    the same second, or a run_dir given twice) this one gets `<run_dir>-2` (or -3, ...), said on the
    console, and the config is composed again so that every `${run_dir}` (the memory path) follows. A
    resumed run goes on in its own folder."""
    if cfg.model.path is not None:
        resolve_model_dir(cfg.model)  # a missing model folder stops here, before any file is written
    weaker = check_tools(cfg)  # so does an unknown tool, or a sandbox level this machine cannot give
    if weaker:
        console.print(f"[yellow]note:[/yellow] {weaker}")
    wanted = Path(cfg.run_dir)
    if resume:  # its own folder, or the run_dir= it was asked to go on in (a copy, say)
        run_dir = wanted
        if not run_dir.is_dir():
            CLAIMS.append(Claim(run_dir, first_missing(run_dir)))
            made(lambda: run_dir.mkdir(parents=True, exist_ok=True), "run_dir", run_dir)
    else:
        created = first_missing(wanted)
        try:
            run_dir = made(lambda: claim_folder(wanted), "run_dir", wanted)
        except SettingError:  # a claim cut short (a full disk) leaves none of the folders it made
            prune(wanted, created)
            raise
        # the folders made for it: the missing parents of run_dir, or <run_dir>-k; an existing one is kept
        outermost = created if created and run_dir.is_relative_to(created) else None
        CLAIMS.append(Claim(run_dir / CONFIG_FILE, outermost or (run_dir if run_dir != wanted else None)))
    if run_dir != wanted:
        console.print(f"{cfg.run_dir} holds another run: this one writes to {run_dir}")
        cfg = in_folder(cfg, overrides, run_dir)
    memory = Path(cfg.memory.path) if cfg.memory.enabled and cfg.memory.path else None
    if memory is not None and first_missing(memory) is not None:
        CLAIMS.append(Claim(memory, first_missing(memory), only_if=memory_is_empty))
    if not resume:  # a resumed run's config.yaml is written once its checkpoint loaded (cmd_train)
        made(lambda: write_config(cfg, run_dir, command), "run_dir", run_dir)
    return cfg, run_dir


@dataclass
class Claim:
    """A file or folder a start made for its run: a refusal before the run starts takes it back (withdraw)."""

    path: Path
    outermost: Path | None  # the outermost folder the start created for it (its missing parents), if any
    only_if: Callable[[Path], bool] = lambda path: True  # taken back only where this holds


# The folders of this process's start that has not yet started its run (cmd_*: run_started()).
CLAIMS: list[Claim] = []


def run_started() -> None:
    """The run has passed every check and goes on: what its start made is its own now."""
    CLAIMS.clear()


def withdraw() -> None:
    """Remove what the refused start made: the run's config.yaml, the memory folder it created (where it
    holds no entry), and the folders it created for them, where empty. Nothing else is removed."""
    for claim in reversed(CLAIMS):
        if claim.path.is_dir() and claim.only_if(claim.path):
            shutil.rmtree(claim.path, ignore_errors=True)
        elif claim.path.is_file():
            claim.path.unlink()
        prune(claim.path if claim.path.is_dir() else claim.path.parent, claim.outermost)
    CLAIMS.clear()


def prune(folder: Path, outermost: Path | None) -> None:
    """Remove `folder` and its parents up to `outermost`, as long as each is empty."""
    while outermost is not None and folder.is_relative_to(outermost):
        try:
            folder.rmdir()  # only an empty one
        except OSError:
            break
        folder = folder.parent


def memory_is_empty(folder: Path) -> bool:
    """A memory folder holds no entry (one whose database cannot be read counts as not empty: kept)."""
    try:
        with closing(sqlite3.connect(f"file:{folder / SQLITE_FILE}?mode=ro", uri=True)) as db:
            return db.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 0
    except sqlite3.Error:
        return not (folder / SQLITE_FILE).exists()


def made(write: Callable[[], T], key: str, path: Path) -> T:
    """`write()`, an OS error of writing `path` (the folder a key names) one SettingError naming the key."""
    try:
        return write()
    except (FileExistsError, NotADirectoryError) as err:
        raise SettingError(
            f"{key}={path}: {err.filename} is a file, not a folder: pass another {key}"
        ) from None
    except OSError as err:
        raise SettingError(
            f"{key}={path}: cannot write there ({err.strerror}): free some space, or pass a writable {key}"
        ) from None


def in_folder(cfg: Config, overrides: list[str], run_dir: Path) -> Config:
    """`cfg` composed again with `run_dir`, so that every `${run_dir}` follows; its model settings (the
    device a rank was given) kept."""
    return replace(load_config([*overrides, f"run_dir={run_dir}"]), model=cfg.model)


def claim_folder(wanted: Path, tries: int = 1000) -> Path:
    """`wanted`, or the first `<wanted>-k` (k >= 2) that holds no run: claimed by creating its
    config.yaml exclusively, so of two processes racing for one name only one gets it."""
    for k in range(1, tries + 1):
        folder = wanted if k == 1 else wanted.with_name(f"{wanted.name}-{k}")
        folder.mkdir(parents=True, exist_ok=True)  # FileExistsError: a file has that name
        try:
            (folder / CONFIG_FILE).open("x").close()
            return folder
        except FileExistsError:
            continue
    raise SettingError(f"run_dir={wanted}: {tries} runs of that name exist; pass another run_dir")


def write_config(cfg: Config, run_dir: Path, command: str) -> None:
    (run_dir / CONFIG_FILE).write_text(f"# meta-agent {command}\n" + commented_yaml(cfg), encoding="utf-8")


# A degenerate loop ends a segment once it fills this many tokens (a sentence of up to 16 tokens said 4
# times): an untrained or confused role answers in seconds instead of filling its whole budget.
SOLVE_REPETITION_STOP = 64
# Untrained roles rarely loop exactly (they sample) and never stop early: a whole-episode budget that
# answers in about a minute on a 2-core float32 CPU (docs/results/speed.md).
SOLVE_UNTRAINED_BUDGET = 256


def cmd_solve(question: str, overrides: list[str]) -> int:
    if not question.strip():
        raise SettingError('meta-agent solve got an empty question: meta-agent solve "What is 12*34?"')
    overrides = overrides + [f"question={_quote(question)}"]
    cfg = load_config(overrides)
    newest = newest_trained_run(Path(cfg.run_dir).parent)
    chose = any(o.split("=", 1)[0] == "adapters" for o in overrides)  # adapters=<run>, or null: untrained
    trained = None if chose else newest
    if trained is not None:
        # Its adapters with the settings it was trained with (adapter shapes, prompts, protocol).
        cfg = config_of_run(
            trained / CONFIG_FILE, overrides, own=("run_dir", "question", "seed", "memory.path")
        )
        cfg = replace(cfg, adapters=str(trained))
    cfg = with_repetition_stop(cfg, overrides)
    budget = ""
    if cfg.adapters is None and not any(o.startswith("protocol.max_new_tokens=") for o in overrides):
        cfg = replace(cfg, protocol=replace(cfg.protocol, max_new_tokens=SOLVE_UNTRAINED_BUDGET))
        budget = f" This solve stops after {SOLVE_UNTRAINED_BUDGET} generated tokens (protocol.max_new_tokens=N for more)."
    check_questions_fit([Task(id="the question", question=question, answer="", source="cli")], cfg)
    cfg, run_dir = start_run(cfg, overrides, "solve")
    if trained is not None:
        console.print(
            f"using the adapters of the newest trained run, {trained}, with its settings "
            "(adapters=<run> picks another; adapters=null runs the untrained roles)",
            highlight=False,
        )
    elif cfg.adapters is None:
        console.print(
            "[yellow]the roles are untrained (fresh LoRA adapters on the base model): "
            + (
                "adapters=null was given."
                if chose
                else f"no trained run under {run_dir.parent} and no adapters= given."
            )
            + "[/yellow] Train them with `make run` (later solves use the newest trained run), or pass one "
            'with the settings it was trained with, e.g. meta-agent solve "..." experiment=arith_hierarchy '
            f"adapters={newest or f'{run_dir.parent}/<run>'}." + budget,
            highlight=False,
        )
    with console.status("loading the backbone"):
        system = build_system(cfg)
    task = Task(id="cli/0", question=question, answer="", source="cli")
    episode = system.factory.new(task)
    check_fits(len(episode.request().prompt_ids), cfg.protocol.max_new_tokens, context_length(system))
    run_started()
    extra = {}
    with console.status("thinking"):
        planner = build_planner(cfg.planner, system.backbone)
        if planner is not None:  # the shown episode is one of the search's, its answer the search's
            [found] = planner.search(system.factory, system.backend, [task], seed=cfg.seed)
            episode = found.episode
            extra = {"search": found.tree.as_dict(), "simulations": found.simulations}
        else:
            play([episode], system.backend, seed=cfg.seed)
    score([episode])  # the trace shows each role's reward
    commit_lessons(system.memory, system.factory.lessons([episode]), Ranks())
    TraceWriter(run_dir / "traces.jsonl").write([episode], split="solve", **extra)
    system.close()
    console.print(Markdown(episode_markdown(episode)))
    if extra:
        plans = extra["search"]["children"]
        how = (
            f"the most visited plan ({max(c['visits'] for c in plans)} visits) answers by majority"
            if cfg.planner.name == "mcts" and plans
            else "the answer is their majority"
        )
        console.print(
            f"\nsearched {extra['simulations']} episodes over {len(plans)} plans; {how}", highlight=False
        )
    console.print(f"\n[bold]answer:[/bold] {episode.final_answer}")
    console.print(f"trace: {run_dir / 'traces.jsonl'}")
    return 0


def newest_trained_run(runs: Path) -> Path | None:
    """The run folder under `runs` whose newest complete checkpoint is the newest, made by `train` or
    `sft` (its config.yaml's first line says which command made it)."""
    found = []
    for config in runs.glob(f"*/{CONFIG_FILE}") if runs.is_dir() else []:
        run = config.parent
        try:
            made_by_train = config.read_text(encoding="utf-8").startswith(
                ("# meta-agent train", "# meta-agent sft")
            )
            checkpoint = latest_checkpoint(run / CHECKPOINTS_DIR) if made_by_train else None
        except (OSError, UnicodeDecodeError, CheckpointError):
            continue  # unreadable or damaged: not a run to use unasked
        if checkpoint is not None:
            found.append((checkpoint.stat().st_mtime, str(run), run))
    return max(found)[2] if found else None


def with_repetition_stop(cfg: Config, overrides: list[str]) -> Config:
    """Every role's sampling with SOLVE_REPETITION_STOP, where the command line did not set one."""
    roles = {}
    for name, role in cfg.roles.items():
        if any(o.startswith(f"roles.{name}.sampling.repetition_stop=") for o in overrides):
            roles[name] = role
        else:
            roles[name] = replace(
                role, sampling=replace(role.sampling, repetition_stop=SOLVE_REPETITION_STOP)
            )
    return replace(cfg, roles=roles)


def context_length(system) -> int | None:
    return context_window(getattr(system.backbone.model, "config", None))


def check_fits(prompt_tokens: int, budget: int, context: int | None) -> None:
    """Refuse a prompt the model cannot read whole; warn when its answer may be cut short."""
    if context is None:
        return
    if prompt_tokens >= context:
        raise SettingError(
            f"the question makes a {prompt_tokens}-token prompt, longer than the model's {context}-token context: "
            "shorten it"
        )
    if prompt_tokens + budget > context:
        console.print(
            f"[yellow]the prompt ({prompt_tokens} tokens) and protocol.max_new_tokens={budget} exceed the "
            f"model's {context}-token context: the episode may be cut short[/yellow]",
            highlight=False,
        )


def cmd_eval(overrides: list[str]) -> int:
    cfg = load_config(overrides)
    # Read before the run folder is claimed: a bad task file or name stops with nothing made.
    tasks = {name: cfg.tasks(name, cfg.eval.split, cfg.eval.limit) for name in cfg.eval.tasks}
    check_questions_fit([t for ts in tasks.values() for t in ts], cfg)
    cfg, run_dir = start_run(cfg, overrides, "eval")
    with console.status("loading the backbone"):
        system = build_system(cfg)
    run_started()
    seeds = cfg.eval.seeds or [cfg.seed]
    total = sum(len(t) for t in tasks.values()) * cfg.eval.samples * len(seeds)
    started = time.perf_counter()
    columns = [TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    traces = TraceWriter(run_dir / "traces.jsonl")
    runs = {}
    planner = build_planner(cfg.planner, system.backbone)
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("eval", total=total)
        for seed in seeds:  # the same problems, sampled with each seed
            advance = lambda n: progress.advance(bar, n)  # noqa: E731
            runs[seed] = evaluate(
                system, tasks, cfg.eval, seed=seed, traces=traces, on_batch=advance, planner=planner
            )
    system.close()
    roles = ", ".join(r.name for r in system.roles)
    for seed, scores in runs.items():
        console.print(
            accuracy_table(scores, f"roles: {roles}" + (f"   seed {seed}" if len(runs) > 1 else ""))
        )
    console.print(
        reflection_table(
            {
                f"{t}" + (f" s{seed}" if len(runs) > 1 else ""): sc
                for seed, scores in runs.items()
                for t, sc in scores.items()
            }
        )
    )
    if len(runs) > 1:
        console.print(seed_table(runs))
    results = run_dir / "eval.json"
    results.write_text(
        json.dumps(
            {
                str(seed): {t: {**asdict(sc), "accuracy": sc.accuracy} for t, sc in scores.items()}
                for seed, scores in runs.items()
            },
            indent=1,
        )
    )
    console.print(f"{total} episodes in {time.perf_counter() - started:.0f} s")
    console.print(
        f"traces: {run_dir / 'traces.jsonl'}   scores: {results}   config: {run_dir / 'config.yaml'}"
    )
    return 0


def cmd_probe(overrides: list[str]) -> int:
    cfg = load_config(overrides)
    tasks = cfg.tasks(cfg.probe.task, cfg.probe.split, cfg.probe.limit)
    check_questions_fit(tasks, cfg)
    check_probe_adapters(cfg)
    cfg, run_dir = start_run(cfg, overrides, "probe")
    # The mixed arm's adapters sit beside the roles' own in one backbone, loaded once.
    mixed = "mixed" in cfg.probe.arms and (cfg.probe.meta_thinker_from or cfg.probe.executors_from)
    slots = mixed_slots(list(cfg.roles)) if mixed else {}
    with console.status("loading the backbone"):
        extra = {slot: cfg.roles[role].adapter for role, slot in slots.items()}
        backbone = Backbone.load(cfg.model, cfg.role_adapters | extra, seed=cfg.seed)
        system = build_system(cfg, backbone)
    run_started()
    began = time.perf_counter()
    with console.status(
        f"probing {len(tasks)} problems x {len(cfg.probe.arms) + 1} arms in one batched rollout"
    ):
        results, episodes = probe(
            system, tasks, cfg.probe, seed=cfg.seed, temperature=cfg.eval.temperature, adapters=cfg.adapters
        )
    system.close()
    traces = TraceWriter(run_dir / "traces.jsonl")
    for arm, played in episodes.items():
        traces.write(played, split="probe", arm=arm)
    header = {
        "adapters": cfg.adapters,
        "task": cfg.probe.task,
        "split": cfg.probe.split,
        "problems": len(tasks),
        "seed": cfg.seed,
        "temperature": cfg.eval.temperature,
        "roles": list(cfg.roles),
        "seconds": round(time.perf_counter() - began, 1),
    }
    json_path, md_path = write_probe(results, run_dir, header)
    console.print(Markdown(md_path.read_text(encoding="utf-8")))
    console.print(
        f"{len(tasks)} problems in {header['seconds']:.0f} s   results: {json_path}   table: {md_path}"
    )
    return 0


def check_probe_adapters(cfg: Config) -> None:
    """Every adapters folder probe reads (adapters=, probe.meta_thinker_from, probe.executors_from) holds
    readable adapters of the roles it gives, each named by its own key in a refusal."""
    roles = cfg.role_list
    sources = [("adapters", cfg.adapters, roles)]
    if "mixed" in cfg.probe.arms:
        sources += [
            ("probe.meta_thinker_from", cfg.probe.meta_thinker_from, [meta_thinker(roles)]),
            ("probe.executors_from", cfg.probe.executors_from, executors(roles)),
        ]
    for key, value, given in sources:
        if value:
            adapters_folder(value, [r.name for r in given], key)


def cmd_demos(overrides: list[str]) -> int:
    cfg = load_config(overrides)
    searched = cfg.planner.name != "none"
    if searched and not cfg.adapters:
        raise SettingError(
            f"meta-agent demos planner.name={cfg.planner.name} searches with trained roles: give them with "
            "adapters=RUN (a run folder, a checkpoint or an adapters folder)"
        )
    if searched and not any(r.kind == META_THINKER for r in cfg.roles.values()):
        raise SettingError(
            f"meta-agent demos planner.name={cfg.planner.name} writes the meta-thinker's plans, and these roles "
            "have none: pick roles with a meta-thinker (roles=hierarchy)"
        )
    if not searched and demo_path(cfg.sft.source) is not None:
        raise SettingError(
            f"meta-agent demos generates demonstrations: sft.source={cfg.sft.source} must be one of {SOURCES}"
        )
    cfg, run_dir = start_run(cfg, overrides, "demos")
    out = Path(cfg.demos_out) if cfg.demos_out else run_dir / "demos.jsonl"
    with console.status("loading the backbone"):
        system = build_system(cfg)
    run_started()
    what = (
        f"searching {cfg.sft.examples} {cfg.train.task} problems"
        if searched
        else (f"playing {cfg.sft.examples} {cfg.sft.source} demonstrations")
    )
    with console.status(what):
        episodes = search_demos(cfg, system) if searched else generate_demos(cfg, system)
    system.close()
    if not episodes:
        if searched:
            raise SettingError(
                f"no search of {cfg.sft.examples} {cfg.train.task} problems chose a right answer: nothing to learn "
                "from; raise sft.examples or planner.simulations"
            )
        raise SettingError(f"no {cfg.sft.source} demonstrations were made: raise sft.examples above 0")
    turns = read_demos(write_demos(episodes, out), roles=[r.name for r in system.roles])
    console.print(f"wrote {len(episodes)} demonstration episodes ({len(turns)} turns) to {out}")
    console.print(f"train on them: meta-agent sft sft.source={out}")
    return 0


def cmd_train(overrides: list[str], command: str = "train") -> int:
    resume = next((o.split("=", 1)[1] for o in overrides if o.startswith("resume=")), None)
    if resume and not any(o.startswith("run_dir=") for o in overrides):
        # A resumed run goes on in its own folder: same memory, same checkpoints, same event files.
        overrides = [*overrides, f"run_dir={run_folder(Path(resume))}"]
    if resume:
        resolve_resume(resume)  # a typo stops here, before any folder exists
    cfg = load_config(overrides)
    if command == "train":
        check_train_tasks(cfg)  # an empty pool stops here, before the backbone loads or a folder exists
    cfg, ranks = join(cfg)  # one process, or this one's rank under `accelerate launch`
    if ranks.main:
        cfg, run_dir = start_run(cfg, overrides, command, resume=bool(resume))
    if ranks.size > 1:  # one folder, named by rank 0's clock and claimed by it
        console.quiet = not ranks.main
        run_dir = Path(ranks.broadcast(str(run_dir) if ranks.main else None))
        if not ranks.main and run_dir != Path(cfg.run_dir):
            cfg = in_folder(cfg, overrides, run_dir)

    def on_start() -> None:  # every check passed: the resumed run's config is the one it goes on with
        if resume and ranks.main:
            made(lambda: write_config(cfg, run_dir, command), "run_dir", run_dir)
        run_started()
        console.print(f"run folder: {run_dir}   (tensorboard --logdir {run_dir})")

    final = train(cfg, run_dir, ranks, on_start=on_start)
    ranks.close()
    console.print(
        f"held-out accuracy ({cfg.train.eval_task}{f' through {cfg.train.env}' if cfg.train.env else ''}, "
        f"{cfg.train.eval_limit} problems): "
        + "  ".join(f"{k.split('/')[-1]} {v:.3f}" for k, v in final.items() if k.startswith("eval/"))
    )
    console.print(f"TensorBoard: tensorboard --logdir {run_dir}   then open http://localhost:6006")
    console.print(f"traces: {run_dir / 'traces.jsonl'}   checkpoints: {run_dir / 'checkpoints'}")
    return 0


def check_train_tasks(cfg: Config) -> None:
    """The training pool and the held-out problems can be read and are not empty (SettingError else)."""
    pool = cfg.tasks(cfg.train.task, "train", cfg.train.pool)
    if not pool:
        raise SettingError(
            f"train.task={cfg.train.task} train.pool={cfg.train.pool}: the training pool is empty; raise "
            "train.pool or pick a task with training problems"
        )
    check_questions_fit([*pool, *cfg.tasks(cfg.train.eval_task, "test", cfg.train.eval_limit)], cfg)


def check_questions_fit(tasks: list[Task], cfg: Config) -> None:
    """Every question is shorter than the model's context, checked as the tasks are read (a tokenizer and
    the model's config.json, no weights): a longer one is refused naming its task, before any tensor."""
    context = model_context(cfg.model)
    if context is None or not tasks:
        return
    counts = load_tokenizer(cfg.model)([t.question for t in tasks], add_special_tokens=False)["input_ids"]
    for task, ids in zip(tasks, counts, strict=True):
        if len(ids) >= context:
            raise BadData(
                f"{task.id}: the question is {len(ids)} tokens, longer than the model's {context}-token "
                "context: shorten it or drop it from the task file"
            )


def run_folder(resume: Path) -> Path:
    """The run folder of `resume=`: a run folder, its checkpoints folder, or one checkpoint in it."""
    if resume.name.startswith("step-"):
        return resume.parent.parent
    if resume.name == "checkpoints":
        return resume.parent
    return resume


def _quote(text: str) -> str:
    """A Hydra override value that keeps any characters of a free-text question."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


# `key=value` as Hydra reads it (a dotted key, no spaces before "="): "If 3x = 12, what is x?" is a question.
OVERRIDE = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.@/-]*=")

HELP = ("-h", "--help")

# The user's mistakes: a bad key or value, a missing model, file or checkpoint, malformed data.
USER_ERRORS = (UserError, BackboneNotFound, ModelMismatch, CheckpointError, MemoryConfigError)


def main(argv: list[str] | None = None) -> int:
    CLAIMS.clear()  # what an earlier start_run in this process (bench.learning's) made is not this one's
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except USER_ERRORS as err:
        withdraw()  # a refused start leaves no folder behind
        # One clear line, nothing half-written lost; any other exception is a bug and keeps its traceback.
        # escaped: a message that quotes a list (eval.tasks=[arith]) is not Rich markup
        console.print(f"[bold red]error:[/bold red] {escape(str(err))}", highlight=False, soft_wrap=True)
        return 2
    finally:
        CLAIMS.clear()  # a run that began, or a bug (its folder kept for the traceback's sake)


def _dispatch(args: list[str]) -> int:
    if not args or args[0] in HELP or args[0] == "help":
        if args[1:2] and args[1] in COMMAND_HELP:  # meta-agent help train
            print(command_help(args[1]))
            return 0
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command in COMMAND_HELP and any(a in HELP for a in rest):  # before Hydra reads "--help" as a key
        print(command_help(command))
        return 0
    if command == "solve":
        if not rest or OVERRIDE.match(rest[0]):
            raise SettingError(
                'meta-agent solve needs the question first: meta-agent solve "What is 12*34?" [key=value ...]'
            )
        return cmd_solve(rest[0], rest[1:])
    if command == "eval":
        return cmd_eval(rest)
    if command == "train":
        return cmd_train(rest)
    if command == "dpo":
        return cmd_train(["train.algorithm=dpo", *rest])
    if command == "sft":
        return cmd_train(["sft.enabled=true", "train.steps=0", *rest], command="sft")
    if command == "demos":
        return cmd_demos(rest)
    if command == "probe":
        return cmd_probe(rest)
    if command == "report":
        if len(rest) != 1 or "=" in rest[0]:
            print("meta-agent report needs the run folder: meta-agent report runs/<run>")
            return 2
        out = write_report(Path(rest[0]))
        console.print(f"report: {out}   figures: {out.parent / 'figures'}")
        return 0
    if command == "config":
        composed = compose_config(rest)
        load_config(rest)  # every value checked, as a run would at start-up
        print(commented_yaml(composed), end="")
        return 0
    print(f"unknown command {command!r}\n\n{USAGE}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
