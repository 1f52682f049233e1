"""What an episode records: its limits, the requests it makes, its turns and tool calls, and each
round graded as it ends (meta_agent.episode.protocol fills them in; traces, credit and metrics read them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from training.types import SamplingParams, Turn

PLAN, EXECUTE, REFLECT = "plan", "execute", "reflect"


@dataclass
class Limits:
    """The `protocol:` settings: how long one episode may run."""

    max_rounds: int = 2  # plan -> execute -> reflect rounds; a revision starts the next one
    max_turns: int = 8  # role turns in the whole episode
    max_new_tokens: int = 1024  # generated tokens in the whole episode, all roles together
    max_tool_calls: int = 4  # tool calls per executor turn
    # the reflection's prompt shows each number of the question that the plan or the work's tool calls
    # lack, with its sentence (meta_agent.episode.prompts.number_check): found by code, judged by the meta-thinker
    number_check: bool = False
    # the last round's reflection is played: it cannot change the answer, only write a lesson, so it is on
    # only where lessons are kept (a turn that cannot change the outcome gets no gradient and costs tokens)
    final_reflection: bool = True
    # the reflection's prompt shows the calculator's check of the round's answer against the task (Countdown:
    # its value against the target, numbers missing or repeated; tasks.countdown.describe_attempt)
    attempt_check: bool = False

    def __post_init__(self) -> None:
        for name in ("max_rounds", "max_turns", "max_new_tokens", "max_tool_calls"):
            if getattr(self, name) < (0 if name == "max_tool_calls" else 1):
                raise ValueError(f"protocol.{name}={getattr(self, name)} is out of range")


@dataclass(frozen=True)
class Request:
    """The next generation the episode needs: the role's sampling, with the stops of its turn and at
    most the episode's remaining token budget, on `adapter` (the role's own unless a probe swaps it)."""

    role: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    adapter: str


@dataclass
class ToolCall:
    name: str
    arguments: str  # the raw call body, as the model wrote it
    output: str
    ok: bool
    error: str | None


@dataclass
class TurnRecord:
    """One role turn while it is being played; tool results sit in the completion with mask 0."""

    role: str
    kind: str  # plan | execute | reflect
    round: int
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""  # completion text including observations, as shown in traces
    tool_calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    format_ok: bool = False
    # Markers only the environment writes (tool-result tags, block and role headers, chat special
    # tokens) that this turn's own text held; quoted in `text` (meta_agent.episode.prompts.neutralise).
    forged: int = 0
    reward: float = 0.0  # its role's: set by meta_agent.episode.reward.score (an env episode: by its env)
    advantage: float | None = None  # set by the GRPO step's credit assignment (meta_agent.learning.credit)

    @property
    def generated_tokens(self) -> int:
        return sum(self.mask)


@dataclass
class RoundRecord:
    """One plan -> execute -> reflect round, graded when its executors are done."""

    index: int  # 0 for the first round
    answer: str | None  # this round's answer: the last executor that answered; None if none did
    correct: bool  # that answer passes the task's verifier
    verdict: str | None = None  # the meta-thinker's reflection: accept | revise; None without a reflection
    # the verdict was written (a verdict tag, a revised plan or a fix that applied); else the protocol
    # accepted by default
    verdict_tagged: bool = False
    ended: bool = False  # the episode ended after this round
    plan: str | None = None  # the plan this round's executors were shown (None: none was shown)


class PlayedEpisode:
    """What the batched runner and the trainer read off an episode, shared by meta_agent.episode.protocol.Episode
    and meta_agent.env.rollout.EnvEpisode: who acts, its request (the role's sampling with the turn's
    stops, within the episode's token budget), and the finished episode's turns as the trainer's."""

    turns: list[TurnRecord]
    done: bool
    task: Any  # a meta_agent.tasks.Task: its id is the group
    correct: bool
    # role -> roles.Outcome of a finished episode, for meta_agent.episode.reward.score to reward; empty where
    # the rewards come from elsewhere (an env's: meta_agent.env.rollout.EnvEpisode)
    outcomes: dict[str, Any]
    rewards: dict[str, float]  # role -> its reward in the episode, each of its turns' `reward`
    roles: dict[str, Any]  # name -> roles.RoleSpec
    adapters: dict[str, str]
    limits: Limits
    chat: Any  # meta_agent.episode.chat.ChatFormat
    _tokens_used: int

    @property
    def current_role(self) -> str | None:
        return None if self.done else self.turns[-1].role

    def request(self) -> Request:
        raise NotImplementedError

    def _request(self, prompt_ids: Sequence[int], stop: tuple[str, ...]) -> Request:
        """The acting turn's request on `prompt_ids`: its role's sampling, ended at `stop`, at most what is
        left of the episode's token budget, on the role's adapter."""
        turn = self.turns[-1]
        spec = self.roles[turn.role].sampling
        budget = self.limits.max_new_tokens - self._tokens_used
        sampling = SamplingParams(
            temperature=spec.temperature,
            top_p=spec.top_p,
            max_new_tokens=max(1, min(spec.max_new_tokens, budget)),
            stop=stop,
            repetition_stop=spec.repetition_stop,
        )
        return Request(turn.role, tuple(prompt_ids), sampling, self.adapters[turn.role])

    def observation(self) -> str:
        """The text the acting role sees now: its prompt and its own turn so far."""
        return self.chat.decode_raw(self.request().prompt_ids)

    def training_turns(self, episode: int = -1) -> list[Turn]:
        """The finished episode as the trainer's records: one Turn per role turn with a token to learn
        (loss mask 1), grouped by task, with its reward and (once credit is assigned) its advantage."""
        if not self.done:
            raise RuntimeError("training_turns() before the episode finished")
        return [
            Turn(
                role=t.role,
                group=self.task.id,
                prompt_ids=tuple(t.prompt_ids),
                completion_ids=tuple(t.completion_ids),
                loss_mask=tuple(t.mask),
                logprobs=tuple(t.logprobs),
                reward=t.reward,
                episode=episode,
                advantage=t.advantage or 0.0,
                correct=self.correct,
            )
            for t in self.learned_turns
        ]

    @property
    def learned_turns(self) -> list[TurnRecord]:
        """The turns with a token to learn (loss mask 1): a demonstration's caught mistake has none."""
        return [t for t in self.turns if any(t.mask)]
