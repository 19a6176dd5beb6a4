"""Secrets stay secret: the one function that masks credentials in any text, and the
logging filter that runs it on every record as the last guard.

`mask_url` masks three things wherever they appear in a text (a URL, an FFmpeg error
message, a traceback, a JSON document):

- the userinfo of a URL with a scheme: `rtsp://admin:pw@cam/live` -> `rtsp://***:***@cam/live`;
  greedy up to the last "@" before the path, so a password containing "@" is masked whole;
- the value of a query, fragment or `;` parameter whose name, lower-cased, contains one of
  `pass` (password, passwd, passphrase), `pwd`, `token`, `key`, `secret`, `auth`,
  `signature`, `credential`, or is exactly `pw` or `sig`: the name stays, the value
  becomes `***`. It needs no scheme (`cam.local/live?pwd=x` is masked too). Where the
  names come from: camera URLs (`?user=admin&password=`, Foscam's `pwd=`), OAuth 2.0
  (RFC 6749, RFC 6750: `access_token`, `refresh_token`, `client_secret`), AWS SigV4
  presigned URLs (`X-Amz-Signature`, `X-Amz-Credential`, `X-Amz-Security-Token`), Google
  signed URLs (`X-Goog-Signature`), Azure SAS (`sig`), API keys (`api_key`, `apikey`,
  `key`). Matching by substring masks some harmless values too (`keyframe=1`,
  `author=x`): a masked value costs nothing, a leaked one does;
- an HTTP credential: `Bearer <token>` (capitalised, as clients send it) and
  `Authorization: <scheme> <credentials>`.

A value ends at the next `&`, `;` or `#`, at whitespace, or at a character a URL cannot
hold unencoded (`"`, `<`, `>`), so it stays inside its URL in a JSON text or an HTML
page. Closing punctuation (`'`, `)`, `]`, `:`, `,`, `.`) where the URL ends is kept:
`'rtsp://h/x?token=abc': refused` reads `'rtsp://h/x?token=***': refused`. A value made
of such characters only is masked whole. Names are matched as written: percent-encoded
names are not decoded.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from pipelines.errors import SECRET_WORDS

MASK = "***"

# scheme://user:pass@host -> scheme://***:***@host. \s and the characters a URL cannot
# hold unencoded keep the match inside one URL of a text.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s\"<>]*@")

_SECRET_WORDS = SECRET_WORDS  # shared with config errors (pipelines/errors.py)
_SECRET_NAMES = ("pw", "sig")  # too short to match inside other names
_NAME = r"[^=&;#?\s/\"<>]"  # a parameter name's characters
_VALUE = r"[^&;#\s\"<>]"  # a value ends at the next parameter, or where its URL ends
_TAIL = "')]:,."  # closing punctuation kept where a URL ends
# The lookahead finds a secret word in the name; being atomic, it keeps a long name that
# is not followed by "=" linear to scan.
_PARAM = re.compile(
    rf"(?P<name>[?&;#](?:(?={_NAME}*?(?:{'|'.join(_SECRET_WORDS)})){_NAME}++"
    rf"|(?:{'|'.join(_SECRET_NAMES)}))=)(?P<value>{_VALUE}*+)",
    re.IGNORECASE,
)
# RFC 6750's b64token (token68 of RFC 9110) after "Bearer" as clients write it (so prose
# such as "missing bearer token" stays), or any credentials after an Authorization header
# name in any case (as written in a text, a dict repr or JSON).
_HTTP_AUTH = re.compile(
    r"(?P<lead>\bBearer\s+|\b(?i:authorization)[\"']?\s*[:=]\s*[\"']?\w+\s+)"
    r"[A-Za-z0-9._~+/-]+=*"
)


def mask_url(text: str) -> str:
    """`text` with the userinfo and the secret parameter values of every URL in it, and
    any HTTP bearer or Authorization credential, replaced by `***`.

    Use it on anything that may carry a URL before it reaches a log, an API answer, an
    error or a state reason: FFmpeg's error messages include the URL they failed on.
    """
    # It runs on every log record: the cheap substring tests skip most regex scans.
    if "://" in text:
        text = _USERINFO.sub(rf"\g<scheme>{MASK}:{MASK}@", text)
    if "=" in text:
        text = _PARAM.sub(_mask_param, text)
    if "Bearer" in text or "uthorization" in text.lower():
        text = _HTTP_AUTH.sub(rf"\g<lead>{MASK}", text)
    return text


def _mask_param(match: re.Match[str]) -> str:
    value = match["value"]
    secret = value.rstrip(_TAIL)
    end = match.end()
    at_url_end = end == len(match.string) or match.string[end] not in "&;#"
    # Punctuation inside a value, or a value of punctuation only, is part of the secret.
    tail = value[len(secret) :] if secret and at_url_end else ""
    return f"{match['name']}{MASK}{tail}"


class MaskingFilter(logging.Filter):
    """Rewrites a record's final message, exception and stack text through `mask_url`.

    Install it on handlers (not loggers: a logger's filters do not see records of its
    children). It changes the record in place, so every later handler sees it masked.
    """

    _formatter = logging.Formatter()  # formatException: the default traceback text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format: leave it to the handler's own error report
            return True
        record.msg, record.args = mask_url(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask_url(record.exc_text)
        if record.stack_info:
            record.stack_info = mask_url(record.stack_info)
        return True


def install(handlers: Iterable[logging.Handler]) -> None:
    """Add one MaskingFilter to each handler, after its other filters (the last guard)."""
    for handler in handlers:
        if not any(isinstance(f, MaskingFilter) for f in handler.filters):
            handler.addFilter(MaskingFilter())
