"""Exemplars on the latency histograms (appliance/observe/exemplars.py): a bucket's is a
recent frame that landed in it, refreshed at most once per REFRESH_S while frames keep
landing, every frame for a bucket that is rarely hit; its labels fit OpenMetrics' 128
characters; /metrics says them in OpenMetrics only."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from appliance.observe.exemplars import MAX_CHARS, REFRESH_S, FrameTags, Sampled, upper_bounds
from appliance.observe.metrics import Metrics, StreamMetrics
from appliance.observe.openmetrics import families, render
from pipelines.types import FrameResult

BOUNDS = (0.01, 0.1, 1.0)


def histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("h_seconds", "h", ["stream"], buckets=BOUNDS, registry=registry)


def exemplars(registry: CollectorRegistry) -> dict[str, dict[str, str]]:
    """Bucket `le` -> its exemplar's labels, as a scraper reads them."""
    out = {}
    for family in families(render(registry).decode()):
        for s in family.samples:
            if s.name.endswith("_bucket") and s.exemplar is not None:
                out[s.labels["le"]] = dict(s.exemplar.labels)
    return out


def test_a_bucket_takes_a_new_exemplar_once_its_own_is_older_than_the_refresh() -> None:
    registry, h = histogram()
    child = Sampled(h.labels("cam"), upper_bounds(h))
    tags = FrameTags()
    child.observe(0.05, 100.0, tags, "cam", 1)  # the 0.1 bucket's first
    child.observe(0.06, 100.0 + REFRESH_S / 2, tags, "cam", 2)  # too soon: kept 1
    child.observe(0.5, 100.0 + REFRESH_S / 2, tags, "cam", 3)  # another bucket: its own
    assert exemplars(registry)["0.1"]["seq"] == "1"
    assert exemplars(registry)["1.0"]["seq"] == "3"
    child.observe(0.07, 100.0 + REFRESH_S, tags, "cam", 4)  # due again
    child.observe(5.0, 100.0 + REFRESH_S, tags, "cam", 5)  # past the last bound: +Inf
    found = exemplars(registry)
    assert found["0.1"] == {"trace_id": "cam/frames/4", "stream": "cam", "seq": "4"}
    assert found["+Inf"]["seq"] == "5"
    child.observe(0.005, 200.0, tags, "cam", -1)  # no frame known: counted, no exemplar
    assert "0.01" not in exemplars(registry)
    assert h.labels("cam")._sum.get() == 0.05 + 0.06 + 0.5 + 0.07 + 5.0 + 0.005  # all counted


def test_the_labels_fit_in_128_characters_the_most_needed_first() -> None:
    tags = FrameTags(lambda: "trace-20261207T152050.123456Z.json", lambda: "0123456789ab")
    short = tags.labels("cam", 42)
    assert list(short) == ["trace_id", "stream", "seq", "trace", "window"]
    assert short["trace_id"] == "cam/frames/42"
    long_id = "c" * 64  # the longest stream id the config takes
    labels = tags.labels(long_id, 1234567)
    assert sum(len(k) + len(v) for k, v in labels.items()) <= MAX_CHARS
    assert labels["trace_id"] == f"{long_id}/frames/1234567"  # the link: always there
    _, h = histogram()  # prometheus_client accepts them (it raises past 128)
    h.labels("x").observe(0.5, labels)


def result(seq: int, spans: list[tuple[float, float] | None], done: float) -> FrameResult:
    return FrameResult("cam", seq, None, 0.0, done - 0.2, done - 0.1, done, None, {}, spans)


def test_metrics_off_observe_without_exemplars_and_on_with_them() -> None:
    for on in (False, True):
        metrics = Metrics(exemplars=on)
        stream = StreamMetrics(metrics, "cam", [("people", "detect"), ("count", "zone_counter")])
        stream.observe(result(7, [(0.0, 0.02), None], 10.0))
        text = render(metrics.registry).decode()
        assert ('trace_id="cam/frames/7"' in text) is on
        by_name = {f.name: f for f in families(text)}
        counts = [
            s
            for s in by_name["appliance_block_latency_seconds"].samples
            if s.name.endswith("_count")
        ]
        assert [(s.labels["block"], s.value) for s in counts] == [("people", 1.0), ("count", 0.0)]
