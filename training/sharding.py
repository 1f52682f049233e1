"""A backbone too big for one card: its frozen base weights sharded over the processes with FSDP2.

    backbone = Backbone.load(ModelConfig(fsdp=True), adapters, ranks)  # shards through shard_model
    ...every rank generates at its own pace...
    backbone.lockstep.drain()               # end of a phase: wait for the other ranks' passes

torch's `fully_shard` (FSDP2) is applied to every decoder layer and to the whole model; each rank keeps
1/N of every base weight and all-gathers a layer's weights just before it runs. The LoRA adapters are
left out of the shards (`ignored_params`): a few MB, whole on every rank, so their gradients, the
optimizer, checkpoints, the vLLM sync and the per-row adapters of generation see plain tensors, and
the gradients are summed over ranks as without sharding (training.distributed). With `offload` the
shards live in CPU memory and each layer is copied to the GPU for its pass: a backbone bigger than the
card on one process.

A sharded forward pass is a collective: every rank must run the same number of them, in the same
order, or the all-gathers deadlock. Training pads each role's micro-batches to the most any rank has
(PolicyTrainer). Generation cannot know its passes ahead, so each pass is announced (`Lockstep`): a
rank whose episodes are done serves empty passes until every rank is done (HF's `synced_gpus`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

from training.distributed import Ranks


class Lockstep:
    """Every rank runs the same number of forward passes of the sharded model.

    Before each generation pass a busy rank calls `before_forward()`; a rank that has finished its
    phase calls `drain()`, which runs an empty pass for each pass announced elsewhere and returns once
    every rank is draining. Every rank must call `drain()` at the end of the same phases. One process:
    both are no-ops.
    """

    def __init__(self, ranks: Ranks, empty_pass):
        self.ranks = ranks
        self.empty_pass = empty_pass  # one forward pass of the model on a token, no grad

    def before_forward(self) -> None:
        if self.ranks.size > 1:
            self.ranks.sum([1.0])

    def drain(self) -> int:
        """Serve the other ranks' passes until every rank is done; returns the empty passes run."""
        served = 0
        while self.ranks.size > 1 and self.ranks.sum([0.0])[0] > 0:
            self.empty_pass()
            served += 1
        return served


def ensure_process_group(device: str) -> bool:
    """FSDP needs a process group even on one process: start a one-rank group if none is running.
    Returns whether one was started here."""
    dist = torch.distributed
    if dist.is_initialized():
        return False
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return True


@dataclass(frozen=True)
class Sharding:
    """How a backbone's base weights are held when they are sharded: what Backbone keeps from shard_model."""

    device: torch.device  # this rank's device, where the shards and the adapters live
    lockstep: Lockstep = field(repr=False)
    owns_process_group: bool = False  # started a one-rank group here, which Backbone.close takes down


def shard_model(
    model, adapters: Collection[torch.nn.Parameter], ranks: Ranks, *, pad_id: int, offload: bool = False
) -> Sharding:
    """Shard the base weights of `model` (a PeftModel) over the ranks' devices, leaving the LoRA
    parameters `adapters` whole (see the module doc). The model may sit on the CPU: each layer's shard
    moves to the rank's device as it is sharded, the adapters after. `pad_id` feeds the empty passes."""
    device = torch.device(ranks.device)
    if offload and device.type != "cuda":  # ModelConfig refuses this for configs; here for direct callers
        raise ValueError(f"offloaded shards are fetched by a GPU: rank device {device} is not one")
    base = model.get_base_model()  # the transformers model inside PEFT's wrapper
    units = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in base.modules() if type(m).__name__ in units]
    if not layers:
        raise ValueError(
            f"{type(base).__name__} names no decoder layer class (_no_split_modules): model.fsdp "
            "shards transformers models that do"
        )
    started = ensure_process_group(str(device))
    mesh = torch.distributed.device_mesh.init_device_mesh(device.type, (ranks.size,))
    adapters = set(adapters)
    with torch.no_grad():  # FSDP moves what it manages (shards, buffers) to the device, not these
        for p in adapters:
            p.data = p.data.to(device)
    # Reshard after every forward, the root included: each pass then all-gathers the same units, so
    # the collectives of any two passes match whatever ran before them.
    kwargs = {
        "mesh": mesh,
        "reshard_after_forward": True,
        "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy(),
        "ignored_params": adapters,
    }
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(base, **kwargs)

    def empty_pass() -> None:
        with torch.no_grad():
            model(input_ids=torch.tensor([[pad_id]], device=device), use_cache=False)

    return Sharding(device, Lockstep(ranks, empty_pass), owns_process_group=started)
