"""Which shard (replica or process) runs which stream: `appliance serve --shard I/N`.

The rule is rendezvous (highest-random-weight) hashing with bounded loads:

1. every (stream, shard) pair gets a weight, blake2b of `"{shard}:{stream_id}"` (stable
   across processes, machines and Python versions; `hash()` is salted per process);
2. streams are placed one at a time, in the order of their best weight (highest first,
   ties broken by id), each on its highest-weight shard that still has room;
3. a shard has room below `n // count`; `n % count` shards may take one more, whichever
   fill first. So loads differ by at most one (the balance plain rendezvous hashing
   lacks: it spreads 1000 streams over 16 shards 52 to 79, not 62 or 63).

The assignment is a pure function of (the set of stream ids, count): every replica
computes it alone and they agree; a replica restart moves nothing. Adding a shard moves
about 1/(count+1) of the streams, like plain rendezvous hashing, plus a few that the
tighter bound shuffles (tests/test_sharding.py measures it). The price of the balance:
adding or removing a stream may also move a few others.

Streams added through `appliance gateway` (not in the config) go by `owner_of` instead:
plain rendezvous, the highest weight, which needs no list of the other streams.
"""

from __future__ import annotations

import hashlib
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from appliance.config import AppConfig

__all__ = [
    "ENV",
    "Shard",
    "assign",
    "owner_of",
    "shard_from_env",
    "shard_of",
    "streams_for",
    "weight",
]

ENV = "APPLIANCE_SHARD"  # `INDEX/COUNT`, or `auto/COUNT`: INDEX from the hostname's `-N`
_ORDINAL = re.compile(r"-([0-9]+)\Z")  # a StatefulSet pod's name: `<set>-<ordinal>`


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit and int() take any script's (`٣` is 3)."""
    return text.isascii() and text.isdigit()


def weight(index: int, stream_id: str) -> int:
    """The rendezvous weight of (shard, stream): the higher, the better the fit."""
    digest = hashlib.blake2b(f"{index}:{stream_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign(stream_ids: Iterable[str], count: int) -> dict[str, int]:
    """Every stream id -> its shard in `range(count)`; loads differ by at most one."""
    if count < 1:
        raise ValueError(f"shard count must be at least 1, got {count}")
    ids = sorted(set(stream_ids))
    ranked = {s: sorted(range(count), key=lambda i: -weight(i, s)) for s in ids}
    best = {s: weight(ranked[s][0], s) for s in ids}
    base, extra = divmod(len(ids), count)  # `extra` shards may hold base + 1
    loads = [0] * count
    placed: dict[str, int] = {}
    for s in sorted(ids, key=lambda s: (-best[s], s)):
        for i in ranked[s]:
            if loads[i] < base or (loads[i] == base and extra > 0):
                extra -= loads[i] == base
                loads[i] += 1
                placed[s] = i
                break
    return placed


def owner_of(stream_id: str, count: int) -> int:
    """The shard of a stream added at runtime through `appliance gateway`: plain
    rendezvous, the shard with the highest `weight` for this id. A pure function of the
    id and `count` alone (other streams do not move it, unlike `assign`'s bounded loads),
    so every replica, the gateway and a restarted gateway agree on it without a list."""
    if count < 1:
        raise ValueError(f"shard count must be at least 1, got {count}")
    return max(range(count), key=lambda i: weight(i, stream_id))


def shard_of(stream_id: str, stream_ids: Iterable[str], count: int) -> int:
    """The shard of `stream_id` among `stream_ids` (which it must be one of)."""
    return assign(stream_ids, count)[stream_id]


def streams_for(stream_ids: Iterable[str], index: int, count: int) -> list[str]:
    """The ids shard `index` of `count` runs, in their given order."""
    ids = list(stream_ids)
    placed = assign(ids, count)
    return [s for s in ids if placed[s] == index]


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard `index` (0-based) of `count`; `within` another shard's streams when given
    (a worker process of `serve --workers` inside a replica's shard)."""

    index: int
    count: int
    within: Shard | None = None

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"shard {self}: COUNT must be at least 1")
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard {self}: INDEX must be 0 to {self.count - 1} (0-based)")

    def __str__(self) -> str:
        own = f"{self.index}/{self.count}"
        return own if self.within is None else f"{self.within}:{own}"

    @classmethod
    def parse(cls, text: str, hostname: Callable[[], str] = socket.gethostname) -> Shard:
        """`INDEX/COUNT` (`1/3`), or `auto/COUNT`: INDEX is the hostname's trailing `-N`
        (a Kubernetes StatefulSet pod, `appliance-2`). ValueError says what is wrong."""
        index, sep, count = text.strip().partition("/")
        if not (sep and _digits(count) and (_digits(index) or index == "auto")):
            raise ValueError(f"shard {text!r}: expected INDEX/COUNT (e.g. 1/3) or auto/COUNT")
        if index == "auto":
            host = hostname()
            match = _ORDINAL.search(host)
            if match is None:
                raise ValueError(f"shard {text!r}: hostname {host!r} does not end in -N")
            index = match.group(1)
        return cls(int(index), int(count))

    def select(self, stream_ids: Iterable[str]) -> list[str]:
        return streams_for(stream_ids, self.index, self.count)

    def apply(self, config: AppConfig) -> AppConfig:
        """The config with only this shard's streams (the rest left to other shards)."""
        if self.within is not None:
            config = self.within.apply(config)
        mine = set(self.select(s.id for s in config.streams))
        return config.model_copy(update={"streams": [s for s in config.streams if s.id in mine]})


def shard_from_env(
    environ: Mapping[str, str], hostname: Callable[[], str] = socket.gethostname
) -> Shard | None:
    """`APPLIANCE_SHARD` parsed, or None when unset or empty."""
    text = environ.get(ENV, "").strip()
    return Shard.parse(text, hostname) if text else None
