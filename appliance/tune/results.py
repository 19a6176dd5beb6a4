"""A tune's result and progress as JSON: what GET /v1/tune answers, `--json` writes, and
what the table, the plot and the YAML patch (report.py) are made from, so a local and a
remote tune print the same report.
"""

from __future__ import annotations

import statistics
from typing import Any

from appliance.tune.search import Progress, TuneResult


def progress_json(p: Progress) -> dict[str, Any]:
    return {
        "current": p.current,
        "windows": p.windows,
        "windows_left": p.windows_left,
        "elapsed_s": round(p.elapsed_s, 1),
        "remaining_s": round(p.remaining_s, 1),
        "best": p.best,
    }


def result_json(r: TuneResult) -> dict[str, Any]:
    """Every candidate with its windows' figures, score ratios and interval; the best
    so far's own windows (`reference`); the winner, what changed and why."""
    return {
        "outcome": r.outcome,
        "problem": r.problem,
        "objective": {
            "kind": r.objective.kind,
            "slo_ms": round(r.objective.slo_ms, 1),
            "description": r.objective.describe(),
        },
        "elapsed_s": round(r.elapsed_s, 1),
        "windows": r.windows,
        "knobs": [
            {
                "key": k.key,
                "values": list(k.values),
                "start": k.start,
                "restarts_streams": k.restarts,
            }
            for k in r.knobs
        ],
        "start": r.start,
        "best": r.best,
        "changed": r.changed,
        "reasons": r.reasons,
        "candidates": [
            {
                "knob": c.knob,
                "value": c.value,
                "settings": c.settings,
                "verdict": c.verdict,
                "ratio": round(c.median, 4) if c.ratios else None,
                "interval": [round(x, 4) for x in c.interval] if c.ratios else None,
                "ratios": [round(x, 4) for x in c.ratios],
                "windows": [w.row() for w in c.windows],
                "score": round(statistics.median(c.scores), 3) if c.scores else None,
                "met": [r.objective.met(w) for w in c.windows],
            }
            for c in r.candidates
        ],
        "reference": [
            {"settings": s, **w.row(), "score": round(score, 3), "met": r.objective.met(w)}
            for s, w, score in r.reference
        ],
    }
