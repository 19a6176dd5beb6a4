"""Child processes of the tests and benches (cameras, brokers): read their READY line,
end them. Standard library only: bench/_reference.py's venv imports the clock camera."""

from __future__ import annotations

import selectors
import signal
import socket
import subprocess
import time
from typing import IO, Any

EXIT_TIMEOUT_S = 5.0


def read_line(stream: IO[str], timeout_s: float) -> str:
    """The first line of a child's stdout; "" when it exits or times out first."""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if sel.select(left):
                return stream.readline().strip()
    return ""


def end_process(
    proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout_s: float = EXIT_TIMEOUT_S
) -> None:
    """Send `sig` (SIGTERM: a clean exit), then SIGKILL after `timeout_s`; close its stdout."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout_s)
    if proc.stdout is not None:
        proc.stdout.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
