"""Several processes, one experiment: which share of the work is this rank's, and the few collectives.

    ranks = Ranks.start("cpu")                  # under `accelerate launch`: gloo on CPU, nccl on GPUs
    mine = ranks.shard(tasks)                   # a contiguous share; whole GRPO groups stay together
    totals = ranks.sum([rows, tokens])          # global normalisers, so N ranks train like one
    lessons = ranks.gather(my_lessons)          # every rank's list, in rank order

Built on accelerate's PartialState over torch.distributed. A single process (plain `meta-agent train`)
is the case size == 1, where every collective is the identity and nothing is initialised.

The adapters' gradients are averaged by one all-reduce per optimizer step (`sum_gradients`), not by
wrapping the model in DDP: each role accumulates over its own micro-batches with its adapter active,
ranks hold different numbers of micro-batches per role, and DDP's per-backward hooks would need every
rank to run the same backward passes. LoRA gradients are a few MB, so one flat all-reduce costs little.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list, gather_object

# Metrics summed over ranks (counts, throughput, a loss whose micro-batch weights are global); keys
# ending in "_max" take the max; every other metric is the mean over the ranks that report it.
SUMMED_METRICS = (
    "train/turns",
    "train/filtered_turns",
    "train/empty_passes",
    "rollout/empty_passes",
    "/trained_tokens",
    "/loss",
    "/sft_nll",
    "time/tokens_per_s",
    "dpo/pairs_",  # each rank's pairs of each kind
    # preference_step's per-role means, each rank's sum over its pairs divided by the global count
    "/pref_loss",
    "/pref_accuracy",
    "/pref_chosen_reward",
    "/pref_rejected_reward",
)


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    size: int = 1
    device: str = "cpu"  # this rank's device: "cpu", or "cuda:<local rank>" under several GPUs

    @classmethod
    def start(cls, device: str = "cpu") -> Ranks:
        """The processes `accelerate launch` (or torchrun) started, or one process without it.

        `device` is the configured `model.device`: under several processes "cuda" becomes this rank's
        own GPU, and "cpu" makes the process group use gloo.
        """
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return cls(device=device)
        state = PartialState(cpu=device == "cpu")
        own = device if device == "cpu" else str(state.device)
        return cls(rank=state.process_index, size=state.num_processes, device=own)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard_bounds(self, n: int) -> tuple[int, int]:
        """This rank's contiguous slice [start, stop) of n items; the first n % size ranks get one more."""
        base, extra = divmod(n, self.size)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (self.rank < extra)

    def shard(self, items: Sequence) -> list:
        start, stop = self.shard_bounds(len(items))
        return list(items[start:stop])

    # ---- collectives (every rank must call them, in the same order) -------------------------------

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks, in float64."""
        return self._all_reduce(values, "SUM")

    def max(self, values: Sequence[float]) -> list[float]:
        """Element-wise maximum over ranks, in float64."""
        return self._all_reduce(values, "MAX")

    def _all_reduce(self, values: Sequence[float], op: str) -> list[float]:
        if self.size == 1:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=getattr(torch.distributed.ReduceOp, op))
        return t.tolist()

    def gather(self, items: list) -> list:
        """Every rank's list, concatenated in rank order (picklable items)."""
        if self.size == 1:
            return list(items)
        return gather_object(list(items))

    def gather_one(self, obj: Any) -> list:
        """One object per rank, in rank order."""
        return [obj] if self.size == 1 else gather_object([obj])

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.size == 1:
            return obj
        box = [obj]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def barrier(self) -> None:
        if self.size > 1:
            torch.distributed.barrier()

    def close(self) -> None:
        """Wait for every rank, then take the process group down: a rank that exits while a peer's gloo
        connection is still open can abort the peer."""
        if self.size > 1 and torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()

    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Replace each parameter's gradient by its sum over ranks (None counts as zeros) in one
        all-reduce. The losses are normalised by global token and row counts, so the sum is the
        gradient of the whole batch."""
        if self.size == 1 or not params:
            return
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
        )
        torch.distributed.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n

    def combine_metrics(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """One metrics dict for the whole step from every rank's (see SUMMED_METRICS)."""
        if self.size == 1:
            return dict(metrics)
        return combine_metrics(self.gather_one(dict(metrics)))

    def checksums(self, tensors: Mapping[str, torch.Tensor]) -> list[dict[str, float]]:
        """Every rank's checksum (sum and sum of squares, float64) of each named tensor group."""
        mine = {name: _checksum(t) for name, t in tensors.items()}
        return self.gather_one(mine)


def combine_metrics(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per-rank metrics -> one dict: summed keys add, "_max" keys take the max, the rest average over
    the ranks that report them."""
    out: dict[str, float] = {}
    keys = dict.fromkeys(k for m in per_rank for k in m)
    for key in keys:
        values = [float(m[key]) for m in per_rank if key in m]
        if key.endswith("_max"):
            out[key] = max(values)
        elif key.startswith(SUMMED_METRICS) or key.endswith(SUMMED_METRICS):
            out[key] = sum(values)
        else:
            out[key] = sum(values) / len(values)
    return out


def _checksum(t: torch.Tensor) -> float:
    t = t.detach().double()
    return float(t.sum()) + float((t * t).sum())
