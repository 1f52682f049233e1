"""What an episode records: its limits, the requests it makes, its turns and tool calls, and each
round graded as it ends (meta_agent.episode fills them in; traces, credit and metrics read them)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    # lack, with its sentence (meta_agent.prompts.number_check): found by code, judged by the meta-thinker
    number_check: bool = False

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
    # tokens) that this turn's own text held; quoted in `text` (meta_agent.prompts.neutralise).
    forged: int = 0
    reward: float = 0.0
    advantage: float | None = None  # set by the GRPO step's credit assignment (meta_agent.credit)

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


def learned(turns: list[TurnRecord]) -> list[TurnRecord]:
    """The turns with a token to learn (loss mask 1): a demonstration's caught mistake has none."""
    return [t for t in turns if any(t.mask)]


def trainer_turns(turns: list[TurnRecord], group: str, correct: bool, episode: int = -1) -> list[Turn]:
    """A finished episode's learned `turns` as the trainer's records, in the GRPO group `group` (the task),
    each with its reward and (once credit is assigned) its advantage."""
    return [
        Turn(
            role=t.role,
            group=group,
            prompt_ids=tuple(t.prompt_ids),
            completion_ids=tuple(t.completion_ids),
            loss_mask=tuple(t.mask),
            logprobs=tuple(t.logprobs),
            reward=t.reward,
            episode=episode,
            advantage=t.advantage or 0.0,
            correct=correct,
        )
        for t in learned(turns)
    ]
