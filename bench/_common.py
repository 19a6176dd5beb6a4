"""Shared by the bench scripts: argument parsing, the printed table, the JSON result."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from appliance.config import AppConfig, parse_config

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
if str(ROOT) not in sys.path:  # run as `python bench/NAME.py` from anywhere
    sys.path.insert(0, str(ROOT))


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="finish within 60 s")
    return parser.parse_args()


def report(
    name: str, metrics: dict[str, Any], targets: dict[str, Any], met: dict[str, bool]
) -> None:
    """Print a table and write bench/results/NAME.json."""
    width = max(len(k) for k in (*metrics, *targets)) + 2
    print(f"\n{name}")
    print(f"{'metric':<{width}}{'value':>14}  {'target':<24}met")
    for key, value in metrics.items():
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        target = str(targets.get(key, ""))
        ok = met.get(key)
        verdict = "" if ok is None else ("yes" if ok else "NO")
        print(f"{key:<{width}}{shown:>14}  {target:<24}{verdict}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(
        json.dumps({"metrics": metrics, "targets": targets, "met": met}, indent=2) + "\n"
    )
    print(f"wrote {out.relative_to(ROOT)}")


def detect_stream_config(
    model_id: str, model: dict[str, Any], stream_id: str, source: dict[str, Any]
) -> AppConfig:
    """One stream running one `detect` block; the model unbatched (one stream), on the
    GPU where there is one."""
    model = {
        "providers": ["cuda", "cpu"],
        "batching": {"max_batch_size": 1, "max_queue_delay_ms": 0},
        **model,
    }
    workflow = {
        "name": model_id,
        "blocks": [{"id": model_id, "type": "detect", "model": model_id}],
        "outputs": {model_id: model_id},
    }
    doc = {
        "models": {model_id: model},
        "streams": [{"id": stream_id, "source": source, "workflow": workflow}],
    }
    return parse_config(doc, ROOT)
