"""What every sink looks like, and the one bounded queue every sink uses.

A sink takes results from stream worker threads and delivers them from the event loop
(aiortc's contrib/media.py practice: threads hand work to the loop explicitly):

    worker ── offer(result) ──► OutboxQueue (bounded, drop-oldest) ──► loop task ──► broker/HTTP

`offer` never blocks and never does I/O: it turns the result into the sink's own small
message (no image: a queue of full frames would hold gigabytes) and puts it on the queue.
When the queue is full the oldest message is dropped and counted: the newest result is the
one that matters, as with frames (docs/outputs.md). `stop` drains for a bounded time.

`sinks/` imports only result types from `pipelines/`; the runtime (appliance/runtime/outputs.py)
builds every sink the same way, `SinkKind.build(name, config, SinkContext)` on the class the
registry names (sinks/registry.py), starts them before the streams and stops them after.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from pipelines.types import FrameResult

if TYPE_CHECKING:
    from sinks.mqtt.commands import CommandHandler

T = TypeVar("T")


class SinkState(StrEnum):
    """A sink's state, as the API, `/ready`, the CLI and the logs spell it."""

    STARTING = "starting"  # built; not connected, nothing delivered yet
    CONNECTED = "connected"  # MQTT: the broker accepted the connection
    RECONNECTING = "reconnecting"  # MQTT: unreachable or lost; paho retries with backoff
    AUTH_FAILED = "auth_failed"  # MQTT: the broker refused the credentials
    TLS_FAILED = "tls_failed"  # MQTT: the TLS handshake failed
    REFUSED = "refused"  # MQTT: another CONNACK refusal
    OK = "ok"  # webhook: the last delivery succeeded
    FAILING = "failing"  # webhook: the last attempt failed (deliveries retry)
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class SinkStatus:
    """A sink's state for the API, `/ready` and metrics."""

    name: str
    type: str
    up: bool  # connected (MQTT) or the last delivery succeeded (webhook)
    state: SinkState
    queue_depth: int
    sent: int = 0
    retried: int = 0
    dropped: int = 0  # overflowed the queue (oldest first)
    dead_lettered: int = 0
    last_error: str | None = None  # masked: never a password or secret
    extra: Mapping[str, Any] = field(default_factory=dict)


class Sink(Protocol):
    """One output destination. `start` and `stop` run on the event loop; `offer` on any
    thread (a stream's worker), without blocking."""

    name: str
    # Optional, read with getattr: True when the sink sends the `video` output's images
    # (MQTT snapshots), so a stream it serves draws every frame (FrameResult.image).

    async def start(self) -> None:
        """Connect (or begin trying to: an unreachable destination must not stop the
        appliance from starting) and start the delivery task."""
        ...

    def offer(self, result: FrameResult) -> bool:
        """Queue the result for delivery; False when it could not be queued (stopped).
        A full queue drops its oldest message instead, and counts it."""
        ...

    async def stop(self, drain_timeout_s: float) -> None:
        """Deliver what is queued for at most `drain_timeout_s`, then close; what is
        left is counted as dropped."""
        ...

    def status(self) -> SinkStatus: ...


M = TypeVar("M", bound=BaseModel)


class KeptDocument(Protocol):
    """A small document a sink keeps across restarts of the appliance, in its state
    folder (`server.state_dir`): written whole and atomically, readable by the owner only.
    The runtime gives each sink its own (appliance/runtime/sinkstate.py)."""

    def read(self, model: type[M]) -> M | None:
        """The kept document validated as `model`; None when none is kept yet.
        ValueError saying why when the one found cannot be used (it is set aside)."""
        ...

    def write(self, body: BaseModel) -> None:
        """Keep `body` from now on; OSError when the folder or the disk refuses (the
        document kept before is left as it was)."""
        ...


# A frame's result delivered: (stream, seq, start, end), perf_counter seconds.
Delivered = Callable[[str, int, float, float], None]


