"""`mask_url`, the one masking function, and the logging filter that applies it to every
record: userinfo and secret parameters of URLs in any text, and HTTP credentials."""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.policy.masking import MaskingFilter, install, mask_one_url, mask_url
from appliance.sources import mask_url as reexported

# The words alone, then inside names as services spell them, then the short
# names matched exactly (Azure SAS, some cameras).
SECRET_NAMES = [
    *("password", "passwd", "pwd", "pass", "token", "key", "secret", "auth", "signature"),
    *("credential", "api_key", "apikey", "auth_token", "access_token", "refresh_token"),
    *("client_secret", "passphrase", "private-key", "authorization", "X-Goog-Signature"),
    *("X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token"),
    *("sig", "pw"),
]
KEPT_NAMES = ["user", "username", "channel", "subtype", "X-Amz-Expires", "sigma", "pwx", "q"]


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("rtsp://admin:hunter2@10.0.0.5:554/live", "rtsp://***:***@10.0.0.5:554/live"),
        ("http://user@cam/video.mjpg", "http://***:***@cam/video.mjpg"),
        ("rtsp://u:p@ss&w@cam/x", "rtsp://***:***@cam/x"),  # "@" and "&" in the password
        ("rtsp://cam/x?user=admin&password=p%40s%26w", "rtsp://cam/x?user=admin&password=***"),
        ("rtsp://cam/x?password=a%20b%2Fc&channel=1", "rtsp://cam/x?password=***&channel=1"),
        ("RTSP://U:P@CAM/X?PASSWORD=Y", "RTSP://***:***@CAM/X?PASSWORD=***"),
        ("http://cam/cb#access_token=xyz&state=1", "http://cam/cb#access_token=***&state=1"),
        ("rtsp://cam/live;password=x;channel=1", "rtsp://cam/live;password=***;channel=1"),
        ("cam.local/live?pwd=x&channel=1", "cam.local/live?pwd=***&channel=1"),  # no scheme
        ("/media/clip.mp4?token=x", "/media/clip.mp4?token=***"),
        (
            "failed 'rtsp://a:b@h1/x?token=t1' then 'http://h2/y?key=k2&z=1': refused",
            "failed 'rtsp://***:***@h1/x?token=***' then 'http://h2/y?key=***&z=1': refused",
        ),
        (
            "Invalid data: 'rtsp://cam/x?password=abc')\n  retrying",
            "Invalid data: 'rtsp://cam/x?password=***')\n  retrying",
        ),
        (
            '{"url": "rtsp://cam/?token=abc", "b": "x@y"}',
            '{"url": "rtsp://cam/?token=***", "b": "x@y"}',
        ),
        (
            "http://proxy/?to=rtsp://u:p@cam/x?password=y",
            "http://proxy/?to=rtsp://***:***@cam/x?password=***",
        ),
        ("rtsp://cam/x?password=...", "rtsp://cam/x?password=***"),  # punctuation only: all of it
        ("rtsp://cam/x?password=a.b.&c=1", "rtsp://cam/x?password=***&c=1"),
        ("Authorization: Bearer abc.DEF-123", "Authorization: Bearer ***"),
        ("{'authorization': 'Basic dXNlcjpwYUBzcw=='}", "{'authorization': 'Basic ***'}"),
        ("sent Bearer tok3n+/= twice", "sent Bearer *** twice"),
    ],
)
def test_mask_url(text: str, masked: str) -> None:
    assert mask_url(text) == masked


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_every_secret_name_is_masked_in_any_case(name: str) -> None:
    for spelled in (name, name.upper(), name.title()):
        url = f"rtsp://cam/live?user=admin&{spelled}=v4lue&channel=1"
        assert mask_url(url) == f"rtsp://cam/live?user=admin&{spelled}=***&channel=1"


@pytest.mark.parametrize("name", KEPT_NAMES)
def test_other_parameters_are_kept(name: str) -> None:
    url = f"rtsp://cam/live?{name}=v4lue&x=1"
    assert mask_url(url) == url


