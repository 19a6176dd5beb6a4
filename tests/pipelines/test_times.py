"""`iso_utc`: the people's form of a wall-clock time agrees with the programs' form."""

from __future__ import annotations

from datetime import datetime

import pytest

from pipelines.types import iso_utc


@pytest.mark.parametrize("t", [1796104205.9398, 1796104205.9995, 1700000000.0, 0.0004, 12.3456])
def test_iso_utc_is_the_instant_round_t_3_names(t: float) -> None:
    """Messages carry both `round(t, 3)` and `iso_utc(t)`: they name the same millisecond
    (1796104205.9398 once read .939 beside a `time` of .94)."""
    at = iso_utc(t)
    assert at.endswith("Z") and len(at) == len("2026-12-01T05:50:05.940Z")
    assert datetime.fromisoformat(at).timestamp() == pytest.approx(round(t, 3), abs=1e-6)