@dataclass(frozen=True, slots=True)
class SinkContext:
    """What the runtime gives every sink it builds, beside the sink's validated config.
    Each kind takes what it needs of it."""

    data_dir: Path  # a sink's files go below it (the webhook's dead letters)
    observe_send: Callable[[float], None] | None = None  # seconds per delivery (a histogram)
    # A frame's result delivered: (stream, seq, start, end), perf_counter seconds from
    # publish (or request) to ack (or answer). The runtime puts it on the frame's trace.
    on_delivered: Delivered | None = None
    on_command: CommandHandler | None = None  # the runtime's commands, for a sink taking them
    # `serve --workers` runs N processes: each appends this to its broker client ids (a
    # broker drops the older session of a duplicate id), and only one takes commands.
    client_suffix: str = ""
    take_commands: bool = True  # False: commands off, whatever the sink's config says
    # This sink's document across restarts (MQTT: the command signatures already used);
    # None without a state folder.
    kept: KeptDocument | None = None


# Which frame a queued message is the result of: (stream, seq); None for other messages.
FrameId = tuple[str, int]


class SinkKind(Protocol):
    """A sink class as the registry holds it (sinks/registry.py): the pydantic model its
    config is validated with (a `type: Literal[<kind>]` field names it), and how the runtime
    builds one from that validated config."""

    @property
    def Config(self) -> type[BaseModel]:  # noqa: N802 (the class attribute's name)
        """The model that validates this kind's `sinks:` entries."""
        ...

    def build(self, name: str, config: BaseModel, context: SinkContext) -> Sink:
        """A sink named `name`, not started; `config` is an instance of `Config`."""
        ...


class OutboxQueue(Generic[T]):
    """A bounded FIFO from threads to one event-loop consumer.

    `put` is called from any thread and never blocks: past `max_items` (or `max_bytes`,
    when items are sized) the oldest items are dropped and counted. `get` is awaited on
    the loop. Waking the loop costs one `call_soon_threadsafe` per put that finds the
    consumer waiting, not one per item.
    """

    def __init__(self, max_items: int, max_bytes: int | None = None) -> None:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.dropped = 0
        self._items: deque[tuple[T, int]] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop whose task will `get` (call from that loop, before the first get)."""
        self._loop = loop

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, item: T, size: int = 0) -> bool:
        """Append `item` (of `size` bytes); False only once the queue is closed."""
        with self._lock:
            if self._closed:
                return False
            self._items.append((item, size))
            self._bytes += size
            self._trim()
            waiter, self._waiter = self._waiter, None
        if waiter is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(_wake, waiter)
        return True

    def put_front(self, item: T, size: int = 0) -> None:
        """Give back an item that could not be delivered, first in line again (on the
        loop). If the queue has filled meanwhile, the oldest, this one, is dropped."""
        with self._lock:
            self._items.appendleft((item, size))
            self._bytes += size
            self._trim()

    async def get(self) -> T:
        """The oldest item, waiting for one. Must run on the bound loop."""
        while True:
            with self._lock:
                if self._items:
                    item, size = self._items.popleft()
                    self._bytes -= size
                    return item
                loop = self._loop or asyncio.get_running_loop()
                self._waiter = waiter = loop.create_future()
            await waiter

    def get_nowait(self) -> T | None:
        with self._lock:
            if not self._items:
                return None
            item, size = self._items.popleft()
            self._bytes -= size
            return item

    def close(self) -> list[T]:
        """No more puts; returns what was still queued (the caller counts it)."""
        with self._lock:
            self._closed = True
            left = [item for item, _ in self._items]
            self._items.clear()
            self._bytes = 0
            return left

    def _trim(self) -> None:
        """Drop the oldest past the bounds (under the lock); the newest always stays."""
        while len(self._items) > 1 and (
            len(self._items) > self.max_items
            or (self.max_bytes is not None and self._bytes > self.max_bytes)
        ):
            _, size = self._items.popleft()
            self._bytes -= size
            self.dropped += 1


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
