"""The regression watch in `appliance status`: its report, and the lines that show it
(appliance/cli/client.py prints them)."""

from __future__ import annotations

from appliance.client import ApplianceAPIError, ApplianceClient
from appliance.watch.report import Regression, WatchReport


def regressions_of(client: ApplianceClient) -> WatchReport | None:
    """The regression watch's report; None from an appliance without one (older)."""
    try:
        return client.regressions()
    except ApplianceAPIError as exc:
        if exc.status == 404:
            return None
        raise


def regression_lines(report: WatchReport) -> list[str]:
    """`regressions: 1 active`, the host's slowdown, then one line per regression:
    `  cam/blur: ×1.62, p50 4.10 → 6.64 ms, since 2026-...Z, evidence /v1/profiling/.../trace`."""
    if not report.enabled:
        return ["regressions: the watch is off (profiling.watch.enabled)"]
    count = len(report.active) + (report.host is not None)
    lines = [f"regressions: {count} active" if count else "regressions: none"]
    if (h := report.host) is not None:
        lines.append(
            f"  host: ×{h.ratio:.2f} slower as a whole, the host and not a block "
            f"(probe ×{h.probe_ratio or 0:.2f}, rows ×{h.common_ratio or 0:.2f}), "
            f"since {h.started_at}"
        )
    return lines + [f"  {_regression_line(r)}" for r in report.active]


def _regression_line(r: Regression) -> str:
    evidence = f"evidence {r.evidence.trace}" if r.evidence else "no evidence trace"
    return (
        f"{r.name}: ×{r.ratio:.2f}, p50 {r.baseline_p50_ms:.2f} → {r.current_p50_ms:.2f} ms, "
        f"since {r.started_at}, {evidence}"
    )
