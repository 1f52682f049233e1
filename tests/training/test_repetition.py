"""The repetition stop's detector, on token lists worked out by hand."""

from __future__ import annotations

from training.types import first_repetition, repeats_at_end


def test_one_token_repeated_is_a_loop() -> None:
    assert repeats_at_end([5] * 8, 8)
    assert not repeats_at_end([5] * 7, 8)  # shorter than the span


def test_a_pattern_must_repeat_four_times_within_the_span() -> None:
    # period 2 over 8 tokens: (1, 2) four times
    assert repeats_at_end([9, 1, 2, 1, 2, 1, 2, 1, 2], 8)
    # period 3 over 8 tokens would repeat only 2.7 times: 8 // 4 = 2 is the longest period looked for
    assert not repeats_at_end([1, 2, 3, 1, 2, 3, 1, 2], 8)
    # the same period-3 loop is found over a span of 12 (four times)
    assert repeats_at_end([1, 2, 3] * 4, 12)


def test_one_different_token_breaks_the_loop() -> None:
    assert not repeats_at_end([1, 2, 1, 2, 1, 7, 1, 2], 8)


def test_first_repetition_is_the_shortest_prefix() -> None:
    tokens = [4, 8, 15, 16, 23, 42] + [3] * 10
    # the last 8 tokens are all 3 once 6 + 8 = 14 tokens are there
    assert first_repetition(tokens, 8) == 14
    assert first_repetition([1, 2, 3, 4, 5, 6, 7, 8, 9], 8) is None
    assert first_repetition([3] * 20, 0) is None  # 0: off
