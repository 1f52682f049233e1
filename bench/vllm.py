"""The `vllm` generation backend against `hf`: rollout tokens/s on one batch, and whether it learns as well.

    python -m bench.vllm                                   # speed: 32 requests, 4 rounds, ~4 min on 2 cores
    python -m bench.vllm --tasks 1 --group-size 1 --rounds 1 --out /tmp/vllm.json   # smoke test
    python -m bench.vllm model.dtype=float32               # trailing key=value: config overrides
    python -m bench.vllm adapters=runs/X/checkpoints/sft-best   # trained adapters instead of random ones
    python -m bench.vllm --learning --seeds 0,1            # train on each backend per seed, ~30 min a seed

Speed (the default). The batch is what a GRPO step of `arith_hierarchy` sends first: for each of `--tasks`
train problems, `--group-size` episodes' plan requests (meta-thinker; one prompt, a seed per episode) and
their executor requests after a demonstration plan (`Episode.request()`), with each role's sampling, the
episode's token limit and the protocol's stop strings: every request stops naturally (EOS, a stop string
or its limit), so the two backends may generate different numbers of tokens and tokens/s is the measure.
Both backends serve one backbone with nonzero adapters (small seeded random ones, or `adapters=...`), the
same per-request seeds, and each keeps the settings the experiment gives it. Every round starts with a
small in-place change to the adapters, as after an optimizer step: HFBackend's prefix cache is invalidated
and VLLMBackend syncs its adapters (timed, and counted in its round). Rounds alternate which backend goes
first, after one untimed warm-up round each, so background load falls on both alike.

Learning (`--learning`): `meta_agent.learning.train.train` of `arith_hierarchy` (as bench/learning.py runs it) with
backend.name=hf and with backend.name=vllm, for each of `--seeds`: held-out accuracy untrained (None where
the experiment's train.eval_base is false, as the default's is), after SFT and after GRPO, and wall seconds. Runs of other seeds already in the file are kept, so seeds can be added
one at a time; the comparison is over the seeds both backends have run, paired by seed (a seed fixes the
SFT data, the task order and the held-out problems of both runs): the mean difference and its 95% interval.
GRPO's outcome varies a lot from seed to seed here (4 steps from a low-entropy SFT policy, whose style
can flip in one step), so a difference is only a difference outside that interval.

Writes bench/results/vllm.json: `speedup_vs_hf` (median vLLM tokens/s over median hf tokens/s), per-backend
rounds, engine start-up and adapter-sync seconds, `targets`, `meets`, settings and machine; `--learning`
writes its `learning` section into the same file after every run (the speed results are kept). A
measurement, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import peft
import psutil
import torch
import transformers

from bench.common import RESULTS_DIR, machine_info, write_result
from meta_agent.analysis.stats import seed_interval
from meta_agent.config import load_config
from meta_agent.demos.build import arith_actions
from meta_agent.episode.runner import request_seed
from meta_agent.settings import Config
from meta_agent.system import System, build_system
from meta_agent.tasks import load_tasks
from roles import meta_thinker
from training.generation import VLLMBackend
from training.types import GenerationBackend, GenerationRequest

RESULTS = RESULTS_DIR / "vllm.json"
TARGETS = {"speedup_vs_hf": 1.3}  # issue 5: vLLM's rollout tokens/s over hf's, 2 CPU cores
EXPERIMENT = "arith_hierarchy"
BACKENDS = ("hf", "vllm")


def parse_seeds(text: str) -> list[int]:
    return [int(seed) for seed in text.split(",")]


def parse_backends(text: str) -> list[str]:
    names = text.split(",")
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {unknown}: choose from {','.join(BACKENDS)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--learning", action="store_true", help="train on each backend instead (~35 min a seed)")
    p.add_argument("--seeds", type=parse_seeds, default=[0], help="--learning: seeds, e.g. 0,1 (0)")
    p.add_argument(
        "--backends",
        type=parse_backends,
        default=list(BACKENDS),
        help="--learning: which backends to train, e.g. vllm to add a run the other one has (hf,vllm)",
    )
    p.add_argument("--tasks", type=int, default=4, help="problems, as a GRPO step's tasks_per_step (4)")
    p.add_argument("--group-size", type=int, default=4, help="episodes per problem (4): 32 requests in all")
    p.add_argument("--rounds", type=int, default=4, help="timed rounds of each backend (4)")
    p.add_argument("--adapter-std", type=float, default=0.01, help="std of the random adapters (0.01)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS, help=f"result file (default {RESULTS})")
    p.add_argument("overrides", nargs="*", help=f"config overrides after experiment={EXPERIMENT}")
    return p.parse_args(argv)


# ---- speed ---------------------------------------------------------------------------------------------


def build(overrides: Sequence[str]) -> tuple[Config, System]:
    """The experiment's config and its system on the `hf` backend (the vLLM engine is started apart)."""
    # Memory off: it loads an embedder and writes a folder, and an empty memory adds nothing to prompts.
    cfg = load_config([f"experiment={EXPERIMENT}", "memory.enabled=false", *overrides, "backend.name=hf"])
    return cfg, build_system(cfg)


