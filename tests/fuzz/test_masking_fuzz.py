"""Fuzz target: credential masking (appliance/policy/masking.py `mask_url`).

Property: in any text holding `scheme://user:password@host/path` (the password of any
characters a URL's userinfo may hold, "@" included, the surrounding text arbitrary but
separated from the URL by a space), the password never appears in the masked text, the
scheme and host stay readable, and masking is idempotent. The same for the malformed
forms FFmpeg or a browser still reads so (whitespace after the slashes, one slash or
none, backslashes) and for a camera's path credentials (`/user=admin_password=pw_x=1`).
"""

from __future__ import annotations

import re
import string

from hypothesis import assume, given
from hypothesis import strategies as st

from appliance.policy.masking import MASK, mask_url
from tests.fuzz.support import fuzz

# RFC 3986 userinfo: unreserved, sub-delims, ":" (not in the user), pct-encoded; plus "@"
# (masked whole: the match is greedy up to the last "@" before the path).
USERINFO = string.ascii_letters + string.digits + "-._~!$&'()*+,;=%"
SCHEMES = st.sampled_from(["rtsp", "http", "https", "rtmp", "mqtt", "srt", "git+ssh"])
USERS = st.text(USERINFO, max_size=8)
PASSWORDS = st.text(USERINFO + ":@", min_size=4, max_size=16)
HOSTS = st.from_regex(r"[a-z0-9]{1,10}(\.[a-z]{2,5})?(:[0-9]{1,5})?", fullmatch=True)
PATHS = st.text(string.ascii_letters + string.digits + "/._-?=&", max_size=12).map(
    lambda p: "/" + p
)
AROUND = st.text(max_size=20)


@fuzz(250)
@given(AROUND, SCHEMES, USERS, PASSWORDS, HOSTS, PATHS, AROUND)
def test_the_password_never_shows(
    before: str, scheme: str, user: str, password: str, host: str, path: str, after: str
) -> None:
    url = f"{scheme}://{user}:{password}@{host}{path}"
    # The property is about the URL: the password must not also be written elsewhere.
    assume(password not in before + " " + after and password not in f"{MASK}:{MASK}@{host}")
    assume(password not in f"{scheme}://" and password not in path)
    masked = mask_url(f"{before} {url} {after}")
    assert password not in masked
    assert f"{scheme}://{MASK}:{MASK}@{host}" in masked
    assert mask_url(masked) == masked


# Between the scheme's ":" and the userinfo: what FFmpeg skips (one or two slashes, or none;
# whitespace after two) and what browsers read as slashes.
SEPARATORS = st.sampled_from(["//", "// ", "//\t ", "/", "", "\\\\", "/\\"])
PATH_VALUE = string.ascii_letters + string.digits + "-.~!$'()*+,:@%"  # no "_", "/", "?"


@fuzz(250)
@given(AROUND, SCHEMES, SEPARATORS, USERS, PASSWORDS, HOSTS, PATHS, AROUND)
def test_the_password_never_shows_in_malformed_forms(
    before: str,
    scheme: str,
    sep: str,
    user: str,
    password: str,
    host: str,
    path: str,
    after: str,
) -> None:
    user = user.replace(":", "") or "u"  # one slash or none: masked as a user:password pair
    url = f"{scheme}:{sep}{user}:{password}@{host}{path}"
    assume(password not in before + " " + after and password not in f"{MASK}:{MASK}@{host}")
    assume(password not in f"{scheme}:{sep}" and password not in path)
    masked = mask_url(f"{before} {url} {after}")
    assert password not in masked
    assert f"{scheme}:{sep.rstrip()}{MASK}:{MASK}@{host}" in masked
    assert mask_url(masked) == masked


@fuzz(200)
@given(AROUND, HOSTS, st.text(PATH_VALUE, min_size=4, max_size=16), AROUND)
def test_a_path_password_never_shows(before: str, host: str, password: str, after: str) -> None:
    url = f"rtsp://{host}/user=admin_password={password}_channel=1_stream=0.sdp"
    expected = f"rtsp://{host}/user=admin_password={MASK}_channel=1_stream=0.sdp"
    # A password that is part of the URL's own words ("pass") cannot be told apart.
    assume(password not in before + " " + after and password not in expected)
    masked = mask_url(f"{before} {url} {after}")
    assert password not in masked
    assert expected in masked


@fuzz(200)
@given(SCHEMES, HOSTS, PATHS, st.text(max_size=30))
def test_text_without_credentials_is_kept(scheme: str, host: str, path: str, text: str) -> None:
    """The other side: a URL without userinfo or secret parameters is left as it is."""
    assume("=" not in text + path and "://" not in text and "uthoriz" not in text.lower())
    assume("Bearer" not in text)
    # A "word:user:password@" in the text is a one-slash-or-none userinfo: masked.
    assume(
        not re.search(r"[A-Za-z][A-Za-z0-9+.-]*:[/\\]?[^/\\\s\"<>:@]+:", text) or "@" not in text
    )
    line = f"{text} {scheme}://{host}{path}"
    assert mask_url(line) == line
