"""Tuning hints: the tiny-operators hint advises graph optimisations only where the trace
does not say they were already on."""

from __future__ import annotations

from typing import Any

from appliance.tools.fingerprint import TINY_OPS_PER_RUN, hints


def _tiny_ops() -> list[dict[str, Any]]:
    """One run of many 2 µs operators, as ORT's profile lists them."""
    return [
        {"name": f"op{i}", "ph": "X", "ts": i, "dur": 2, "cat": "Node", "args": {}}
        for i in range(TINY_OPS_PER_RUN + 50)
    ]


def _tiny_hint(other: dict[str, Any]) -> str:
    fp: Any = {"ops": {}, "blocks": {}}
    return next(h for h in hints(fp, _tiny_ops(), 1, other) if h.startswith("many tiny"))


def test_graph_optimisations_are_advised_only_where_they_were_off() -> None:
    assert "enable graph optimisations" in _tiny_hint({})  # unknown: advise
    assert "enable graph optimisations" in _tiny_hint({"graph_optimization": "basic"})
    on = _tiny_hint({"graph_optimization": "all"})
    assert "enable graph optimisations" not in on and "fuse the model" in on
