"""One answer from N workers' answers: /metrics, /ready, lists and profiling traces.
The same merges serve `appliance gateway --replicas` (its members are replicas, named by
a `replica` label where a worker's answers have `worker`); it merges no metrics.

Metrics: every worker's series with a `worker` label added, one family per name. Each
stream and sink runs in exactly one worker, so no series is counted twice and every
stream label is kept; a model loaded by two workers is two series (two sessions), which
`sum by (model)` adds up. Traces: each worker's events keep their own pid (one process
track per worker in Perfetto) on the same clock (wall-clock microseconds, tracer.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from appliance.observe.openmetrics import families as openmetrics_families
from appliance.observe.openmetrics import render as openmetrics_latest

WORKER_LABEL = "worker"


class _Families:
    """A collector over already-built families (prometheus_client renders them)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge_metrics(
    texts: Mapping[int, str], own: Iterable[Metric] = (), openmetrics: bool = False
) -> bytes:
    """Worker index -> its /metrics text in OpenMetrics (exemplars kept), as one
    exposition with `worker` labels, plus the supervisor's `own` families: OpenMetrics or
    the classic text format. ValueError when a text does not parse."""
    merged: dict[str, Metric] = {}
    for index, text in sorted(texts.items()):
        for family in openmetrics_families(text):
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            label = str(index)
            for s in family.samples:
                labels = {**s.labels, WORKER_LABEL: label}
                into.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
    for family in own:  # the supervisor's samples of a family the workers have join it
        into = merged.setdefault(family.name, family)
        if into is not family:
            into.samples.extend(family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(merged.values()))
    return openmetrics_latest(registry) if openmetrics else generate_latest(registry)


def merge_lists(
    key: str, answers: Mapping[int, Mapping[str, Any]], label: str = WORKER_LABEL
) -> dict[str, Any]:
    """`{"streams": [...]}` from each member as one list, each item with its index under
    `label` (`worker`, or `replica`)."""
    items = [
        {**item, label: index}
        for index, answer in sorted(answers.items())
        for item in answer.get(key, [])
    ]
    return {key: items}


def merge_readiness(
    answers: Mapping[int, Mapping[str, Any]],
    workers: Sequence[Mapping[str, Any]],
    *,
    insecure: bool,
    shard: str | None,
    noun: str = "worker",
    tls: bool = False,
) -> dict[str, Any]:
    """GET /ready's shape over all members: ready when every member is up and ready.
    `workers` is the gateway's view of each (a worker's state, pid and restarts; a
    replica's address and state), shown under `workers` or `replicas` (`noun`).
    `insecure`, `tls`: the gateway's own listener's (its members' are private)."""
    ready = len(answers) == len(workers) and all(a.get("ready") for a in answers.values())
    sinks: dict[str, set[str]] = {}
    for answer in answers.values():
        for name, state in answer.get("sinks", {}).items():
            sinks.setdefault(name, set()).add(state)
    first = answers[min(answers)] if answers else {}
    # ISO 8601 UTC sorts as time: the earliest start, the longest uptime.
    starts = sorted(a["started_at"] for a in answers.values() if a.get("started_at"))
    uptimes = [a["uptime_s"] for a in answers.values() if a.get("uptime_s") is not None]
    return {
        "ready": ready,
        "models": sorted({m for a in answers.values() for m in a.get("models", [])}),
        "waiting": [s for a in answers.values() for s in a.get("waiting", [])],
        "stalled": {k: v for a in answers.values() for k, v in a.get("stalled", {}).items()},
        "insecure": insecure,
        "tls": tls,
        # One sink per worker: one state when they agree, else each state seen.
        "sinks": {name: "/".join(sorted(states)) for name, states in sorted(sinks.items())},
        "profiling": first.get("profiling", {}),
        "shard": shard,
        "started_at": starts[0] if starts else None,
        "uptime_s": max(uptimes, default=None),
        # No one state folder behind a gateway: each member's `state` (its own document,
        # its problem at start, its entries; appliance/runtime/state.py), by index.
        "state": None,
        "states": {str(i): answers[i].get("state") for i in sorted(answers)},
        f"{noun}s": list(workers),
    }


def merge_reloads(answers: Sequence[Mapping[str, list[str]]]) -> dict[str, list[str]]:
    """The workers' reload answers as the appliance's: a stream that one worker removed
    and another added (the new set moved it) was restarted, not added or removed."""
    seen = {k: {s for a in answers for s in a[k]} for k in ("added", "removed", "restarted")}
    moved = seen["added"] & seen["removed"]
    unchanged = {s for a in answers for s in a["unchanged"]} - moved
    return {
        "added": sorted(seen["added"] - moved),
        "removed": sorted(seen["removed"] - moved),
        "restarted": sorted(seen["restarted"] | moved),
        "unchanged": sorted(unchanged),
    }


def merge_traces(traces: Mapping[int, Mapping[str, Any]], noun: str = "worker") -> dict[str, Any]:
    """Member index -> its window's Chrome trace, as one trace: each member's process
    track named `appliance worker I` (`appliance replica I`), all on one timeline."""
    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    for index, trace in sorted(traces.items()):
        for event in trace.get("traceEvents", []):
            if event.get("ph") == "M" and event.get("name") == "process_name":
                pids[str(index)] = int(event.get("pid", 0))
                events.append({**event, "args": {"name": f"appliance {noun} {index}"}})
            else:
                events.append(event)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"source": "appliance profiling window", f"{noun}_pids": pids},
    }


def merge_regressions(
    answers: Mapping[int, Mapping[str, Any]], label: str = WORKER_LABEL
) -> dict[str, Any]:
    """GET /v1/regressions over all members: each watches its own streams and models (and
    its own view of the host); every regression carries its `worker` (`label`)."""
    docs = [({**a}, i) for i, a in sorted(answers.items())]

    def tagged(key: str) -> list[dict[str, Any]]:
        return [{**r, label: i} for a, i in docs for r in a.get(key) or []]

    hosts = [{**a["host"], label: i} for a, i in docs if a.get("host")]
    factors = [a["host_ratio"] for a, _ in docs if a.get("host_ratio") is not None]
    history = sorted(tagged("history"), key=lambda r: r.get("ended_at") or "", reverse=True)
    contention = sorted(tagged("contention"), key=lambda e: e.get("at") or "", reverse=True)
    return {
        "enabled": any(a.get("enabled") for a, _ in docs),
        "interval_s": max((a.get("interval_s", 0) for a, _ in docs), default=0),
        "comparisons": sum(a.get("comparisons", 0) for a, _ in docs),
        "host": hosts[0] if hosts else None,  # the first worker's that sees one
        "host_ratio": max(factors, default=None),
        "active": tagged("active"),
        "history": history[:200],
        "baseline_error": next(
            (a["baseline_error"] for a, _ in docs if a.get("baseline_error")), None
        ),
        "contention": contention[:50],
    }


def merge_audit(
    answers: Mapping[int | str, Mapping[str, Any]], limit: int, label: str = WORKER_LABEL
) -> dict[str, Any]:
    """GET /v1/audit over all members: each records the changes it made (a forwarded
    request's by who asked, `alice via admin`); newest first, each with its `worker`
    (`label`), at most `limit`."""
    entries = [{**e, label: i} for i, a in answers.items() for e in a.get("entries") or []]
    entries.sort(key=lambda e: e.get("at") or "", reverse=True)
    return {"entries": entries[:limit]}
