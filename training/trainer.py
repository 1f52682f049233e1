"""The policy update: every role's adapter trained on its own turns, one optimizer step for all.

    trainer = PolicyTrainer(backbone, {"meta_thinker": 1e-4, "executor": 1e-4}, grpo=GRPOSettings())
    metrics = trainer.grpo_step(turns)   # turns of a rollout batch, each with its advantage
    metrics = trainer.sft_step(turns)    # demonstrations: same turns, same masks
    metrics = trainer.preference_step(pairs, PreferenceSettings())  # DPO, IPO or SimPO on turn pairs

Roles own disjoint LoRA parameters, so each role accumulates gradients over its micro-batches with
its adapter active, then a single AdamW step (one parameter group, one learning rate per role)
updates every role. The trainer stands on accelerate's Accelerator for device and precision. Under
several processes (`training.distributed.Ranks`) each rank trains on its own turns, every loss is
normalised by the whole batch's token and row counts, and the gradients are summed over ranks before
the step, so N ranks end with the adapters one process would have from the same global batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace

import torch
from accelerate import Accelerator

from training.backbone import Backbone
from training.batch import TurnBatch, collate, completion_logits, micro_batches, minibatches
from training.distributed import Ranks
from training.grpo import (
    TOKEN_NORMALISED,
    GRPOSettings,
    entropy_from_logits,
    grpo_loss,
    sft_loss,
    token_logprobs,
)
from training.preference import PreferencePair, PreferenceSettings, preference_loss
from training.shared_prefix import SharedPrefix, prefix_groups
from training.types import Turn
from training.value import ValueHeads, ValueSettings, prompt_states


@dataclass
class UpdateSettings:
    """How an optimizer step is taken (the `train:` settings the trainer reads)."""

    micro_batch_size: int = 8  # turns per forward/backward; gradients accumulate per role
    max_grad_norm: float = 1.0  # each role's gradient is clipped to this norm
    warmup_steps: int = 0  # linear warm-up of every role's learning rate
    weight_decay: float = 0.0  # AdamW's
    # true: keep only each decoder layer's input for backward and recompute the rest: less memory per
    # turn, one more forward pass of the adapted layers per micro-batch (about 1/3 slower)
    gradient_checkpointing: bool = False
    # optimizer steps per rollout batch: passes over it (as TRL's num_iterations, verl's ppo_epochs) ...
    updates_per_rollout: int = 1
    # ... each in this many minibatches of whole episodes, one step each. Above one update the old
    # policy is fixed at the rollout, so the clipped ratio (grpo.eps_low, eps_high) acts from the second.
    minibatches: int = 1
    # true: turns of a role that begin alike (its system prompt; a task's question) run their common
    # prefix forward and backward once per update, not once per turn (training.shared_prefix): the same
    # gradient up to float rounding. Not with a sequence-level ratio, gradient checkpointing, dropout or a
    # sharded backbone, which keep the turn-by-turn passes.
    shared_prefix: bool = True

    def __post_init__(self) -> None:
        for name in ("micro_batch_size", "updates_per_rollout", "minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")


class PolicyTrainer:
    """`lr`: each role's learning rate (roles learn at different speeds). `temperature`: each role's
    sampling temperature, at which its tokens are scored (0, greedy, scores at 1: the rollout backends
    record greedy logprobs there); default 1. `value`: give every role a value head (grpo.advantage=gae),
    trained apart from the adapters (training.value)."""

    def __init__(
        self,
        backbone: Backbone,
        lr: Mapping[str, float],
        *,
        temperature: Mapping[str, float] | None = None,
        grpo: GRPOSettings | None = None,
        update: UpdateSettings | None = None,
        accelerator: Accelerator | None = None,
        ranks: Ranks | None = None,
        value: ValueSettings | None = None,
    ):
        missing = [r for r in backbone.adapters if r not in lr]
        if missing:
            raise ValueError(f"no learning rate for roles {missing}; set one per role")
        for role, rate in lr.items():
            if not rate > 0:
                raise ValueError(f"lr for role {role!r} must be > 0, got {rate}")
        self.backbone = backbone
        self.lr = dict(lr)
        self.temperature = {r: t if t > 0 else 1.0 for r, t in (temperature or {}).items()}
        self.grpo = grpo or GRPOSettings()
        self.update = update or UpdateSettings()
        self.ranks = ranks or Ranks()
        self.accelerator = accelerator or Accelerator(cpu=backbone.device.type == "cpu")
        groups = [
            {"params": backbone.trainable_parameters(role), "lr": self.lr[role], "name": role}
            for role in backbone.adapters
        ]
        optimizer = torch.optim.AdamW(groups, weight_decay=self.update.weight_decay)
        warmup = self.update.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
        )
        # The model is not wrapped (no DDP): gradients are summed over ranks once per step, see
        # training.distributed. The backbone already sits on this rank's device.
        self.model = backbone.model
        self.optimizer, self.scheduler = self.accelerator.prepare(optimizer, scheduler)
        if self.update.gradient_checkpointing:
            # Non-reentrant checkpoints need no input that requires grad (the embeddings are frozen);
            # generation runs in eval mode, where transformers skips checkpointing.
            backbone.model.base_model.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self._stepped_roles: set[str] = set()  # roles some rank trains in the current step
        # prompt tokens this step's passes did not rerun (shared prefixes), of all they would have run
        self._prefix_tokens = {"saved": 0, "total": 0}
        self.values: ValueHeads | None = None
        if value is not None and backbone.sharded:
            # The value pass is one forward pass per micro-batch, a collective on a sharded backbone,
            # and ranks hold different numbers of turns: not padded across ranks as the update is.
            raise ValueError("value heads (grpo.advantage=gae) need an unsharded backbone (model.fsdp=false)")
        if value is not None:
            hidden = backbone.model.get_base_model().config.hidden_size
            self.values = ValueHeads(list(backbone.adapters), hidden, value).to(self.accelerator.device)

    # ---- GRPO --------------------------------------------------------------------------------

    def grpo_step(
        self, turns: Sequence[Turn], reference: Mapping[str, Sequence[torch.Tensor]] | None = None
    ) -> dict[str, float]:
        """The updates of one rollout batch: `train.updates_per_rollout` passes over `turns` (each carrying
        its advantage, see training.grpo.trainable_turns), each pass in `train.minibatches` optimizer
        steps. Returns "role/<name>/<metric>" and "train/<metric>" metrics: the mean over the updates, and
        the clip fraction and ratio of the first update and of the later ones apart. `reference`: each
        role's adapter weights (snapshot()) that grpo.beta's KL pulls toward (grpo.kl_reference=start);
        None: the backbone with its adapters off."""
        if reference is not None and self.grpo.beta > 0:
            turns = self._with_reference_logprobs(turns, reference)
        passes, parts = self.update.updates_per_rollout, self.update.minibatches
        if passes * parts == 1:
            return self._grpo_update(turns)
        if self.grpo.tis_cap is not None:
            # The ratio's old policy is the trainer's own at the rollout; the rollout backend's logprobs
            # only weigh tokens (TIS). Without TIS they are the old policy themselves.
            turns = self._with_policy_logprobs(turns)
        updates = []
        for epoch in range(passes):
            for part in minibatches(turns, parts, seed=epoch):
                updates.append(self._grpo_update(part))
        return merge_updates(updates)

    def _with_policy_logprobs(self, turns: Sequence[Turn]) -> list[Turn]:
        """`turns`, in their order, with Turn.policy_logprobs: this policy's logprobs now, before any
        update."""
        rows = self._completion_logprobs(turns)
        return [replace(t, policy_logprobs=row) for t, row in zip(turns, rows, strict=True)]

    def _with_reference_logprobs(
        self, turns: Sequence[Turn], reference: Mapping[str, Sequence[torch.Tensor]]
    ) -> list[Turn]:
        """`turns`, in their order, with Turn.ref_logprobs: their logprobs under `reference` (each role's
        adapter weights), taken before any pass with gradient, as the weights are swapped in place."""
        if self.backbone.sharded:
            raise ValueError(
                "grpo.kl_reference=start on a sharded backbone (model.fsdp) is not supported yet: use "
                "grpo.kl_reference=base there"
            )
        with self.all_weights(reference):
            rows = self._completion_logprobs(turns)
        return [replace(t, ref_logprobs=row) for t, row in zip(turns, rows, strict=True)]

    def completion_logprobs(self, turns: Sequence[Turn]) -> list[tuple[float, ...]]:
        """The per-token logprobs of each turn's completion under its role's adapter as it is now (no
        gradient; 0 where the loss mask is 0), in the turns' order: what training.drift compares."""
        return self._completion_logprobs(turns)

    def _completion_logprobs(self, turns: Sequence[Turn]) -> list[tuple[float, ...]]:
        """The per-token logprobs of each turn's completion, in the turns' order, under its role's adapter
        as it is now, at the role's temperature, 0 where its loss mask is 0; no gradient. Where turns begin
        alike the passes run their common prefix once, as the update's do (train.shared_prefix);
        train/prefix_tokens_saved counts the update's passes only."""
        rows: dict[int, tuple[float, ...]] = {}
        counted = dict(self._prefix_tokens)
        for role in self.backbone.adapters:
            own = [t for t in turns if t.role == role]
            if not own:
                continue
            self.backbone.activate(role)
            temperature = self.temperature.get(role, 1.0)
            chunks = micro_batches(own, self.update.micro_batch_size)
            with torch.no_grad():  # the passes' generator runs inside: no graph is kept
                for chunk, batch, logits in self._training_passes(chunks):
                    logprobs = token_logprobs(logits, batch.targets, temperature)
                    k = batch.completion_len
                    for i, t in enumerate(chunk):
                        row = (
                            logprobs[i, k - len(t.completion_ids) :]
                            * batch.loss_mask[i, k - len(t.completion_ids) :]
                        )
                        rows[id(t)] = tuple(float(x) for x in row)
        self._prefix_tokens = counted
        return [rows[id(t)] for t in turns]

    def _grpo_update(self, turns: Sequence[Turn]) -> dict[str, float]:
        """One optimizer step on `turns`."""
        by_role: dict[str, list[Turn]] = defaultdict(list)
        for t in turns:
            by_role[t.role].append(t)
        totals = self._global_sizes(by_role)
        metrics: dict[str, float] = {}
        for role, chunks in self._role_chunks(by_role, whole_episodes=self.grpo.ratio_level == "sequence"):
            metrics.update(self._grpo_role(role, chunks, *totals[role]))
            self._count_empty(metrics, chunks)
        metrics.update(self._prefix_metrics())
        metrics.update(self._optimizer_step())
        return metrics

    def _global_sizes(self, by_role: Mapping[str, Sequence[Turn]]) -> dict[str, tuple[int, int]]:
        """(turns, loss tokens) of each role over every rank: the normalisers of the whole batch."""
        roles = list(self.backbone.adapters)
        local = []
        for role in roles:
            local += [len(by_role.get(role, ())), sum(sum(t.loss_mask) for t in by_role.get(role, ()))]
        total = self.ranks.sum(local)
        sizes = {role: (int(total[2 * k]), int(total[2 * k + 1])) for k, role in enumerate(roles)}
        # Roles no rank trains this step keep gradient None everywhere, so AdamW skips them as in one process.
        self._stepped_roles = {role for role, (rows, _) in sizes.items() if rows > 0}
        return sizes

    def _role_chunks(
        self, by_role: Mapping[str, Sequence[Turn]], whole_episodes: bool = False
    ) -> list[tuple[str, list[list[Turn] | None]]]:
        """The micro-batches of each role some rank trains this step (after _global_sizes), in adapter
        order. On a sharded backbone under several ranks every rank gets as many per role as the rank
        with the most: None pads with an empty pass (a forward pass is a collective there)."""
        roles = [r for r in self.backbone.adapters if r in self._stepped_roles]
        size = self.update.micro_batch_size
        chunks: dict[str, list] = {
            r: micro_batches(by_role.get(r, ()), size, whole_episodes=whole_episodes) for r in roles
        }
        if self.backbone.sharded and self.ranks.size > 1:
            most = self.ranks.max([len(chunks[r]) for r in roles])
            chunks = {
                r: chunks[r] + [None] * (int(n) - len(chunks[r])) for r, n in zip(roles, most, strict=True)
            }
        return [(r, chunks[r]) for r in roles if chunks[r]]

    def _count_empty(self, metrics: dict[str, float], chunks: Sequence[list[Turn] | None]) -> None:
        """A sharded backbone's padding micro-batches (train/empty_passes, summed over ranks)."""
        if self.backbone.sharded:
            metrics["train/empty_passes"] = metrics.get("train/empty_passes", 0.0) + chunks.count(None)

    def _empty_pass(self, role: str, temperature: float, reference: bool) -> None:
        """The passes of a micro-batch (forward, `reference` forward, backward) adding nothing to any
        gradient."""
        pad = self.backbone.pad_id
        turn = Turn(role, "", (pad,), (pad,), (0,), (0.0,))
        batch = collate([turn], pad, self.accelerator.device)
        logits = completion_logits(self.model, batch)
        if reference:
            self._reference_logprobs(batch, temperature)
        self.accelerator.backward(logits.float().sum() * 0.0)

    def _grpo_role(
        self,
        role: str,
        chunks: list[list[Turn] | None],
        total_rows: int,
        total_tokens: int,
    ) -> dict[str, float]:
        g = self.grpo
        temperature = self.temperature.get(role, 1.0)
        self.backbone.activate(role)
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        for chunk, batch, logits in self._training_passes(chunks, whole_episodes=g.ratio_level == "sequence"):
            if chunk is None:
                self._empty_pass(role, temperature, reference=g.beta > 0)
                continue
            advantages = torch.tensor([t.advantage for t in chunk], device=batch.targets.device)
            logprobs = token_logprobs(logits, batch.targets, temperature)
            ref = batch.ref_logprobs  # taken before the step (grpo.kl_reference=start), or:
            if g.beta > 0 and ref is None:  # the whole turns: without adapters the prefix's states differ
                ref = self._reference_logprobs(
                    collate(chunk, self.backbone.pad_id, batch.targets.device), temperature
                )
            # With TIS the ratio is taken against the trainer's policy at the rollout (this forward pass
            # itself on a single update, else the logprobs recorded before the first) and the rollout's
            # logprobs only weigh tokens; without TIS, against the rollout's logprobs.
            if g.tis_cap is None:
                old = batch.old_logprobs
            else:
                old = batch.policy_logprobs if batch.policy_logprobs is not None else logprobs.detach()
            loss, stats = grpo_loss(
                logprobs,
                old,
                ref,
                advantages,
                batch.loss_mask,
                episode_ids=batch.episode_ids,
                rollout_logprobs=batch.old_logprobs,
                **g.loss_kwargs(),
            )
            weight = _micro_batch_weight(g.aggregation, batch, total_rows, total_tokens)
            self.accelerator.backward(loss * weight)
            tokens = float(batch.loss_mask.sum())
            with torch.no_grad():
                entropy = entropy_from_logits(logits.detach(), temperature)
                # How far the rollout backend's logprobs are from this forward pass's, token by token.
                mismatch = (logprobs.detach() - batch.old_logprobs).abs() * batch.loss_mask  # [B, K]
                sums["mismatch"] += float(mismatch.sum())
                sums["mismatch_max"] = max(sums["mismatch_max"], float(mismatch.max()))
            sums["entropy"] += float((entropy * batch.loss_mask).sum())
            for name in ("kl", "clip_fraction", "ratio_mean", "tis_weight_mean", "tis_capped_fraction"):
                sums[name] += stats[name] * tokens
            sums["loss"] += float(loss.detach()) * weight
            sums["tokens"] += tokens
        if all(chunk is None for chunk in chunks):
            return {}  # only empty passes: this rank has no turns of the role to report on
        n = max(sums["tokens"], 1.0)
        return {
            f"role/{role}/loss": sums["loss"],
            f"role/{role}/kl": sums["kl"] / n,
            f"role/{role}/clip_fraction": sums["clip_fraction"] / n,
            f"role/{role}/ratio_mean": sums["ratio_mean"] / n,
            f"role/{role}/entropy": sums["entropy"] / n,
            # Rollout vs trainer logprobs of the same tokens (before this step's update): backend numerics.
            f"role/{role}/logprob_mismatch_mean": sums["mismatch"] / n,
            f"role/{role}/logprob_mismatch_max": sums["mismatch_max"],
            # The correction of that mismatch (grpo.tis_cap): mean weight, share of tokens at the cap.
            f"role/{role}/tis_weight_mean": sums["tis_weight_mean"] / n,
            f"role/{role}/tis_capped_fraction": sums["tis_capped_fraction"] / n,
            f"role/{role}/trained_tokens": sums["tokens"],
        }

    def _training_passes(
        self, chunks: Sequence[list[Turn] | None], whole_episodes: bool = False
    ) -> Iterator[tuple[list[Turn] | None, TurnBatch | None, torch.Tensor | None]]:
        """Each micro-batch of the active role's `chunks` with its batch and the logits of its completions,
        with gradient unless run under torch.no_grad: (turns, batch, logits), or (None, None, None) for a
        sharded backbone's padding. The caller takes each micro-batch's loss backward before asking for the
        next. Where the turns begin alike (train.shared_prefix), they are regrouped by common prefix: the
        batch then holds the turns' tails and, after a group's last micro-batch, its prefix goes backward
        once."""
        shared = self.update.shared_prefix and not (
            whole_episodes or self.update.gradient_checkpointing or self.backbone.sharded or self._dropout()
        )
        pad, device = self.backbone.pad_id, self.accelerator.device
        if not shared:
            for chunk in chunks:
                if chunk is None:
                    yield None, None, None
                    continue
                batch = collate(chunk, pad, device)
                yield chunk, batch, completion_logits(self.model, batch)
            return
        turns = [t for chunk in chunks if chunk is not None for t in chunk]
        for length, members in prefix_groups([t.prompt_ids for t in turns]):
            group = [turns[i] for i in members]
            prefix = SharedPrefix(self.model, group[0].prompt_ids[:length], device) if length else None
            for chunk in micro_batches(group, self.update.micro_batch_size):
                tails = [replace(t, prompt_ids=t.prompt_ids[length:]) for t in chunk]
                batch = collate(tails, pad, device)
                yield chunk, batch, completion_logits(self.model, batch, prefix)
            if prefix is not None:
                prefix.backward()
            self._prefix_tokens["saved"] += (len(group) - 1) * length
            self._prefix_tokens["total"] += sum(len(t.prompt_ids) + len(t.completion_ids) for t in group)

    def _dropout(self) -> bool:
        """Whether a training pass draws dropout (LoRA's or attention's): a shared prefix would then draw one
        mask for all its turns, where turn by turn each draws its own."""
        base = (
            self.model.get_base_model().config if hasattr(self.model, "get_base_model") else self.model.config
        )
        return (
            getattr(base, "attention_dropout", 0.0) > 0  # Llama's: functional, no module to find
            # dropout modules: LoRA's (lora_dropout) and other architectures' (GPT-2's attn/resid/embd_pdrop)
            or any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in self.model.modules())
        )

    def _prefix_metrics(self) -> dict[str, float]:
        """train/prefix_tokens_saved: the share of this step's tokens that shared prefixes spared the
        passes (train.shared_prefix); absent where the passes ran turn by turn. Counts reset."""
        counts, self._prefix_tokens = self._prefix_tokens, {"saved": 0, "total": 0}
        if not counts["total"]:
            return {}
        return {"train/prefix_tokens_saved": counts["saved"] / counts["total"]}

    def _reference_logprobs(self, batch: TurnBatch, temperature: float) -> torch.Tensor:
        """The KL reference of grpo.kl_reference=base is free: the same backbone with every adapter off."""
        with torch.no_grad(), self.backbone.disabled_adapters():
            return token_logprobs(completion_logits(self.model, batch), batch.targets, temperature)

    # ---- SFT ---------------------------------------------------------------------------------

    def sft_step(self, turns: Sequence[Turn]) -> dict[str, float]:
        """Maximum likelihood on the generated (mask 1) tokens of demonstration turns, per role."""
        metrics: dict[str, float] = {"train/turns": float(len(turns))}
        by_role: dict[str, list[Turn]] = defaultdict(list)
        for t in turns:
            by_role[t.role].append(t)
        totals = self._global_sizes(by_role)
        for role, chunks in self._role_chunks(by_role):
            self._count_empty(metrics, chunks)
            self.backbone.activate(role)
            self.model.train()
            total_tokens = totals[role][1]
            nll = 0.0
            for chunk, batch, logits in self._training_passes(chunks):
                if chunk is None:
                    self._empty_pass(role, 1.0, reference=False)
                    continue
                logprobs = token_logprobs(logits, batch.targets)
                loss = sft_loss(logprobs, batch.loss_mask)
                weight = float(batch.loss_mask.sum()) / max(total_tokens, 1)
                self.accelerator.backward(loss * weight)
                nll += float(loss.detach()) * weight
            if by_role.get(role):
                metrics[f"role/{role}/sft_nll"] = nll
                metrics[f"role/{role}/trained_tokens"] = float(sum(sum(t.loss_mask) for t in by_role[role]))
        metrics.update(self._prefix_metrics())
        metrics.update(self._optimizer_step())
        return metrics

    # ---- value heads (grpo.advantage=gae) ----------------------------------------------------

    def state_features(self, turns: Sequence[Turn]) -> torch.Tensor:
        """The backbone's last hidden state (after its final norm) at each turn's last prompt token, with
        the turn's role adapter active and no gradient: the state the turn acted in, [N, H] float32."""
        out: dict[int, torch.Tensor] = {}  # by id() of the turn
        training = self.model.training
        self.model.eval()
        try:
            for chunk in self._role_micro_batches(turns):
                prompts = [t.prompt_ids for t in chunk]
                hidden = prompt_states(self.model, self.backbone.pad_id, prompts, self.accelerator.device)
                out.update({id(t): h for t, h in zip(chunk, hidden, strict=True)})
        finally:
            self.model.train(training)
        if not turns:
            hidden_size = self.model.get_base_model().config.hidden_size
            return torch.zeros((0, hidden_size), device=self.accelerator.device)
        return torch.stack([out[id(t)] for t in turns])

    def state_values(self, turns: Sequence[Turn]) -> tuple[list[float], torch.Tensor]:
        """Each turn's value under its role's head, and the features it was taken from (state_features)."""
        if self.values is None:
            raise RuntimeError(
                "state_values() needs value heads: build the trainer with value=ValueSettings()"
            )
        features = self.state_features(turns)
        with torch.no_grad():
            values = [
                float(self.values.predict(t.role, f.unsqueeze(0))[0])
                for t, f in zip(turns, features, strict=True)
            ]
        return values, features

    def value_step(
        self, turns: Sequence[Turn], features: torch.Tensor, returns: Sequence[float]
    ) -> dict[str, float]:
        """Fit each role's value head on its turns' `returns` (training.value.ValueHeads.fit), every rank
        together; returns the "value/<role>/..." metrics of the roles some rank has turns of."""
        if self.values is None:
            raise RuntimeError("value_step() needs value heads: build the trainer with value=ValueSettings()")
        metrics: dict[str, float] = {}
        roles = list(self.backbone.adapters)
        counts = self.ranks.sum([sum(t.role == role for t in turns) for role in roles])
        for role, count in zip(roles, counts, strict=True):
            if count == 0:
                continue  # every rank skips it alike
            rows = [i for i, t in enumerate(turns) if t.role == role]
            index = torch.tensor(rows, dtype=torch.long, device=features.device)
            metrics.update(self.values.fit(role, features[index], [returns[i] for i in rows], self.ranks))
        return metrics

    def value_estimator(self) -> HeadEstimator:
        """The value heads as a training.value.ValueEstimator."""
        return HeadEstimator(self)

    # ---- preferences (DPO, IPO, SimPO) -------------------------------------------------------

    def sequence_logprobs(self, turns: Sequence[Turn]) -> list[float]:
        """Each turn's summed logprob of its generated (mask 1) tokens under its role's adapter as it is
        now, at temperature 1; no gradient."""
        out: dict[int, float] = {}  # by id() of the turn
        for chunk in self._role_micro_batches(turns):
            batch = collate(chunk, self.backbone.pad_id, self.accelerator.device)
            with torch.no_grad():
                logprobs = token_logprobs(completion_logits(self.model, batch), batch.targets)
            sums = (logprobs * batch.loss_mask).sum(-1)  # [B]
            out.update({id(t): float(x) for t, x in zip(chunk, sums, strict=True)})
        return [out[id(t)] for t in turns]

    def _role_micro_batches(self, turns: Sequence[Turn]) -> Iterator[list[Turn]]:
        """`turns` in micro-batches of one role, role by role, each role's adapter active while its
        batches are used; a turn of a role without an adapter is an error."""
        unknown = {t.role for t in turns} - set(self.backbone.adapters)
        if unknown:
            raise ValueError(f"no adapter for roles {sorted(unknown)}")
        for role in self.backbone.adapters:
            own = [t for t in turns if t.role == role]
            if own:
                self.backbone.activate(role)
                yield from micro_batches(own, self.update.micro_batch_size)

    def snapshot(self, role: str) -> list[torch.Tensor]:
        """A copy of `role`'s adapter weights (the reference of a preference stage)."""
        return [p.detach().clone() for p in self.backbone.trainable_parameters(role)]

    @contextmanager
    def weights(self, role: str, snapshot: Sequence[torch.Tensor]) -> Iterator[None]:
        """`role`'s adapter holds `snapshot` inside the block, its own weights again after it."""
        params = self.backbone.trainable_parameters(role)
        shapes = [tuple(p.shape) for p in params]
        if shapes != [tuple(w.shape) for w in snapshot]:
            raise ValueError(
                f"the snapshot of {role!r} does not fit its adapter (other LoRA ranks or modules)"
            )
        own = [p.detach().clone() for p in params]
        try:
            with torch.no_grad():
                for p, w in zip(params, snapshot, strict=True):
                    p.copy_(w)
            yield
        finally:
            with torch.no_grad():
                for p, w in zip(params, own, strict=True):
                    p.copy_(w)

    @contextmanager
    def all_weights(self, snapshots: Mapping[str, Sequence[torch.Tensor]]) -> Iterator[None]:
        """Each role of `snapshots` holds its snapshot inside the block (weights()), its own weights after it."""
        with ExitStack() as stack:
            for role, snapshot in snapshots.items():
                stack.enter_context(self.weights(role, snapshot))
            yield

    def preference_step(
        self, pairs: Sequence[PreferencePair], settings: PreferenceSettings
    ) -> dict[str, float]:
        """One optimizer step on preference pairs (each scored by its reference unless the loss needs
        none): per role, the mean loss over its pairs, chosen and rejected turns in one forward pass."""
        if self.backbone.sharded:
            raise ValueError("preference training on a sharded backbone (model.fsdp) is not supported yet")
        if settings.needs_reference and any(p.ref_chosen is None or p.ref_rejected is None for p in pairs):
            raise ValueError(f"dpo.loss={settings.loss} needs every pair scored by its reference first")
        by_role: dict[str, list[PreferencePair]] = defaultdict(list)
        for pair in pairs:
            by_role[pair.role].append(pair)
        roles = list(self.backbone.adapters)
        total = self.ranks.sum([len(by_role.get(r, ())) for r in roles])
        self._stepped_roles = {r for r, n in zip(roles, total, strict=True) if n > 0}
        metrics: dict[str, float] = {"train/pairs": float(sum(total))}
        per_chunk = max(1, self.update.micro_batch_size // 2)  # a chunk's chosen and rejected turns together
        for role, n in zip(roles, total, strict=True):
            own = by_role.get(role, [])
            if not own:
                continue
            self.backbone.activate(role)
            self.model.train()
            sums: dict[str, float] = defaultdict(float)
            for start in range(0, len(own), per_chunk):
                chunk = own[start : start + per_chunk]
                k = len(chunk)
                batch = collate(
                    [p.chosen for p in chunk] + [p.rejected for p in chunk],
                    self.backbone.pad_id,
                    self.accelerator.device,
                )
                logprobs = token_logprobs(completion_logits(self.model, batch), batch.targets)
                seq = (logprobs * batch.loss_mask).sum(-1)  # [2k]
                tokens = batch.loss_mask.sum(-1)  # [2k]
                refs = None
                if settings.needs_reference:
                    refs = torch.tensor(
                        [p.ref_chosen for p in chunk] + [p.ref_rejected for p in chunk], device=seq.device
                    )
                losses, stats = preference_loss(
                    seq[:k],
                    seq[k:],
                    None if refs is None else refs[:k],
                    None if refs is None else refs[k:],
                    tokens[:k],
                    tokens[k:],
                    settings,
                )
                self.accelerator.backward(losses.sum() / n)
                sums["loss"] += float(losses.detach().sum())
                for name, values in stats.items():
                    sums[name] += float(values.sum())
            # Over the global count: summed over the ranks (training.distributed.SUMMED_METRICS), the mean
            metrics.update({f"role/{role}/pref_{name}": value / n for name, value in sums.items()})
            metrics[f"role/{role}/pairs"] = float(n)
        metrics.update(self._optimizer_step())
        return metrics

    # ---- shared ------------------------------------------------------------------------------

    def _optimizer_step(self) -> dict[str, float]:
        stepped, self._stepped_roles = self._stepped_roles, set()
        groups = self.optimizer.param_groups
        self.ranks.sum_gradients([p for g in groups if g["name"] in stepped for p in g["params"]])
        metrics = {}
        for group in self.optimizer.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                norm = self.accelerator.clip_grad_norm_(params, self.update.max_grad_norm)
                metrics[f"role/{group['name']}/grad_norm"] = float(norm)
            metrics[f"role/{group['name']}/lr"] = float(group["lr"])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return metrics


def merge_updates(updates: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The metrics of several updates on one rollout as one: each the mean over the updates that report
    it (a learning rate: the last); the clip fraction and mean ratio also of the first update alone and of
    the later ones (where the clip range acts), as `<name>_first` and `<name>_later`."""
    merged: dict[str, float] = {}
    for key in dict.fromkeys(k for u in updates for k in u):
        values = [u[key] for u in updates if key in u]
        merged[key] = values[-1] if key.endswith("/lr") else sum(values) / len(values)
        if key.endswith(("/clip_fraction", "/ratio_mean")):
            merged[f"{key}_first"] = updates[0].get(key, float("nan"))
            later = [u[key] for u in updates[1:] if key in u]
            if later:
                merged[f"{key}_later"] = sum(later) / len(later)
    merged["train/updates"] = float(len(updates))
    return merged


def _micro_batch_weight(aggregation: str, batch: TurnBatch, total_rows: int, total_tokens: int) -> float:
    """Scale a micro-batch's aggregated loss so the sum over micro-batches is the full-batch loss."""
    if aggregation in TOKEN_NORMALISED:
        return float(batch.loss_mask.sum()) / max(total_tokens, 1)
    rows = batch.targets.shape[0]
    return rows / max(total_rows, 1)


class HeadEstimator:
    """A PolicyTrainer's value heads as a training.value.ValueEstimator: `estimate` runs the value pass
    and keeps its features, so `learn` on the same turns fits without another forward pass. Call
    `learn` before the adapters change (the loop does): the kept features are of the adapters then."""

    def __init__(self, trainer: PolicyTrainer):
        if trainer.values is None:
            raise RuntimeError(
                "a value estimator needs value heads: build the trainer with value=ValueSettings()"
            )
        self.trainer = trainer
        self._features: tuple[list[Turn], torch.Tensor] | None = None

    def estimate(self, turns: Sequence[Turn]) -> list[float]:
        values, features = self.trainer.state_values(turns)
        self._features = (list(turns), features)
        return values

    def learn(self, turns: Sequence[Turn], returns: Sequence[float]) -> dict[str, float]:
        kept = self._features
        same = (
            kept is not None
            and len(kept[0]) == len(turns)
            and all(a is b for a, b in zip(kept[0], turns, strict=True))
        )
        features = kept[1] if same else self.trainer.state_features(turns)
        return self.trainer.value_step(turns, features, returns)
