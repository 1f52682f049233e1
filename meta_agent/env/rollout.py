"""The trainer's way into a PettingZoo env: its agents are roles, its text actions the roles' generations.

    meta-agent train experiment=feedback_env                          # FeedbackEnv, built in
    meta-agent train train.env=my_package.my_env:make +train.env_args.level=2   # a researcher's own

`train.env` names an env (`ENVS`) or a `module:callable` returning a PettingZoo `AECEnv` or `ParallelEnv`
(called with `train.env_args`, and with the run's tool registry and its tokenizer's special tokens where
it takes `registry` or `special_tokens`; a ParallelEnv is turned into an AECEnv). Each agent must be the name of a
role of the config: its requests run on that role's adapter with its sampling. A GRPO step resets G envs
of each task with one seed (`options={"task": the Task}`: an env that needs no task ignores it), so the
G rollouts of a seed are a group. Each action is one turn of its role. Its prompt: the env's
`system_prompt(agent)` (else, or when that is None, the role's system prompt with its tools described),
the observation as the user's message, and the env's `prefill(agent)` as the start of the reply (the
agent's work so far, which it continues as its own); it ends at the env's `stops(agent)` (else at end of
text). A role's reward is the sum of what its agent got over the episode; every turn of the role shares
the role's advantage in the group. Held-out accuracy plays the test tasks through the env, greedily: an
episode is right when an agent's final `infos` say `correct`, or, for an env that reports no `correct`,
when some agent's reward summed positive. The episode ends when every agent is done, after
`protocol.max_turns` actions, or when the roles have generated `protocol.max_new_tokens`.

`EnvEpisode` is shaped as meta_agent.episode.protocol.Episode is for the batched runner (meta_agent.episode.runner.play),
the credit (meta_agent.learning.credit), the logged metrics and the traces, so the trainer's loop is the same.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import parallel_to_aec

from meta_agent.env.environments import FeedbackEnv
from meta_agent.episode.prompts import Markers, neutralise
from meta_agent.episode.records import Limits, PlayedEpisode, Request, RoundRecord, TurnRecord
from meta_agent.episode.runner import EpisodeFactory, play
from meta_agent.errors import SettingError
from meta_agent.tasks import Task
from roles import RoleSpec
from training.distributed import Ranks
from training.types import GenerationBackend

ENVS: dict[str, Callable[..., Any]] = {"feedback": FeedbackEnv}  # train.env=<name>
ACT = "act"  # the kind of an env turn in the traces


def check_env_settings(algorithm: str, reflection_credit: str) -> None:
    """Refuse, in one line, what does not train on an env episode: it has no reflect turns or graded
    rounds (grpo.reflection_credit=round; none leaves out reflections it has none of), and preference
    pairs are mined from those (train.algorithm=dpo)."""
    if algorithm != "grpo":
        raise SettingError(
            f"train.env trains with GRPO; train.algorithm={algorithm} mines no pair from an env"
        )
    if reflection_credit == "round":
        raise SettingError(
            f"train.env: grpo.reflection_credit={reflection_credit} credits graded rounds, which an env "
            "episode has none of; set grpo.reflection_credit=episode"
        )


# What the run hands an env callable that takes it (env_maker's `provided`): the run's tool registry, built
# from `tools:` and checked at start-up, and the special tokens of the run's tokenizer.
PROVIDED = ("registry", "special_tokens")


def env_callable(spec: str) -> Callable[..., Any]:
    """What `train.env=spec` names: a built-in env (ENVS) or a module's callable; one SettingError line if
    it is neither."""
    if spec in ENVS:
        return ENVS[spec]
    if ":" in spec:
        module, _, name = spec.partition(":")
        try:
            make = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise SettingError(f"train.env={spec}: cannot load {name!r} from {module!r} ({e})") from None
        if not callable(make):
            raise SettingError(f"train.env={spec}: {name!r} is not callable; name a class or function")
        return make
    raise SettingError(f"train.env={spec}: neither a built-in env {sorted(ENVS)} nor module:callable")


def env_tools(spec: str, args: Mapping[str, Any], known: Sequence[str]) -> tuple[str, ...]:
    """Which of the run's tools (`known`) an env of `train.env=spec` may run, for the start-up check: the
    `tools` argument of a callable that takes the run's registry (its default where env_args sets none),
    every known tool where it takes the registry and no `tools`, none where it takes no registry."""
    try:
        parameters = inspect.signature(env_callable(spec)).parameters
    except ValueError:
        return ()
    if "registry" not in parameters:
        return ()
    if "tools" not in parameters:
        return tuple(known)
    tools = args.get("tools", parameters["tools"].default)
    return tuple(tools) if isinstance(tools, list | tuple) else tuple(known)


def env_maker(
    spec: str, args: Mapping[str, Any], provided: Mapping[str, Any] | None = None
) -> Callable[[], AECEnv]:
    """A function making a fresh AECEnv as `train.env=spec` and `train.env_args=args` say; a bad name, a
    callable that is not there or arguments it does not take are one SettingError line each. `provided`
    (names in PROVIDED): the run's own, passed to a callable whose signature takes that name; an
    env_args entry naming one is refused, so no env runs tools with other limits than the run's."""
    make = env_callable(spec)
    provided = dict(provided or {})
    clash = sorted(set(args) & set(PROVIDED))
    if clash:
        raise SettingError(
            f"train.env_args.{clash[0]}: the run provides it (its `tools:` settings, its tokenizer); "
            "remove it from train.env_args"
        )
    try:
        parameters = inspect.signature(make).parameters
        inspect.signature(make).bind(**args)
    except TypeError as e:
        raise SettingError(f"train.env_args: {spec} does not take them ({e})") from None
    except ValueError:  # no signature to read (a builtin): the call below says what is wrong
        parameters = {}
    given = {name: value for name, value in provided.items() if name in parameters}

    def build() -> AECEnv:
        env = make(**args, **given)
        if isinstance(env, ParallelEnv):
            env = parallel_to_aec(env)
        if not isinstance(env, AECEnv):
            raise SettingError(
                f"train.env={spec} made a {type(env).__name__}, not a PettingZoo AECEnv or ParallelEnv"
            )
        return env

    return build


