"""The webhook sink: each result POSTed as JSON to one URL, reliably and within bounds.

    worker ── offer ──► OutboxQueue ──► dispatcher ──► ≤ concurrency delivery tasks ──► POST
                                                                   └─ gave up ──► dead letters

Unlike a fire-and-forget webhook (Roboflow's webhook block), a delivery is retried on
network errors, 429 and 5xx, with backoff (or the server's Retry-After), up to
`retries` times; what still fails, or is refused with another 4xx, goes to the
dead-letter file with its last error. Bounds: the queue (drop-oldest, counted), the
`concurrency` slots (a delivery keeps its slot while it waits to retry, so one failing
destination never has more than `concurrency` requests open), the dead-letter files.

`stop` delivers what it can within the drain timeout; what is left (queued or cut off
mid-attempt) is counted as dropped, as the Sink contract says, and also written to the
dead-letter file with the reason, so a shutdown loses nothing silently.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
from pydantic import BaseModel

from pipelines.types import FrameResult
from sinks.base import Delivered, FrameId, OutboxQueue, SinkContext, SinkState, SinkStatus
from sinks.messages import encode, encoded_prediction, notice
from sinks.webhook.deadletter import DeadLetterFile
from sinks.webhook.http import Attempt, WebhookConfig, headers_for, post, safe_url
from sinks.webhook.retry import backoff_delay

__all__ = ["WebhookConfig", "WebhookSink"]

log = logging.getLogger("sinks.webhook")
# The sink's name becomes a file name: no separators, no dot files.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(slots=True)
class Delivery:
    """One message to deliver: the encoded body is built once, and sent and signed as is."""

    id: str  # uuid4 hex, the same on every attempt (X-Appliance-Delivery)
    event: str
    body: bytes
    offered: float  # time.time() when offered
    attempts: int = 0
    last: Attempt | None = None
    settled: bool = False  # sent or dead-lettered: nothing left to do at shutdown
    frame: FrameId | None = None  # the frame whose prediction it is (its trace's span)


class WebhookSink:
    """Implements sinks.base.Sink (and SinkKind) for one webhook destination.

    `observe_send(seconds)` is called on the loop with the duration of every successful
    POST (request to answer), for a latency histogram."""

    Config: ClassVar[type[WebhookConfig]] = WebhookConfig  # what sinks.registry validates with

    def __init__(
        self,
        name: str,
        config: WebhookConfig,
        *,
        data_dir: Path,
        observe_send: Callable[[float], None] | None = None,
        on_delivered: Delivered | None = None,
    ) -> None:
        if not _NAME.fullmatch(name):
            raise ValueError(f"sink name {name!r}: expected {_NAME.pattern}")
        if config.secret_file is not None and config.secret is None:
            # sinks/ has no file policy: the runtime reads the file (appliance/runtime/outputs.py).
            # Never send unsigned what the config asked to sign.
            raise ValueError(f"sinks.{name}.secret_file: not read (only the runtime reads it)")
        self.name = name
        self.config = config
        self._url = safe_url(config.url)
        self._observe = observe_send
        self._on_delivered = on_delivered  # a prediction delivered: its frame's trace span
        self._queue: OutboxQueue[Delivery] = OutboxQueue(
            config.queue.max_messages, config.queue.max_bytes
        )
        self._dead = DeadLetterFile(data_dir / "dead-letters" / f"{name}.jsonl", config.dead_letter)
        self._rng = random.Random()
        self._slots = asyncio.Semaphore(config.concurrency)
        self._tasks: dict[asyncio.Task[None], Delivery] = {}
        self._dispatcher: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closing = False
        self._drained = asyncio.Event()  # closing, and nothing queued or in flight
        self._state = SinkState.STARTING
        self._sent = self._retried = self._dead_lettered = self._dropped_at_stop = 0
        self._last_error: str | None = None

    @classmethod
    def build(cls, name: str, config: BaseModel, context: SinkContext) -> WebhookSink:
        """sinks.base.SinkKind: dead letters go below the context's data_dir."""
        if not isinstance(config, WebhookConfig):
            raise TypeError(f"webhook {name}: a WebhookConfig, not {type(config).__name__}")
        return cls(
            name,
            config,
            data_dir=context.data_dir,
            observe_send=context.observe_send,
            on_delivered=context.on_delivered,
        )

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Open the HTTP session and start dispatching; no connection is made yet, so an
        unreachable destination cannot stop the appliance from starting."""
        if self._dispatcher is not None:
            raise RuntimeError(f"webhook {self.name}: already started")
        self._queue.bind(asyncio.get_running_loop())
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.config.timeout_s),
            connector=aiohttp.TCPConnector(limit=self.config.concurrency),
        )
        self._dispatcher = asyncio.create_task(self._dispatch(), name=f"webhook-{self.name}")

    def offer(self, result: FrameResult) -> bool:
        """Encode the result and queue it (any thread, never blocks: no I/O here)."""
        if self._closing:
            return False
        body = encoded_prediction(result)
        frame = (result.stream_id, result.seq)
        delivery = Delivery(uuid.uuid4().hex, "prediction", body, time.time(), frame=frame)
        return self._queue.put(delivery, len(body))

    def publish_event(self, stream_id: str | None, event: dict[str, Any]) -> None:
        """An event not made by a frame (the regression watch's; any thread): one delivery
        named by its `type`, signed and retried like a prediction."""
        if self._closing:
            return
        body = encode(notice(stream_id, event))
        delivery = Delivery(uuid.uuid4().hex, str(event["type"]), body, time.time())
        self._queue.put(delivery, len(body))

    async def stop(self, drain_timeout_s: float) -> None:
        """Take no more; deliver what is queued or in flight for up to `drain_timeout_s`,
        then cancel and dead-letter the rest (counted as dropped)."""
        self._closing = True
        self._check_drained()
        if self._dispatcher is not None:
            try:
                await asyncio.wait_for(self._drained.wait(), drain_timeout_s)
            except TimeoutError:
                log.warning(
                    "webhook %s: %d queued, %d in flight after the %.1f s drain; cancelling",
                    self.name,
                    len(self._queue),
                    len(self._tasks),
                    drain_timeout_s,
                )
            await self._cancel()
        left = [d for d in (*self._tasks.values(), *self._queue.close()) if not d.settled]
        self._tasks.clear()
        self._dropped_at_stop += len(left)
        if left:
            await self._write_dead(left, "shutdown before delivery")
        if self._session is not None:
            await self._session.close()
        self._state = SinkState.STOPPED

    async def _cancel(self) -> None:
        assert self._dispatcher is not None
        pending = [self._dispatcher, *self._tasks]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    # -- delivery ---------------------------------------------------------------------
    async def _dispatch(self) -> None:
        """Hand queued deliveries to tasks, at most `concurrency` at once. A slot is taken
        before a message is: waiting messages stay in the bounded, drop-oldest queue."""
        while True:
            await self._slots.acquire()
            delivery = await self._queue.get()
            task = asyncio.create_task(self._deliver(delivery))
            self._tasks[task] = delivery
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return  # stop() is collecting it
        self._tasks.pop(task, None)
        self._slots.release()
        if task.exception() is not None:
            log.error("webhook %s: delivery failed", self.name, exc_info=task.exception())
        self._check_drained()

    def _check_drained(self) -> None:
        if self._closing and not self._tasks and len(self._queue) == 0:
            self._drained.set()

    async def _deliver(self, delivery: Delivery) -> None:
        """Attempt until sent, refused, or out of retries; sleeps in its own slot."""
        while True:
            attempt = await self._attempt(delivery)
            if attempt.ok:
                delivery.settled = True
                self._sent += 1
                return
            if not attempt.retry or delivery.attempts > self.config.retries:
                delivery.settled = True
                self._dead_lettered += 1
                log.warning(
                    "webhook %s: delivery %s dead-lettered after %d attempt(s): %s",
                    self.name,
                    delivery.id,
                    delivery.attempts,
                    attempt.error,
                )
                await self._write_dead([delivery], None)
                return
            self._retried += 1
            delay = attempt.retry_after_s
            if delay is None:
                delay = backoff_delay(self.config.backoff, delivery.attempts, self._rng)
            await asyncio.sleep(delay)

    async def _attempt(self, delivery: Delivery) -> Attempt:
        assert self._session is not None
        delivery.attempts += 1
        headers = headers_for(self.config, delivery.event, delivery.id, delivery.body)
        started = time.perf_counter()
        attempt = await post(self._session, self.config, headers, delivery.body)
        delivery.last = attempt
        if attempt.ok:
            if self._state == SinkState.FAILING:
                log.info("webhook %s (%s): delivering again", self.name, self._url)
            self._state, self._last_error = SinkState.OK, None
            now = time.perf_counter()
            if self._observe is not None:
                self._observe(now - started)
            if delivery.frame is not None and self._on_delivered is not None:
                self._on_delivered(*delivery.frame, started, now)
        else:
            if self._state != SinkState.FAILING:
                log.warning("webhook %s (%s): failing: %s", self.name, self._url, attempt.error)
            log.debug(
                "webhook %s: attempt %d failed: %s", self.name, delivery.attempts, attempt.error
            )
            self._state, self._last_error = SinkState.FAILING, attempt.error
        return attempt

    # -- dead letters -----------------------------------------------------------------
    async def _write_dead(self, deliveries: Iterable[Delivery], reason: str | None) -> None:
        """Append off the loop (a slow disk must not stall it); a write error is logged
        and shown in status, never raised into the delivery path."""
        records = [self._record(d, reason) for d in deliveries]
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self._dead.append, records)
        except OSError as exc:
            self._last_error = f"dead letters not written: {exc.strerror or type(exc).__name__}"
            log.error("webhook %s: %d %s", self.name, len(records), self._last_error)

    def _record(self, delivery: Delivery, reason: str | None) -> dict[str, Any]:
        last = delivery.last
        error = last.error if last is not None else None
        if reason is not None:
            error = f"{reason} (last error: {error})" if error else reason
        # Not pipelines.types.iso_utc, which writes `Z` and rounds to the ms: a dead-letter
        # file is read by other programs, so its lines keep the format they always had
        # (`+00:00`; `time` to the ms, truncated; `offered` to the µs).
        return {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "delivery": delivery.id,
            "event": delivery.event,
            "url": self._url,
            "offered": datetime.fromtimestamp(delivery.offered, UTC).isoformat(),
            "attempts": delivery.attempts,
            "last_error": error,
            "status": last.status if last is not None else None,
            "answer": last.answer if last is not None else None,
            "body": json.loads(delivery.body),
        }

    # -- status -----------------------------------------------------------------------
    def status(self) -> SinkStatus:
        return SinkStatus(
            name=self.name,
            type="webhook",
            up=self._state == SinkState.OK,
            state=self._state,
            queue_depth=len(self._queue),
            sent=self._sent,
            retried=self._retried,
            dropped=self._queue.dropped + self._dropped_at_stop,
            dead_lettered=self._dead_lettered,
            last_error=self._last_error,
            extra={
                "url": self._url,
                "in_flight": len(self._tasks),
                "queue_bytes": self._queue.bytes,
                "dead_letter_file": str(self._dead.path),
            },
        )
