"""The conformance suite every generation backend passes (like PettingZoo's `api_test`).

    from training.generation.conformance import check_backend
    check_backend(make_backend("hf", backbone), backbone.tokenizer)   # AssertionError names what failed

Each check is a plain function `check_x(backend, tokenizer, adapters, atol)` listed in CHECKS, so a test
can run them one by one. The checks need no particular model: they compare the backend with itself
(batch against single requests, a run against a rerun), so they hold for the real backbone too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from training.types import (
    GenerationBackend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    first_repetition,
)

PROMPTS = (
    "The capital of France is",
    "Question: what is 2+2?\nAnswer:",
    "Once upon a time, in a land far away, there lived a",
    "def add(a, b):",
)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)
FINISH_REASONS = ("stop", "eos", "length", "repetition")
# top_p = 1: what every backend serves (vllm refuses nucleus sampling; hf's is tested in its own tests).
SAMPLED = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=8)


def _ids(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def _same(a: GenerationResult, b: GenerationResult, atol: float, what: str) -> None:
    assert a.token_ids == b.token_ids, f"{what}: token ids differ: {a.token_ids} vs {b.token_ids}"
    worst = max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0)
    assert worst <= atol, f"{what}: logprobs differ by {worst:.2e} (> {atol:.0e})"


def check_one_result_per_request_in_order(backend, tokenizer, adapters, atol) -> None:
    """n requests give n results, result i answers request i (told apart by max_new_tokens = i + 1)."""
    roles = [None, *adapters]
    requests = [
        GenerationRequest(
            roles[i % len(roles)],
            _ids(tokenizer, PROMPTS[i % len(PROMPTS)]),
            SamplingParams(temperature=0.0, max_new_tokens=i + 1),
        )
        for i in range(6)
    ]
    results = backend.generate(requests)
    assert len(results) == len(requests), f"{len(requests)} requests gave {len(results)} results"
    for i, (request, result) in enumerate(zip(requests, results, strict=True)):
        assert isinstance(result, GenerationResult), f"result {i} is a {type(result).__name__}"
        n = len(result.token_ids)
        limit = request.sampling.max_new_tokens
        assert n == limit or (n < limit and result.finish_reason == "eos"), (
            f"result {i} has {n} tokens for max_new_tokens={limit} ({result.finish_reason}): out of order?"
        )
    assert backend.generate([]) == [], "an empty batch must give an empty list"


def check_result_fields(backend, tokenizer, adapters, atol) -> None:
    """Finish reasons are valid; token ids and logprobs line up; logprobs are finite and <= 0."""
    requests = [
        GenerationRequest(adapter, _ids(tokenizer, prompt), sampling, seed=i)
        for i, (adapter, prompt, sampling) in enumerate(
            (a, p, s) for a in [None, *adapters] for p in PROMPTS[:2] for s in (GREEDY, SAMPLED)
        )
    ]
    for i, (request, result) in enumerate(zip(requests, backend.generate(requests), strict=True)):
        assert result.finish_reason in FINISH_REASONS, f"result {i}: finish {result.finish_reason!r}"
        assert len(result.token_ids) == len(result.logprobs), (
            f"result {i}: {len(result.token_ids)} ids, {len(result.logprobs)} logprobs"
        )
        assert 0 < len(result.token_ids) <= request.sampling.max_new_tokens, (
            f"result {i}: {len(result.token_ids)} tokens"
        )
        assert all(math.isfinite(x) and x <= 1e-6 for x in result.logprobs), (
            f"result {i}: logprobs {result.logprobs}"
        )
        assert isinstance(result.text, str), f"result {i}: text is a {type(result.text).__name__}"
        if result.finish_reason == "length":
            assert len(result.token_ids) == request.sampling.max_new_tokens, (
                f"result {i}: 'length' before the limit"
            )
        assert (result.stop is not None) == (result.finish_reason == "stop"), (
            f"result {i}: stop={result.stop!r}"
        )


def check_max_new_tokens(backend, tokenizer, adapters, atol) -> None:
    """A generation never outgrows max_new_tokens, and max_new_tokens=1 gives exactly one token."""
    prompt = _ids(tokenizer, PROMPTS[2])
    for limit in (1, 3):
        for sampling in (GREEDY, SAMPLED):
            request = GenerationRequest(None, prompt, replace(sampling, max_new_tokens=limit), seed=0)
            (result,) = backend.generate([request])
            assert len(result.token_ids) == limit or result.finish_reason == "eos", (
                f"max_new_tokens={limit} gave {len(result.token_ids)} tokens ({result.finish_reason})"
            )


def _stop_candidate(backend, tokenizer) -> tuple[GenerationRequest, GenerationResult, str]:
    """A greedy run and a stop string taken from the middle of its text, so the stop surely appears."""
    for prompt in PROMPTS:
        request = GenerationRequest(
            None, _ids(tokenizer, prompt), SamplingParams(temperature=0.0, max_new_tokens=16)
        )
        (full,) = backend.generate([request])
        for token in full.token_ids[2:]:
            piece = tokenizer.decode([token], skip_special_tokens=True).strip()
            if piece and "\ufffd" not in piece:
                return request, full, piece
    raise AssertionError("no greedy generation produced a usable stop string candidate")


def check_stop_strings(backend, tokenizer, adapters, atol) -> None:
    """Generation ends at the first stop string; the text ends with it; tokens are the unstopped prefix."""
    request, full, stop = _stop_candidate(backend, tokenizer)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=16, stop=("never-appears-\x01", stop))
    (result,) = backend.generate([GenerationRequest(None, request.prompt_ids, sampling)])
    assert result.finish_reason == "stop", f"stop {stop!r} did not end generation: {result}"
    assert result.stop == stop, f"result.stop={result.stop!r}, expected {stop!r}"
    assert result.text.endswith(stop), f"text {result.text!r} does not end with stop {stop!r}"
    n = len(result.token_ids)
    assert result.token_ids == full.token_ids[:n], "stopped tokens are not a prefix of the unstopped run"
    before = tokenizer.decode(list(result.token_ids[:-1]), skip_special_tokens=True)
    assert stop not in before, f"stop {stop!r} appeared before the last token: generation ran past it"


def check_repetition_stop(backend, tokenizer, adapters, atol) -> None:
    """With repetition_stop=N a greedy run ends ("repetition") at the first token where its last N tokens
    are one pattern repeated 4+ times, keeping the tokens before; a run with no such loop is unchanged."""
    for prompt in PROMPTS:
        ids = _ids(tokenizer, prompt)
        (full,) = backend.generate(
            [GenerationRequest(None, ids, SamplingParams(temperature=0.0, max_new_tokens=48))]
        )
        span = 8
        cut = first_repetition(full.token_ids, span)
        stopped_sampling = SamplingParams(temperature=0.0, max_new_tokens=48, repetition_stop=span)
        (stopped,) = backend.generate([GenerationRequest(None, ids, stopped_sampling)])
        if cut is None or cut >= len(full.token_ids):
            assert stopped.token_ids == full.token_ids and stopped.finish_reason == full.finish_reason, (
                f"no loop in {full.token_ids}, yet the repetition stop changed the run: {stopped}"
            )
        else:
            assert stopped.finish_reason == "repetition", f"a loop ends at token {cut}: {stopped}"
            assert stopped.token_ids == full.token_ids[:cut], "the stopped run is not the loop's prefix"


def check_greedy_deterministic(backend, tokenizer, adapters, atol) -> None:
    """The same greedy batch twice gives the same tokens and logprobs."""
    requests = [
        GenerationRequest(a, _ids(tokenizer, p), GREEDY) for a in [None, *adapters] for p in PROMPTS[:2]
    ]
    first, second = backend.generate(requests), backend.generate(requests)
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        _same(a, b, atol, f"greedy request {i}, run twice")


def check_mixed_adapter_batch(backend, tokenizer, adapters, atol) -> None:
    """One batch mixing adapters (and the bare backbone) equals running each request on its own."""
    roles = [None, *adapters]
    requests = [
        GenerationRequest(roles[i % len(roles)], _ids(tokenizer, PROMPTS[i % len(PROMPTS)]), GREEDY)
        for i in range(2 * len(roles) + 1)
    ]
    for i, (request, batched) in enumerate(zip(requests, backend.generate(requests), strict=True)):
        (alone,) = backend.generate([request])
        _same(batched, alone, atol, f"request {i} (adapter {request.adapter}) batched vs alone")


def check_seeded_sampling(backend, tokenizer, adapters, atol) -> None:
    """A seeded sampled request gives the same tokens alone and inside any batch."""
    adapter = adapters[0] if adapters else None
    seeded = [
        GenerationRequest(adapter, _ids(tokenizer, PROMPTS[0]), SAMPLED, seed=1234),
        GenerationRequest(
            None, _ids(tokenizer, PROMPTS[3]), SamplingParams(temperature=0.8, max_new_tokens=8), seed=99
        ),
    ]
    others = [
        GenerationRequest(a, _ids(tokenizer, p), SAMPLED) for a in [None, *adapters] for p in PROMPTS[1:3]
    ]
    alone = [backend.generate([r])[0] for r in seeded]
    batch = [others[0], seeded[1], *others[1:], seeded[0]]
    results = backend.generate(batch)
    _same(results[1], alone[1], atol, "seeded request inside a batch vs alone")
    _same(results[-1], alone[0], atol, "seeded request inside a batch vs alone")


Check = Callable[[GenerationBackend, object, Sequence[str], float], None]
CHECKS: tuple[Check, ...] = (
    check_one_result_per_request_in_order,
    check_result_fields,
    check_max_new_tokens,
    check_stop_strings,
    check_repetition_stop,
    check_greedy_deterministic,
    check_mixed_adapter_batch,
    check_seeded_sampling,
)


def check_backend(
    backend: GenerationBackend, tokenizer, adapters: Sequence[str] | None = None, atol: float = 1e-4
) -> None:
    """Run every check; `adapters` defaults to `backend.adapters`. Raises AssertionError on the first failure."""
    adapters = tuple(adapters if adapters is not None else getattr(backend, "adapters", ()))
    for check in CHECKS:
        check(backend, tokenizer, adapters, atol)
