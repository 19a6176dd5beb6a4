"""Backoff: capped exponential growth, bounded jitter, reset."""

from __future__ import annotations

import random

import pytest

from appliance.sources import Backoff
from appliance.sources.config import BackoffConfig


def delays(backoff: Backoff, count: int) -> list[float]:
    return [backoff.next_delay() for _ in range(count)]


def test_grows_by_the_multiplier_up_to_the_cap() -> None:
    cfg = BackoffConfig(initial_s=0.5, max_s=10.0, multiplier=2.0, jitter=0.0)
    assert delays(Backoff(cfg), 8) == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_jitter_stays_within_its_fraction_of_each_delay() -> None:
    cfg = BackoffConfig(initial_s=1.0, max_s=8.0, multiplier=2.0, jitter=0.2)
    got = delays(Backoff(cfg, random.Random(42)), 200)
    bases = [min(2.0**n, 8.0) for n in range(200)]
    for delay, base in zip(got, bases, strict=True):
        assert base * 0.8 <= delay <= base * 1.2
    capped = got[3:]
    assert len(set(capped)) == len(capped)  # jittered: no two reconnect at the same time
    assert min(capped) < 8.0 < max(capped)


def test_same_seed_same_delays() -> None:
    cfg = BackoffConfig(jitter=0.5)
    assert delays(Backoff(cfg, random.Random(7)), 10) == delays(Backoff(cfg, random.Random(7)), 10)


def test_reset_starts_again_from_the_initial_delay() -> None:
    backoff = Backoff(BackoffConfig(initial_s=0.25, multiplier=3.0, jitter=0.0))
    assert delays(backoff, 3) == [0.25, 0.75, 2.25]
    backoff.reset()
    assert delays(backoff, 2) == [0.25, 0.75]


def test_many_failures_stay_at_the_cap() -> None:
    backoff = Backoff(BackoffConfig(initial_s=0.1, max_s=30.0, multiplier=10.0, jitter=0.0))
    assert delays(backoff, 5000)[-1] == pytest.approx(30.0)
