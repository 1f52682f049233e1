"""`meta-agent probe`: counterfactual replays of one fixed problem set, each arm against the unmodified
hierarchy on the same problems with the same seeds.

    meta-agent probe adapters=runs/X                                  # the run's latest adapters
    meta-agent probe adapters=runs/X probe.meta_thinker_from=runs/Y/checkpoints/sft-best

Arms (`probe.arms`):
- `no_plan`: the meta-thinker plans, but its executors are not shown the plan;
- `other_plan`: each problem's executors get the plan written for another problem (a seeded derangement);
- `no_reflection`: one round, no reflection (with protocol.max_rounds=1 that is the base itself);
- `mixed`: the meta-thinker of `probe.meta_thinker_from` with the executors of `probe.executors_from`
  (either defaults to `adapters=`), to see which role's training made the difference;
- `executors_alone`: the executors without a meta-thinker: no plan, no reflection.

Every adapter sits in its own slot of one backbone, loaded once; every arm's episodes play in one batched
rollout. Plans are generated once per meta-thinker and replayed into the arms that share them, and the
last round's reflection, which cannot change an answer, is not played. Each arm
reports its accuracy and the paired difference from the base with a 95% paired-bootstrap interval and an
exact sign test, in probe.json and probe.md.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from meta_agent.analysis.reflection import reflected, reflection_metrics
from meta_agent.analysis.stats import PairedDifference, paired_difference
from meta_agent.episode.protocol import Episode
from meta_agent.episode.reward import score
from meta_agent.episode.runner import next_requests, play
from meta_agent.errors import SettingError
from meta_agent.settings import ProbeSettings
from meta_agent.system import System, adapters_folder, load_saved_adapters
from meta_agent.tasks import Task
from roles import executors, meta_thinker


@dataclass(frozen=True)
class ArmResult:
    arm: str
    accuracy: float | None  # None: the arm was not run (note says why)
    correct: list[bool]  # per problem, in problem order
    difference: PairedDifference | None  # against the base; None for the base itself
    reflection: dict[str, float | None]
    note: str = ""


def derangement(n: int, seed: int) -> list[int]:
    """A seeded permutation of range(n) with no fixed point: problem i gets the plan of problem p[i]."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    out = [0] * n
    for k, i in enumerate(order):
        out[i] = order[(k + 1) % n]
    return out


def mixed_slots(roles: Sequence[str]) -> dict[str, str]:
    """The adapter slot of each role in the mixed arm, beside the role's own: "<role>-mixed"."""
    return {role: f"{role}-mixed" for role in roles}


def load_mixed_adapters(system: System, settings: ProbeSettings, base: str | None) -> str:
    """Fill the mixed arm's slots: the meta-thinker's from `probe.meta_thinker_from`, the executors' from
    `probe.executors_from` (either default: `base`, the adapters= folder). Returns what was loaded."""
    meta = meta_thinker(system.roles)
    sources = {meta.name: settings.meta_thinker_from or base}
    sources |= {r.name: settings.executors_from or base for r in executors(system.roles)}
    slots = mixed_slots([r.name for r in system.roles])
    for role, source in sources.items():
        if source is not None:  # else the slot stays fresh (lora_B = 0): the same function as a fresh role
            folder = adapters_folder(source, [role], mixed_source_key(settings, source, role == meta.name))
            load_saved_adapters(system.backbone, folder, {slots[role]: role})
    used = settings.executors_from or base or "fresh adapters"
    return f"the meta-thinker of {sources[meta.name] or 'fresh adapters'} with the executors of {used}"


def mixed_source_key(settings: ProbeSettings, source: str, for_meta_thinker: bool) -> str:
    """The key that named `source`, the adapters of one side of the mixed arm."""
    own = settings.meta_thinker_from if for_meta_thinker else settings.executors_from
    if own == source:
        return "probe.meta_thinker_from" if for_meta_thinker else "probe.executors_from"
    return "adapters"


def generate_plans(system: System, episodes: Sequence[Episode], *, seed: int, temperature: float | None):
    """The first request of each episode (its meta-thinker's plan), in one batch, seeded by position."""
    n = len(episodes)
    requests = next_requests(episodes, range(n), [0] * n, range(n), seed=seed, temperature=temperature)
    return system.backend.generate(requests)


def replay(episodes: Sequence[Episode], results) -> None:
    """Give each episode's first turn the generated `results` (its own plan, or another problem's)."""
    for ep, result in zip(episodes, results, strict=True):
        ep.advance(result.token_ids, result.logprobs, result.text, result.finish_reason)


