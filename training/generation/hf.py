"""Batched generation with transformers: one decode loop, mixed role adapters in one batch, KV cache.

    backend = HFBackend(backbone, batch_size=16)
    results = backend.generate([GenerationRequest("executor", prompt_ids, SamplingParams(temperature=0.7, max_new_tokens=64))])

Each row of a batch carries its own adapter (`RowAdapters`: every adapter stacked, rows masked), sampling
settings and torch.Generator, so a seeded request gives the same tokens whatever batch it lands in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from training.backbone import BASE_ADAPTER, Backbone
from training.generation.packed import PackedLinears
from training.generation.prefix_cache import CachedPrefix, PrefixCache, common_prefix, weights_fingerprint
from training.mixed_lora import RowAdapters
from training.types import GenerationRequest, GenerationResult, repeats_at_end

NUCLEUS_CANDIDATES = 1024
BATCH_SIZE = 16  # rows per forward pass (backend.batch_size)
PREFIX_CACHE_MB = 2048  # key/value states kept for prompts that extend earlier ones (backend.prefix_cache_mb)
MIN_SHARED_PREFIX = 16  # tokens that uncached prompts of one adapter must share to have them run once


def default_eos_ids(backbone: Backbone) -> frozenset[int]:
    """Every id that ends a generation: the tokenizer's eos and the generation config's eos ids."""
    ids = {backbone.tokenizer.eos_token_id}
    config_eos = getattr(backbone.model.generation_config, "eos_token_id", None)
    ids.update(config_eos if isinstance(config_eos, list | tuple) else [config_eos])
    return frozenset(i for i in ids if i is not None)


@dataclass
class _Row:
    """Decode state of one request (mutable: it grows one token per step)."""

    request: GenerationRequest
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class HFBackend:
    """GenerationBackend on a Backbone: left-padded batches, KV cache, per-row adapter and sampling.

    Logprobs are log_softmax(logits / temperature) at the sampled token (raw logits when greedy), before
    top-p truncation: the same quantity the trainer recomputes, so the GRPO ratio starts at 1.
    A stop string ends a row at the token that completes it; `text` is cut right after the stop string
    (that token may carry a few more characters, which stay in `token_ids`).

    Prompts that extend an earlier request's prompt and output (the same episode after a tool result,
    a reflection after its plan) reuse that request's key/value states (`PrefixCache`, at most
    `prefix_cache_mb`; 0 turns it off) and run only their new tokens.

    batch_size: most rows per forward pass. eos_token_ids: ids that end a row (default: the tokenizer's
    and the generation config's eos); the eos token is kept in token_ids so training learns to stop.
    """

    def __init__(
        self,
        backbone: Backbone,
        batch_size: int = BATCH_SIZE,
        eos_token_ids: Iterable[int] | None = None,
        prefix_cache_mb: float = PREFIX_CACHE_MB,
    ):
        if batch_size < 1:
            raise ValueError(f"generation batch_size={batch_size} must be >= 1")
        self.backbone = backbone
        self.batch_size = batch_size
        self.prefix = PrefixCache(int(prefix_cache_mb * 2**20))
        self.eos_ids = frozenset(eos_token_ids) if eos_token_ids is not None else default_eos_ids(backbone)
        self.pad_id = backbone.pad_id
        self._rows: RowAdapters | None = None  # per-row adapters, while generate() runs
        # bfloat16 CPU weights packed once for oneDNN (frozen: the adapters train, not the base)
        self._packed = PackedLinears(backbone.model) if not backbone.sharded else nullcontext()

    @property
    def adapters(self) -> tuple[str, ...]:
        return self.backbone.adapters

    def clear_cache(self) -> None:
        """Forget every cached prompt state: the next prompts run whole, as in a fresh backend. The same
        states computed in another batch layout differ in their last bits, and a sample can turn on that."""
        self.prefix.clear()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """One result per request, in request order."""
        requests = list(requests)
        for request in requests:
            self._validate(request)
        # Unseeded rows draw their seed from torch's global RNG in request order, so torch.manual_seed
        # makes a whole call reproducible too.
        generators = [self._generator(r.seed) for r in requests]
        # Longest prompts first, so each batch holds prompts of similar length (less padding).
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i].prompt_ids))
        results: list[GenerationResult | None] = [None] * len(requests)
        model = self.backbone.model
        was_training = model.training
        model.eval()
        try:
            # FSDP's all-gather buffers outlive a pass: made inside inference mode, training could not use them.
            no_grad = torch.no_grad() if self.backbone.sharded else torch.inference_mode()
            with no_grad, RowAdapters(model) as self._rows, self._packed:
                for start in range(0, len(order), self.batch_size):
                    chunk = order[start : start + self.batch_size]
                    rows = [_Row(requests[i], generators[i]) for i in chunk]
                    self._decode(rows)
                    for i, row in zip(chunk, rows, strict=True):
                        results[i] = self._result(row)
        finally:
            self._rows = None
            model.train(was_training)
        return results

    def _forward(self, adapters: list[str], **inputs):
        """One forward pass of the backbone with row i on adapter `adapters[i]` (BASE_ADAPTER: none)."""
        if self._rows is None:
            raise RuntimeError("HFBackend forward passes run inside generate(), which sets the row adapters")
        self._rows.set(adapters)
        self.backbone.lockstep.before_forward()  # sharded backbone: the other ranks join this pass
        return self.backbone.model(**inputs)

    def _validate(self, request: GenerationRequest) -> None:
        if request.adapter is not None and request.adapter not in self.backbone.adapters:
            raise ValueError(f"request adapter {request.adapter!r} is not one of {self.backbone.adapters}")
        if not request.prompt_ids:
            raise ValueError("a generation request needs at least one prompt token")
        sampling = request.sampling
        if sampling.temperature < 0 or not 0 < sampling.top_p <= 1:
            raise ValueError(f"bad sampling params {sampling}: need temperature >= 0 and 0 < top_p <= 1")

    def _generator(self, seed: int | None) -> torch.Generator:
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        return torch.Generator(device=self.backbone.device).manual_seed(seed)

    def _decode(self, rows: list[_Row]) -> None:
        """Run the decode loop until every row has finished; fills each row's tokens and logprobs."""
        for row in rows:
            if row.request.sampling.max_new_tokens <= 0:
                row.finish_reason = "length"
        active = [b for b, row in enumerate(rows) if not row.done]  # batch position -> row index
        if not active:
            return
        states = self._prefill([rows[b].request for b in active])
        room = max(rows[b].request.sampling.max_new_tokens for b in active)
        cache, attention_mask, position_ids = assemble_cache(states, room, self.backbone.device)
        logits = torch.stack([s.logits for s in states])  # [B, V]
        adapter_names = [rows[b].request.adapter or BASE_ADAPTER for b in active]
        while True:
            next_tokens = [self.pad_id] * len(active)  # finished rows are fed pad and ignored
            for k, token, logprob in self._sample(logits, [rows[b] for b in active]):
                row = rows[active[k]]
                row.tokens.append(token)
                row.logprobs.append(logprob)
                row.finish_reason = self._finish_reason(row)
                next_tokens[k] = token
            still = [k for k, b in enumerate(active) if not rows[b].done]
            if not still:
                self._remember(cache, attention_mask, [rows[b] for b in active], range(len(active)))
                return
            if len(still) <= len(active) // 2:
                # Once half the rows are done, drop them so they stop costing attention and matmuls.
                done = [k for k in range(len(active)) if k not in still]
                self._remember(cache, attention_mask, [rows[b] for b in active], done)
                keep = torch.tensor(still, device=attention_mask.device)
                cache.batch_select_indices(keep)
                attention_mask, position_ids = attention_mask[keep], position_ids[keep]
                active = [active[k] for k in still]
                adapter_names = [adapter_names[k] for k in still]
                next_tokens = [next_tokens[k] for k in still]
            input_ids = torch.tensor(next_tokens, device=attention_mask.device)[:, None]  # [B, 1]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(active), 1))], dim=-1)
            out = self._forward(
                adapter_names,
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()  # [B, V]
            position_ids = position_ids + 1  # [B, 1]

    def prefill(self, requests: Sequence[GenerationRequest]) -> list[_State]:
        """Each request's prompt states and last logits, as `generate` computes them before its decode
        loop (measurements decode from them: bench/rollout.py). Call it under torch.inference_mode."""
        with RowAdapters(self.backbone.model) as self._rows, self._packed:
            try:
                return self._prefill(list(requests))
            finally:
                self._rows = None

    def _prefill(self, requests: list[GenerationRequest]) -> list[_State]:
        """Each prompt's key/value states and last logits; cached prefixes skip their forward pass.

        Identical prompts (the G episodes of a task) are run once. Prompts are run in groups of similar
        uncached length, so little of a forward pass is spent on padding.
        """
        prompts = [torch.tensor(r.prompt_ids, dtype=torch.long) for r in requests]
        adapters = [r.adapter or BASE_ADAPTER for r in requests]
        self.prefix.validate(weights_fingerprint(self.backbone.model.parameters()))
        unique: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            unique.setdefault((adapters[i], r.prompt_ids), []).append(i)
        firsts = [indices[0] for indices in unique.values()]
        self._share_prefixes([(adapters[i], prompts[i]) for i in firsts])
        items = []
        for indices in unique.values():
            i = indices[0]
            entry, n = self.prefix.lookup(adapters[i], prompts[i])
            items.append(_Pending(indices, prompts[i], adapters[i], entry, n))
        items.sort(key=lambda it: -it.uncached)
        states: list[_State | None] = [None] * len(requests)
        for group in _length_groups(items, self.batch_size):
            for item, state in zip(group, self._prefill_group(group), strict=True):
                for i in item.indices:
                    states[i] = state
        return states

    def _share_prefixes(self, prompts: list[tuple[str, torch.Tensor]]) -> None:
        """Distinct (adapter, prompt)s that the cache cannot start (the first requests after an update)
        have the beginning that all of one adapter's share (its system prompt, the tools' descriptions)
        run once and stored: each then starts from it."""
        if self.prefix.max_bytes == 0:
            return
        uncached: dict[str, list[torch.Tensor]] = {}
        for adapter, prompt in prompts:
            if self.prefix.lookup(adapter, prompt, count=False)[1] < MIN_SHARED_PREFIX:
                uncached.setdefault(adapter, []).append(prompt)
        for adapter, group in uncached.items():
            if len(group) < 2:
                continue
            n = min(len(p) for p in group) - 1  # each prompt's last token is run for its logits
            for prompt in group[1:]:
                n = min(n, common_prefix(group[0], prompt))
            if n < MIN_SHARED_PREFIX:
                continue
            shared = group[0][:n]
            (state,) = self._prefill_group([_Pending([], shared, adapter, None, 0)])
            self.prefix.misses += n
            self.prefix.store(CachedPrefix(adapter, shared, state.keys, state.values))

    def _prefill_group(self, group: list[_Pending]) -> list[_State]:
        """One forward pass over the uncached tails of `group`, after their cached prefixes."""
        device = self.backbone.device
        past = max(it.cached for it in group)
        width = max(it.uncached for it in group)
        input_ids = torch.full((len(group), width), self.pad_id, dtype=torch.long)  # [B, S]
        attention_mask = torch.zeros((len(group), past + width), dtype=torch.long)  # [B, P + S]
        position_ids = torch.zeros((len(group), width), dtype=torch.long)  # [B, S]
        for k, it in enumerate(group):
            n, s = it.cached, it.uncached
            input_ids[k, width - s :] = it.prompt[n:]
            attention_mask[k, past - n : past] = 1
            attention_mask[k, past + width - s :] = 1
            # Positions count real tokens from 0 whatever the padding, so cached states fit any batch.
            position_ids[k, width - s :] = torch.arange(n, n + s)
        cache = None
        if past > 0:
            layers = _left_padded([it.entry and _slice(it.entry, it.cached) for it in group], past, device)
            cache = DynamicCache(ddp_cache_data=layers)
        out = self._forward(
            [it.adapter for it in group],
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            position_ids=position_ids.to(device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,  # the lm_head over the whole prompt would cost B x T x vocab
        )
        logits = out.logits[:, -1, :].float()  # [B, V]
        attention_mask = attention_mask.to(device)
        return [
            _State(logits[k], *_row_states(out.past_key_values, attention_mask[k], len(it.prompt), k))
            for k, it in enumerate(group)
        ]

    def _remember(
        self, cache, attention_mask: torch.Tensor, rows: list[_Row], positions: Iterable[int]
    ) -> None:
        """Keep the states of finished rows: a later prompt that extends one (after a tool result,
        or a reflection after its plan) starts from them."""
        if self.prefix.max_bytes == 0:
            return
        for k in positions:
            row = rows[k]
            tokens = (*row.request.prompt_ids, *row.tokens[:-1])  # the last token was never fed back
            keys, values = _row_states(cache, attention_mask[k], len(tokens), k)
            adapter = row.request.adapter or BASE_ADAPTER
            self.prefix.store(CachedPrefix(adapter, torch.tensor(tokens, dtype=torch.long), keys, values))

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> list[tuple[int, int, float]]:
        """(batch position, token, logprob) for every unfinished row; logits: [B, V] float32."""
        temperatures = torch.tensor(
            [row.request.sampling.temperature or 1.0 for row in rows], device=logits.device
        )  # [B]; greedy rows keep raw logits
        logprobs = torch.log_softmax(logits / temperatures[:, None], dim=-1)  # [B, V]
        # Every sampling row's candidates in one call: a row at a time took twice as long, same picks.
        sampled = any(not row.done and row.request.sampling.temperature > 0 for row in rows)
        top = logprobs.topk(min(NUCLEUS_CANDIDATES, logprobs.shape[-1]), dim=-1) if sampled else None
        picks = []
        for k, row in enumerate(rows):
            if row.done:
                continue
            sampling = row.request.sampling
            if sampling.temperature == 0:
                token = int(logits[k].argmax())
            else:
                token = _sample_top_p(
                    logprobs[k], sampling.top_p, row.generator, top=(top.values[k], top.indices[k])
                )
            picks.append((k, token, float(logprobs[k, token])))
        return picks

    def _finish_reason(self, row: _Row) -> str | None:
        sampling = row.request.sampling
        if row.tokens[-1] in self.eos_ids:
            return "eos"
        if sampling.stop:
            # A stop string spans at most one token per byte; decode only that tail, not the whole row.
            window = 4 * max(len(s) for s in sampling.stop) + 2
            tail = self.backbone.tokenizer.decode(row.tokens[-window:], skip_special_tokens=True)
            if any(stop in tail for stop in sampling.stop):
                return "stop"
        if len(row.tokens) >= sampling.max_new_tokens:
            return "length"
        if sampling.repetition_stop and repeats_at_end(row.tokens, sampling.repetition_stop):
            return "repetition"
        return None

    def _result(self, row: _Row) -> GenerationResult:
        text = self.backbone.tokenizer.decode(row.tokens, skip_special_tokens=True)
        stop = None
        if row.finish_reason == "stop":
            # The token that completed the stop string may carry characters after it: cut the text there.
            found = [(text.find(s) + len(s), s) for s in row.request.sampling.stop if s in text]
            if found:
                end, stop = min(found)
                text = text[:end]
        return GenerationResult(
            token_ids=tuple(row.tokens),
            logprobs=tuple(row.logprobs),
            text=text,
            finish_reason=row.finish_reason,
            stop=stop,
        )


def _sample_top_p(
    logprobs: torch.Tensor,
    top_p: float,
    generator: torch.Generator,
    candidates: int = NUCLEUS_CANDIDATES,
    top: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> int:
    """Sample one token from the smallest set of tokens whose probability reaches top_p; logprobs: [V]
    (normalised: a log_softmax).

    Exponential race (Gumbel-max): argmax(log p - log E), E ~ Exp(1), is an exact sample from p, and the
    float noise between batch compositions (~1e-7) almost never changes the winner, unlike an inverse CDF
    over 49k near-equal probabilities. The race is run over the `candidates` most likely tokens, which
    hold almost all the mass: drawing 49k exponentials per row was a tenth of a float32 CPU decode step.
    Exact up to float rounding (about 1e-6 of probability): with top_p < 1 the nucleus lies inside the
    candidates (else the whole vocabulary is raced); with top_p = 1 one uniform draw first picks the
    candidates with their total probability, or else the rest. The candidates race in token-id order,
    each step drawing the same numbers whatever the nucleus, so near-tied tokens that swap rank between
    batch layouts keep their own noise. `top`: the row's candidates (values, indices, most likely first)
    when the caller took every row's at once.
    """
    if top is None:
        top = logprobs.topk(min(candidates, logprobs.numel()))  # most likely first
    values, indices = top
    if top_p < 1.0:
        probs = values.exp()
        if float(probs.sum()) < top_p:  # the nucleus reaches beyond the candidates: race the whole vocabulary
            return _race(_nucleus(logprobs, top_p), generator)
        # Keep a token while the mass before it is below top_p; the most likely token is always kept.
        n = int(((probs.cumsum(0) - probs) < top_p).sum())
        values = values.clone()
        values[n:] = -torch.inf
    else:
        u = float(torch.rand((), generator=generator, device=generator.device, dtype=torch.float64))
        rest = 1.0 - float(values.double().exp().sum())  # the probability outside the candidates
        if values.numel() < logprobs.numel() and u < rest:
            others = logprobs.index_fill(0, indices, -torch.inf)
            if bool(torch.isfinite(others).any()):  # rounding can leave `rest` > 0 where nothing is
                return _race(others, generator)
    order = indices.argsort()  # token-id order
    return int(indices[order][_race(values[order], generator)])


def _race(logprobs: torch.Tensor, generator: torch.Generator) -> int:
    """The index of an exact sample from softmax(logprobs) (the exponential race)."""
    noise = torch.empty_like(logprobs).exponential_(generator=generator)
    return int((logprobs - noise.log()).argmax())


def _nucleus(logprobs: torch.Tensor, top_p: float) -> torch.Tensor:
    """`logprobs` with all but the nucleus at -inf: the most likely tokens, counted as the fast path
    counts them (exactly n, ties cut by rank), whose mass before the last is below top_p."""
    top = logprobs.sort(descending=True)  # [V]
    probs = top.values.exp()
    n = int(((probs.cumsum(0) - probs) < top_p).sum())
    return torch.full_like(logprobs, -torch.inf).index_copy_(0, top.indices[:n], top.values[:n])


@dataclass
class _Pending:
    """A distinct prompt waiting for its prefill, and the cached prefix it can start from."""

    indices: list[int]  # the requests that share this prompt
    prompt: torch.Tensor  # [L]
    adapter: str
    entry: CachedPrefix | None
    cached: int  # leading prompt tokens whose states come from `entry`

    @property
    def uncached(self) -> int:
        return len(self.prompt) - self.cached


@dataclass
class _State:
    """A prefilled prompt: the logits for its next token and its per-layer states [H, L, D]."""

    logits: torch.Tensor  # [V]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]


def _length_groups(items: list[_Pending], size: int) -> list[list[_Pending]]:
    """Split items (longest uncached tail first) into groups of at most `size` whose tails differ by
    at most 2x, so padding costs at most half of a group's forward pass."""
    groups: list[list[_Pending]] = []
    for item in items:
        if groups and len(groups[-1]) < size and 2 * item.uncached >= groups[-1][0].uncached:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def _slice(entry: CachedPrefix, n: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    return tuple(k[:, :n] for k in entry.keys), tuple(v[:, :n] for v in entry.values)


def _left_padded(rows: list, width: int, device, room: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values) [B, H, width + room, D] with each row's states ending at `width`;
    rows without states (None) stay zero, their positions masked out."""
    first = next(r for r in rows if r)
    out = []
    for layer in range(len(first[0])):
        heads, _, dim = first[0][layer].shape
        like = first[0][layer]
        keys = torch.zeros((len(rows), heads, width + room, dim), dtype=like.dtype, device=device)
        values = torch.zeros_like(keys)
        for b, row in enumerate(rows):
            if row:
                n = row[0][layer].shape[1]
                keys[b, :, width - n : width] = row[0][layer]
                values[b, :, width - n : width] = row[1][layer]
        out.append((keys, values))
    return out


def assemble_cache(
    states: list[_State], room: int, device
) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
    """The decode batch: every row's states left-padded into one cache with `room` free positions,
    its attention mask and each row's next position."""
    lengths = [s.keys[0].shape[1] for s in states]
    width = max(lengths)
    layers = _left_padded([(s.keys, s.values) for s in states], width, device, room=room)
    cache = DynamicCache()
    cache.layers = [_RoomyLayer(keys, values, width) for keys, values in layers]
    attention_mask = torch.zeros((len(states), width), dtype=torch.long, device=device)  # [B, T]
    for b, n in enumerate(lengths):
        attention_mask[b, width - n :] = 1
    position_ids = torch.tensor(lengths, device=device)[:, None]  # [B, 1]: the next token's position
    return cache, attention_mask, position_ids


class _RoomyLayer(DynamicLayer):
    """A cache layer that writes new states into room allocated up front.

    transformers' DynamicLayer concatenates at every step, copying the whole cache: on a CPU that copy
    was most of a decode step. Here `keys` and `values` are views of the first `length` positions.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._keys, self._values = keys, values  # [B, H, capacity, D]
        self._set_length(length)

    def _set_length(self, length: int) -> None:
        self.keys, self.values = self._keys[:, :, :length], self._values[:, :, :length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self._keys.shape[-2]:  # out of room: grow (not expected: room covers max_new_tokens)
            grow = (0, 0, 0, max(end - self._keys.shape[-2], 64))
            self._keys = torch.nn.functional.pad(self._keys, grow)
            self._values = torch.nn.functional.pad(self._values, grow)
        self._keys[:, :, start:end] = key_states
        self._values[:, :, start:end] = value_states
        self._set_length(end)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        length = self.keys.shape[-2]
        self._keys, self._values = self._keys[indices], self._values[indices]
        self._set_length(length)


def _row_states(cache, mask: torch.Tensor, n: int, row: int):
    """The first n real positions of one batch row: per-layer keys and values [H, n, D]."""
    valid = mask.nonzero().squeeze(1)[:n]
    keys = tuple(layer.keys[row].index_select(1, valid) for layer in cache.layers)
    values = tuple(layer.values[row].index_select(1, valid) for layer in cache.layers)
    return keys, values