def rollout_requests(system: System, n_tasks: int, group_size: int, seed: int) -> list[GenerationRequest]:
    """Each episode's plan request, then its executor request after a demonstration plan: the prompts,
    sampling, token limits, stop strings and per-request seeds `runner.play` sends."""
    roles = {r.name: r for r in system.roles}
    meta = meta_thinker(system.roles)
    requests = []
    for t, task in enumerate(load_tasks("arith", "train", limit=n_tasks, seed=seed)):
        for g in range(group_size):
            episode_index = t * group_size + g
            episode = system.factory.new(task)
            wanted = [episode.request()]
            episode.advance_text(arith_actions(task, seed=seed + g, grammar=meta.grammar).plan)
            wanted.append(episode.request())
            for step, req in enumerate(wanted):
                requests.append(
                    GenerationRequest(
                        req.role, req.prompt_ids, req.sampling, request_seed(seed, episode_index, step)
                    )
                )
    if {r.adapter for r in requests} != set(roles):
        raise RuntimeError(
            f"expected requests of roles {sorted(roles)}, got {sorted({r.adapter for r in requests})}"
        )
    return requests


def nudge_adapters(system: System, std: float, generator: torch.Generator) -> None:
    """Add N(0, std) to every adapter weight in place: fresh adapters (lora_B = 0) become nonzero, and
    trained ones change a little, as after an optimizer step (so no backend reuses cached states)."""
    with torch.no_grad():
        for role in system.backbone.adapters:
            for param in system.backbone.trainable_parameters(role):
                param.add_((torch.randn(param.shape, generator=generator) * std).to(param.dtype))


