"""The statistics of evaluations and probes, as small pure functions checked against hand-worked numbers.

pass_at_k(n=10, c=3, k=1)                  # 0.3: the unbiased estimator of Chen et al. (2021)
mean_interval([1, 0, 1, 1])                # mean accuracy and its 95% interval over problems
paired_difference(arm, base, seed=0)       # an arm against the unmodified hierarchy, same problems
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

Z_95 = 1.959964  # the normal quantile of a two-sided 95% interval


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k samples, drawn without replacement from n of which c are
    correct, is correct: 1 - C(n - c, k) / C(n, k) (unbiased for pass@k when n >= k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def normal_answer(answer: str | None) -> str | None:
    """An answer as majority voting compares it: without spaces, thousands commas and a final period."""
    if answer is None:
        return None
    return "".join(answer.split()).replace(",", "").rstrip(".") or None


def majority(answers: Sequence[Hashable | None]) -> int | None:
    """The index of the first sample whose answer is the most common one (None answers do not vote)."""
    counts: dict[Hashable, int] = {}
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1
    if not counts:
        return None
    top = max(counts.values())
    return next(i for i, a in enumerate(answers) if a is not None and counts[a] == top)


def mean_interval(values: Sequence[float]) -> tuple[float, float, float] | None:
    """(mean, low, high): the mean of `values` (one per problem: its accuracy, or its mean over samples)
    and its 95% interval; None for no values. All 0/1: the Wilson score interval of the proportion
    (defined for any n, and never [1, 1] when every problem is right). Otherwise the normal approximation
    from the sample std, clipped to [0, 1]; None for fewer than two values."""
    n = len(values)
    if n == 0:
        return None
    mean = sum(values) / n
    if all(v in (0, 1) for v in values):
        return (mean, *wilson(mean, n))
    if n < 2:
        return None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = Z_95 * sd / math.sqrt(n)
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def wilson(p: float, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion p observed in n trials."""
    z2 = Z_95 * Z_95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class PairedDifference:
    """An arm's accuracy minus the base's on the same problems, with its 95% interval and exact test."""

    mean: float  # mean of arm - base over problems
    low: float  # 2.5th percentile of the paired bootstrap
    high: float  # 97.5th percentile
    better: int  # problems the arm got right and the base wrong
    worse: int  # problems the base got right and the arm wrong
    p_value: float  # exact two-sided sign (McNemar) test on the discordant problems


def paired_difference(
    arm: Sequence[float], base: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> PairedDifference:
    """`arm` and `base` hold one accuracy per problem (0/1, or a mean over samples), in the same order.
    The interval resamples problems with replacement (a paired bootstrap, seeded)."""
    if len(arm) != len(base) or not arm:
        raise ValueError(f"a paired difference needs equal, non-empty lists, got {len(arm)} and {len(base)}")
    diffs = [a - b for a, b in zip(arm, base, strict=True)]
    n = len(diffs)
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    low, high = (means[round(q * (resamples - 1))] for q in (0.025, 0.975))  # the same rule at both ends
    better = sum(1 for d in diffs if d > 0)
    worse = sum(1 for d in diffs if d < 0)
    return PairedDifference(sum(diffs) / n, low, high, better, worse, sign_test(better, worse))


def sign_test(better: int, worse: int) -> float:
    """Two-sided exact binomial p-value of `better` successes in `better + worse` fair coin flips
    (McNemar's exact test for paired 0/1 outcomes); 1 when no problem differs."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(better, worse) + 1)) / 2**n
    return min(1.0, 2 * tail)


# Two-sided 95% points of Student's t with k - 1 degrees of freedom, k = 2..10 seeds (t_975 beyond).
T_975 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}


def t_975(df: int) -> float:
    """The two-sided 95% point of Student's t with `df` degrees of freedom: the table up to 9, then the
    Cornish-Fisher expansion around the normal quantile (2.2254 at df=10 against 2.228; 2.0422 at 30)."""
    if df + 1 in T_975:
        return T_975[df + 1]
    z = Z_95
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class SeedInterval:
    """The mean over seeds of one per-seed difference (each seed's two runs share its data and problems)
    and its 95% interval (Student's t on k - 1 degrees of freedom); no interval for a single seed."""

    mean: float
    low: float | None
    high: float | None
    seeds: int


def seed_interval(diffs: Sequence[float]) -> SeedInterval:
    """`diffs` holds one paired difference per seed (e.g. GRPO minus SFT accuracy of the same run)."""
    k = len(diffs)
    if k == 0:
        raise ValueError("an interval over seeds needs at least one seed")
    mean = sum(diffs) / k
    if k == 1:
        return SeedInterval(mean, None, None, 1)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (k - 1))
    half = t_975(k - 1) * sd / math.sqrt(k)
    return SeedInterval(mean, mean - half, mean + half, k)