def probe(
    system: System,
    tasks: Sequence[Task],
    settings: ProbeSettings,
    *,
    seed: int,
    temperature: float | None,
    adapters: str | None,
    on_step: Callable[[int], None] | None = None,
) -> tuple[dict[str, ArmResult], dict[str, list[Episode]]]:
    """Play the base hierarchy and every arm on `tasks`; returns each arm's result, the base first, and
    the episodes each arm played. The backbone must hold the mixed arm's slots (mixed_slots) for it."""
    if meta_thinker(system.roles) is None:
        raise SettingError("meta-agent probe compares arms of a hierarchy: pick roles with a meta-thinker")
    n = len(tasks)
    if n < 2:
        raise SettingError(
            f"meta-agent probe found {n} problem(s) of {settings.task}/{settings.split}: need 2"
        )
    mixed = "mixed" in settings.arms and bool(settings.meta_thinker_from or settings.executors_from)
    notes: dict[str, str] = {}
    if mixed:  # before any plan: new weights in the backbone empty the backend's prefix cache
        notes["mixed"] = load_mixed_adapters(system, settings, adapters)
    # The last round's reflection can neither revise nor change an answer (it writes a lesson, which a
    # probe keeps out of memory): no arm plays it, as held-out evaluation does not.
    new = partial(system.factory.new, final_reflection=False)
    episodes: dict[str, list[Episode]] = {"base": [new(t) for t in tasks]}
    plans = generate_plans(system, episodes["base"], seed=seed, temperature=temperature)
    replay(episodes["base"], plans)
    if "no_plan" in settings.arms:
        episodes["no_plan"] = [new(t, show_plan=False) for t in tasks]
        replay(episodes["no_plan"], plans)
    if "other_plan" in settings.arms:
        episodes["other_plan"] = [new(t) for t in tasks]
        replay(episodes["other_plan"], [plans[j] for j in derangement(n, seed)])
    if "no_reflection" in settings.arms:
        one_round = replace(system.factory.limits, max_rounds=1)
        episodes["no_reflection"] = [new(t, limits=one_round) for t in tasks]
        replay(episodes["no_reflection"], plans)
        if system.factory.limits.max_rounds == 1:
            notes["no_reflection"] = (
                "protocol.max_rounds=1: the base has one round too, so this arm is the base"
            )
    if mixed:
        episodes["mixed"] = [new(t, adapters=mixed_slots([r.name for r in system.roles])) for t in tasks]
        # The meta-thinker of adapters= plans as in the base: its plans are the base's.
        mixed_plans = plans
        if settings.meta_thinker_from:
            mixed_plans = generate_plans(system, episodes["mixed"], seed=seed, temperature=temperature)
        replay(episodes["mixed"], mixed_plans)
    if "executors_alone" in settings.arms:
        episodes["executors_alone"] = [new(t, roles=executors(system.roles)) for t in tasks]
    flat = [ep for arm in episodes.values() for ep in arm]
    play(
        flat,
        system.backend,
        seed=seed,
        temperature=temperature,
        indices=[i for arm in episodes.values() for i in range(n)],  # problem i samples alike in every arm
        steps=[0 if name == "executors_alone" else 1 for name, arm in episodes.items() for _ in arm],
        on_step=on_step,
    )
    score(flat)  # the traces show each role's reward
    base = [ep.correct for ep in episodes["base"]]
    out = {"base": arm_result("base", episodes["base"], base, None, settings)}
    for name in settings.arms:
        if name in episodes:
            correct = [ep.correct for ep in episodes[name]]
            out[name] = arm_result(name, episodes[name], correct, base, settings, note=notes.get(name, ""))
        else:
            why = "not run: set probe.meta_thinker_from and/or probe.executors_from"
            out[name] = ArmResult(name, None, [], None, {}, why)
    return out, episodes


def arm_result(
    name: str,
    episodes: Sequence[Episode] | None,
    correct: Sequence[bool],
    base: Sequence[bool] | None,
    settings: ProbeSettings,
    *,
    note: str = "",
) -> ArmResult:
    diff = None
    if base is not None:
        diff = paired_difference(
            [float(c) for c in correct], [float(b) for b in base], resamples=settings.resamples
        )
    reflection = reflection_metrics([reflected(ep) for ep in episodes]) if episodes else {}
    return ArmResult(name, sum(correct) / len(correct), list(correct), diff, reflection, note)


def write_probe(results: dict[str, ArmResult], folder: Path, header: dict) -> tuple[Path, Path]:
    """probe.json (everything, per problem) and probe.md (the table) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {**header, "arms": {name: asdict(r) for name, r in results.items()}}
    json_path = folder / "probe.json"
    json_path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    md_path = folder / "probe.md"
    md_path.write_text(probe_markdown(results, header), encoding="utf-8")
    return json_path, md_path


def probe_markdown(results: dict[str, ArmResult], header: dict) -> str:
    base = results["base"]
    lines = [
        f"# Probe: {header.get('adapters') or 'fresh adapters'}",
        "",
        f"{header['problems']} problems of {header['task']}/{header['split']}, seed {header['seed']}, "
        f"temperature {header['temperature']}. Each arm against the unmodified hierarchy on the same problems: "
        "the paired difference in accuracy, its 95% paired-bootstrap interval, and the exact sign-test p-value "
        "on the problems where the two differ.",
        "",
        "| arm | accuracy | difference | 95% interval | better / worse | p |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| base (the hierarchy) | {base.accuracy:.3f} | | | | |",
    ]
    for name, r in results.items():
        if name == "base":
            continue
        if r.difference is None:
            lines.append(f"| {name} | not run | | | | |")
            continue
        d = r.difference
        lines.append(
            f"| {name} | {r.accuracy:.3f} | {d.mean:+.3f} | [{d.low:+.3f}, {d.high:+.3f}] | {d.better} / {d.worse} "
            f"| {d.p_value:.3g} |"
        )
    notes = [f"- {name}: {r.note}" for name, r in results.items() if r.note]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"
