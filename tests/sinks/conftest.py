"""Real parts for the sink tests: a mosquitto broker on a free loopback port, a paho
subscriber that collects what arrives, an event loop on its own thread for the sink.

    def test_x(mosquitto, subscriber, sink_loop):
        sub = subscriber(mosquitto, "t/#")
        sink = sink_loop.start(MqttSink("bus", config(mosquitto)))   # stopped at teardown
        ...
        mosquitto.stop(); mosquitto.start()     # an outage, then the broker back on its port

Every broker, subscriber and loop is stopped at teardown. The broker persists sessions
(saved at a clean stop), so a subscriber's subscription and the messages queued for it
survive an outage, as with a production broker.
"""

from __future__ import annotations

import getpass
import logging
import re
import shutil
import signal
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar, cast

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.sinks.receiver import LoopThread
from tests.support.processes import end_process

T = TypeVar("T")
WAIT_S = 15.0  # default wait for something to arrive: generous for a busy 2-core box
EXIT_TIMEOUT_S = 5.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Lines:
    """A child's output, read by a thread (ends at EOF), waitable line by line."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        stream.close()

    def wait_for(self, pattern: str, start: int = 0, timeout: float = WAIT_S) -> bool:
        """True once a line from index `start` on matches `pattern` (re.search)."""
        rx = re.compile(pattern)
        with self._cond:
            return self._cond.wait_for(
                lambda: any(rx.search(line) for line in self.lines[start:]), timeout
            )

    def count(self, pattern: str) -> int:
        with self._cond:
            return sum(1 for line in self.lines if re.search(pattern, line))

    def join(self) -> None:
        self._thread.join(EXIT_TIMEOUT_S)


@dataclass
class Broker:
    """A mosquitto process; `stop` then `start` is an outage on the same port."""

    port: int
    folder: Path
    users: dict[str, str] | None = None
    tls: bool = False  # a self-signed certificate for 127.0.0.1: folder/cert.pem
    proc: subprocess.Popen[str] | None = None
    log: Lines | None = None

    def start(self) -> None:
        assert self.proc is None, "already running"
        conf = self._write_conf()
        self.proc = subprocess.Popen(
            ["mosquitto", "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,  # its log: unbuffered there, buffered on a stdout pipe
            text=True,
        )
        assert self.proc.stderr is not None
        self.log = Lines(self.proc.stderr)
        if not self.log.wait_for(r"mosquitto version \S+ running"):
            self.stop()
            pytest.fail(f"mosquitto did not start on port {self.port}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: mosquitto saves its sessions and exits (clients see the socket close)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        end_process(proc, sig)
        if self.log is not None:
            self.log.join()

    def _write_conf(self) -> Path:
        lines = [
            f"listener {self.port} 127.0.0.1",
            "log_dest stderr",
            f"user {getpass.getuser()}",  # as root it would switch to `mosquitto`: no tmp_path
            "persistence true",
            f"persistence_location {self.folder}/",
            "max_queued_messages 100000",  # per offline subscriber; mosquitto's default: 1000
        ]
        if self.tls:
            cert, key = self._make_cert()
            lines += [f"certfile {cert}", f"keyfile {key}"]
        if self.users is None:
            lines.append("allow_anonymous true")
        else:
            passwd = self.folder / "passwd"
            passwd.unlink(missing_ok=True)
            for i, (user, password) in enumerate(self.users.items()):
                create = ["-c"] if i == 0 else []
                subprocess.run(
                    ["mosquitto_passwd", *create, "-b", str(passwd), user, password], check=True
                )
            passwd.chmod(0o600)  # mosquitto 2.0 warns about readable password files
            lines += ["allow_anonymous false", f"password_file {passwd}"]
        conf = self.folder / "mosquitto.conf"
        conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return conf

    @property
    def cert(self) -> Path:
        return self.folder / "cert.pem"

    def _make_cert(self) -> tuple[Path, Path]:
        key = self.folder / "key.pem"
        if not self.cert.exists():
            subprocess.run(
                [
                    *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
                    *("-keyout", str(key), "-out", str(self.cert), "-subj", "/CN=127.0.0.1"),
                    *("-addext", "subjectAltName=IP:127.0.0.1"),
                ],
                check=True,
                capture_output=True,
            )
        return self.cert, key


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Callable[..., Broker]]:
    """start_broker(users={"cam": "pw"}, tls=False, run=True) → a Broker."""
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed: run sh tests/install_deps.sh")
    brokers: list[Broker] = []

    def start(users: dict[str, str] | None = None, tls: bool = False, run: bool = True) -> Broker:
        folder = tmp_path / f"broker{len(brokers)}"
        folder.mkdir()
        broker = Broker(free_port(), folder, users, tls)
        brokers.append(broker)
        if run:
            broker.start()
        return broker

    yield start
    for broker in brokers:
        broker.stop()


@pytest.fixture
def mosquitto(start_broker: Callable[..., Broker]) -> Broker:
    """An anonymous broker on a free port."""
    return start_broker()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """An anonymous broker on a free port for a whole module (a live appliance's tests:
    each keeps apart by its own topic prefix or client ids). tests/security/conftest.py
    takes it too."""
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed: run sh tests/install_deps.sh")
    running = Broker(free_port(), tmp_path_factory.mktemp("broker"))
    running.start()
    yield running
    running.stop()


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    retain: bool
    properties: Any


class Subscriber:
    """A paho client that keeps every message it receives; waits are thread-safe.

    Its session is persistent (MQTT 3.1.1 clean_session=False, QoS 1 subscription), so
    what is published while it reconnects after a broker outage is kept for it."""

    def __init__(
        self,
        broker: Broker,
        topics: list[str],
        protocol: MQTTProtocolVersion = mqtt.MQTTv311,
    ):
        self.messages: list[Received] = []
        self._cond = threading.Condition()
        self._topics = topics
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"sub-{uuid.uuid4().hex[:12]}",  # never reused, unlike id()
            protocol=protocol,
            clean_session=False if protocol == mqtt.MQTTv311 else None,
        )
        self.client.reconnect_delay_set(cast(int, 0.1), cast(int, 0.5))
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self._subscribed = threading.Event()
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.connect("127.0.0.1", broker.port, keepalive=30)
        self.client.loop_start()
        assert self._subscribed.wait(WAIT_S), "subscriber did not subscribe"

    def _on_connect(self, client: mqtt.Client, *_: Any) -> None:
        client.subscribe([(t, 1) for t in self._topics])

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self._cond:
            self.messages.append(
                Received(msg.topic, bytes(msg.payload), msg.retain, msg.properties)
            )
            self._cond.notify_all()

    def wait_for(
        self, ready: Callable[[list[Received]], bool], timeout: float = WAIT_S
    ) -> list[Received]:
        """Every message so far, once `ready(messages)` holds; AssertionError on timeout."""
        with self._cond:
            ok = self._cond.wait_for(lambda: ready(self.messages), timeout)
            assert ok, f"timed out; received: {[(m.topic, m.payload[:80]) for m in self.messages]}"
            return list(self.messages)

    def on(self, topic: str) -> list[Received]:
        with self._cond:
            return [m for m in self.messages if m.topic == topic]

    def publish(self, topic: str, payload: bytes, properties: Any = None) -> None:
        self.client.publish(topic, payload, qos=1, properties=properties).wait_for_publish(WAIT_S)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def subscriber() -> Iterator[Callable[..., Subscriber]]:
    """subscriber(broker, "t/#", ...) → a connected Subscriber; closed at teardown."""
    made: list[Subscriber] = []

    def make(
        broker: Broker, *topics: str, protocol: MQTTProtocolVersion = mqtt.MQTTv311
    ) -> Subscriber:
        made.append(Subscriber(broker, list(topics), protocol))
        return made[-1]

    yield make
    for sub in made:
        sub.close()


class SinkLoop:
    """Sinks on an event loop of their own thread, as the runtime's `sinks` thread runs
    them; the test thread plays the stream worker that calls `offer`."""

    def __init__(self, loop: LoopThread) -> None:
        self.thread = loop
        self._sinks: list[Any] = []

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = WAIT_S) -> T:
        return self.thread.call(coro, timeout)

    def start(self, sink: T) -> T:
        self.call(cast(Any, sink).start())
        self._sinks.append(sink)
        return sink

    def stop(self, sink: Any, drain_timeout_s: float = 1.0) -> None:
        self._sinks.remove(sink)
        self.call(sink.stop(drain_timeout_s), drain_timeout_s + WAIT_S)


@pytest.fixture
def sink_loop() -> Iterator[SinkLoop]:
    with LoopThread("sinks") as thread:
        loop = SinkLoop(thread)
        yield loop
        for sink in list(loop._sinks):
            loop.stop(sink)


class LogWatch(logging.Handler):
    """Log records of one logger, waitable: the sink says when its state changes."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []
        self._cond = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._cond:
            self.records.append(record.getMessage())
            self._cond.notify_all()

    def wait_for(self, pattern: str, start: int = 0, timeout: float = WAIT_S) -> int:
        """Index of the first record from `start` on matching `pattern`; fails on timeout."""
        rx = re.compile(pattern)

        def found() -> int | None:
            return next(
                (i for i, r in enumerate(self.records) if i >= start and rx.search(r)), None
            )

        with self._cond:
            ok = self._cond.wait_for(lambda: found() is not None, timeout)
            assert ok, f"no log line matching {pattern!r}; got: {self.records}"
            return cast(int, found())


@pytest.fixture
def sink_log() -> Iterator[LogWatch]:
    watch = LogWatch()
    logger = logging.getLogger("sinks.mqtt")
    logger.addHandler(watch)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    yield watch
    logger.removeHandler(watch)
    logger.setLevel(old)