class EnvEpisode(PlayedEpisode):
    """One episode of a PettingZoo AECEnv played by roles: the env is reset with `seed` and `task`, and
    each live agent's turn is a generation request of the role of that name (see the module doc)."""

    def __init__(self, env: AECEnv, task: Task, seed: int, factory: EpisodeFactory):
        self.env = env
        # the GRPO group is the task and the seed: a task drawn twice in a step is two groups
        self.task = replace(task, id=f"{task.id}@{seed}")
        self.roles: dict[str, RoleSpec] = {r.name: r for r in factory.roles}
        unknown = [a for a in env.possible_agents if a not in self.roles]
        if unknown:
            raise SettingError(
                f"train.env: its agents {unknown} are not roles of this config ({sorted(self.roles)}); "
                "name the env's agents after roles, or choose roles=... that have them"
            )
        self.chat = factory.chat
        self.registry = factory.registry
        self.limits: Limits = factory.limits
        self.adapters = {name: name for name in self.roles}
        # Observations may echo model text: no chat special token in one may open a turn of its own.
        self._markers = Markers(self.chat.special_tokens, ())
        self._hooks = getattr(env, "unwrapped", env)
        # What Episode has and an env episode has not: no meta-thinker rounds, memories or lessons.
        self.meta = None
        self.memories: list = []
        self.rounds: list[RoundRecord] = []
        self.round = 0
        self.lesson: str | None = None
        self.leaked = False
        self.turns: list[TurnRecord] = []
        # The env hands out the rewards (summed per agent, below): no outcome for meta_agent.episode.reward.score
        self.outcomes: dict = {}
        self.rewards: dict[str, float] = {}
        self.final_answer: str | None = None
        self.correct = False
        self.truncated = False
        self.done = False
        self._infos: dict[str, dict] = {}
        self._env_truncated = False  # some agent was truncated by the env
        self._tokens_used = 0
        env.reset(seed=seed, options={"task": task})  # the task itself, as the env's tasks are
        self._collect()
        self._next()

    def request(self) -> Request:
        turn = self.turns[-1]
        stops = getattr(self._hooks, "stops", None)
        return self._request(turn.prompt_ids, tuple(stops(turn.role)) if stops else ())

    def advance(
        self, token_ids: Sequence[int], logprobs: Sequence[float], text: str, finish_reason: str
    ) -> None:
        """The acting role's generation as its agent's action; then the env moves on to the next live
        agent, or the episode ends."""
        if self.done:
            raise RuntimeError("advance() on a finished episode")
        turn = self.turns[-1]
        turn.completion_ids = list(token_ids)
        turn.mask = [1] * len(token_ids)
        turn.logprobs = list(logprobs) if logprobs else [0.0] * len(token_ids)
        turn.text, forged = neutralise(text, self._markers)
        # ended where the env's stops end an action (without stops: at end of text, not cut by a limit)
        ended = ("stop",) if getattr(self._hooks, "stops", None) else ("stop", "eos")
        self._tokens_used += len(token_ids)
        # The env is given the action as written: it judges what in it imitates its own markers, and
        # refuses that as it sees fit (FeedbackEnv does, as the hierarchy's episode does, and reports
        # `forged`, the chat special tokens among them when it was given them: see env_maker).
        self.env.step(text)
        self._collect()
        turn.forged = max(forged, int(self.env.infos.get(turn.role, {}).get("forged", 0)))
        turn.format_ok = finish_reason in ended and not turn.forged
        spent = self._tokens_used >= self.limits.max_new_tokens or len(self.turns) >= self.limits.max_turns
        env = self.env
        if spent and any(not (env.terminations[a] or env.truncations[a]) for a in env.agents):
            self._finish(truncated=True)
        else:
            self._next()

    def _collect(self) -> None:
        """Add what every agent was just given to its sum, and keep each agent's latest infos and how it
        ended (PettingZoo drops a finished agent's entries once it leaves)."""
        for agent, reward in self.env.rewards.items():
            self.rewards[agent] = self.rewards.get(agent, 0.0) + float(reward)
        for agent, info in self.env.infos.items():
            self._infos[agent] = dict(info)
        self._env_truncated |= any(self.env.truncations.values())

    def _next(self) -> None:
        """Step past finished agents (as PettingZoo asks) to the next live one and start its turn."""
        env = self.env
        dead_steps = 0
        while env.agents:
            agent = env.agent_selection
            if env.terminations[agent] or env.truncations[agent]:
                dead_steps += 1
                if dead_steps > len(env.possible_agents):
                    raise RuntimeError(
                        f"{type(env).__name__} keeps finished agent {agent!r} after its dead step"
                    )
                env.step(None)
                self._collect()
                continue
            hooks, role = self._hooks, self.roles[agent]
            system = hooks.system_prompt(agent) if hasattr(hooks, "system_prompt") else None
            if system is None:  # the role's own, its tools (those the env runs) described as in the episode
                runs = hooks.tool_names(agent) if hasattr(hooks, "tool_names") else role.tools
                tools = [t for t in role.tools if t in runs]
                system = role.system_text(self.registry.describe(tools) if tools else "")
            observation, _ = neutralise(str(env.observe(agent)), self._markers)
            messages = [{"role": "system", "content": system}, {"role": "user", "content": observation}]
            prompt = self.chat.prompt(messages)
            prefill = hooks.prefill(agent) if hasattr(hooks, "prefill") else ""
            if prefill:  # the start of the reply, as the agent's own: its work so far
                prompt += self.chat.encode(neutralise(prefill, self._markers)[0])
            self.turns.append(TurnRecord(role=agent, kind=ACT, round=len(self.turns), prompt_ids=prompt))
            return
        self._finish(truncated=self._env_truncated)

    def _finish(self, *, truncated: bool) -> None:
        self.truncated = truncated
        reported = [info["correct"] for info in self._infos.values() if "correct" in info]
        self.correct = (
            any(bool(c) for c in reported) if reported else any(r > 0 for r in self.rewards.values())
        )
        answers = [info["answer"] for info in self._infos.values() if info.get("answer") is not None]
        self.final_answer = str(answers[0]) if answers else None
        for turn in self.turns:
            turn.reward = self.rewards.get(turn.role, 0.0)
        self.rewards = {role: reward for role, reward in self.rewards.items() if role in self.roles}
        self.done = True
        self.env.close()

    @property
    def tool_calls(self) -> int:
        """The tool calls the env reports in its agents' infos (`tool_calls`; 0 when it reports none)."""
        return max((int(info.get("tool_calls", 0)) for info in self._infos.values()), default=0)

    @property
    def tool_errors(self) -> int:
        return max((int(info.get("tool_errors", 0)) for info in self._infos.values()), default=0)