def cpu_seconds() -> float:
    """CPU time of this process and its children (the vLLM engine's processes)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # a process that ended meanwhile
            total += sum(child.cpu_times()[:2])
    return total


def timed_round(backend: GenerationBackend, requests: list[GenerationRequest]) -> dict:
    """One generate call (after the adapter sync, for vLLM): seconds, tokens and how it stopped."""
    started, cpu = time.perf_counter(), cpu_seconds()
    sync = 0.0
    if isinstance(backend, VLLMBackend):  # what its generate() would do first after an update
        backend.sync_adapters()
        sync = time.perf_counter() - started
    results = backend.generate(requests)
    seconds = time.perf_counter() - started
    tokens = sum(len(r.token_ids) for r in results)
    return {
        "seconds": seconds,
        "sync_seconds": sync,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        # Well below 1: another job took the CPU during this round.
        "cpu_share": (cpu_seconds() - cpu) / (seconds * len(os.sched_getaffinity(0))),
        "finish": Counter((q.adapter, r.finish_reason) for q, r in zip(requests, results, strict=True)),
    }


def measure(
    system: System,
    backends: dict[str, GenerationBackend],
    requests: list[GenerationRequest],
    args: argparse.Namespace,
    random_adapters: bool,
) -> dict[str, list[dict]]:
    """Per backend, its timed rounds (see timed_round); the adapters change a little before each round."""
    generator = torch.Generator().manual_seed(args.seed)
    if random_adapters:
        nudge_adapters(system, args.adapter_std, generator)
    for name, backend in backends.items():  # warm-up: kernels, allocators, the engine's first batches
        print(f"warm-up {name}: {timed_round(backend, requests)['seconds']:.1f} s", flush=True)
    rounds: dict[str, list[dict]] = {name: [] for name in backends}
    for k in range(args.rounds):
        nudge_adapters(system, args.adapter_std / 10, generator)
        for name in BACKENDS[k % 2 :] + BACKENDS[: k % 2]:
            rounds[name].append(timed_round(backends[name], requests))
            r = rounds[name][-1]
            print(f"round {k + 1} {name}: {r['tokens']} tokens in {r['seconds']:.1f} s", flush=True)
    return rounds


def summary(runs: list[dict]) -> dict:
    rates = [r["tokens_per_s"] for r in runs]
    finish: dict[str, dict[str, int]] = {}  # role -> finish reason -> requests, over all rounds
    for (role, reason), n in sorted(sum((r["finish"] for r in runs), Counter()).items()):
        finish.setdefault(role, {})[reason] = n
    return {
        "median_tokens_per_s": round(statistics.median(rates), 2),
        "best_tokens_per_s": round(max(rates), 2),
        "tokens_per_s": [round(x, 2) for x in rates],
        "seconds": [round(r["seconds"], 2) for r in runs],
        "tokens": [r["tokens"] for r in runs],
        "cpu_share": [round(r["cpu_share"], 2) for r in runs],
        "finish_reasons": finish,
    }


def speed(args: argparse.Namespace) -> dict:
    machine = machine_info(  # before the runs: the load average says whether the machine was free
        torch=torch.__version__,
        transformers=transformers.__version__,
        peft=peft.__version__,
        vllm=_vllm_version(),
        torch_threads=str(torch.get_num_threads()),
    )
    cfg, system = build(args.overrides)
    requests = rollout_requests(system, args.tasks, args.group_size, args.seed)
    roles = [r.name for r in system.roles]
    print(f"{len(requests)} requests, {len({r.prompt_ids for r in requests})} distinct prompts", flush=True)
    settings = cfg.backend.vllm
    started = time.perf_counter()
    engine = VLLMBackend(system.backbone, settings)
    startup = time.perf_counter() - started
    try:
        backends = {"hf": system.backend, "vllm": engine}
        rounds = measure(system, backends, requests, args, random_adapters=cfg.adapters is None)
    finally:
        engine.close()
    arms = {name: summary(runs) for name, runs in rounds.items()}
    speedup = arms["vllm"]["median_tokens_per_s"] / arms["hf"]["median_tokens_per_s"]
    paired = [
        v["tokens_per_s"] / h["tokens_per_s"] for h, v in zip(rounds["hf"], rounds["vllm"], strict=True)
    ]
    sync = statistics.median(r["sync_seconds"] for r in rounds["vllm"])
    dtype = str(system.backbone.model.dtype).removeprefix("torch.")
    result = {
        "speedup_vs_hf": round(speedup, 3),
        "speedup_vs_hf_best": round(arms["vllm"]["best_tokens_per_s"] / arms["hf"]["best_tokens_per_s"], 3),
        "speedup_per_round": [round(x, 3) for x in paired],
        "meets": {"speedup_vs_hf": speedup >= TARGETS["speedup_vs_hf"]},
        "targets": TARGETS,
        "dtype": dtype,
        "engine_startup_seconds": round(startup, 1),
        "adapter_sync_seconds": round(sync, 3),
        "backends": arms,
        "notes": notes(speedup, arms, dtype, cfg.model.dtype, startup, sync),
        "settings": {
            "experiment": EXPERIMENT,
            "overrides": ["memory.enabled=false", *args.overrides],
            "requests": len(requests),
            "distinct_prompts": len({r.prompt_ids for r in requests}),
            "batch": f"{args.tasks} tasks x {args.group_size} episodes: each episode's plan request "
            "(meta-thinker) and executor request after a demonstration plan, in one generate call",
            "prompt_tokens": {
                role: _stats([len(r.prompt_ids) for r in requests if r.adapter == role]) for role in roles
            },
            "max_new_tokens": {
                role: _stats([r.sampling.max_new_tokens for r in requests if r.adapter == role])
                for role in roles
            },
            "stopping": "natural: EOS, the protocol's stop strings, or the episode's token limit",
            "sampling": {
                r.name: {"temperature": r.sampling.temperature, "top_p": r.sampling.top_p}
                for r in system.roles
            },
            "seeds": "one per request (runner.request_seed), the same for both backends",
            "adapters": cfg.adapters
            or f"random: N(0, {args.adapter_std}) on every LoRA weight (seed {args.seed}), nudged by "
            f"N(0, {args.adapter_std / 10}) before every round",
            "hf": {"batch_size": cfg.backend.batch_size, "prefix_cache_mb": cfg.backend.prefix_cache_mb},
            "vllm": dataclasses.asdict(cfg.backend.vllm),
            "model_dtype_setting": cfg.model.dtype,
            "rounds": args.rounds,
            "order": "one untimed warm-up round each, then rounds alternating which backend goes first",
            "top_layers": {r.name: r.adapter.top_layers for r in system.roles},
            "lora_r": {r.name: r.adapter.r for r in system.roles},
        },
        "machine": {**machine, "load_average_1m_at_end": round(os.getloadavg()[0], 2)},
    }
    system.close()
    return result


def notes(speedup: float, arms: dict, dtype: str, setting: str, startup: float, sync: float) -> list[str]:
    """What the numbers say, in words, for the result file."""
    hf, vl = arms["hf"], arms["vllm"]
    out = [
        f"vllm/hf = {speedup:.2f} (target >= {TARGETS['speedup_vs_hf']}) in {dtype} "
        f"(model.dtype={setting}): median {vl['median_tokens_per_s']} against "
        f"{hf['median_tokens_per_s']} generated tokens/s (best {vl['best_tokens_per_s']} against "
        f"{hf['best_tokens_per_s']}).",
        f"the engine started in {startup:.1f} s (once per run); an adapter sync took {sync * 1000:.0f} ms "
        "(every update, counted in vLLM's rounds).",
        f"finish reasons over all rounds: hf {hf['finish_reasons']}, vllm {vl['finish_reasons']}; tokens "
        f"per round hf {hf['tokens']}, vllm {vl['tokens']} (same seeds; the two compute in {dtype} "
        "differently, so their samples can differ).",
    ]
    busy = min(share for a in arms.values() for share in a["cpu_share"])
    if busy < 0.8:
        out.insert(
            0, f"MACHINE BUSY: a timed round got only {busy:.0%} of the CPU; rerun on an idle machine."
        )
    return out


def _stats(values: list[int]) -> dict:
    return {
        "n": len(values),
        "min": min(values),
        "max": max(values),
        "mean": round(sum(values) / len(values), 1),
    }


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


# ---- learning ------------------------------------------------------------------------------------------


def learning(args: argparse.Namespace, old: dict, save) -> dict:
    """Train the experiment on each backend for each of `--seeds`; `save(section)` after every run, so a
    failed run keeps the ones before it. Runs of other seeds in `old` (the file's section) are kept."""
    from bench.learning import run

    machine = machine_info(
        torch=torch.__version__, vllm=_vllm_version(), torch_threads=str(torch.get_num_threads())
    )
    runs = {name: dict(old.get("runs", {}).get(name, {})) for name in BACKENDS}
    section: dict = {}
    for seed in args.seeds:
        for name in args.backends:
            overrides = [*args.overrides, f"seed={seed}", f"backend.name={name}"]
            final, seconds, _ = run(EXPERIMENT, overrides, f"vllm-bench-{name}-seed{seed}")
            runs[name][str(seed)] = {
                "base": final.get("eval/accuracy_before"),  # None where train.eval_base is false
                "sft": final.get("eval/accuracy_after_sft"),
                "grpo": final["eval/accuracy_after"],
                "grpo_steps": final["train/grpo_steps"],
                "generated_tokens": final["train/generated_tokens"],
                "seconds": round(seconds, 1),
            }
            print(f"{name} seed {seed}: {runs[name][str(seed)]}", flush=True)
            machine["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
            section = {**compare(runs, args.overrides), "machine": machine}
            save(section)
    return section


def paired_difference(hf: Sequence[float], vllm: Sequence[float]) -> dict[str, float]:
    """vLLM minus hf accuracy over seeds run on both, paired by seed (each seed fixes the SFT data, the
    task order and the held-out problems of both runs): the mean difference, its standard error and the
    half-width of its 95% confidence interval (Student's t; k >= 2 seeds)."""
    diffs = [v - h for h, v in zip(hf, vllm, strict=True)]
    k = len(diffs)
    if k < 2:
        raise ValueError(f"a paired comparison needs at least 2 seeds, got {k}")
    interval = seed_interval(diffs)
    return {
        "mean": interval.mean,
        "se": statistics.stdev(diffs) / k**0.5,
        "ci95": interval.high - interval.mean,
    }


def compare(runs: dict[str, dict[str, dict]], overrides: Sequence[str]) -> dict:
    """GRPO accuracy of each backend over the seeds both have run, and whether they differ by more than
    the noise: the paired difference's 95% interval, or the eval's own sampling noise if that is wider."""
    eval_limit = load_config([f"experiment={EXPERIMENT}", *overrides]).train.eval_limit
    seeds = sorted(set(runs["hf"]) & set(runs["vllm"]), key=int)
    out: dict = {"runs": runs, "seeds_compared": [int(s) for s in seeds]}
    if seeds:
        accuracy = {name: [runs[name][s]["grpo"] for s in seeds] for name in BACKENDS}
        mean = {name: statistics.mean(values) for name, values in accuracy.items()}
        p = statistics.mean(mean.values())
        # Two means of k accuracies near p on n problems each differ by sqrt(2 p (1 - p) / (n k)) by
        # chance alone (one standard error); training noise (other samples, another run) comes on top.
        eval_noise = 2 * (2 * p * (1 - p) / (eval_limit * len(seeds))) ** 0.5
        out |= {
            "grpo_mean": {name: round(v, 4) for name, v in mean.items()},
            "grpo_vllm_minus_hf": round(mean["vllm"] - mean["hf"], 4),
            "eval_noise_two_se": round(eval_noise, 4),
            "seed_spread": {name: round(max(v) - min(v), 4) for name, v in accuracy.items()},
            "sft_mean": {
                name: round(statistics.mean(runs[name][s]["sft"] for s in seeds), 4) for name in BACKENDS
            },
        }
        noise = eval_noise
        if len(seeds) >= 2:
            paired = paired_difference(accuracy["hf"], accuracy["vllm"])
            out["paired_difference"] = {k: round(v, 4) for k, v in paired.items()}
            noise = max(noise, paired["ci95"])
        out["within_noise"] = abs(mean["vllm"] - mean["hf"]) <= noise
    out["settings"] = {
        "experiment": EXPERIMENT,
        "overrides": list(overrides),
        "runs": "meta_agent.learning.train.train as bench/learning.py runs it, backend.name and seed set per run",
        "eval": f"held-out arith test split (drawn with the run's seed), greedy, {eval_limit} problems",
        "noise": "within_noise: |grpo_vllm_minus_hf| <= max(eval_noise_two_se, paired_difference.ci95): "
        "the 95% interval of the seed-paired difference (Student's t), floored by the eval's noise",
    }
    return out


def main(argv: list[str] | None = None) -> dict:
    """Run one part and write it into the result file; the other part's results there are kept."""
    args = parse_args(argv)
    old = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if args.learning:

        def save(section: dict) -> None:
            stamped = {**section, "measured_at": datetime.now(UTC).isoformat(timespec="seconds")}
            # The top level (with its measured_at) stays the speed measurement's.
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({**old, "learning": stamped}, indent=2) + "\n")

        section = learning(args, old.get("learning", {}), save)
        print(json.dumps({k: v for k, v in section.items() if k != "machine"}, indent=2))
        return {**old, "learning": section}
    kept = {"learning": old["learning"]} if "learning" in old else {}
    result = write_result({**speed(args), **kept}, args.out)
    print(json.dumps({k: result[k] for k in ("speedup_vs_hf", "notes")}, indent=2))
    return result


if __name__ == "__main__":  # vLLM starts its engine with "spawn", which imports this module again
    main()
