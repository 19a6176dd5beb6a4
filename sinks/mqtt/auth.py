"""Signed MQTT commands (`commands.auth: hmac`): who may make the appliance act.

The broker is a trust boundary: any client its ACLs let publish to `<prefix>/cmd/...` can
send a command. With `auth: hmac` a command runs only when it carries, as the MQTT 5 user
property `signature`, sinks.signing's header over its full topic and its payload bytes:

    signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<topic>.<payload>")>

The topic is the signed id, so a signed restart of one stream cannot be moved to another.
A signature is refused when it is missing, malformed, does not match, lies outside
`tolerance_s` of the appliance's clock, or was already used (the same time, topic and
payload: a replay) within that window. The response topic and correlation data are not
signed: they only steer the answer, which stays under the prefix (mqtt_commands).
"""

from __future__ import annotations

from sinks.mqtt.config import MqttCommands
from sinks.signing import ReplayGuard, SignatureError, signature, verify

PROPERTY = "signature"  # the MQTT 5 user property that carries the signature
# Signatures remembered within the tolerance window, the oldest forgotten first: a replay
# gets through only after this many newer signed commands in one window (5 minutes).
MAX_SEEN = 10_000


class CommandAuth:
    """Checks commands' signatures and remembers the used ones."""

    def __init__(self, secret: bytes, tolerance_s: float) -> None:
        self._secret, self._tolerance_s = secret, tolerance_s
        self._seen = ReplayGuard(tolerance_s, MAX_SEEN)

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
        if not self._seen.accept(
            signature(self._secret, signed_at, topic, payload), signed_at, now
        ):
            return "replayed: this signature was already used (sign each command anew)"
        return None


def command_auth(sink: str, cfg: MqttCommands) -> CommandAuth | None:
    """The check for `cfg.auth` (None: `none`, every command runs). ValueError, naming the
    field, when `hmac` has no key: `secret_file` is read by the runtime, through its file
    policy, into `secret` before the sink is built."""
    if not cfg.enabled or cfg.auth == "none":
        return None
    key = cfg.secret.get_secret_value() if cfg.secret is not None else ""
    if not key:
        field = "secret_file" if cfg.secret_file is not None else "secret"
        raise ValueError(
            f"sinks.{sink}.commands.{field}: no HMAC key (the file was not read, or is empty)"
        )
    return CommandAuth(key.encode("utf-8"), cfg.tolerance_s)


def signature_of(user_properties: object) -> str | None:
    """The `signature` user property of a PUBLISH (paho: a list of (name, value) pairs),
    the first when several are given; None when there is none."""
    for pair in user_properties if isinstance(user_properties, list) else ():
        if isinstance(pair, tuple) and len(pair) == 2 and pair[0] == PROPERTY:
            return str(pair[1])
    return None
