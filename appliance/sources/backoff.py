"""Capped exponential backoff with jitter, for reconnecting live sources."""

from __future__ import annotations

import random

from appliance.sources.config import BackoffConfig


class Backoff:
    """Delays `initial_s * multiplier**n`, capped at `max_s`, each scaled by a random
    factor in `[1 - jitter, 1 + jitter]` so that many cameras behind one failed switch do
    not reconnect in lockstep. `reset()` after a success starts again from `initial_s`.
    """

    def __init__(self, cfg: BackoffConfig, rng: random.Random | None = None) -> None:
        self._cfg = cfg
        self._rng = rng or random.Random()
        self._base = cfg.initial_s

    def next_delay(self) -> float:
        """The next delay in seconds; each call grows the following one until the cap."""
        base = min(self._base, self._cfg.max_s)
        # Stop multiplying once capped: the exponent would overflow after ~1000 failures.
        self._base = min(self._base * self._cfg.multiplier, self._cfg.max_s)
        jitter = self._cfg.jitter
        return base * self._rng.uniform(1.0 - jitter, 1.0 + jitter)

    def reset(self) -> None:
        """Start again from `initial_s` (after a source delivered a frame)."""
        self._base = self._cfg.initial_s
