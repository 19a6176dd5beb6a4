"""The MQTT sink's link to the broker: the paho client and its callbacks.

paho runs the network on its own thread (`loop_start`): it connects, reconnects with
backoff (`reconnect_delay_set`) and calls the callbacks below there. They do no work of
their own: each turns what paho reports into one call of the sink's `LinkEvents` on the
event loop (`call_soon_threadsafe`, aiortc's explicit thread → loop hand-over). Each is
guarded (mqtt_guard): an exception is logged and counted, and never ends paho's thread;
should that thread end all the same, `revive` starts it again (the sink checks).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import sys
from contextlib import suppress
from dataclasses import replace
from typing import Any, Protocol, cast

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from sinks.base import KeptDocument, SinkState
from sinks.mqtt.auth import command_auth, signature_of
from sinks.mqtt.commands import CommandTopics, Request, parse
from sinks.mqtt.config import MqttConfig
from sinks.mqtt.guard import CallbackGuard

log = logging.getLogger("sinks.mqtt")

PROTOCOLS = {"5": mqtt.MQTTv5, "3.1.1": mqtt.MQTTv311}
IN_FLIGHT = 32  # unacknowledged publishes at once: paho's queue, a reconnect's duplicates
AUTH_REASONS = frozenset({"Not authorized", "Bad user name or password"})  # CONNACK reasons


class LinkEvents(Protocol):
    """What the link reports, called on the event loop."""

    def link_up(self) -> None: ...

    def link_down(self, state: SinkState, error: str, lost: bool) -> None:
        """`lost`: an established connection went down (else an attempt failed)."""

    def acked(self, mid: int) -> None:
        """Publish `mid` is done: acknowledged (QoS ≥ 1) or written (QoS 0)."""

    def request(self, request: Request) -> None:
        """A command request arrived (already checked, see mqtt_commands)."""


def build_client(cfg: MqttConfig) -> mqtt.Client:
    """A paho 2.x client (VERSION2 callbacks) with identity, credentials, TLS and
    backoff set; not connected."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=cfg.client_id,
        protocol=PROTOCOLS[cfg.protocol],
        reconnect_on_failure=True,
    )
    if cfg.username is not None:
        password = cfg.password.get_secret_value() if cfg.password else None
        client.username_pw_set(cfg.username, password)
    if cfg.tls is not None:
        tls = cfg.tls
        client.tls_set(
            ca_certs=None if tls.ca_file is None else str(tls.ca_file),
            certfile=None if tls.cert_file is None else str(tls.cert_file),
            keyfile=None if tls.key_file is None else str(tls.key_file),
        )
        client.tls_insecure_set(tls.insecure)
    client.max_inflight_messages_set(IN_FLIGHT)
    # paho annotates int, but only adds and compares: fractions of a second work.
    client.reconnect_delay_set(cast(int, cfg.reconnect.initial_s), cast(int, cfg.reconnect.max_s))
    return client


def _close_wakeup_pair(client: mqtt.Client) -> None:
    """Close the socket pair by which `publish` wakes paho's thread, once it has ended:
    `loop_start` opens a new one and leaves the old open, and `loop_stop` leaves it too
    (only the client's `__del__` and `reinitialise` close it, with this routine of paho's
    own: paho 2.x has no public one)."""
    client._reset_sockets(sockpair_only=True)


