"""Secrets stay secret: the one function that masks credentials in any text, and the
logging filter that runs it on every record as the last guard.

`mask_url` masks three things wherever they appear in a text (a URL, an FFmpeg error
message, a traceback, a JSON document):

- the userinfo of a URL with a scheme: `rtsp://admin:pw@cam/live` -> `rtsp://***:***@cam/live`;
  greedy up to the last "@" (or "%40") before the path, so a password containing "@" is
  masked whole. Malformed forms that FFmpeg or a browser still reads as userinfo are
  masked too: whitespace after the slashes (`rtsp:// admin:pw@cam`), backslashes for
  slashes (`http:\\\\u:pw@cam`), one slash or none (`rtsp:/admin:pw@cam`, `rtsp:admin:pw@cam`:
  there, only a `user:password` pair, so that prose such as `note:me@host` stays);
- the value of a query, fragment, `;` or path parameter whose name, lower-cased, contains one of
  `pass` (password, passwd, passphrase), `pwd`, `token`, `key`, `secret`, `auth`,
  `signature`, `credential`, or is exactly `pw` or `sig`: the name stays, the value
  becomes `***`. It needs no scheme (`cam.local/live?pwd=x` is masked too). Where the
  names come from: camera URLs (`?user=admin&password=`, Foscam's `pwd=`), OAuth 2.0
  (RFC 6749, RFC 6750: `access_token`, `refresh_token`, `client_secret`), AWS SigV4
  presigned URLs (`X-Amz-Signature`, `X-Amz-Credential`, `X-Amz-Security-Token`), Google
  signed URLs (`X-Goog-Signature`), Azure SAS (`sig`), API keys (`api_key`, `apikey`,
  `key`), camera paths (Dahua's and XMEye's `/user=admin_password=pw_channel=1`, where
  `_` and `/` separate the pairs as well). Matching by substring masks some harmless
  values too (`keyframe=1`, `author=x`, `max_keys=5`): a masked value costs nothing, a
  leaked one does;
- an HTTP credential: `Bearer <token>` (capitalised, as clients send it) and
  `Authorization: <scheme> <credentials>`.

A value ends at the next `&`, `;` or `#`, at whitespace, or at a character a URL cannot
hold unencoded (`"`, `<`, `>`), so it stays inside its URL in a JSON text or an HTML
page. A path parameter's value (after `/` or `_`) ends sooner: at `/`, `?`, or the `_`
of a next `_name=` (`password=pw_channel=1` -> `password=***_channel=1`). Closing
punctuation (`'`, `)`, `]`, `:`, `,`, `.`) where the URL ends is kept:
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

# Where a URL's userinfo may begin: after its scheme and two slashes (or backslashes, as
# browsers read them) and any whitespace (FFmpeg skips it), or after one slash or none
# before a `user:` (so that prose such as `note:me@host` stays). A scheme does not start
# inside a longer one, and nothing backtracks: each character is looked at a few times.
_AUTHORITY = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*+:)"
    r"(?P<slashes>[/\\]{2}\s*+|[/\\]?(?=[^/\\\s\"<>:@]++:))"
)
# Where the userinfo must have ended: the path, or the end of the URL in a text.
_RUN_END = re.compile(r"[/\s\"<>]")

_SECRET_WORDS = SECRET_WORDS  # shared with config errors (pipelines/errors.py)
_SECRET_NAMES = ("pw", "sig")  # too short to match inside other names
_NAME = r"[^=&;#?\s/\"<>]"  # a parameter name's characters
_PART = r"[^=&;#?\s/\"<>_]"  # after a "_" separator: no "_" (linear to scan)
_VALUE = r"[^&;#\s\"<>]"  # a value ends at the next parameter, or where its URL ends
# In a path (Dahua's /user=admin_password=x_channel=1) a value also ends at "/", "?" or the
# "_" of a next pair. The lookahead stops at the next "_": linear to scan.
_PATH_VALUE = r"(?:(?!_[A-Za-z0-9]+=)[^&;#\s\"<>/?])"
_ENDS = "&;#/?_"  # where a value ends when more of its URL follows
_TAIL = "')]:,."  # closing punctuation kept where a URL ends


def _secret_name(chars: str) -> str:
    """A name of `chars` holding a secret word, or a short secret name. The lookahead
    finds the word; being atomic, it keeps a long name not followed by "=" linear to scan."""
    words, names = "|".join(_SECRET_WORDS), "|".join(_SECRET_NAMES)
    return rf"(?:(?={chars}*?(?:{words})){chars}++|(?:{names}))"


_PARAM = re.compile(
    rf"(?P<name>(?:(?P<query>[?&;#])|/){_secret_name(_NAME)}=|_{_secret_name(_PART)}=)"
    rf"(?P<value>(?(query){_VALUE}*+|{_PATH_VALUE}*+))",
    re.IGNORECASE,
)
# RFC 6750's b64token (token68 of RFC 9110) after "Bearer" as clients write it (so prose
# such as "missing bearer token" stays), or any credentials after an Authorization header
# name in any case (as written in a text, a dict repr or JSON).
_HTTP_AUTH = re.compile(
    r"(?P<lead>\bBearer\s+|\b(?i:authorization)[\"']?\s*[:=]\s*[\"']?\w+\s+)"
    r"[A-Za-z0-9._~+/-]+=*"
)
# One URL's scheme and the slashes after it, however many or few.
_SCHEME = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*:[/\\\s]*")


def mask_url(text: str) -> str:
    """`text` with the userinfo and the secret parameter values of every URL in it, and
    any HTTP bearer or Authorization credential, replaced by `***`.

    Use it on anything that may carry a URL before it reaches a log, an API answer, an
    error or a state reason: FFmpeg's error messages include the URL they failed on.
    """
    # It runs on every log record: the cheap substring tests skip most regex scans.
    if "@" in text or "%40" in text:
        text = _mask_userinfo(text)
    if "=" in text:
        text = _PARAM.sub(_mask_param, text)
    if "Bearer" in text or "uthorization" in text.lower():
        text = _HTTP_AUTH.sub(rf"\g<lead>{MASK}", text)
    return text


def mask_one_url(url: str) -> str:
    """One URL (not a text that holds URLs), masked as `mask_url` does and, however
    malformed, with everything between its scheme and the last "@" (or "%40") before its
    path masked, whitespace and control characters included: for the messages that
    refuse such a URL."""
    scheme = _SCHEME.match(url)
    if scheme is not None:
        rest = url[scheme.end() :]
        path = rest.find("/")
        authority = rest if path < 0 else rest[:path]
        at = max(authority.rfind("@"), authority.rfind("%40"))
        if at >= 0:
            url = f"{scheme[0]}{MASK}:{MASK}{rest[at:]}"
    return mask_url(url)


def _mask_userinfo(text: str) -> str:
    """Each URL's userinfo, up to the last "@" (or "%40") before the path, masked."""
    out: list[str] = []
    done = 0  # text[:done] is in `out`
    clean = (0, 0)  # a span known to hold no "@" up to its end: candidates there are skipped
    for found in _AUTHORITY.finditer(text):
        start = found.end()
        if found.start() < done or clean[0] <= start <= clean[1]:
            continue
        run = _RUN_END.search(text, start)
        end = len(text) if run is None else run.start()
        at = max(text.rfind("@", start, end), text.rfind("%40", start, end))
        if at < 0:
            clean = (start, end)
            continue
        slashes = found["slashes"].rstrip()
        out += (text[done : found.start()], found["scheme"], slashes, f"{MASK}:{MASK}")
        done, clean = at, (at + 1, end)
    return "".join(out) + text[done:]


def _mask_param(match: re.Match[str]) -> str:
    value = match["value"]
    secret = value.rstrip(_TAIL)
    end = match.end()
    at_url_end = end == len(match.string) or match.string[end] not in _ENDS
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
