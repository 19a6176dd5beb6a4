"""Camera credentials in the state folder, sealed (docs/security.md, "Camera credentials").

A stream added over the API is kept in `server.state_dir` (state.py; the fleet's store,
workers/fleetstore.py) so that a restart brings it back, and its source URL often holds
the camera's password (`rtsp://user:pw@cam`, `?password=`). The document keeps that URL
masked (`mask_url`: a person reading the file still sees which camera) and, beside it,
the whole URL sealed with Fernet (`cryptography`: AES-128-CBC and HMAC-SHA256 over a
timestamped token) under the key in `APPLIANCE_STATE_KEY`. A copy of the folder, a
backup, or anyone who may read it learns no password without the key, which lives in
the environment (a Kubernetes Secret, say), never in the folder.

Without a usable key nothing with credentials is kept: over the API such a stream is
refused (422) when there is a state folder. A document written in clear by an older
version still loads: sealed at the next start with a key, else kept with a WARNING.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken

from appliance.config import ConfigError
from appliance.policy.masking import mask_url

KEY_ENV = "APPLIANCE_STATE_KEY"
MAKE_KEY = (
    'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
)


class SealError(ValueError):
    """A sealed URL that cannot be opened: no key, or another key than the one it was
    sealed with. The message says which, never the token."""


def has_credentials(url: str) -> bool:
    """Whether `url` holds anything `mask_url` masks: userinfo, a secret parameter."""
    return mask_url(url) != url


@dataclass(frozen=True, slots=True)
class Sealer:
    """The state key, or why there is none (`problem`, "" with a key; `given`: a key
    was set, usable or not)."""

    fernet: Fernet | None
    problem: str
    given: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Sealer:
        text = environ.get(KEY_ENV, "").strip()
        if not text:
            return cls(None, f"{KEY_ENV} is not set")
        try:
            return cls(Fernet(text.encode("ascii")), "", given=True)
        except (ValueError, UnicodeEncodeError):  # binascii.Error is a ValueError
            problem = f"{KEY_ENV} is not a Fernet key (32 url-safe base64-encoded bytes)"
            return cls(None, problem, given=True)

    @property
    def usable(self) -> bool:
        return self.fernet is not None

    def seal(self, url: str) -> str:
        """The Fernet token of `url`; only with a key (`usable`)."""
        if self.fernet is None:
            raise SealError(self.problem)
        return self.fernet.encrypt(url.encode()).decode("ascii")

    def kept(self, url: str) -> tuple[str, str | None]:
        """`url` as a document keeps it, and its token: masked and sealed beside when it
        holds credentials and there is a key; else as it is, and None."""
        if self.fernet is None or not has_credentials(url):
            return url, None
        return mask_url(url), self.seal(url)

    def unseal(self, token: str) -> str:
        """The URL sealed in `token`; SealError when this key cannot open it."""
        if self.fernet is None:
            raise SealError(f"its source URL is sealed and {self.problem}")
        try:
            return self.fernet.decrypt(token.encode("ascii")).decode()
        except (InvalidToken, UnicodeError):
            raise SealError(f"its source URL is sealed with another key than {KEY_ENV}'s") from None

    def check(self, url: str, where: str) -> None:
        """Before a stream is kept: ConfigError (422) naming `source.url` (in `where`, the
        stream) when `url` holds credentials that, without a key, would be kept in clear."""
        if self.fernet is None and has_credentials(url):
            refusal = (
                f"holds credentials, and the state folder (server.state_dir) keeps streams "
                f"added over the API, sealed, but {self.problem}: set {KEY_ENV} to a Fernet "
                f"key (make one with {MAKE_KEY}) and restart, or give the camera without "
                "credentials in its URL"
            )
            raise ConfigError([f"source.url: {refusal}"], where)


# What the fix says for a stream that could not be unsealed at start.
UNSEAL_FIX = f"set {KEY_ENV} to the key that sealed it and restart, or DELETE it"
CLEAR_FIX = f"set {KEY_ENV} (make a key with {MAKE_KEY}) and restart to seal them"
