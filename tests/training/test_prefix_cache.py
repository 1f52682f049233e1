"""Prefix reuse in HFBackend: continuations, shared prompts and weight changes give the same results
as running every prompt from scratch; the cache's bookkeeping on hand-made entries."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ROLES
from training.generation import HFBackend
from training.generation.prefix_cache import CachedPrefix, PrefixCache, common_prefix, weights_fingerprint
from training.types import GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)
HOT = SamplingParams(temperature=0.9, max_new_tokens=8)


def entry(adapter: str, tokens: list[int], heads: int = 2, dim: int = 4, layers: int = 2) -> CachedPrefix:
    states = tuple(torch.full((heads, len(tokens), dim), float(i)) for i in range(layers))
    return CachedPrefix(adapter, torch.tensor(tokens), states, states)


def test_common_prefix():
    t = torch.tensor
    assert common_prefix(t([1, 2, 3]), t([1, 2, 4, 5])) == 2
    assert common_prefix(t([1, 2]), t([1, 2, 3])) == 2
    assert common_prefix(t([9]), t([1])) == 0
    assert common_prefix(t([], dtype=torch.long), t([1])) == 0


def test_lookup_takes_the_longest_prefix_of_the_same_adapter_and_leaves_one_token_to_run():
    cache = PrefixCache(max_bytes=1 << 20)
    cache.store(entry("a", [1, 2, 3]))
    cache.store(entry("a", [1, 2, 7, 8, 9]))
    cache.store(entry("b", [1, 2, 3, 4, 5, 6]))
    found, n = cache.lookup("a", torch.tensor([1, 2, 3, 4, 5]))
    assert n == 3 and found.tokens.tolist() == [1, 2, 3]
    found, n = cache.lookup("a", torch.tensor([1, 2, 3]))  # the whole prompt is cached: run its last token
    assert n == 2
    assert cache.lookup("c", torch.tensor([1, 2, 3])) == (None, 0)
    assert cache.hits == 5 and cache.misses == 2 + 1 + 3


def test_store_replaces_entries_it_extends_and_evicts_the_least_recently_used():
    one = entry("a", [1]).nbytes
    cache = PrefixCache(max_bytes=6 * one)
    cache.store(entry("a", [1, 2]))
    cache.store(entry("a", [1, 2, 3]))  # extends [1, 2]: that one goes
    assert len(cache) == 1 and cache.nbytes == 3 * one
    cache.store(entry("b", [5, 6]))
    cache.lookup("a", torch.tensor([1, 2, 3, 4]))  # [1, 2, 3] is now the most recently used
    cache.store(entry("b", [7, 8]))  # 7 tokens > 6: the oldest, b:[5, 6], goes
    assert cache.lookup("b", torch.tensor([5, 6, 0]))[1] == 0
    assert cache.lookup("a", torch.tensor([1, 2, 3, 4]))[1] == 3
    assert cache.nbytes == 5 * one


def test_validate_empties_the_cache_when_a_parameter_changes_in_place():
    weight = torch.nn.Parameter(torch.zeros(3))
    cache = PrefixCache(max_bytes=1 << 20)
    cache.validate(weights_fingerprint([weight]))
    cache.store(entry("a", [1, 2]))
    cache.validate(weights_fingerprint([weight]))
    assert len(cache) == 1
    with torch.no_grad():
        weight.add_(1.0)
    cache.validate(weights_fingerprint([weight]))
    assert len(cache) == 0


def test_bad_size_is_rejected():
    with pytest.raises(ValueError, match="prefix cache size"):
        PrefixCache(max_bytes=-1)


def assert_same(a, b, what=""):
    assert a.token_ids == b.token_ids, what
    assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4), what


def continuation(tokenizer, prompt: tuple[int, ...], result) -> tuple[int, ...]:
    """What an episode sends after a tool call: the prompt, the output and a tool result."""
    return (*prompt, *result.token_ids, *tokenizer("\n<tool_result>\n42\n</tool_result>\n")["input_ids"])


def test_continuations_reuse_states_and_match_a_fresh_run(tiny_backbone, tokenizer):
    prompts = [
        tuple(tokenizer(t)["input_ids"]) for t in ("Q: 3 * 7 = ?", "Hello there, executor", "Plan: add")
    ]
    requests = [GenerationRequest(ROLES[i % 2], p, HOT, seed=i) for i, p in enumerate(prompts)]
    cached, fresh = HFBackend(tiny_backbone), HFBackend(tiny_backbone, prefix_cache_mb=0)
    first = cached.generate(requests)
    for a, b in zip(first, fresh.generate(requests), strict=True):
        assert_same(a, b)
    assert cached.prefix.hits == 0
    follow = [
        GenerationRequest(r.adapter, continuation(tokenizer, r.prompt_ids, out), HOT, seed=10 + i)
        for i, (r, out) in enumerate(zip(requests, first, strict=True))
    ]
    # Mixed with a request that has nothing cached, so rows of one batch start at different points.
    follow.append(
        GenerationRequest(ROLES[0], tuple(tokenizer("Unrelated prompt")["input_ids"]), HOT, seed=99)
    )
    for i, (a, b) in enumerate(zip(cached.generate(follow), fresh.generate(follow), strict=True)):
        assert_same(a, b, f"request {i}")
    reused = sum(len(r.prompt_ids) + len(o.token_ids) - 1 for r, o in zip(requests, first, strict=True))
    assert cached.prefix.hits == reused


def test_identical_prompts_in_one_batch_match_separate_runs(tiny_backbone, tokenizer):
    prompt = tuple(tokenizer("The same plan prompt for G episodes")["input_ids"])
    requests = [GenerationRequest(ROLES[0], prompt, HOT, seed=i) for i in range(4)]
    together = HFBackend(tiny_backbone).generate(requests)
    for i, request in enumerate(requests):
        assert_same(together[i], HFBackend(tiny_backbone, prefix_cache_mb=0).generate([request])[0])
    assert len({r.token_ids for r in together}) > 1  # different seeds, different samples


def test_prompts_that_share_a_system_prompt_run_it_once_and_match_separate_runs(tiny_backbone, tokenizer):
    system = "You are an executor. Solve the problem step by step with the calculator tool. " * 2
    prompts = [tuple(tokenizer(system + q)["input_ids"]) for q in ("Q: 3 * 7?", "Q: 12 + 30?", "Q: 8 - 5?")]
    shared = min(common_prefix(torch.tensor(prompts[0]), torch.tensor(p)) for p in prompts[1:])
    assert shared >= 16
    requests = [GenerationRequest(ROLES[1], p, HOT, seed=i) for i, p in enumerate(prompts)]
    requests.append(GenerationRequest(ROLES[0], prompts[0], HOT, seed=7))  # alone on its adapter
    backend = HFBackend(tiny_backbone)
    together = backend.generate(requests)
    for i, request in enumerate(requests):
        assert_same(
            together[i], HFBackend(tiny_backbone, prefix_cache_mb=0).generate([request])[0], f"request {i}"
        )
    # The shared beginning ran once; each of the three prompts started from it.
    assert backend.prefix.hits == 3 * shared
    assert backend.prefix.misses == shared + sum(len(p) for p in prompts) - 3 * shared + len(prompts[0])


def test_lookup_that_only_looks_counts_nothing():
    cache = PrefixCache(max_bytes=1 << 20)
    cache.store(entry("a", [1, 2, 3]))
    found, n = cache.lookup("a", torch.tensor([1, 2, 3, 4]), count=False)
    assert n == 3 and found.tokens.tolist() == [1, 2, 3]
    assert cache.lookup("a", torch.tensor([9]), count=False) == (None, 0)
    assert cache.hits == 0 and cache.misses == 0


def test_states_computed_before_a_weight_change_are_not_reused(tiny_backbone, tokenizer):
    prompt = tuple(tokenizer("Q: 12 + 30 = ?")["input_ids"])
    request = GenerationRequest(ROLES[1], prompt, GREEDY)
    backend = HFBackend(tiny_backbone)
    out = backend.generate([request])[0]
    follow = GenerationRequest(ROLES[1], continuation(tokenizer, prompt, out), GREEDY)
    params = tiny_backbone.trainable_parameters(ROLES[1])
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p in params:
                p.add_(0.05 * torch.randn_like(p))
        after = backend.generate([follow])[0]
        assert backend.prefix.hits == 0
        assert_same(after, HFBackend(tiny_backbone, prefix_cache_mb=0).generate([follow])[0])
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)


def test_a_cleared_cache_runs_every_prompt_whole_as_a_fresh_backend_does(tiny_backbone, tokenizer):
    """clear_cache (training calls it after each held-out evaluation): the next prompts reuse nothing, so
    their states, logprobs and samples are a fresh backend's bit for bit."""
    prompt = tuple(tokenizer("Q: 12 + 30 = ?")["input_ids"])
    request = GenerationRequest(ROLES[1], prompt, HOT, seed=3)
    backend = HFBackend(tiny_backbone)
    out = backend.generate([request])[0]
    assert len(backend.prefix) > 0
    backend.clear_cache()
    assert len(backend.prefix) == 0 and backend.prefix.nbytes == 0
    follow = GenerationRequest(ROLES[1], continuation(tokenizer, prompt, out), HOT, seed=4)
    got = backend.generate([follow])[0]
    assert backend.prefix.hits == 0
    fresh = HFBackend(tiny_backbone).generate([follow])[0]
    assert got.token_ids == fresh.token_ids and got.logprobs == fresh.logprobs
