"""A reader that goes away is no error (issue 39): closing MJPEG and event readers
mid-stream, abruptly (a reset) or politely, logs nothing above DEBUG, so a token holder
cannot fill the appliance's log with tracebacks by opening and dropping readers.

`appliance serve` runs in a child process (alone, and with `--workers`) and its log is
read back whole once it has exited. Readers are opened in rounds of `limits.max_watchers`:
a round opens only once every reader of the one before has given its slot back, i.e. its
handler has ended and said whatever it says about the client leaving.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import pytest

from tests.server.conftest import demo_stream
from tests.server.live import wait_for, write_yaml
from tests.support.appliance import Served, person_model, start_served

WATCHERS = 10  # limits.max_watchers: one round of readers
ROUNDS = {"/v1/streams/clip/video.mjpeg?max_fps=30": 2, "/v1/streams/clip/events": 2}
FIRST_BYTES = {"video.mjpeg": b"Content-Type: image/jpeg", "events": b"event: result"}
DEADLINE_S = 30.0
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, not FIN


def _open_reader(served: Served, path: str) -> socket.socket | None:
    """A reader that has received its first frame or event; None if it was refused
    (429: its slot is not free yet)."""
    port = int(served.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    want = next(marker for name, marker in FIRST_BYTES.items() if name in path)
    got = b""
    while want not in got:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the reader: {got[:300]!r}"
        got += chunk
        if got.startswith(b"HTTP/1.1 429"):
            sock.close()
            return None
    assert got.startswith(b"HTTP/1.1 200"), got[:300]
    return sock


def _round(served: Served, path: str) -> list[socket.socket]:
    """WATCHERS readers of `path`, opened while slots are free, then again once more are."""
    readers: list[socket.socket] = []

    def filled() -> bool:
        while len(readers) < WATCHERS and (reader := _open_reader(served, path)) is not None:
            readers.append(reader)
        return len(readers) == WATCHERS

    wait_for(filled, DEADLINE_S, f"{WATCHERS} free reader slots of {path}")
    return readers


def _close(readers: list[socket.socket]) -> None:
    """Half of them reset, half closed (FIN): the server sees either while writing."""
    for i, reader in enumerate(readers):
        if i % 2 == 0:
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
        reader.close()


@pytest.mark.parametrize("extra", [(), ("--workers", "2")], ids=["one process", "workers"])
def test_readers_that_leave_log_no_error(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """With `--workers`, the readers' worker answers through the gateway: the same rule."""
    doc = {
        "limits": {"max_watchers": WATCHERS},
        "models": {"person": person_model()},
        "streams": [demo_stream("clip")],
    }
    served = start_served(write_yaml(tmp_path, doc, "config.yaml"), tmp_path, *extra)
    try:
        served.wait_for(
            lambda: served.json("/v1/streams/clip")["frames_processed"] > 0,
            DEADLINE_S,
            "clip processing",
        )
        closed = 0
        for path, rounds in ROUNDS.items():
            for _ in range(rounds):
                readers = _round(served, path)
                _close(readers)
                closed += len(readers)
        _close(_round(served, next(iter(ROUNDS))))  # every slot back: all handlers ended
        assert closed == 40
        assert served.terminate() == 0
    finally:
        served.stop()
    log = served.log_path.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in log, log[-6000:]
    errors = [line for line in log.splitlines() if " ERROR " in line or " WARNING " in line]
    assert not [e for e in errors if "/v1/streams/clip" in e or "aiohttp" in e], errors
