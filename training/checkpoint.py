"""Atomic training checkpoints that resume exactly: adapters, optimizer, scheduler, RNG and caller state.

    path = save_checkpoint(run_dir / "checkpoints", step, trainer, {"data_pos": 128}, keep=2)
    step, state = load_checkpoint(resolve_resume("runs/arith_hierarchy"), trainer)

Layout of a checkpoint root:

    latest                  text file: the name of the newest complete checkpoint ("step-000012")
    step-000012/adapters/<role>/   each role's LoRA adapter in PEFT format (Backbone.save_adapters)
    step-000012/trainer.pt  optimizer, scheduler, step and RNG states (python, numpy, torch CPU and CUDA;
                            one set per process)
    step-000012/state.json  the caller's JSON state (data position, stage, ...)

A checkpoint is written whole into `.tmp-step-<step>-<pid>/` and renamed into place, then `latest` is
replaced the same way, so a kill at any moment leaves the previous checkpoint and `latest` usable.
Other entries of the root (e.g. `sft-best/`) are never touched.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.backbone import first_mismatch
from training.trainer import PolicyTrainer
from training.value import ValueHeads

LATEST = "latest"
TRAINER_FILE = "trainer.pt"
STATE_FILE = "state.json"
ADAPTERS_DIR = "adapters"
CHECKPOINTS_DIR = "checkpoints"  # a run folder keeps its checkpoint root here
TMP_PREFIX = ".tmp-"
FORMAT_VERSION = 1
KEEP = 2  # the newest step checkpoints kept (train.keep_checkpoints)
_STEP_DIR = re.compile(r"step-(\d{6,})")


class CheckpointError(RuntimeError):
    """A checkpoint path is missing, incomplete, corrupt or does not match this trainer."""


def step_dirname(step: int) -> str:
    return f"step-{step:06d}"


def is_complete(folder: Path) -> bool:
    """A step-* folder that holds every part a load needs (only whole folders are ever renamed in)."""
    return (
        _STEP_DIR.fullmatch(folder.name) is not None
        and (folder / TRAINER_FILE).is_file()
        and (folder / STATE_FILE).is_file()
        and (folder / ADAPTERS_DIR).is_dir()
    )


def _complete_checkpoints(root: Path) -> list[Path]:
    """Complete step-* folders of `root`, oldest step first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: int(_STEP_DIR.fullmatch(p.name).group(1)))


def latest_checkpoint(root: str | Path) -> Path | None:
    """The checkpoint `root/latest` names; if that is missing or broken, the highest complete step-* folder."""
    root = Path(root)
    try:
        name = (root / LATEST).read_text().strip()
    except (OSError, UnicodeDecodeError):
        name = ""
    if _STEP_DIR.fullmatch(name) and is_complete(root / name):
        return root / name
    found = _complete_checkpoints(root)
    return found[-1] if found else None


# ---- writing -----------------------------------------------------------------------------------


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """Flush every file, then every folder, so a rename never publishes data still in the page cache."""
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            _fsync_path(Path(dirpath) / name)
    for dirpath, _, _ in os.walk(folder, topdown=False):
        _fsync_path(Path(dirpath))


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.parent / f"{TMP_PREFIX}{path.name}-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_path(path.parent)


