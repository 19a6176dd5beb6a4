"""The shadows' figures as Prometheus series, read from each running shadow at scrape time
(a collector: a stopped shadow's series go with it, with nothing to remove)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class ShadowCollector(Collector):
    """`reports()` gives each running shadow's report (appliance/runtime/shadow.py)."""

    def __init__(self, reports: Callable[[], list[dict[str, Any]]]) -> None:
        self._reports = reports

    def describe(self) -> list[Metric]:
        return list(self._families())  # empty families: the names and help, for the registry

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        for report in self._reports():
            stream, comparison = [report["stream"]], report["comparison"]
            families[0].add_metric(stream, comparison["agreement"])
            families[1].add_metric(stream, comparison["frames"])
            families[2].add_metric(stream, comparison["missed"])
            families[3].add_metric(stream, comparison["extra"])
            families[4].add_metric(stream, report["skipped"])
            ratio = comparison["latency_ms"]["ratio_p50"]
            if ratio is not None:
                families[5].add_metric(stream, ratio)
        yield from families

    @staticmethod
    def _families() -> list[Any]:
        labels = ["stream"]
        return [
            GaugeMetricFamily(
                "appliance_shadow_agreement",
                "F1 of the shadow's detections against the live workflow's, same frames.",
                labels=labels,
            ),
            CounterMetricFamily(
                "appliance_shadow_compared_frames",
                "Frames both the live and the shadow workflow ran, compared.",
                labels=labels,
            ),
            CounterMetricFamily(
                "appliance_shadow_missed_detections",
                "Live detections the shadow workflow did not find.",
                labels=labels,
            ),
            CounterMetricFamily(
                "appliance_shadow_extra_detections",
                "Shadow detections the live workflow did not have.",
                labels=labels,
            ),
            CounterMetricFamily(
                "appliance_shadow_skipped_frames",
                "Sampled frames replaced before the shadow could take them.",
                labels=labels,
            ),
            GaugeMetricFamily(
                "appliance_shadow_latency_ratio",
                "Median per-frame workflow run time, shadow over live.",
                labels=labels,
            ),
        ]