class Link:
    """One paho client, its Last Will, and its callbacks handed to the loop."""

    def __init__(
        self,
        name: str,
        cfg: MqttConfig,
        events: LinkEvents,
        loop: asyncio.AbstractEventLoop,
        topics: CommandTopics,
        kept: KeptDocument | None = None,
    ) -> None:
        self.name, self.cfg, self._events, self._loop = name, cfg, events, loop
        self._topics = topics  # the commands requests may name (the sink's handler's)
        self._prefix = cfg.topic_prefix
        self._auth = command_auth(name, cfg.commands, kept)  # used on paho's thread only
        self.attempts = 0  # connection attempts, each one counted by paho's thread
        self.guard = guard = CallbackGuard(name)  # no exception ends paho's thread
        self._closing = False  # close() began: paho's thread ends, and stays ended
        self.client = client = build_client(cfg)
        client.on_pre_connect = guard(self._on_pre_connect)
        client.on_connect = guard(self._on_connect)
        client.on_connect_fail = guard(self._on_connect_fail)
        client.on_disconnect = guard(self._on_disconnect)
        client.on_publish = guard(self._on_publish)
        client.on_subscribe = guard(self._on_subscribe)
        client.on_message = guard(self._on_message)
        qos = max(cfg.qos, 1)
        client.will_set(f"{self._prefix}/status", b"offline", qos, cfg.retain_status)

    def start(self) -> None:
        """Connect in the background: paho's thread keeps trying until it works."""
        self.client.connect_async(self.cfg.host, self.cfg.port, self.cfg.keepalive_s)
        self.client.loop_start()

    def revive(self) -> bool:
        """Start paho's network thread again if it has ended while the link should run
        (past the callback guard: a bug in paho, a caller's `loop_stop`); True when it
        had. The connection is dropped then, so that paho connects afresh: while nobody
        read it, keep-alives and acknowledgements went unanswered."""
        # paho has no public view of its thread: it clears `_thread` as the thread ends
        # (`_thread_main`'s `finally`), and `loop_start` starts none while it is set.
        if self._closing or self.client._thread is not None:
            return False
        _close_wakeup_pair(self.client)
        self.client.loop_start()
        sock = self.client.socket()
        if isinstance(sock, socket.socket):  # ssl.SSLSocket too
            with suppress(OSError):  # already closed by the peer: paho sees it either way
                sock.shutdown(socket.SHUT_RDWR)  # paho reads the end: on_disconnect, reconnect
        return True

    async def close(self) -> None:
        """DISCONNECT (the broker then drops the Will) and join paho's thread."""
        self._closing = True
        self.client.disconnect()
        await asyncio.to_thread(self.client.loop_stop)  # its waits last ≤ 1 s each
        _close_wakeup_pair(self.client)  # else left to the client's __del__, whenever that runs

    def _post(self, fn: Any, *args: Any) -> None:
        with suppress(RuntimeError):  # the loop has closed: nobody is listening
            self._loop.call_soon_threadsafe(fn, *args)

    # -- paho's thread ------------------------------------------------------------------
    def _on_pre_connect(self, client: mqtt.Client, userdata: Any) -> None:
        self.attempts += 1

    def _on_connect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, props: Any
    ) -> None:
        if reason.is_failure:
            name = reason.getName()
            state = SinkState.AUTH_FAILED if name in AUTH_REASONS else SinkState.REFUSED
            error = f"broker refused the connection: {name}"
            self._post(self._events.link_down, state, error, False)
            return
        if self.cfg.commands.enabled:
            self._subscribe(client)
        self._post(self._events.link_up)

    def _subscribe(self, client: mqtt.Client) -> None:
        topic = f"{self._prefix}/cmd/#"
        if self.cfg.protocol == "5":  # noLocal: our own answers do not come back
            client.subscribe(topic, options=SubscribeOptions(qos=1, noLocal=True))
        else:
            client.subscribe(topic, qos=1)

    def _on_subscribe(
        self, client: mqtt.Client, userdata: Any, mid: int, reasons: list[ReasonCode], props: Any
    ) -> None:
        if any(r.is_failure for r in reasons):
            log.error("mqtt sink %s: commands refused by the broker: %s", self.name, reasons)
        else:
            log.info("mqtt sink %s: commands on %s/cmd/#", self.name, self._prefix)

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        # paho calls this inside its `except OSError:` block: the exception is current.
        exc = sys.exception()
        if isinstance(exc, ssl.SSLError | ssl.CertificateError):
            self._post(self._events.link_down, SinkState.TLS_FAILED, f"TLS: {exc}", False)
        else:
            where = f"{self.cfg.host}:{self.cfg.port}"
            error = f"cannot reach {where}: {exc}"
            self._post(self._events.link_down, SinkState.RECONNECTING, error, False)

    def _on_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, props: Any
    ) -> None:
        error = f"connection lost: {reason.getName()}"
        self._post(self._events.link_down, SinkState.RECONNECTING, error, True)

    def _on_publish(
        self, client: mqtt.Client, userdata: Any, mid: int, reason: ReasonCode, props: Any
    ) -> None:
        self._post(self._events.acked, mid)

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        request = self._request(msg)
        if request is not None:
            self._post(self._events.request, request)

    def _request(self, msg: mqtt.MQTTMessage) -> Request | None:
        """The command `msg` carries, checked (refused: `error` set); None for our own."""
        props, payload = msg.properties, bytes(msg.payload)
        request = parse(
            msg.topic[len(self._prefix) + 1 :],
            payload,
            self.cfg.commands.max_payload_bytes,
            getattr(props, "ResponseTopic", None),
            getattr(props, "CorrelationData", None),
            prefix=self._prefix,
            topics=self._topics,
            retained=bool(msg.retain),
        )
        if request is None or request.error is not None or self._auth is None:
            return request
        header = signature_of(getattr(props, "UserProperty", None))
        refusal = self._auth.refusal(msg.topic, payload, header)
        return request if refusal is None else replace(request, error=refusal, auth_refused=True)
