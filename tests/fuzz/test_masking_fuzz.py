"""Fuzz target: credential masking (appliance/masking.py `mask_url`).

Property: in any text holding `scheme://user:password@host/path` (the password of any
characters a URL's userinfo may hold, "@" included, the surrounding text arbitrary but
separated from the URL by a space), the password never appears in the masked text, the
scheme and host stay readable, and masking is idempotent.
"""

from __future__ import annotations

import string

from hypothesis import assume, given
from hypothesis import strategies as st

from appliance.masking import MASK, mask_url
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


@fuzz(200)
@given(SCHEMES, HOSTS, PATHS, st.text(max_size=30))
def test_text_without_credentials_is_kept(scheme: str, host: str, path: str, text: str) -> None:
    """The other side: a URL without userinfo or secret parameters is left as it is."""
    assume("=" not in text + path and "://" not in text and "uthoriz" not in text.lower())
    assume("Bearer" not in text)
    line = f"{text} {scheme}://{host}{path}"
    assert mask_url(line) == line