@pytest.mark.parametrize(
    "text",
    [
        "",
        "stream cam1: running (cam1: 1280x720 at 15 fps)",
        "mail me at a@b.c; a=b & c=d",
        "rtsp://10.0.0.5:554/live?channel=1&subtype=0",
        "/media/clip.mp4",
        "missing bearer token (Authorization: Bearer <token>)",
        "x = 1; keyframes every 2 s",
    ],
)
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert mask_url(text) == text


# Issue 23: forms FFmpeg (or a browser) still reads as user:password@host, and credentials
# in a camera's path. Each masked as it is written, the password nowhere.
@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("rtsp:// admin:PW@cam/x", "rtsp://***:***@cam/x"),  # FFmpeg skips the space
        ("refused 'rtsp://\t admin:PW@cam/x'", "refused 'rtsp://***:***@cam/x'"),
        ("rtsp:/admin:PW@cam/x", "rtsp:/***:***@cam/x"),  # one slash: FFmpeg skips it
        ("rtsp:admin:PW@cam/x", "rtsp:***:***@cam/x"),  # none
        ("(rtsp:/admin:PW@cam/x)", "(rtsp:/***:***@cam/x)"),
        ("http:\\\\admin:PW@cam\\x", "http:\\\\***:***@cam\\x"),  # a browser's slashes
        ("http:/\\admin:PW@cam/x", "http:/\\***:***@cam/x"),
        ("rtsp://admin:PW%40cam/x", "rtsp://***:***%40cam/x"),  # an encoded "@" as the "@"
        ("rtsp://a@b:PW@@cam/x", "rtsp://***:***@cam/x"),  # the last "@" ends it
        ("rtsp://admin:P\\W@cam/x", "rtsp://***:***@cam/x"),
        ("rtsp://admin:PW@rtsp:/u:PW2@cam/x", "rtsp://***:***@rtsp:/***:***@cam/x"),
        ("x.rtsp://admin:PW@cam/x", "x.rtsp://***:***@cam/x"),
        (
            "rtsp://cam/user=admin_password=PW_channel=1_stream=0.sdp?real_stream",
            "rtsp://cam/user=admin_password=***_channel=1_stream=0.sdp?real_stream",
        ),
        ("rtsp://cam/password=PW/channel=1", "rtsp://cam/password=***/channel=1"),
        (
            "rtsp://cam/user=admin&password=PW&channel=1",
            "rtsp://cam/user=admin&password=***&channel=1",
        ),
        ("rtsp://cam/user=admin_pwd=P.W._channel=1", "rtsp://cam/user=admin_pwd=***_channel=1"),
        (
            "stream cam: rtsp://cam/x_token=PW: refused",
            "stream cam: rtsp://cam/x_token=***: refused",
        ),
        ("rtsp://cam/live?password=PW_channel=1&x=1", "rtsp://cam/live?password=***&x=1"),
    ],
)
def test_malformed_and_path_credentials_are_masked(text: str, masked: str) -> None:
    assert mask_url(text) == masked
    assert mask_url(masked) == masked


@pytest.mark.parametrize(
    "text",
    [
        "note:me@host",  # a user name alone after one slash or none: prose, not a URL
        "stream cam1: running at 12:30",
        "rtsp://cam/live/channel_1/sub_stream",
        "config: server.allowed_source_hosts: 10.1.0.0/16",
    ],
)
def test_prose_near_those_forms_is_kept(text: str) -> None:
    assert mask_url(text) == text


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("rtsp://ad min:PW@cam/x", "rtsp://***:***@cam/x"),  # whitespace inside
        ("rtsp://admin:P\x01W@cam/x?token=T", "rtsp://***:***@cam/x?token=***"),
        (" rtsp:/ admin:PW@cam/x", " rtsp:/ ***:***@cam/x"),
        ("rtsp://admin:P?W@cam/x", "rtsp://***:***@cam/x"),
        ("rtsp://cam/x", "rtsp://cam/x"),
        ("/media/a@b.mp4", "/media/a@b.mp4"),
    ],
)
def test_one_url_is_masked_however_malformed(url: str, masked: str) -> None:
    assert mask_one_url(url) == masked


