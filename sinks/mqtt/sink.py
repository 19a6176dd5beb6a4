"""The MQTT sink (paho-mqtt 2.x; MQTT 5 or 3.1.1): results to a broker, reliably and bounded.

    <prefix>/<stream>/predictions   one message per result offered (messages.prediction)
    <prefix>/<stream>/shadow        a shadow's candidate results, when it asks (publish_shadow)
    <prefix>/<stream>/events        one message per event (events.EventDetector, and the
                                    regression watch's for that stream)
    <prefix>/events                 the watch's events of no one stream (the host)
    <prefix>/<stream>/status        retained: the stream's state and reason
    <prefix>/status                 retained "online"; the Last Will is "offline"
    <prefix>/cmd/...                requests, when enabled (mqtt_commands; signed: mqtt_auth)
    <prefix>/cmd/reply              answers, or an MQTT 5 response topic under cmd/response/

Threads: workers `offer` onto the OutboxQueue; paho's own network thread connects,
reconnects with backoff and reports to the event loop (mqtt_client.Link); one loop task
publishes, another starts paho's thread again should it end (Link.revive). States
(sinks.base.SinkState): starting, connected, reconnecting, auth_failed, tls_failed,
refused (another CONNACK refusal), stopped; each change is logged once, not every retry.

Delivery: the task takes a message from the queue only while connected and while fewer
than IN_FLIGHT are unacknowledged, so paho's own (unbounded) queue never holds more than
that window; everything else waits in our queue, bounded by count and bytes, dropping
the oldest (counted) when full. paho keeps an unacknowledged QoS ≥ 1 message across a
reconnect and sends it again first (with DUP set), so after a reconnect nothing new is
published until that carried-over window is acknowledged: messages arrive in order, and
a message may arrive twice (QoS 1's at-least-once contract; consumers dedupe on
`stream` + `seq`). With `qos: 0` (Frigate's choice) a result offered while disconnected
is dropped and counted, and so is one written but lost with the connection. Status
messages (`online`, stream states, command answers) always go at QoS ≥ 1, and on every
connect `online` and each stream's latest state are sent again: a broker without
persistence forgets retained messages when it restarts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import BaseModel

from pipelines.types import FrameResult, iso_utc
from sinks.base import (
    Delivered,
    FrameId,
    KeptDocument,
    OutboxQueue,
    SinkContext,
    SinkState,
    SinkStatus,
)
from sinks.messages import SCHEMA_VERSION, encode, encode_jpeg, encoded_prediction, notice
from sinks.mqtt.client import IN_FLIGHT, Link
from sinks.mqtt.commands import REPLY, CommandHandler, Request, answer, topics_of
from sinks.mqtt.config import MqttConfig
from sinks.mqtt.events import EventDetector, event_message

log = logging.getLogger("sinks.mqtt")

STOP_ACK_S = 2.0  # at stop, how long the retained "offline" may take to be acknowledged
WATCH_S = 1.0  # how often the sink checks that paho's network thread still runs


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish; its size (topic + payload) counts against the queue."""

    topic: str
    payload: bytes
    qos: int
    retain: bool = False
    properties: Properties | None = None
    frame: FrameId | None = None  # the frame whose prediction it is (its trace's span)

    @property
    def size(self) -> int:
        return len(self.topic) + len(self.payload)


