"""What the processes of one run agree on: who starts first, one memory, and the same adapters at the end.

    cfg, ranks = join(cfg)                          # one process, or this one's rank under accelerate
    with rank0_first(ranks):                        # rank 0 converts the backbone and creates the memory
        system = build_system(cfg, memory_read_only=not ranks.main, ranks=ranks)
    commit_lessons(memory, lessons, ranks, private=...)   # after every batch of episodes, train and eval
    rollback_memory(memory, newest_id, ranks, private=...)  # on resume: undo lessons of replayed steps
    check_ranks_agree(backbone, ranks, run_dir)     # at the end: every rank holds the same adapters

One process is the case `ranks.size == 1`, where every collective is the identity. Under N processes
rank 0 alone writes the memory folder; the others open it read-only and catch up after each commit. A
memory kept in-process (memory.path=null) is private: every rank writes every lesson itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from memory.types import Memory
from meta_agent.settings import Config
from training.backbone import Backbone
from training.distributed import Ranks


def join(cfg: Config) -> tuple[Config, Ranks]:
    """This process's rank (one process without a launcher) and the config it runs with: under several
    processes each rank's `model.device` is its own (the rank's GPU, or the CPU)."""
    ranks = Ranks.start(cfg.model.device)
    if ranks.size > 1:
        cfg = replace(cfg, model=replace(cfg.model, device=ranks.device))
    return cfg, ranks


@contextmanager
def rank0_first(ranks: Ranks) -> Iterator[None]:
    """Run the block on rank 0, then on the others: what rank 0 creates (the converted backbone's
    cache, the memory folder) exists before they open it."""
    if not ranks.main:
        ranks.barrier()
    yield
    if ranks.main:
        ranks.barrier()


def load_rank0_adapters(backbone: Backbone, folder: Path, ranks: Ranks) -> bool:
    """Once rank 0 has saved adapters into `folder` (it alone writes files), every rank loads them: the
    best SFT adapters start GRPO on every rank. Returns whether there were any."""
    ranks.barrier()
    if not folder.exists():
        return False
    backbone.load_adapters(folder)
    return True


def commit_lessons(
    memory: Memory | None, lessons: Sequence[tuple[str, str, float]], ranks: Ranks, *, private: bool = False
) -> int:
    """Every rank's `lessons` ((text, task, reward), see EpisodeFactory.lessons), in global episode
    order, committed once by rank 0; afterwards every rank's memory holds the same entries. A private
    memory is written by every rank itself. Returns how many lessons were committed."""
    lessons = ranks.gather(list(lessons))
    if memory is None or not lessons:
        return 0
    if ranks.main or private:
        for text, task, reward in lessons:
            memory.add(text, kind="lesson", task=task, reward=reward)
    ranks.barrier()
    if not ranks.main and not private:
        memory.refresh()
    return len(lessons)


def rollback_memory(memory: Memory | None, newest_id: int, ranks: Ranks, *, private: bool = False) -> None:
    """Delete this run's entries newer than `newest_id` (the newest at a checkpoint): on resume, the
    lessons of the steps that will be played again. Entries other writers added to a shared memory stay."""
    if memory is None:
        return
    if ranks.main or private:
        memory.delete([i for i in memory.ids(writer=memory.writer) if i > newest_id])
    ranks.barrier()
    if not ranks.main and not private:
        memory.refresh()


def check_ranks_agree(backbone: Backbone, ranks: Ranks, run_dir: Path) -> None:
    """Every rank must end with the same adapters; rank 0 records their checksums in ranks.json."""
    if ranks.size == 1:
        return
    adapters = {
        role: torch.cat([p.detach().reshape(-1).double() for p in backbone.trainable_parameters(role)])
        for role in backbone.adapters
    }
    sums = ranks.checksums(adapters)
    if ranks.main:
        (run_dir / "ranks.json").write_text(
            json.dumps({"world_size": ranks.size, "adapter_checksums": sums}, indent=2)
        )
    if any(
        abs(a - b) > 1e-9 * max(1.0, abs(b))
        for s in sums
        for a, b in zip(s.values(), sums[0].values(), strict=True)
    ):
        raise RuntimeError(
            f"the {ranks.size} processes ended with different adapters (checksums {sums}): gradients were "
            "not synchronised; report this with the run's config"
        )
