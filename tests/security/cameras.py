"""Cameras that tell what they were sent: a loopback server (plain TCP or TLS, on any
127.x address) that records, for every connection, whether its TLS handshake completed
and every byte that came after it, and answers each request head with what the test
says. The camera-credential tests assert on those bytes: a password a server never
received is a password it cannot keep.

    camera = RecordingServer("127.0.0.1", answer, tls=context)   # started; stop() ends it
    camera.url("https", "user:pw", "/video")                      # https://user:pw@127.0.0.1:PORT/video
    camera.wait_closed(1)                                         # the first connection, over
    camera.received()                                             # every byte, all connections
"""

from __future__ import annotations

import base64
import contextlib
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import cv2
import trustme

from tests.support.media import pattern_frame

WAIT_S = 20.0  # upper bound of any wait here; normal runs take a fraction
_READ_S = 10.0  # a connection that sends nothing for this long is closed
BOUNDARY = "frame"
MJPEG_TYPE = f"multipart/x-mixed-replace; boundary={BOUNDARY}"

# What a server sends back for one request head: bytes, or an iterable of chunks
# (a stream), or None to close the connection.
Answer = Callable[[bytes], bytes | Iterable[bytes] | None]


@dataclass
class Connection:
    """One accepted connection: `handshake` is the TLS error (None: completed, or plain
    TCP); `received`, every byte read after the handshake; `closed`, set at its end."""

    handshake: str | None = None
    received: bytearray = field(default_factory=bytearray)
    closed: threading.Event = field(default_factory=threading.Event)


class RecordingServer:
    """A loopback server recording each connection; its threads are named
    `camera:<host>` and end with `stop()`."""

    def __init__(self, host: str, answer: Answer, *, tls: ssl.SSLContext | None = None) -> None:
        self.host, self._answer, self._tls = host, answer, tls
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Condition()
        self.connections: list[Connection] = []
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._accepting = threading.Thread(target=self._accept, name=f"camera:{host}")
        self._accepting.start()

    def url(self, scheme: str, userinfo: str = "", path: str = "/") -> str:
        at = f"{userinfo}@" if userinfo else ""
        return f"{scheme}://{at}{self.host}:{self.port}{path}"

    def received(self) -> bytes:
        """Every byte every connection sent after its handshake, in order of connection."""
        with self._lock:
            return b"".join(bytes(c.received) for c in self.connections)

    def wait_closed(self, count: int, timeout: float = WAIT_S) -> list[Connection]:
        """The first `count` connections, once each of them has ended."""
        with self._lock:
            arrived = self._lock.wait_for(lambda: len(self.connections) >= count, timeout)
            assert arrived, f"{len(self.connections)} of {count} connections within {timeout} s"
            first = self.connections[:count]
        for connection in first:
            assert connection.closed.wait(timeout), "a connection still open"
        return first

    def stop(self) -> None:
        """End the accepting thread and every connection's."""
        _shut_down(self._listener, self._sockets, self._accepting, self._threads)

    # -- the server's side ------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:  # closed by stop()
                return
            connection = Connection()
            self._sockets.append(sock)
            with self._lock:
                self.connections.append(connection)
                self._lock.notify_all()
            thread = threading.Thread(
                target=self._serve, args=(sock, connection), name=f"camera:{self.host}"
            )
            self._threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket, connection: Connection) -> None:
        sock.settimeout(_READ_S)
        try:
            if self._tls is not None:
                try:
                    sock = self._tls.wrap_socket(sock, server_side=True)
                except (OSError, ssl.SSLError) as exc:
                    connection.handshake = str(exc) or type(exc).__name__
                    return
                self._sockets.append(sock)  # the plain one is detached: stop() wakes this
            self._talk(sock, connection)
        finally:
            sock.close()
            connection.closed.set()

    def _talk(self, sock: socket.socket, connection: Connection) -> None:
        """Read request heads (up to a blank line) and send each one's answer."""
        pending = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            connection.received += chunk
            pending += chunk
            while b"\r\n\r\n" in pending:
                head, pending = pending.split(b"\r\n\r\n", 1)
                reply = self._answer(head)
                if reply is None or not _send(sock, reply):
                    return


def _shut_down(
    listener: socket.socket,
    sockets: list[socket.socket],
    accepting: threading.Thread,
    threads: list[threading.Thread],
) -> None:
    """Wake and join a server's threads, then close its listener: a shutdown wakes a
    blocked accept() or recv(); a close from another thread would not. `threads` is read
    once `accepting` has ended, so that it holds every connection's."""
    for sock in [listener, *sockets]:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    accepting.join(WAIT_S)
    for thread in threads:
        thread.join(WAIT_S)
    listener.close()


def _send(sock: socket.socket, reply: bytes | Iterable[bytes]) -> bool:
    """Send a reply; False when the client went away."""
    try:
        for chunk in [reply] if isinstance(reply, bytes) else reply:
            sock.sendall(chunk)
    except OSError:
        return False
    return True


def header(head: bytes, name: str) -> str | None:
    """A header's value in a request head (the first of that name, any case)."""
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name.lower().encode():
            return value.strip().decode("latin-1")
    return None


def basic(user: str, password: str) -> str:
    """The Authorization header's value for HTTP Basic (RFC 7617)."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def mjpeg(frames: int = 30) -> Iterable[bytes]:
    """An HTTP answer streaming `frames` numbered 160x120 JPEGs as multipart, then its end."""
    yield f"HTTP/1.0 200 OK\r\nContent-Type: {MJPEG_TYPE}\r\n\r\n".encode()
    for index in range(frames):
        ok, jpeg = cv2.imencode(".jpg", pattern_frame(index, 160, 120))
        assert ok
        part = f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {jpeg.size}\r\n\r\n"
        yield part.encode() + jpeg.tobytes() + b"\r\n"


def server_context(ca: trustme.CA, *names: str) -> ssl.SSLContext:
    """A server's TLS context with a certificate `ca` issued for `names`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(context)
    return context


class TlsProxy:
    """TLS in front of a plain TCP server on 127.0.0.1 (an RTSP camera becomes an rtsps
    one: RTSP over TCP, media interleaved, is one connection). Records what each client
    sent after its handshake, as RecordingServer does; threads named `tls-proxy`."""

    def __init__(self, backend_port: int, tls: ssl.SSLContext) -> None:
        self._backend = ("127.0.0.1", backend_port)
        self._tls = tls
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.received = bytearray()
        self.handshakes: list[str | None] = []  # each client's TLS error, None: completed
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, name="tls-proxy")
        self._accepting.start()

    def url(self, userinfo: str, path: str) -> str:
        return f"rtsps://{userinfo}@127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        _shut_down(self._listener, self._sockets, self._accepting, self._threads)
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # shut down by stop()
                return
            self._sockets.append(client)
            self._start(self._open, client)

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name="tls-proxy")
        self._threads.append(thread)
        thread.start()

    def _open(self, client: socket.socket) -> None:
        try:
            secure = self._tls.wrap_socket(client, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            self.handshakes.append(str(exc) or type(exc).__name__)
            return
        self.handshakes.append(None)
        self._sockets.append(secure)
        backend = socket.create_connection(self._backend)
        self._sockets.append(backend)
        self._start(self._pump, backend, secure, None)
        self._pump(secure, backend, self.received)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, record: bytearray | None) -> None:
        """Copy until either side ends, then end both."""
        try:
            while chunk := source.recv(65536):
                if record is not None:
                    record += chunk
                sink.sendall(chunk)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
