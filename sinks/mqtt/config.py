"""The MQTT sink's configuration (`sinks: {bus: {type: mqtt, ...}}`), validated once.

```yaml
sinks:
  bus:
    type: mqtt
    host: broker.local
    port: 8883
    protocol: "5"            # "5" | "3.1.1"
    qos: 1                   # 0: fire and forget (Frigate's choice); 1, 2: queued offline
    topic_prefix: appliance
    username: cam
    password: secret         # never logged, never in status or repr
    tls: {ca_file: /etc/ssl/ca.pem, cert_file: client.pem, key_file: client.key}
    queue: {max_messages: 10000, max_bytes: 16777216}
    reconnect: {initial_s: 0.5, max_s: 30}
    commands: {enabled: false, max_payload_bytes: 4096, auth: none}
    # signed commands (MQTT 5 only): {enabled: true, auth: hmac, secret_file: /run/secrets/cmd}
```

TLS paths and secret files are accepted as paths here; the runtime checks them (and reads
the secret files) through its file policy.
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

MIB = 1024 * 1024


def _default_client_id() -> str:
    # The broker drops an older session with the same id: ids must differ per appliance.
    host = socket.gethostname() or uuid.uuid4().hex[:12]
    return f"appliance-{host}"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MqttTls(_Frozen):
    """TLS to the broker: a CA to trust (system CAs when absent), a client certificate."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure: bool = False  # skip the host name check (self-signed lab brokers only)

    @model_validator(mode="after")
    def _key_needs_cert(self) -> MqttTls:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("tls.key_file needs tls.cert_file")
        return self


class MqttQueue(_Frozen):
    """The offline queue: bounded by count and bytes; past either, the oldest go."""

    max_messages: Annotated[int, Field(ge=1)] = 10_000
    max_bytes: Annotated[int, Field(ge=1024)] = 16 * MIB


class MqttBackoff(_Frozen):
    """Reconnect waits: `initial_s`, doubled per failed attempt, capped at `max_s`."""

    initial_s: Annotated[float, Field(gt=0.0)] = 0.5
    max_s: Annotated[float, Field(gt=0.0)] = 30.0

    @model_validator(mode="after")
    def _ordered(self) -> MqttBackoff:
        if self.max_s < self.initial_s:
            raise ValueError(f"reconnect.max_s ({self.max_s}) < initial_s ({self.initial_s})")
        return self


class MqttCommands(_Frozen):
    """`<prefix>/cmd/...` requests; off unless enabled (they restart streams).

    `auth: hmac` refuses every request that does not carry a valid `signature` (MQTT 5
    user property, sinks.signing's scheme over the request's topic and payload) made with
    `secret` within `tolerance_s` of now, or that repeats one already seen."""

    enabled: bool = False
    max_payload_bytes: Annotated[int, Field(ge=16, le=MIB)] = 4096
    auth: Literal["none", "hmac"] = "none"
    secret: SecretStr | None = Field(default=None, min_length=1, repr=False)  # the HMAC key
    # The key read from a file instead (a mounted secret), through the file policy.
    secret_file: Path | None = None
    # How far a signed time may be from the appliance's clock, seconds (Stripe's default).
    tolerance_s: Annotated[float, Field(gt=0, le=3600)] = 300.0

    @model_validator(mode="after")
    def _one_secret_for_hmac(self) -> MqttCommands:
        given = (self.secret is not None) + (self.secret_file is not None)
        if self.auth == "hmac" and given != 1:
            raise ValueError("auth: hmac needs one of secret, secret_file")
        if self.auth == "none" and given:
            raise ValueError("secret, secret_file: only with auth: hmac")
        return self


class MqttSnapshots(_Frozen):
    """`<prefix>/<stream>/snapshot`: a JPEG of the `video` output when a result has events
    (a line crossed, a class appeared), at most one per stream every `min_interval_s`."""

    enabled: bool = False
    quality: Annotated[int, Field(ge=1, le=100)] = 80  # OpenCV's JPEG scale
    # Encoding a 640x480 JPEG takes a few ms of the stream's worker: this bounds its share.
    min_interval_s: Annotated[float, Field(ge=0.0)] = 1.0
    retain: bool = True  # a dashboard that subscribes later sees the last one at once


class MqttConfig(_Frozen):
    type: Literal["mqtt"]
    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 1883
    protocol: Literal["5", "3.1.1"] = "5"
    client_id: Annotated[str, Field(min_length=1, max_length=128)] = Field(
        default_factory=_default_client_id
    )
    keepalive_s: Annotated[int, Field(ge=5, le=65535)] = 30  # MQTT's field is 16-bit seconds
    qos: Literal[0, 1, 2] = 1
    topic_prefix: str = "appliance"
    username: str | None = None
    password: SecretStr | None = Field(default=None, repr=False)
    # The password read from a file instead (a mounted Kubernetes Secret, a Docker
    # secret): the appliance reads it through its file policy when the sink starts.
    password_file: Path | None = None
    tls: MqttTls | None = None
    queue: MqttQueue = MqttQueue()
    reconnect: MqttBackoff = MqttBackoff()
    commands: MqttCommands = MqttCommands()
    snapshots: MqttSnapshots = MqttSnapshots()
    retain_status: bool = True

    @field_validator("topic_prefix")
    @classmethod
    def _plain_topic(cls, v: str) -> str:
        if not v or any(level == "" for level in v.split("/")):
            raise ValueError(f"topic_prefix {v!r}: no empty levels (no leading/trailing '/')")
        if any(c in v for c in "+#\0"):
            raise ValueError(f"topic_prefix {v!r}: wildcards '+' and '#' are not allowed")
        return v

    @model_validator(mode="after")
    def _password_needs_user(self) -> MqttConfig:
        if self.password is not None and self.password_file is not None:
            raise ValueError("password and password_file: give one")
        if (self.password or self.password_file) is not None and self.username is None:
            raise ValueError("password needs username")
        if self.commands.auth == "hmac" and self.protocol != "5":
            raise ValueError(
                'commands.auth: hmac needs protocol "5" (the signature is an MQTT 5 user property)'
            )
        return self