class MqttSink:
    """sinks.base.Sink (and SinkKind) for an MQTT broker; see the module docstring for
    its semantics."""

    Config = MqttConfig

    def __init__(
        self,
        name: str,
        config: MqttConfig,
        *,
        on_command: CommandHandler | None = None,
        observe_send: Callable[[float], None] | None = None,
        kept: KeptDocument | None = None,
        on_delivered: Delivered | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self._prefix = config.topic_prefix
        self._status_qos = max(config.qos, 1)  # state must not be lost silently
        self._on_command = on_command
        self._kept = kept  # the signatures commands used, across restarts (mqtt_auth)
        self._observe_send = observe_send
        self._on_delivered = on_delivered  # a prediction acked: its frame's trace span
        self._queue: OutboxQueue[Outgoing] = OutboxQueue(
            config.queue.max_messages, config.queue.max_bytes
        )
        self._state = SinkState.STARTING
        self._last_error: str | None = None  # masked: never the password
        self._sent = self._dropped = 0
        self._counts = threading.Lock()  # _dropped is counted from worker threads too
        self._unacked: dict[int, tuple[Outgoing, float]] = {}  # mid → (message, sent at)
        self._carried: set[int] = set()  # unacked when the last connection went down
        self._fresh = False  # connected, `online` and stream states not sent yet
        self._streams: dict[str, Outgoing] = {}  # each stream's latest state
        self._streams_lock = threading.Lock()
        self._detectors: dict[str, EventDetector] = {}  # one per stream, fed by its worker
        self._snapshot_at: dict[str, float] = {}  # stream -> its last snapshot's done_mono
        self.sends_images = config.snapshots.enabled  # the streams it serves draw every frame
        self._commands: set[asyncio.Task[None]] = set()
        self._refused = self._auth_refused = 0  # commands answered with an error; by auth
        self._closed = False  # stop() began: no more offers
        self._hanging_up = False  # stop() disconnects: the link going down is expected
        self._wake = asyncio.Event()  # something the delivery task waits on changed
        self._link: Link | None = None
        self._task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None  # revives paho's network thread
        self._network_restarts = 0

    @classmethod
    def build(cls, name: str, config: BaseModel, context: SinkContext) -> MqttSink:
        """sinks.base.SinkKind: this process's own client id (a broker drops the older
        session of a duplicate id), and commands only where this process takes them."""
        if not isinstance(config, MqttConfig):
            raise TypeError(f"mqtt {name}: an MqttConfig, not {type(config).__name__}")
        update: dict[str, Any] = {"client_id": config.client_id + context.client_suffix}
        if not context.take_commands:
            update["commands"] = config.commands.model_copy(update={"enabled": False})
        return cls(
            name,
            config.model_copy(update=update),
            on_command=context.on_command,
            observe_send=context.observe_send,
            kept=context.kept,
            on_delivered=context.on_delivered,
        )

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Begin connecting (paho's thread retries until it works) and delivering."""
        loop = asyncio.get_running_loop()
        self._queue.bind(loop)
        topics = topics_of(self._on_command)
        self._link = Link(self.name, self.config, self, loop, topics, self._kept)
        commands = self.config.commands
        if commands.enabled and commands.auth == "none":
            log.warning(
                "mqtt sink %s: commands are enabled without authentication: any client the "
                "broker lets publish to %s/cmd/# can restart streams (set commands.auth: hmac, "
                "and restrict the topic with broker ACLs: docs/security.md)",
                self.name,
                self._prefix,
            )
        self._link.start()
        self._task = loop.create_task(self._deliver(), name=f"mqtt-{self.name}")
        self._watch = loop.create_task(self._watch_network(), name=f"mqtt-{self.name}-watch")

    async def stop(self, drain_timeout_s: float) -> None:
        """Deliver for up to `drain_timeout_s`, publish `offline`, disconnect; what is
        left undelivered is counted as dropped."""
        if self._task is None or self._link is None or self._closed:
            return
        self._closed = True
        with suppress(TimeoutError):
            await asyncio.wait_for(self._until(self._drained), drain_timeout_s)
        for task in list(self._commands):
            task.cancel()
        self._task.cancel()
        with suppress(asyncio.CancelledError):
            await self._task
        self._count_dropped(len(self._queue.close()) + len(self._unacked))
        self._unacked.clear()
        if self._state == SinkState.CONNECTED:  # a clean DISCONNECT does not fire the Last Will
            self._publish(self._status_message(b"offline"))
            with suppress(TimeoutError):
                await asyncio.wait_for(self._until(lambda: not self._unacked), STOP_ACK_S)
        self._hanging_up = True
        if self._watch is not None:
            self._watch.cancel()  # paho's thread ends now, on purpose
        await self._link.close()
        self._set_state(SinkState.STOPPED, self._last_error)

    # -- from worker threads ------------------------------------------------------------
    def offer(self, result: FrameResult) -> bool:
        if self._closed:
            return False
        detector = self._detectors.get(result.stream_id)
        if detector is None:  # setdefault: atomic, one stream is fed by one worker
            detector = self._detectors.setdefault(result.stream_id, EventDetector())
        events = detector.feed(result)
        if self.config.qos == 0 and self._state != SinkState.CONNECTED:
            self._count_dropped(1 + len(events))
            return True
        base, qos = f"{self._prefix}/{result.stream_id}", self.config.qos
        frame = (result.stream_id, result.seq)
        self._put(Outgoing(f"{base}/predictions", encoded_prediction(result), qos, frame=frame))
        for event in events:
            self._put(Outgoing(f"{base}/events", encode(event_message(result, event)), qos))
        if events and result.image is not None and self._snapshot_due(result):
            shots = self.config.snapshots
            jpeg = encode_jpeg(result.image, shots.quality)
            self._put(Outgoing(f"{base}/snapshot", jpeg, qos, shots.retain))
        return True

    def publish_shadow(self, result: FrameResult) -> None:
        """A shadow's candidate result (docs/shadow.md), on `<prefix>/<stream>/shadow`."""
        if not self._closed:
            topic = f"{self._prefix}/{result.stream_id}/shadow"
            self._put(Outgoing(topic, encoded_prediction(result), self.config.qos))

    def _snapshot_due(self, result: FrameResult) -> bool:
        """Snapshots on, and none of this stream within min_interval_s (worker thread:
        one stream is fed by one worker, so its entry has one writer)."""
        shots = self.config.snapshots
        if not shots.enabled:
            return False
        last = self._snapshot_at.get(result.stream_id)
        if last is not None and result.done_mono - last < shots.min_interval_s:
            return False
        self._snapshot_at[result.stream_id] = result.done_mono
        return True

    def publish_stream_status(self, stream_id: str, state: str, reason: str | None) -> None:
        """A stream's state changed (any thread): retained on `<prefix>/<stream>/status`."""
        body = {"v": SCHEMA_VERSION, "stream": stream_id, "state": state, "reason": reason}
        now = time.time()
        body["time"] = round(now, 3)  # epoch seconds, for programs
        body["at"] = iso_utc(now)  # for people
        msg = Outgoing(
            f"{self._prefix}/{stream_id}/status",
            encode(body),
            self._status_qos,
            self.config.retain_status,
        )
        with self._streams_lock:
            self._streams[stream_id] = msg
        self._put(msg)

    def publish_event(self, stream_id: str | None, event: dict[str, Any]) -> None:
        """An event not made by a frame (any thread): on the stream's `events` topic, or
        `<prefix>/events` for the appliance as a whole."""
        if self._closed:
            return
        topic = f"{self._prefix}/{stream_id}/events" if stream_id else f"{self._prefix}/events"
        self._put(Outgoing(topic, encode(notice(stream_id, event)), self.config.qos))

    def status(self) -> SinkStatus:
        commands = {"commands_refused": self._refused, "commands_auth_refused": self._auth_refused}
        return SinkStatus(
            name=self.name,
            type="mqtt",
            up=self._state == SinkState.CONNECTED,
            state=self._state,
            queue_depth=len(self._queue) + len(self._unacked),
            sent=self._sent,
            dropped=self._queue.dropped + self._dropped,
            last_error=self._last_error,
            extra={
                "broker": f"{self.config.host}:{self.config.port}",
                "connect_attempts": 0 if self._link is None else self._link.attempts,
                "in_flight": len(self._unacked),
                "callback_errors": 0 if self._link is None else self._link.guard.errors,
                "network_restarts": self._network_restarts,
                **(commands if self.config.commands.enabled else {}),
            },
        )

    def _put(self, msg: Outgoing) -> None:
        self._queue.put(msg, msg.size)

    def _count_dropped(self, n: int) -> None:
        with self._counts:
            self._dropped += n

    # -- the delivery task (event loop) -------------------------------------------------
    async def _deliver(self) -> None:
        while True:
            await self._until(self._can_send)
            if self._fresh:
                self._fresh = False
                for msg in self._session_messages():
                    self._publish(msg)
                continue
            msg = await self._queue.get()
            if self._can_send() and not self._fresh:
                self._publish(msg)
            elif msg.qos == 0:
                self._count_dropped(1)
            else:  # the link went down while we waited: first in line again
                self._queue.put_front(msg, msg.size)

    def _can_send(self) -> bool:
        connected = self._state == SinkState.CONNECTED
        return connected and not self._carried and len(self._unacked) < IN_FLIGHT

    def _drained(self) -> bool:
        return len(self._queue) == 0 and not self._unacked

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            self._wake.clear()
            await self._wake.wait()

    def _publish(self, msg: Outgoing) -> None:
        assert self._link is not None
        info = self._link.client.publish(
            msg.topic, msg.payload, msg.qos, msg.retain, msg.properties
        )
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS and msg.qos == 0:
            self._count_dropped(1)  # QoS ≥ 1 stays with paho, sent once connected
            return
        self._unacked[info.mid] = (msg, time.perf_counter())

    def _session_messages(self) -> list[Outgoing]:
        with self._streams_lock:
            streams = list(self._streams.values()) if self.config.retain_status else []
        return [self._status_message(b"online"), *streams]

    def _status_message(self, payload: bytes) -> Outgoing:
        topic = f"{self._prefix}/status"
        return Outgoing(topic, payload, self._status_qos, self.config.retain_status)

    async def _watch_network(self) -> None:
        """Defence in depth: should paho's network thread end while the sink runs (no
        callback can end it: mqtt_guard), say so and start it again."""
        assert self._link is not None
        while True:
            await asyncio.sleep(WATCH_S)
            if not self._link.revive():
                continue
            self._network_restarts += 1
            error = f"the network thread had ended; restarted ({self._network_restarts} so far)"
            log.error("mqtt sink %s: %s", self.name, error)
            self._set_state(SinkState.RECONNECTING, error)

    # -- facts from paho's thread, applied on the loop ----------------------------------
    def acked(self, mid: int) -> None:
        entry = self._unacked.pop(mid, None)
        if entry is None:
            return
        self._carried.discard(mid)
        self._sent += 1
        now = time.perf_counter()
        if self._observe_send is not None:
            self._observe_send(now - entry[1])  # publish → ack, seconds
        frame = entry[0].frame
        if frame is not None and self._on_delivered is not None:
            self._on_delivered(frame[0], frame[1], entry[1], now)
        self._wake.set()

    def link_up(self) -> None:
        if not self._closed:
            self._set_state(SinkState.CONNECTED, self._last_error)
            self._fresh = True
            self._wake.set()

    def link_down(self, state: SinkState, error: str, lost: bool) -> None:
        if self._hanging_up:
            return
        if not lost or self._state == SinkState.CONNECTED:  # a refused CONNACK keeps its reason
            self._set_state(state, error)
        lost_qos0 = [mid for mid, (msg, _) in self._unacked.items() if msg.qos == 0]
        for mid in lost_qos0:
            del self._unacked[mid]
        self._count_dropped(len(lost_qos0))
        self._carried = set(self._unacked)
        self._wake.set()

    def _set_state(self, state: SinkState, error: str | None) -> None:
        error = self._mask(error)
        if (state, error) == (self._state, self._last_error):
            return  # the same failure again: logged once, not every retry
        self._state, self._last_error = state, error
        where = f"{self.config.host}:{self.config.port}"
        if state in (SinkState.CONNECTED, SinkState.STOPPED):
            log.info("mqtt sink %s %s (%s)", self.name, state, where)
        else:
            log.warning("mqtt sink %s %s (%s): %s", self.name, state, where, error)

    def _mask(self, text: str | None) -> str | None:
        secret = self.config.password.get_secret_value() if self.config.password else ""
        return text.replace(secret, "***") if text and secret else text

    def request(self, request: Request) -> None:
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._command(request))
        self._commands.add(task)
        task.add_done_callback(self._commands.discard)

    async def _command(self, request: Request) -> None:
        body = await answer(request, self._on_command)
        self._refused += not body["ok"]
        self._auth_refused += request.auth_refused
        # parse() let through only a response topic under <prefix>/cmd/response/.
        topic = request.reply_topic or f"{self._prefix}/{REPLY}"
        props = None
        if request.correlation is not None and self.config.protocol == "5":
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.CorrelationData = request.correlation
        self._put(Outgoing(topic, encode(body), self._status_qos, False, props))
