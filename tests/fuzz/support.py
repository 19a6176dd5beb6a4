"""What the fuzz modules share: reproducible settings, JSON/YAML-like values, a hang guard.

Every module runs derandomized and without an example database, so a CI run sees the same
examples each time (explore with random seeds locally: `--hypothesis-seed=random` is
ignored under `derandomize`, so drop `derandomize` from FUZZ while exploring).
"""

from __future__ import annotations

import contextlib
import gc
import signal
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def fuzz(max_examples: int, capsys: bool = False) -> settings:
    """Derandomized, database-less, no deadline (I/O and first-call imports vary). With
    `capsys`, the function-scoped capsys fixture is allowed: each example reads it out
    before it runs, so examples never see each other's output."""
    checks = [HealthCheck.function_scoped_fixture] if capsys else []
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=checks,
    )


class HangError(Exception):
    """A parser ran past its time budget: the test fails with this, never blocks CI."""


@contextlib.contextmanager
def no_hang(seconds: float = 2.0) -> Iterator[None]:
    """Raise HangError in the main thread if the body runs longer than `seconds`; again
    every 0.1 s after that, in case one is swallowed (raised inside a finaliser).
    pytest-timeout's own alarm (the same signal) is put back afterwards with what was
    left of it."""

    def expired(signum: int, frame: FrameType | None) -> None:
        raise HangError(f"still running after {seconds} s")

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expired)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds, 0.1)
    collecting = gc.isenabled()
    gc.disable()  # no gc callbacks (hypothesis times collections) to swallow the alarm
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if collecting:
            gc.enable()
        if outer > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer - time.monotonic() + started, 0.01))


KEYS = st.one_of(
    st.sampled_from(["id", "type", "url", "name", "path", "sink", "host", "port", "models"]),
    st.text(max_size=6),
)
SCALARS: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
# JSON-like documents: what yaml.safe_load or json.loads can hand a validator.
DOCUMENTS: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)
