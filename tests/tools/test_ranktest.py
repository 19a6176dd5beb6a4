"""The rank statistics of `trace diff`: the U test's p-values as published, the
Hodges–Lehmann shift against brute force."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from appliance.watch.ranktest import compare, mann_whitney_p


def _ints(text: str) -> list[int]:
    return [int(word) for word in text.split()]


# Two lognormal samples (seed 7, the second 1.1 × larger), in µs.
LOGNORMAL_A = _ints(
    "2982 3260 2746 2282 2601 2214 3035 4456 2572 2475 3453 3318 3077 2255 2955 3672 "
    "1992 2599 1685 2025 1716 2778 2038 3234 3124 2818 1401 2536 2938 3084 1884 2583 "
    "2223 2339 4098 2340 2952 3887 2502 2883"
)
LOGNORMAL_B = _ints(
    "3390 3342 2271 3355 4929 2061 4243 3399 2705 5976 4122 2288 3353 3898 3099 4025 "
    "3214 4006 5049 2677 3485 2854 3407 2297 2756 3092 4294 4623 2204 2584 3981 1804 "
    "2854 3185 4781 4032 2972 2936 3042 5179 2884 2994 3645 3162 3091 2347 3268 2870 "
    "4652 3989"
)


@pytest.mark.parametrize(
    ("before", "after", "scipy_p"),
    [
        # scipy.stats.mannwhitneyu(after, before, method="asymptotic"), scipy 1.17.1
        ([19, 22, 16, 29, 24], [20, 11, 17, 12], 0.11134688653314041),
        (
            [1, 2, 2, 3, 3, 3, 4, 5, 5, 9],
            [2, 3, 3, 4, 4, 5, 6, 6, 7, 8, 8, 10],
            0.07766856919636676,
        ),
        (LOGNORMAL_A, LOGNORMAL_B, 0.00012888156546020136),
    ],
)
def test_p_value_matches_scipy(before: list[int], after: list[int], scipy_p: float) -> None:
    assert mann_whitney_p(before, after) == pytest.approx(scipy_p, rel=1e-9)
    assert mann_whitney_p(after, before) == pytest.approx(scipy_p, rel=1e-9)  # two-sided


def test_equal_values_are_no_evidence() -> None:
    assert mann_whitney_p([5] * 20, [5] * 30) == 1.0


def test_shift_and_interval_are_the_order_statistics_of_all_differences() -> None:
    shift = compare(LOGNORMAL_A, LOGNORMAL_B, 0.95)
    diffs = np.sort(np.subtract.outer(LOGNORMAL_B, LOGNORMAL_A).ravel())
    pairs, n, m = diffs.size, len(LOGNORMAL_A), len(LOGNORMAL_B)
    k = math.floor(pairs / 2 - NormalDist().inv_cdf(0.975) * math.sqrt(pairs * (n + m + 1) / 12))
    assert shift.estimate == np.median(diffs) == 615
    assert (shift.low, shift.high) == (diffs[k - 1], diffs[pairs - k]) == (306, 951)
    assert shift.p_value == mann_whitney_p(LOGNORMAL_A, LOGNORMAL_B)


def test_a_constant_shift_is_found_exactly() -> None:
    before = list(range(1000, 3000, 37))
    shift = compare(before, [b + 600 for b in before], 0.99)
    assert shift.estimate == 600
    assert shift.low < 600 < shift.high
    assert shift.p_value < 0.01
    wider = compare(before, [b + 600 for b in before], 0.999)
    assert wider.low < shift.low and wider.high > shift.high  # more confidence, wider


def test_no_shift_keeps_zero_inside() -> None:
    rng = np.random.default_rng(3)
    a, b = (rng.lognormal(8, 0.3, 200).round().astype(int).tolist() for _ in range(2))
    shift = compare(a, b, 0.99)
    assert shift.low < 0 < shift.high
    assert shift.p_value > 0.01
