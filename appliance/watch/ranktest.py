"""Two-sample rank statistics for `trace diff`: the Mann–Whitney U test and the
Hodges–Lehmann shift with its distribution-free confidence interval (Hollander, Wolfe and
Chicken, Nonparametric Statistical Methods, 3rd ed., §4.1–4.3).

Why ranks: span durations are skewed, with long tails (a preempted thread, a page fault),
so means and t-tests follow a few outliers; ranks do not. The Hodges–Lehmann shift (the
median of every after − before difference) is the effect the U test tests, and its
interval is that test inverted: the two agree on whether zero is excluded (up to ties).

The test is scipy's `mannwhitneyu` (large-sample normal approximation with the tie and
continuity corrections: `trace diff` asks for at least MIN_SAMPLES spans per side, where
it holds). scipy has no Hodges–Lehmann interval, so that is here: samples are whole
numbers (µs, as trace files hold them), so the k-th smallest of the n·m differences is
found exactly by bisection over values, counting differences with a sorted search, in
O((n + m) log n) per step without building the n·m differences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
MIN_SAMPLES = 10  # per side: below, the normal approximation is too rough to gate on


@dataclass(frozen=True, slots=True)
class Shift:
    """How much larger `after` is than `before`, in their unit."""

    estimate: float  # Hodges–Lehmann: the median of all after − before differences
    low: float  # the interval at the requested confidence
    high: float
    p_value: float  # two-sided Mann–Whitney U: no shift at all


def compare(before: Sequence[int], after: Sequence[int], confidence: float) -> Shift:
    """The shift of `after` against `before` (each with ≥ 1 value; whole numbers)."""
    a = np.sort(np.asarray(before, dtype=np.int64))
    b = np.asarray(after, dtype=np.int64)
    n, m = len(a), len(b)
    pairs = n * m
    estimate = _median_difference(a, b)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    k = max(1, math.floor(pairs / 2 - z * math.sqrt(pairs * (n + m + 1) / 12)))
    return Shift(
        estimate=estimate,
        low=float(_kth_difference(a, b, k)),
        high=float(_kth_difference(a, b, pairs + 1 - k)),
        p_value=mann_whitney_p(a, b),
    )


def mann_whitney_p(before: npt.ArrayLike, after: npt.ArrayLike) -> float:
    """Two-sided p-value of the Mann–Whitney U test (normal approximation, tie and
    continuity corrected); 1.0 when every value is equal (nothing to tell apart)."""
    # scipy.stats takes 0.8 s to import: only `trace diff` pays it, not every command.
    from scipy.stats import mannwhitneyu

    a, b = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if np.all(a == a[0]) and np.all(b == a[0]):
        return 1.0  # scipy answers NaN: zero variance
    result = mannwhitneyu(b, a, alternative="two-sided", method="asymptotic")
    return float(result.pvalue)


def _median_difference(a: Ints, b: Ints) -> float:
    pairs = len(a) * len(b)
    middle = _kth_difference(a, b, (pairs + 1) // 2)
    if pairs % 2:
        return float(middle)
    return (middle + _kth_difference(a, b, pairs // 2 + 1)) / 2


def _kth_difference(a: Ints, b: Ints, k: int) -> int:
    """The k-th smallest (from 1) of all b[j] − a[i]; `a` sorted."""
    low, high = int(b.min() - a[-1]), int(b.max() - a[0])
    while low < high:
        mid = (low + high) // 2
        if _count_at_most(a, b, mid) >= k:
            high = mid
        else:
            low = mid + 1
    return low


def _count_at_most(a: Ints, b: Ints, t: int) -> int:
    """How many b[j] − a[i] ≤ t, i.e. a[i] ≥ b[j] − t; `a` sorted."""
    return len(a) * len(b) - int(np.searchsorted(a, b - t, side="left").sum())
