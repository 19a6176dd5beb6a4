"""Ctrl+C and SIGTERM as a stop flag for a long command (`appliance tune`): the command
checks the flag at each step and ends in order (its settings restored), instead of a
KeyboardInterrupt landing wherever the main thread happens to be."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl+C; a service manager's stop
WATCHER_JOIN_S = 1.0  # the signal watcher ends at once when its socket closes


@contextlib.contextmanager
def stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop` (the tune ends at its next step and restores);
    the previous handlers are back afterwards.

    The handlers themselves set nothing: Python runs a handler on the main thread between
    two bytecodes, possibly inside `stop.wait()` while that holds the Event's lock, where
    `stop.set()` would wait for itself forever (the tune hung, its streams running on).
    The signal's number goes to a socket instead (signal.set_wakeup_fd: written by the
    C-level handler, even while the main thread is busy in C), and a thread sets `stop`."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)  # set_wakeup_fd's rule: the handler must never block
    watcher = threading.Thread(
        target=_stop_on_signal, args=(reader, stop), name="tune-signals", daemon=True
    )
    watcher.start()
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    previous = {sig: signal.signal(sig, _noted) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_fd)
        writer.close()  # the watcher reads the end of the stream, and ends
        watcher.join(WATCHER_JOIN_S)
        reader.close()


def _noted(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler: nothing (the wakeup socket has the signal already)."""


def _stop_on_signal(reader: socket.socket, stop: threading.Event) -> None:
    """The watcher thread: `stop` set at the first SIGINT or SIGTERM the socket gets."""
    while data := reader.recv(64):  # a byte per signal: its number
        if any(sig in data for sig in STOP_SIGNALS):
            stop.set()
