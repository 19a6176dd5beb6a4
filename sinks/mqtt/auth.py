"""Signed MQTT commands (`commands.auth: hmac`): who may make the appliance act.

The broker is a trust boundary: any client its ACLs let publish to `<prefix>/cmd/...` can
send a command. With `auth: hmac` a command runs only when it carries, as the MQTT 5 user
property `signature`, sinks.signing's header over its full topic and its payload bytes:

    signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<topic>.<payload>")>

The topic is the signed id, so a signed restart of one stream cannot be moved to another.
A signature is refused when it is missing, malformed, does not match, lies outside
`tolerance_s` of the appliance's clock, or was already used (the same time, topic and
payload: a replay) within that window, in this process or, with a state folder, an
earlier one; without one, when it was made before the sink started (mqtt_replay). The
response topic and correlation data are not signed: they only steer the answer, which
stays under the prefix (mqtt_commands).
"""

from __future__ import annotations

from sinks.base import KeptDocument
from sinks.mqtt.config import MqttCommands
from sinks.mqtt.replay import UsedSignatures
from sinks.signing import SignatureError, digest, verify

PROPERTY = "signature"  # the MQTT 5 user property that carries the signature


class CommandAuth:
    """Checks commands' signatures; the used ones are remembered (mqtt_replay)."""

    def __init__(self, secret: bytes, tolerance_s: float, used: UsedSignatures) -> None:
        self._secret, self._tolerance_s, self._used = secret, tolerance_s, used

    def refusal(
        self, topic: str, payload: bytes, header: str | None, now: float | None = None
    ) -> str | None:
        """Why the command on `topic` may not run (never the secret), or None: it is
        signed, in time and new, and is remembered from now on."""
        if header is None:
            return f"unsigned: commands.auth is hmac, give the {PROPERTY!r} user property"
        try:
            signed_at = verify(
                self._secret, header, topic, payload, tolerance_s=self._tolerance_s, now=now
            )
        except SignatureError as exc:
            return f"bad signature: {exc}"
        # The message's own digest is its id: the topic alone would be every profiling
        # command's, and the header may carry a second v1 to vary it by.
        return self._used.refusal(digest(self._secret, signed_at, topic, payload), signed_at, now)


def command_auth(
    sink: str, cfg: MqttCommands, kept: KeptDocument | None = None
) -> CommandAuth | None:
    """The check for `cfg.auth` (None: `none`, every command runs), with the signatures
    already used read from `kept` (None: no state folder). ValueError, naming the field,
    when `hmac` has no key: `secret_file` is read by the runtime, through its file
    policy, into `secret` before the sink is built."""
    if not cfg.enabled or cfg.auth == "none":
        return None
    key = cfg.secret.get_secret_value() if cfg.secret is not None else ""
    if not key:
        field = "secret_file" if cfg.secret_file is not None else "secret"
        raise ValueError(
            f"sinks.{sink}.commands.{field}: no HMAC key (the file was not read, or is empty)"
        )
    used = UsedSignatures(sink, cfg.tolerance_s, kept)  # read now: the sink's start
    return CommandAuth(key.encode("utf-8"), cfg.tolerance_s, used)


def signature_of(user_properties: object) -> str | None:
    """The `signature` user property of a PUBLISH (paho: a list of (name, value) pairs),
    the first when several are given; None when there is none."""
    for pair in user_properties if isinstance(user_properties, list) else ():
        if isinstance(pair, tuple) and len(pair) == 2 and pair[0] == PROPERTY:
            return str(pair[1])
    return None
