"""The MQTT sink's link to the broker: the paho client and its callbacks.

paho runs the network on its own thread (`loop_start`): it connects, reconnects with
backoff (`reconnect_delay_set`) and calls the callbacks below there. They do no work of
their own: each turns what paho reports into one call of the sink's `LinkEvents` on the
event loop (`call_soon_threadsafe`, aiortc's explicit thread → loop hand-over).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import sys
from contextlib import suppress
from dataclasses import replace
from typing import Any, Protocol, cast

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from sinks.base import SinkState
from sinks.mqtt.auth import command_auth, signature_of
from sinks.mqtt.commands import CommandTopics, Request, parse
from sinks.mqtt.config import MqttConfig

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


class Link:
    """One paho client, its Last Will, and its callbacks handed to the loop."""

    def __init__(
        self,
        name: str,
        cfg: MqttConfig,
        events: LinkEvents,
        loop: asyncio.AbstractEventLoop,
        topics: CommandTopics,
    ) -> None:
        self.name, self.cfg, self._events, self._loop = name, cfg, events, loop
        self._topics = topics  # the commands requests may name (the sink's handler's)
        self._prefix = cfg.topic_prefix
        self._auth = command_auth(name, cfg.commands)  # used on paho's thread only
        self.attempts = 0  # connection attempts, each one counted by paho's thread
        self.client = client = build_client(cfg)
        client.on_pre_connect = self._on_pre_connect
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        qos = max(cfg.qos, 1)
        client.will_set(f"{self._prefix}/status", b"offline", qos, cfg.retain_status)

    def start(self) -> None:
        """Connect in the background: paho's thread keeps trying until it works."""
        self.client.connect_async(self.cfg.host, self.cfg.port, self.cfg.keepalive_s)
        self.client.loop_start()

    async def close(self) -> None:
        """DISCONNECT (the broker then drops the Will) and join paho's thread."""
        self.client.disconnect()
        await asyncio.to_thread(self.client.loop_stop)  # its waits last ≤ 1 s each

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
        props, payload = msg.properties, bytes(msg.payload)
        request = parse(
            msg.topic[len(self._prefix) + 1 :],
            payload,
            self.cfg.commands.max_payload_bytes,
            getattr(props, "ResponseTopic", None),
            getattr(props, "CorrelationData", None),
            prefix=self._prefix,
            topics=self._topics,
        )
        if request is not None and request.error is None and self._auth is not None:
            header = signature_of(getattr(props, "UserProperty", None))
            refusal = self._auth.refusal(msg.topic, payload, header)
            if refusal is not None:
                request = replace(request, error=refusal, auth_refused=True)
        if request is not None:
            self._post(self._events.request, request)
