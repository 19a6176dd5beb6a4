"""When to try a delivery again: capped exponential backoff with jitter, and the
server's own `Retry-After` (RFC 9110 §10.2.3: seconds, or an HTTP-date).

Pure functions over a config, so every sink that retries shares one schedule.
"""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Twelve digits are ~31,700 years of seconds: longer is not a delay anyone means, and
# int() of a huge digit string is slow (CPython caps it at 4,300 digits for that reason).
_SECONDS = re.compile(r"[0-9]{1,12}", re.ASCII)


class BackoffConfig(BaseModel):
    """Delays between attempts: `initial_s * multiplier**(n-1)` before retry n, capped at
    `max_s`, each scaled by a random factor in `[1 - jitter, 1 + jitter]`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    initial_s: Annotated[float, Field(gt=0)] = 0.5
    max_s: Annotated[float, Field(gt=0)] = 30.0
    multiplier: Annotated[float, Field(ge=1)] = 2.0
    jitter: Annotated[float, Field(ge=0, le=1)] = 0.2  # +- fraction of the delay

    @model_validator(mode="after")
    def _ordered(self) -> BackoffConfig:
        if self.initial_s > self.max_s:
            raise ValueError(f"initial_s ({self.initial_s}) is more than max_s ({self.max_s})")
        return self


def backoff_delay(cfg: BackoffConfig, retry: int, rng: random.Random) -> float:
    """Seconds to wait before retry number `retry` (1 = the first retry).

    The jitter spreads out many appliances retrying one receiver that came back at once
    (the thundering herd the AWS Architecture Blog's "Exponential Backoff and Jitter"
    describes)."""
    base = cfg.initial_s
    for _ in range(retry - 1):
        if base >= cfg.max_s:
            break  # stop multiplying once capped: no overflow after many retries
        base *= cfg.multiplier
    base = min(base, cfg.max_s)
    return base * rng.uniform(1.0 - cfg.jitter, 1.0 + cfg.jitter)


def retry_after_s(value: str | None, cap_s: float, now: datetime | None = None) -> float | None:
    """A `Retry-After` header as seconds from `now`, within `[0, cap_s]`; None when the
    header is absent or unreadable (the caller then uses its own backoff)."""
    if value is None:
        return None
    text = value.strip()
    if _SECONDS.fullmatch(text):
        seconds = float(int(text))
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # "-0000" in a date means UTC with no zone stated
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), cap_s)
