"""Batched generation with transformers: one decode loop, mixed role adapters in one batch, KV cache.

    backend = HFBackend(backbone, batch_size=16)
    results = backend.generate([GenerationRequest("executor", prompt_ids, SamplingParams(temperature=0.7))])

Each row of a batch carries its own adapter (PEFT mixed-adapter inference), sampling settings and
torch.Generator, so a seeded request gives the same tokens whatever batch it lands in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from training.backbone import BASE_ADAPTER, Backbone
from training.types import GenerationRequest, GenerationResult

NUCLEUS_CANDIDATES = 1024


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

    batch_size: most rows per forward pass. eos_token_ids: ids that end a row (default: the tokenizer's
    and the generation config's eos); the eos token is kept in token_ids so training learns to stop.
    """

    def __init__(self, backbone: Backbone, batch_size: int = 16, eos_token_ids: Iterable[int] | None = None):
        if batch_size < 1:
            raise ValueError(f"generation batch_size={batch_size} must be >= 1")
        self.backbone = backbone
        self.batch_size = batch_size
        self.eos_ids = frozenset(eos_token_ids) if eos_token_ids is not None else default_eos_ids(backbone)
        tokenizer = backbone.tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @property
    def adapters(self) -> tuple[str, ...]:
        return self.backbone.adapters

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
        model.eval()  # PEFT refuses per-row adapter names in training mode
        try:
            with torch.inference_mode():
                for start in range(0, len(order), self.batch_size):
                    chunk = order[start : start + self.batch_size]
                    rows = [_Row(requests[i], generators[i]) for i in chunk]
                    self._decode(rows)
                    for i, row in zip(chunk, rows, strict=True):
                        results[i] = self._result(row)
        finally:
            model.train(was_training)
        return results

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
        device = self.backbone.device
        for row in rows:
            if row.request.sampling.max_new_tokens <= 0:
                row.finish_reason = "length"
        active = [b for b, row in enumerate(rows) if not row.done]  # batch position -> row index
        if not active:
            return
        width = max(len(rows[b].request.prompt_ids) for b in active)
        input_ids = torch.full((len(active), width), self.pad_id, dtype=torch.long)  # [B, T]
        attention_mask = torch.zeros((len(active), width), dtype=torch.long)  # [B, T]
        for k, b in enumerate(active):
            prompt = rows[b].request.prompt_ids
            input_ids[k, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[k, width - len(prompt) :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        # Left padding: real tokens count positions from 0 whatever the padding in front of them.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, T]
        adapter_names = [rows[b].request.adapter or BASE_ADAPTER for b in active]
        cache = None
        while True:
            out = self.backbone.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                adapter_names=adapter_names,
                logits_to_keep=1,  # the lm_head over the whole prompt would cost B x T x vocab
            )
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()  # [B, V]
            next_tokens = [self.pad_id] * len(active)  # finished rows are fed pad and ignored
            for k, token, logprob in self._sample(logits, [rows[b] for b in active]):
                row = rows[active[k]]
                row.tokens.append(token)
                row.logprobs.append(logprob)
                row.finish_reason = self._finish_reason(row)
                next_tokens[k] = token
            still = [k for k, b in enumerate(active) if not rows[b].done]
            if not still:
                return
            if len(still) <= len(active) // 2:
                # Once half the rows are done, drop them so they stop costing attention and matmuls.
                keep = torch.tensor(still, device=device)
                cache.batch_select_indices(keep)
                attention_mask, position_ids = attention_mask[keep], position_ids[keep]
                active = [active[k] for k in still]
                adapter_names = [adapter_names[k] for k in still]
                next_tokens = [next_tokens[k] for k in still]
            input_ids = torch.tensor(next_tokens, device=device)[:, None]  # [B, 1]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(active), 1))], dim=-1)
            position_ids = position_ids[:, -1:] + 1  # [B, 1]

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> list[tuple[int, int, float]]:
        """(batch position, token, logprob) for every unfinished row; logits: [B, V] float32."""
        temperatures = torch.tensor(
            [row.request.sampling.temperature or 1.0 for row in rows], device=logits.device
        )  # [B]; greedy rows keep raw logits
        logprobs = torch.log_softmax(logits / temperatures[:, None], dim=-1)  # [B, V]
        picks = []
        for k, row in enumerate(rows):
            if row.done:
                continue
            sampling = row.request.sampling
            if sampling.temperature == 0:
                token = int(logits[k].argmax())
            else:
                token = _sample_top_p(logprobs[k], sampling.top_p, row.generator)
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


def _sample_top_p(logprobs: torch.Tensor, top_p: float, generator: torch.Generator) -> int:
    """Sample one token from the smallest set of tokens whose probability reaches top_p; logprobs: [V]."""
    if top_p < 1.0:
        logprobs = logprobs.masked_fill(logprobs < _nucleus_cutoff(logprobs, top_p), -torch.inf)
    # Exponential race (Gumbel-max): argmax(log p - log E), E ~ Exp(1), is an exact sample from p, and the
    # float noise between batch compositions (~1e-7) almost never changes the winner, unlike an inverse CDF
    # over 49k near-equal probabilities.
    noise = torch.empty_like(logprobs).exponential_(generator=generator)  # [V]
    return int((logprobs - noise.log()).argmax())


def _nucleus_cutoff(logprobs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The smallest logprob inside the nucleus (the most likely tokens whose mass reaches top_p)."""
    # The nucleus almost always lies in the top 1024 tokens; sorting the whole vocabulary is the fallback.
    top = logprobs.topk(min(NUCLEUS_CANDIDATES, logprobs.numel())).values  # [K], most likely first
    if top.exp().sum() < top_p:
        top = logprobs.sort(descending=True).values  # [V]
    probs = top.exp()
    # Keep a token while the mass before it is below top_p; the most likely token is always kept.
    n = int(((probs.cumsum(0) - probs) < top_p).sum())
    return top[n - 1]