def env_seed(seed: int, position: int, split: str = "train") -> int:
    """The reset seed of the G rollouts of the task at `position` in the run's stream of `split` tasks:
    the held-out episodes never reset with a seed a training episode had (short of a hash collision)."""
    digest = hashlib.blake2b(f"{split}:{seed}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


def env_episodes(
    make: Callable[[], AECEnv],
    tasks: Sequence[Task],
    group: int,
    seed: int,
    first: int,
    factory: EpisodeFactory,
) -> list[EnvEpisode]:
    """`group` episodes of a fresh env per task, all reset with the seed of the task's position (`first`
    for the first of `tasks`)."""
    return [
        EnvEpisode(make(), task, env_seed(seed, first + k), factory)
        for k, task in enumerate(tasks)
        for _ in range(group)
    ]


def env_accuracy(
    make: Callable[[], AECEnv],
    factory: EpisodeFactory,
    backend: GenerationBackend,
    tasks: Mapping[str, Sequence[Task]],
    seed: int,
    ranks: Ranks,
    drain: Callable[[], object] = lambda: None,
) -> float:
    """Greedy held-out accuracy through the env: one episode per task (each rank its share), the counts
    summed over ranks."""
    episodes = []
    for task_list in tasks.values():
        first, _ = ranks.shard_bounds(len(task_list))
        mine = ranks.shard(list(task_list))
        episodes += [
            EnvEpisode(make(), task, env_seed(seed, first + k, "test"), factory)
            for k, task in enumerate(mine)
        ]
    play(episodes, backend, seed=seed, temperature=0.0)
    drain()
    correct, total = ranks.sum([sum(ep.correct for ep in episodes), len(episodes)])
    return correct / max(total, 1)
