"""server.allowed_source_hosts (issue 23, item 8): a token holder must not use stream
sources to scan the internal network. A host outside the list is refused from the config
and over the API with the same words whatever the host (nothing looked up), and a name is
looked up again before each connection: a name that resolves outside the list, or not at
all, never connects. Each "never connects" is seen by a real listening socket there.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.config import ConfigError, load_config, parse_config
from appliance.policy.hosts import NOT_ALLOWED, Resolver, SourceHosts
from tests.server.conftest import WAIT_S, LiveFactory, config_doc
from tests.server.live import LiveServer, wait_for, write_yaml
from tests.support.appliance import detect_workflow

ALLOWED = ["127.0.0.1", "::1"]  # what `localhost` resolves to, whatever the system
OUTSIDE = "127.0.0.2"  # loopback too (Linux routes 127/8 to lo): a listener can watch it
# 127.0.0.2 as one 32-bit number: no address to Python, a name that resolves to it for
# getaddrinfo (and FFmpeg); a way around a check that reads the URL only.
OUTSIDE_AS_NUMBER = str(int.from_bytes(socket.inet_aton(OUTSIDE), "big"))
FAST_RETRY = {"open_timeout_s": 2, "backoff": {"initial_s": 0.05, "max_s": 0.2}}


class Listener:
    """A TCP socket listening on `host`; `connected()` counts the connections it took."""

    def __init__(self, host: str, port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.bind((host, port))
        self._sock.listen(16)
        self._sock.setblocking(False)
        self.port = int(self._sock.getsockname()[1])
        self._taken: list[socket.socket] = []

    def connected(self) -> int:
        with contextlib.suppress(BlockingIOError):
            while True:
                self._taken.append(self._sock.accept()[0])
        return len(self._taken)

    def close(self) -> None:
        for conn in self._taken:
            conn.close()
        self._sock.close()


@pytest.fixture
def outside() -> Iterator[Listener]:
    listener = Listener(OUTSIDE)
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def guarded(module_server: LiveFactory) -> LiveServer:
    return module_server(config_doc(allowed_source_hosts=ALLOWED))


def stream(stream_id: str, url: str) -> dict[str, object]:
    return {"id": stream_id, "source": {"url": url, **FAST_RETRY}, "workflow": detect_workflow()}


@contextlib.contextmanager
def added(server: LiveServer, stream_id: str, url: str) -> Iterator[None]:
    reply = server.call("POST", "/v1/streams", json_body=stream(stream_id, url))
    assert reply.status == 201, reply.body
    try:
        yield
    finally:
        assert server.call("DELETE", f"/v1/streams/{stream_id}").status == 200


def tried_twice(server: LiveServer, stream_id: str) -> bool:
    return int(server.stream(stream_id)["reconnects"]) >= 2


# -- from the config, and over the API: the URL alone decides --------------------------
def test_an_address_outside_the_list_is_refused_over_the_api(
    guarded: LiveServer, outside: Listener
) -> None:
    answers = []
    for url in (
        f"rtsp://{OUTSIDE}:{outside.port}/x",
        f"http://user:pw@{OUTSIDE}:{outside.port}/video.mjpg",
        "rtsp://10.255.255.1:554/x",  # nothing there: refused in the same words
        "rtsp://[::2]/x",
    ):
        reply = guarded.call("POST", "/v1/streams", json_body=stream("probe", url))
        assert reply.status == 422, reply.body
        answers.append(reply.error)
    assert all(a == answers[0] for a in answers), answers  # nothing told about the host
    assert answers[0]["details"] == [f"source.url: {NOT_ALLOWED}"]
    assert "probe" in answers[0]["message"]
    assert guarded.get_json("/v1/streams")["streams"] == []
    assert outside.connected() == 0


def test_an_address_outside_the_list_is_refused_from_the_config(
    tmp_path: Path, outside: Listener
) -> None:
    doc = config_doc(
        stream("inside", "rtsp://127.0.0.1:8554/x"),
        stream("outside", f"rtsp://{OUTSIDE}:{outside.port}/x"),
        allowed_source_hosts=ALLOWED,
    )
    with pytest.raises(ConfigError) as caught:
        load_config(write_yaml(tmp_path, doc))
    assert caught.value.problems == [f"streams[1].source.url: {NOT_ALLOWED}"]
    assert "server.allowed_source_hosts" in str(caught.value)
    assert outside.connected() == 0


def test_without_the_list_any_host_is_taken(tmp_path: Path) -> None:
    doc = config_doc(stream("outside", f"rtsp://{OUTSIDE}:8554/x"))
    assert load_config(write_yaml(tmp_path, doc)).server.allowed_source_hosts is None


def test_a_bad_entry_is_named() -> None:
    doc = {"server": {"allowed_source_hosts": ["cam1.local", "10.1.0.0/33", "*.corp", "10.1"]}}
    with pytest.raises(ConfigError) as caught:
        parse_config(doc, Path("."))
    assert [p.split(":")[0] for p in caught.value.problems] == [
        "server.allowed_source_hosts[1]",
        "server.allowed_source_hosts[2]",
        "server.allowed_source_hosts[3]",
    ]
    assert "not a CIDR network" in caught.value.problems[0]
    assert "no wildcards" in caught.value.problems[1]


# -- before each connection: a name's addresses decide ---------------------------------
def test_a_name_resolving_outside_the_list_never_connects(
    guarded: LiveServer, outside: Listener
) -> None:
    # A name that does not resolve is the policy tests' (a live one would ask the DNS
    # server, off this machine): it reads the same, test_an_unresolvable_name_reads_alike.
    url = f"rtsp://{OUTSIDE_AS_NUMBER}:{outside.port}/x"
    with added(guarded, "numeric", url):
        wait_for(lambda: tried_twice(guarded, "numeric"), WAIT_S, "numeric to retry")
        assert outside.connected() == 0
        error = guarded.stream("numeric")["last_error"]
        assert error.split("/x: ")[1].split(";")[0] == NOT_ALLOWED


def test_a_name_resolving_inside_the_list_connects(guarded: LiveServer) -> None:
    """The other side, and proof that the listeners above would have seen a connection."""
    inside = Listener("127.0.0.1")
    with contextlib.ExitStack() as stack:
        stack.callback(inside.close)
        with contextlib.suppress(OSError):  # where `localhost` is ::1 too, watch it there
            stack.callback(Listener("::1", inside.port).close)
        with added(guarded, "local", f"rtsp://localhost:{inside.port}/x"):
            wait_for(lambda: inside.connected() > 0, WAIT_S, "a connection to localhost")


# -- the policy itself, with a resolver that answers what a DNS server might -----------
def resolver(answers: dict[str, list[str]]) -> Resolver:
    def resolve(host: str) -> list[str]:
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return answers[host]

    return resolve


@pytest.mark.parametrize(
    ("entries", "url", "addresses", "allowed"),
    [
        (["127.0.0.1"], "rtsp://localhost/x", ["127.0.0.1", "::1"], False),  # every address
        (["127.0.0.1", "::1"], "rtsp://localhost/x", ["127.0.0.1", "::1"], True),
        (["127.0.0.0/8"], "rtsp://localhost/x", ["127.0.0.1"], True),
        (["10.1.0.0/16"], "rtsp://cam.corp/x", ["10.1.2.3"], True),
        (["10.1.0.0/16"], "rtsp://cam.corp/x", ["10.1.2.3", "10.2.0.1"], False),
        (["10.1.0.0/16"], "rtsp://cam.corp/x", [], False),
        (["Cam.Corp."], "rtsp://CAM.corp/x", ["192.168.0.9"], True),  # a listed name: as named
        (["cam.corp"], "rtsp://cam2.corp/x", ["10.1.2.3"], False),
        (["10.1.0.0/16"], "rtsp://[::ffff:10.1.2.3]/x", [], True),  # IPv4-mapped: its IPv4
        (["::/0"], "rtsp://[::ffff:10.1.2.3]/x", [], False),
        (["::ffff:10.1.0.0/112"], "rtsp://10.1.2.3/x", [], True),
        (["10.1.0.0/16"], "rtsp://u:p@evil.example@10.1.2.3:554/x", [], True),  # the last "@"
        (["10.1.0.0/16"], "rtsp://10.1.2.3@evil.example/x", [], False),
        (["10.1.0.0/16"], "/media/clip.mp4", [], True),  # files and devices are no hosts
        (["10.1.0.0/16"], "/dev/video0", [], True),
    ],
)
def test_the_policy(entries: list[str], url: str, addresses: list[str], allowed: bool) -> None:
    hosts = SourceHosts.of(entries)
    resolve = resolver({"localhost": addresses, "cam.corp": addresses, "cam2.corp": addresses})
    assert (hosts.connect_refusal(url, resolve) is None) is allowed


def test_an_unresolvable_name_reads_alike() -> None:
    """Refused in the words of a name that resolves outside: nothing tells them apart."""
    hosts = SourceHosts.of(["10.1.0.0/16"])
    resolve = resolver({"outside.corp": ["10.2.0.1"]})
    refusals = [
        hosts.connect_refusal(f"rtsp://{h}/x", resolve) for h in ("outside.corp", "no.corp")
    ]
    assert refusals == [NOT_ALLOWED, NOT_ALLOWED]


def test_the_check_when_added_looks_nothing_up() -> None:
    """Names are left to the connection when networks are listed, refused when only names
    are; addresses are decided at once."""
    networks = SourceHosts.of(["10.1.0.0/16"])
    assert networks.refusal("rtsp://nowhere.invalid/x") is None
    assert networks.refusal("rtsp://10.2.0.1/x") == NOT_ALLOWED
    names = SourceHosts.of(["cam.corp"])
    assert names.refusal("rtsp://nowhere.invalid/x") == NOT_ALLOWED
    assert names.refusal("rtsp://cam.corp:554/x") is None
