"""A promotion's gates (appliance/runtime/promotion.py): the latency gate judged by
`trace diff`'s rule on every compared frame, materially and significantly over the
ceiling, so that a median ratio just over it by noise is not refused; without enough
frames, the median ratio alone."""

from __future__ import annotations

import numpy as np

from appliance.runtime.promotion import PromoteRequest, latency_refusal, merged
from appliance.watch.ranktest import MIN_SAMPLES

LIVE = 10 + np.random.default_rng(1).standard_normal(100) * 0.5  # ms, 100 frames


def pairs(factor: float) -> list[tuple[float, float]]:
    return [(float(live), float(live * factor)) for live in LIVE]


def test_a_candidate_slower_than_the_ceiling_allows_is_refused_saying_by_how_much() -> None:
    refusal = latency_refusal(1.5, 1.6, pairs(1.6))
    assert refusal is not None and refusal.startswith("max_latency_ratio: ")
    assert "1.600x the live one's, over 1.5 by trace diff's rule" in refusal
    assert "+60.1 %" in refusal and "Mann-Whitney" in refusal
    assert latency_refusal(1.5, 1.45, pairs(1.45)) is None


def test_a_ratio_over_the_ceiling_by_noise_alone_is_not_refused() -> None:
    rng = np.random.default_rng(2)
    live = rng.lognormal(np.log(10), 0.6, MIN_SAMPLES)
    candidate = rng.lognormal(np.log(15.5), 0.6, MIN_SAMPLES)
    ratio = float(np.median(candidate / live))
    assert ratio > 1.5  # the median ratio alone would refuse it
    assert latency_refusal(1.5, ratio, list(zip(live, candidate, strict=True))) is None


def test_with_too_few_frames_or_a_ceiling_under_one_the_median_ratio_decides() -> None:
    few = pairs(1.6)[: MIN_SAMPLES - 1]
    assert latency_refusal(1.5, 1.6, few) == "max_latency_ratio: ratio 1.600 is 0.100 over 1.5"
    assert latency_refusal(0.9, 0.95, pairs(0.95)) is not None  # asks for a faster one
    assert latency_refusal(0.9, 0.85, pairs(0.85)) is None


def test_every_failed_gate_is_named() -> None:
    comparison = {"frames": 100, "agreement": 0.7, "latency_ms": {"ratio_p50": 1.6}}
    request = PromoteRequest(min_agreement=0.9, max_latency_ratio=1.5)
    refusals = request.refusals(comparison, pairs(1.6))
    assert [r.split(":")[0] for r in refusals] == ["min_agreement", "max_latency_ratio"]
    assert refusals[0] == "min_agreement: agreement 0.700 is 0.200 under 0.9"
    early = {**comparison, "frames": 10}
    assert request.refusals(early, pairs(1.6)) == [
        "min_frames: 10 frames compared, the gates need 30"
    ]
    assert PromoteRequest().refusals(comparison, pairs(9.0)) == []  # no gate: none


def test_a_shadows_declared_gates_hold_unless_the_request_sets_its_own() -> None:
    declared = PromoteRequest(min_agreement=0.95, rollback_s=600)
    assert merged(None, PromoteRequest(min_agreement=0.5)).min_agreement == 0.5
    assert merged(declared, PromoteRequest()) == declared
    request = merged(declared, PromoteRequest(min_agreement=0.5, auto_rollback=False))
    assert (request.min_agreement, request.rollback_s, request.auto_rollback) == (0.5, 600, False)