def _remove_stale_tmp(root: Path) -> None:
    # Only one process writes a root, so any temp entry left here is from a write that was killed.
    for entry in root.glob(f"{TMP_PREFIX}*"):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def rng_states() -> dict[str, Any]:
    """Every global RNG a training step may draw from, as plain values and tensors (loads weights_only)."""
    np_state = np.random.get_state(legacy=False)
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: Mapping[str, Any]) -> None:
    """Restore what `rng_states` captured (CUDA only when this machine has it)."""
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    n = states["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _prune(root: Path, keep: int) -> None:
    found = _complete_checkpoints(root)
    kept = set(found[-keep:])
    latest = latest_checkpoint(root)
    if latest is not None:
        kept.add(latest)  # after resuming an older step, higher stale steps may outrank it
    for folder in found:
        if folder not in kept:
            shutil.rmtree(folder, ignore_errors=True)


def save_checkpoint(
    root: str | Path, step: int, trainer: PolicyTrainer, state: Mapping[str, Any], keep: int = KEEP
) -> Path:
    """Write `root/step-{step:06d}/` atomically, point `root/latest` at it, keep the `keep` newest.

    `state` is the caller's JSON-serialisable state. Re-saving an existing step replaces it. With several
    processes only the main one writes; the others wait for it and get the same path back.
    """
    if keep < 1:
        raise ValueError(f"keep={keep} must be >= 1: the checkpoint just written is always kept")
    if step < 0:
        raise ValueError(f"checkpoint step={step} must be >= 0")
    root = Path(root)
    final = root / step_dirname(step)
    accelerator = trainer.accelerator
    rng = trainer.ranks.gather_one(rng_states())  # each rank's generators, in rank order
    if not accelerator.is_main_process:
        accelerator.wait_for_everyone()
        return final
    try:
        state_text = json.dumps(dict(state), indent=2)
    except (TypeError, ValueError) as err:
        raise TypeError(f"checkpoint state for step {step} must be JSON-serialisable: {err}") from err
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(root)
    tmp = root / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    try:
        tmp.mkdir()
        trainer.backbone.save_adapters(tmp / ADAPTERS_DIR)
        torch.save(
            {
                "format": FORMAT_VERSION,
                "step": step,
                "roles": list(trainer.backbone.adapters),
                "optimizer": trainer.optimizer.state_dict(),
                "scheduler": trainer.scheduler.state_dict(),
                "rng": rng[0],
                "rng_ranks": rng,
                **({"values": trainer.values.state()} if trainer.values is not None else {}),
            },
            tmp / TRAINER_FILE,
        )
        (tmp / STATE_FILE).write_text(state_text)
        _fsync_tree(tmp)
        if final.exists():
            # os.replace cannot overwrite a non-empty folder: move the old one aside first.
            old = root / f"{TMP_PREFIX}old-{final.name}-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_path(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_text_atomic(root / LATEST, final.name + "\n")
    _prune(root, keep)
    accelerator.wait_for_everyone()
    return final


# ---- reading -----------------------------------------------------------------------------------


def resolve_resume(value: str | Path, key: str = "resume") -> Path:
    """The checkpoint folder `resume=value` (or another setting `key`) means: a step-* folder itself, or the
    newest one of a checkpoint root (holding `latest` or step-* folders) or of a run folder (holding
    `checkpoints/`)."""
    path = Path(value).expanduser()
    if not path.exists():
        raise CheckpointError(
            f"{key}={value} does not exist: pass a step-* checkpoint folder, a checkpoints folder or a run folder"
        )
    if (path / TRAINER_FILE).is_file():
        return path
    for root in (path, path / CHECKPOINTS_DIR):
        found = latest_checkpoint(root)
        if found is not None:
            return found
    raise CheckpointError(
        f"{key}={value} points to {path}, which has no {TRAINER_FILE} and no complete step-* checkpoint "
        f"(directly or under {CHECKPOINTS_DIR}/): pass a step-* folder or the run folder"
    )


def load_value_heads(value: str | Path, key: str = "planner.value_heads") -> ValueHeads:
    """The value heads a `grpo.advantage=gae` run saved in its checkpoint (`value`: as resolve_resume reads
    it; `key`: the setting that named it, for the messages), on the CPU, ready to predict."""
    path = resolve_resume(value, key)
    saved = _read_trainer_file(path)
    if "values" not in saved:
        raise CheckpointError(
            f"{key}={value}: checkpoint {path} has no value heads (its run did not train with "
            "grpo.advantage=gae): name a checkpoint or run folder of such a run"
        )
    heads = saved["values"]["heads"]
    roles = sorted({name.split(".")[0] for name in heads})
    hidden = heads[f"{roles[0]}.weight"].shape[-1]
    values = ValueHeads(roles, hidden)
    values.load_state(saved["values"])
    values.requires_grad_(False)  # read, never fitted, by whoever loads them
    return values


def _read_trainer_file(path: Path) -> dict[str, Any]:
    file = path / TRAINER_FILE
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint {path} does not exist: pass a step-* folder, or a run folder via resolve_resume"
        )
    if not file.is_file():
        raise CheckpointError(
            f"checkpoint {path} has no {TRAINER_FILE}: pass a step-* folder, or the run folder "
            "(resolve_resume picks its newest complete checkpoint)"
        )
    try:
        saved = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(
            f"{file} is corrupt ({type(err).__name__}: {err}): delete {path} and resume from an older "
            "step-* folder"
        ) from err
    if not isinstance(saved, dict) or saved.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{file} is not a format-{FORMAT_VERSION} training checkpoint: resume from a checkpoint "
            "written by training.checkpoint.save_checkpoint"
        )
    return saved


def load_checkpoint(path: str | Path, trainer: PolicyTrainer) -> tuple[int, dict[str, Any]]:
    """Restore a `save_checkpoint` folder into `trainer` (and its backbone); returns (step, state).

    Adapters are copied into the existing parameters, so the optimizer keeps pointing at them.
    """
    path = Path(path)
    saved = _read_trainer_file(path)
    roles = list(trainer.backbone.adapters)
    if saved["roles"] != roles:
        raise CheckpointError(
            f"checkpoint {path} holds roles {saved['roles']} but this trainer has {roles}: "
            "resume with the same roles, in the same order, as the run that wrote it"
        )
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"{path / STATE_FILE} is missing or not JSON ({err}): resume from an older step-* folder"
        ) from err
    try:
        trainer.backbone.load_adapters(path / ADAPTERS_DIR)
    except (OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(
            f"cannot load the adapters of checkpoint {path} ({first_mismatch(err)}): "
            "resume with the adapter settings (rank, target modules, top_layers) of the run that wrote it"
        ) from err
    try:
        trainer.optimizer.load_state_dict(saved["optimizer"])
        trainer.scheduler.load_state_dict(saved["scheduler"])
    except (KeyError, ValueError, RuntimeError) as err:
        raise CheckpointError(
            f"optimizer/scheduler state in {path / TRAINER_FILE} does not fit this trainer ({err}): "
            "resume with the adapter settings (rank, target modules) of the run that wrote it"
        ) from err
    if trainer.values is not None:
        if "values" not in saved:
            raise CheckpointError(
                f"checkpoint {path} has no value heads (its run did not train with grpo.advantage=gae): "
                "resume it with the advantage it was trained with, or start a new run from it with adapters=..."
            )
        trainer.values.load_state(saved["values"])
    # Each rank continues its own random streams; a run resumed on another number of processes
    # restores rank 0's on every rank.
    per_rank = saved.get("rng_ranks") or [saved["rng"]]
    ranks = trainer.ranks
    set_rng_states(per_rank[ranks.rank] if len(per_rank) == ranks.size else saved["rng"])
    return int(saved["step"]), state