@pytest.mark.parametrize(
    "text",
    [
        "@" + "a:" * 100_000,  # each "a:" could begin a one-slash userinfo
        "@" + "a." * 100_000 + "://",  # each "a" could begin a scheme
        "a:\\\\" * 50_000 + "@",  # backslashes do not end the userinfo
        "=" + "_a" * 100_000,  # each "_" could begin a path parameter
        "_password=" + "_a" * 100_000,
    ],
)
def test_masking_stays_linear(text: str) -> None:
    """It runs on every log record: a text made to backtrack must not stall the process
    (a quadratic scan of these takes minutes)."""
    started = time.perf_counter()
    mask_url(text)
    assert time.perf_counter() - started < 5.0


def test_sources_keep_importing_it() -> None:
    assert reexported is mask_url


# Characters a secret may hold unencoded: in userinfo anything but what ends the
# authority or a URL in text; in a query anything but what ends a parameter.
_PRINTABLE = st.characters(min_codepoint=33, codec="utf-8")
USERINFO_CHARS = _PRINTABLE.filter(lambda c: c not in '/"<>' and not c.isspace())
VALUE_CHARS = _PRINTABLE.filter(lambda c: c not in '&;#"<>' and not c.isspace())


@given(st.text(min_size=1), st.text(USERINFO_CHARS, min_size=1))
def test_a_userinfo_password_never_survives(user: str, password: str) -> None:
    url = f"rtsp://{quote(user, safe='')}:{password}@cam/live?channel=1"
    assert mask_url(url) == "rtsp://***:***@cam/live?channel=1"


@given(st.text(min_size=1))
def test_an_encoded_password_parameter_never_survives(secret: str) -> None:
    url = f"rtsp://cam/live?user=admin&password={quote(secret, safe='')}&channel=1"
    assert mask_url(url) == "rtsp://cam/live?user=admin&password=***&channel=1"


@given(st.text(VALUE_CHARS, min_size=1), st.sampled_from(SECRET_NAMES))
def test_a_raw_secret_value_never_survives(secret: str, name: str) -> None:
    url = f"rtsp://cam/live?user=admin&{name}={secret}"
    stem = secret.rstrip("')]:,.")
    kept = secret[len(stem) :] if stem else ""  # closing punctuation, never all of it
    assert mask_url(url) == f"rtsp://cam/live?user=admin&{name}=***{kept}"


@given(st.text(VALUE_CHARS, min_size=1))
def test_json_stays_json(secret: str) -> None:
    url = f"http://u:{quote(secret, safe='')}@cam/x?token={secret}"
    document = json.dumps({"url": url, "n": 1})
    assert json.loads(mask_url(document)) == {"url": mask_url(url), "n": 1}


# -- the logging filter -----------------------------------------------------------
@pytest.fixture
def masked_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger whose one handler writes to a string through a MaskingFilter."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    install([handler])
    logger = logging.getLogger(f"tests.security.{id(out)}")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    yield logger, out
    logger.removeHandler(handler)


def test_the_filter_masks_the_formatted_message(
    masked_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = masked_log
    logger.warning("stream %s: %s", "cam", "rtsp://admin:pw1@cam/x?password=pw2")
    assert out.getvalue() == "stream cam: rtsp://***:***@cam/x?password=***\n"


def test_the_filter_masks_a_traceback_and_a_stack(
    masked_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = masked_log
    try:
        raise ConnectionError("cannot open rtsp://admin:pw1@cam/x?token=pw2")
    except ConnectionError:
        logger.exception("open failed")
    logger.info("here", stack_info=True)  # the stack shows this line: ?token=pw3
    text = out.getvalue()
    assert "ConnectionError: cannot open rtsp://***:***@cam/x?token=***" in text
    assert "token=***" in text.split("Stack (most recent call last)")[1]
    assert "pw1" not in text and "pw2" not in text and "pw3" not in text


def test_installing_twice_adds_one_filter() -> None:
    handler = logging.StreamHandler(sys.stderr)
    install([handler])
    install([handler])
    assert sum(isinstance(f, MaskingFilter) for f in handler.filters) == 1


def test_a_record_that_cannot_be_formatted_is_left_to_its_handler() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%d items", ("many",), None)
    assert MaskingFilter().filter(record)
    assert (record.msg, record.args) == ("%d items", ("many",))
