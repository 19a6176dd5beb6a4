"""The webhook sink against a real aiohttp receiver on a loopback port: what is sent
(body, headers, a signature the client's `verify_webhook` takes, and refuses replayed or
moved), retries and Retry-After, dead letters, bounds while the endpoint hangs, and
shutdown. The sink runs on its own loop thread; the test thread plays
the stream worker that calls `offer`."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from appliance.client import WebhookDelivery, WebhookVerificationError, verify_webhook
from pipelines.types import FrameResult
from sinks.messages import prediction
from sinks.signing import DEFAULT_TOLERANCE_S, ReplayGuard
from sinks.webhook.deadletter import DeadLetterConfig, DeadLetterFile
from sinks.webhook.http import safe_url
from sinks.webhook.retry import BackoffConfig, backoff_delay, retry_after_s
from sinks.webhook.sink import WebhookConfig, WebhookSink
from tests.sinks.receiver import WAIT_S, Answer, LoopThread, Receiver, Request, bound_socket

SECRET = "s3cret-hmac-key"
FAST = {"initial_s": 0.01, "max_s": 0.05, "jitter": 0.0}  # backoff for tests, seconds


def frame_result(seq: int) -> FrameResult:
    return FrameResult(
        stream_id="cam1",
        seq=seq,
        pts=None,
        capture_time=1_700_000_000.0 + seq,
        capture_mono=10.0,
        start_mono=10.01,
        done_mono=10.02,
        image=np.zeros((2, 2, 3), np.uint8),
        outputs={"count": seq},
    )


def make_config(url: str, **fields: Any) -> WebhookConfig:
    return WebhookConfig.model_validate({"type": "webhook", "url": url, "backoff": FAST, **fields})


@contextmanager
def running(sink: WebhookSink, drain_s: float = 5.0) -> Iterator[LoopThread]:
    """The sink started on a loop thread; stopped on exit unless the test stopped it."""
    with LoopThread("sink-loop") as lt:
        lt.call(sink.start())
        try:
            yield lt
        finally:
            if sink.status().state != "stopped":
                lt.call(sink.stop(drain_s), timeout=drain_s + WAIT_S)


async def offer_while_stopping(sink: WebhookSink, drain_s: float) -> bool:
    """Offer once while `stop` drains; what offer answered."""
    stopping = asyncio.create_task(sink.stop(drain_s))
    await asyncio.sleep(0)  # one turn of the loop: stop() runs up to its drain wait
    accepted = sink.offer(frame_result(-1))
    await stopping
    return accepted


def dead_letters(sink: WebhookSink) -> list[dict[str, Any]]:
    path = Path(sink.status().extra["dead_letter_file"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def verified(request: Request, secret: str = SECRET) -> WebhookDelivery:
    """The request's delivery, checked as a receiver would (WebhookVerificationError)."""
    return verify_webhook(secret, request.headers, request.body)


class LogWaiter(logging.Handler):
    """Counts records on `sinks.webhook` containing `text`; `wait(n)` blocks until n."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self._text = text
        self._count = 0
        self._cond = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        if self._text in record.getMessage():
            with self._cond:
                self._count += 1
                self._cond.notify_all()

    def wait(self, n: int, timeout: float = WAIT_S) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self._count >= n, timeout), f"{self._count} < {n}"


@contextmanager
def log_waiter(text: str) -> Iterator[LogWaiter]:
    logger = logging.getLogger("sinks.webhook")
    waiter, level = LogWaiter(text), logger.level
    logger.addHandler(waiter)
    logger.setLevel(logging.DEBUG)
    try:
        yield waiter
    finally:
        logger.removeHandler(waiter)
        logger.setLevel(level)


# -- what is sent ---------------------------------------------------------------------
def test_deliveries_carry_body_ids_and_a_valid_signature(tmp_path: Path) -> None:
    sent_s: list[float] = []
    with Receiver() as rx:
        cfg = make_config(rx.url, secret=SECRET, headers={"Authorization": "Bearer api-key-1"})
        sink = WebhookSink("hook", cfg, data_dir=tmp_path, observe_send=sent_s.append)
        with running(sink) as lt:
            for seq in range(3):
                assert sink.offer(frame_result(seq))
            got = rx.wait_for(3)
            lt.call(sink.stop(5.0))
    for req in got:
        assert req.headers["content-type"] == "application/json"
        assert req.headers["x-appliance-event"] == "prediction"
        assert req.headers["authorization"] == "Bearer api-key-1"
        delivery = verified(req)
        assert delivery.id == req.headers["x-appliance-delivery"]
        assert delivery.event == "prediction"
        assert abs(delivery.timestamp - time.time()) < 60  # signed when sent
    assert sorted((r.json() for r in got), key=lambda m: m["seq"]) == [
        prediction(frame_result(seq)) for seq in range(3)
    ]
    ids = [r.headers["x-appliance-delivery"] for r in got]
    assert len(set(ids)) == 3 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    status = sink.status()
    assert (status.sent, status.retried, status.dropped, status.state) == (3, 0, 0, "stopped")
    assert len(sent_s) == 3 and all(s > 0 for s in sent_s)
    assert SECRET not in repr(cfg) and "api-key-1" not in repr(cfg)
    assert SECRET not in repr(status) and SECRET not in str(cfg.model_dump())


def test_500s_then_recovery_deliver_once_with_the_same_id(tmp_path: Path) -> None:
    with Receiver([Answer(500)] * 3) as rx:
        sink = WebhookSink("hook", make_config(rx.url, secret=SECRET), data_dir=tmp_path)
        with running(sink) as lt:
            sink.offer(frame_result(7))
            got = rx.wait_for(4)
            lt.call(sink.stop(5.0))
    assert [r.answer.status for r in rx.requests] == [500, 500, 500, 200]
    assert len({r.headers["x-appliance-delivery"] for r in got}) == 1
    assert all(verified(r).id == got[0].headers["x-appliance-delivery"] for r in got)
    assert all(r.body == got[0].body for r in got)
    status = sink.status()
    assert (status.sent, status.retried, status.dead_lettered) == (1, 3, 0)
    assert dead_letters(sink) == []


def test_429_retry_after_is_honoured(tmp_path: Path) -> None:
    with Receiver([Answer(429, headers={"Retry-After": "1"})]) as rx:
        sink = WebhookSink("hook", make_config(rx.url), data_dir=tmp_path)
        with running(sink):
            sink.offer(frame_result(1))
            first, second = rx.wait_for(2)
    # The backoff alone would wait 0.01 s: the gap is the server's 1 s.
    assert second.time - first.time >= 0.95
    assert second.headers["x-appliance-delivery"] == first.headers["x-appliance-delivery"]
    assert sink.status().sent == 1


# -- signatures: what a receiver refuses ----------------------------------------------
def refuse_unverified(headers: Mapping[str, str], body: bytes, now: float | None = None) -> Any:
    """A receiver's check with the client's helper: 401 for what does not verify."""
    try:
        verify_webhook(SECRET, headers, body, now=now)
    except WebhookVerificationError as exc:
        return Answer(401, str(exc).encode())
    return None


def deliveries(n: int, tmp_path: Path, secret: str = SECRET) -> list[Request]:
    """`n` deliveries as a receiver got them from a sink signing with `secret`."""
    with Receiver() as rx:
        sink = WebhookSink("hook", make_config(rx.url, secret=secret), data_dir=tmp_path)
        with running(sink) as lt:
            for seq in range(n):
                sink.offer(frame_result(seq))
            got = rx.wait_for(n)
            lt.call(sink.stop(5.0))
    return got


def replay(url: str, request: Request) -> int:
    """POST `request`'s headers and body again, as an attacker who recorded it would."""
    headers = {k: v for k, v in request.headers.items() if k not in ("host", "content-length")}
    req = urllib.request.Request(url, request.body, headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_verifying_receiver_takes_signed_deliveries_and_refuses_a_wrong_key(
    tmp_path: Path,
) -> None:
    with Receiver(check=refuse_unverified) as rx:
        for name, secret in (("good", SECRET), ("bad", "another-key")):
            sink = WebhookSink(name, make_config(rx.url, secret=secret), data_dir=tmp_path)
            with running(sink) as lt:
                sink.offer(frame_result(1))
                sink.offer(frame_result(2))
                rx.wait_for(2 if name == "good" else 4)
                lt.call(sink.stop(5.0))
            statuses = [r.answer.status for r in rx.requests[-2:]]
            assert statuses == ([200, 200] if name == "good" else [401, 401]), name
    # A 401 is final: the wrong key's deliveries are dead letters, saying why.
    assert sink.status().dead_lettered == 2
    assert all("does not match" in d["answer"] for d in dead_letters(sink))


def test_a_delivery_replayed_after_the_tolerance_is_refused(tmp_path: Path) -> None:
    [original] = deliveries(1, tmp_path)
    delivery = verified(original)
    later = delivery.timestamp + DEFAULT_TOLERANCE_S + 1  # the receiver's clock, replayed
    with pytest.raises(WebhookVerificationError, match="tolerance 300 s"):
        verify_webhook(SECRET, original.headers, original.body, now=later)
    # The same request sent again to a receiver whose clock is past the window: refused.
    with Receiver(check=lambda h, b: refuse_unverified(h, b, now=later)) as rx:
        assert replay(rx.url, original) == 401
        assert b"replay" in rx.wait_for(1)[0].answer.body
    # Within the window the signature still verifies: the replay guard drops the id.
    guard = ReplayGuard()
    assert guard.accept(delivery.id, delivery.timestamp)
    again = verified(original)
    assert not guard.accept(again.id, again.timestamp)


def test_a_body_moved_under_another_delivery_id_is_refused(tmp_path: Path) -> None:
    first, second = deliveries(2, tmp_path)
    other_id = second.headers["x-appliance-delivery"]
    moved = {**first.headers, "x-appliance-delivery": other_id}
    with pytest.raises(WebhookVerificationError, match="does not match"):
        verify_webhook(SECRET, moved, first.body)  # first's body and signature, second's id
    with pytest.raises(WebhookVerificationError, match="does not match"):
        verify_webhook(SECRET, first.headers, second.body)  # another body, first's signature
    # An id with a '.' could move bytes between the id and the body: never a delivery id.
    shifted = {**first.headers, "x-appliance-delivery": first.headers["x-appliance-delivery"] + "."}
    with pytest.raises(WebhookVerificationError, match="not a delivery id"):
        verify_webhook(SECRET, shifted, first.body[1:])


def test_a_retry_is_signed_afresh_with_the_same_id(tmp_path: Path) -> None:
    """Each attempt is signed when it is sent: a retry after 2 s carries a later time (a
    signature made once, at offer, would age out of a receiver's window while retrying)."""
    with Receiver([Answer(503, headers={"Retry-After": "2"})]) as rx:
        sink = WebhookSink("hook", make_config(rx.url, secret=SECRET), data_dir=tmp_path)
        with running(sink):
            sink.offer(frame_result(1))
            first, second = rx.wait_for(2)
    one, two = verified(first), verified(second)
    assert one.id == two.id and first.body == second.body
    assert two.timestamp >= one.timestamp + 1
    assert sink.status().sent == 1


# -- dead letters ---------------------------------------------------------------------
def test_a_400_is_dead_lettered_at_once_with_the_answer(tmp_path: Path) -> None:
    refusal = Answer(400, b'{"error": "field stream unknown"}')
    with Receiver([refusal]) as rx:
        sink = WebhookSink("hook", make_config(rx.url, retries=5), data_dir=tmp_path)
        with running(sink) as lt:
            sink.offer(frame_result(3))
            rx.wait_for(1)
            lt.call(sink.stop(5.0))
        assert len(rx.requests) == 1
    [letter] = dead_letters(sink)
    assert letter["status"] == 400 and letter["attempts"] == 1
    assert letter["last_error"] == "HTTP 400 Bad Request"
    assert "field stream unknown" in letter["answer"]
    assert letter["body"] == prediction(frame_result(3))
    assert letter["url"] == rx.url
    # The file's own time format, unchanged (not iso_utc's `...Z`): `time` to the
    # millisecond, `offered` to the microsecond, both with `+00:00`.
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", letter["time"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00", letter["offered"])
    offered = datetime.fromisoformat(letter["offered"]).timestamp()
    assert offered <= datetime.fromisoformat(letter["time"]).timestamp() + 0.001
    assert abs(offered - time.time()) < 60
    status = sink.status()
    assert (status.dead_lettered, status.retried, status.sent) == (1, 0, 0)


def test_exhausted_retries_are_dead_lettered_with_the_last_error(tmp_path: Path) -> None:
    with Receiver(default=Answer(500, b"boom")) as rx:
        sink = WebhookSink("hook", make_config(rx.url, retries=2), data_dir=tmp_path)
        with running(sink) as lt:
            sink.offer(frame_result(4))
            rx.wait_for(3)
            lt.call(sink.stop(5.0))
        assert len(rx.requests) == 3  # the first attempt and 2 retries, no more
    [letter] = dead_letters(sink)
    assert letter["attempts"] == 3 and letter["status"] == 500 and letter["answer"] == "boom"
    assert letter["last_error"] == "HTTP 500 Internal Server Error"
    status = sink.status()
    assert (status.dead_lettered, status.retried, status.sent) == (1, 2, 0)
    assert status.last_error == "HTTP 500 Internal Server Error"


def test_dead_letter_files_rotate_within_bounds(tmp_path: Path) -> None:
    cfg = DeadLetterConfig(max_bytes=1024, keep_files=2)
    dead = DeadLetterFile(tmp_path / "dead-letters" / "hook.jsonl", cfg)
    for i in range(60):
        dead.append([{"delivery": i, "pad": "x" * 150}])
    files = dead.files()
    assert [p.name for p in files] == ["hook.jsonl", "hook.jsonl.1", "hook.jsonl.2"]
    assert len(list(dead.path.parent.iterdir())) == 3
    assert all(p.stat().st_size <= cfg.max_bytes for p in files)
    ids = [[json.loads(x)["delivery"] for x in p.read_text().splitlines()] for p in files]
    assert ids[0][-1] == 59  # the newest is in the live file
    assert ids[2] + ids[1] + ids[0] == list(range(ids[2][0], 60))  # oldest went first


# -- bounds and failures --------------------------------------------------------------
def test_a_hanging_endpoint_keeps_offer_cheap_and_the_queue_bounded(tmp_path: Path) -> None:
    with Receiver(default=Answer(hang=True)) as rx:
        cfg = make_config(rx.url, timeout_s=60, concurrency=2, queue={"max_messages": 5})
        sink = WebhookSink("hook", cfg, data_dir=tmp_path)
        with running(sink) as lt:
            sink.offer(frame_result(0))
            sink.offer(frame_result(1))
            rx.wait_for(2)  # both slots now wait on the endpoint
            started = time.perf_counter()
            assert all(sink.offer(frame_result(seq)) for seq in range(2, 202))
            # A blocking offer would wait for the 60 s timeout: this is not a benchmark.
            assert time.perf_counter() - started < 1.0
            status = sink.status()
            assert (status.queue_depth, status.dropped, status.extra["in_flight"]) == (5, 195, 2)
            started = time.perf_counter()
            assert lt.call(offer_while_stopping(sink, 0.2)) is False
            assert time.perf_counter() - started < 5.0
        assert len(rx.requests) == 2  # the concurrency limit held
    assert sink.status().dropped == 195 + 7
    assert not sink.offer(frame_result(999))
    letters = dead_letters(sink)
    assert len(letters) == 7
    assert all(d["last_error"] == "shutdown before delivery" for d in letters)
    assert sorted(d["body"]["seq"] for d in letters) == [0, 1, *range(197, 202)]


def test_a_receiver_that_is_down_then_up_gets_the_delivery(tmp_path: Path) -> None:
    closed = bound_socket()  # bound, not listening: connections are refused
    port = closed.getsockname()[1]
    url = f"http://user:pw-secret@127.0.0.1:{port}/hook?token=tok-secret"
    sink = WebhookSink("hook", make_config(url, retries=100), data_dir=tmp_path)
    with running(sink) as lt, log_waiter("attempt") as failures:
        sink.offer(frame_result(5))
        failures.wait(2)
        down = sink.status()
        closed.close()
        with Receiver(port=port) as rx:
            [req] = rx.wait_for(1)
            lt.call(sink.stop(5.0))
    assert req.json() == prediction(frame_result(5))
    assert not down.up and down.state == "failing" and down.last_error is not None
    assert "ClientConnectorError" in down.last_error
    assert down.extra["url"] == f"http://127.0.0.1:{port}/hook"
    assert "secret" not in str(down)
    status = sink.status()
    assert status.sent == 1 and status.retried >= 2 and status.dead_lettered == 0


def test_stop_drains_what_is_queued(tmp_path: Path) -> None:
    with Receiver() as rx:
        sink = WebhookSink("hook", make_config(rx.url, concurrency=1), data_dir=tmp_path)
        for seq in range(20):  # queued before start, as a worker may
            sink.offer(frame_result(seq))
        with running(sink) as lt:
            lt.call(sink.stop(10.0))
        assert sorted(r.json()["seq"] for r in rx.requests) == list(range(20))
    status = sink.status()
    assert (status.sent, status.dropped, status.queue_depth) == (20, 0, 0)


def test_a_sink_stopped_before_it_started_dead_letters_what_it_held(tmp_path: Path) -> None:
    sink = WebhookSink("hook", make_config("http://127.0.0.1:9/hook"), data_dir=tmp_path)
    sink.offer(frame_result(1))
    sink.offer(frame_result(2))
    with LoopThread("sink-loop") as lt:
        lt.call(sink.stop(1.0))
    assert (sink.status().dropped, sink.status().state) == (2, "stopped")
    assert [d["body"]["seq"] for d in dead_letters(sink)] == [1, 2]


# -- config and helpers ---------------------------------------------------------------
@pytest.mark.parametrize(
    "fields",
    [
        {"url": "ftp://host/x"},
        {"url": "http:///no-host"},
        {"url": "http://host:99999/"},
        {"headers": {"X-Appliance-Signature": "forged"}},
        {"headers": {"X-Key": "a\r\nInjected: 1"}},
        {"backoff": {"initial_s": 10, "max_s": 1}},
        {"retries": -1},
        {"unknown": 1},
        {"secret": ""},
        {"secret": "key", "secret_file": "/run/secrets/hook"},
    ],
)
def test_bad_configs_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        WebhookConfig.model_validate({"type": "webhook", "url": "https://example.com/h", **fields})


def test_bad_sink_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sink name"):
        WebhookSink("../x", make_config("http://127.0.0.1/h"), data_dir=tmp_path)


def test_a_secret_file_the_runtime_did_not_read_is_refused(tmp_path: Path) -> None:
    """The runtime reads `secret_file` (through its file policy) into `secret`; a sink
    given the path alone would send unsigned what the config asked to sign."""
    cfg = make_config("http://127.0.0.1/h", secret_file="/run/secrets/hook")
    with pytest.raises(ValueError, match=r"sinks\.hook\.secret_file: not read"):
        WebhookSink("hook", cfg, data_dir=tmp_path)


def test_safe_url_shows_no_credentials() -> None:
    assert safe_url("https://u:p@h.example:8443/a/b?key=k#f") == "https://h.example:8443/a/b"
    assert safe_url("http://[::1]:81/h") == "http://[::1]:81/h"


def test_retry_after_reads_seconds_and_dates_within_the_cap() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert retry_after_s("7", 300, now) == 7.0
    assert retry_after_s("100000", 300, now) == 300.0
    assert retry_after_s(format_datetime(now + timedelta(seconds=30), usegmt=True), 300, now) == 30
    assert retry_after_s(format_datetime(now - timedelta(seconds=30), usegmt=True), 300, now) == 0
    assert retry_after_s("soon", 300, now) is None
    assert retry_after_s(None, 300, now) is None


def test_backoff_grows_to_its_cap_with_bounded_jitter() -> None:
    cfg = BackoffConfig(initial_s=0.5, max_s=4, multiplier=2, jitter=0.0)
    rng = random.Random(1)
    assert [backoff_delay(cfg, n, rng) for n in range(1, 7)] == [0.5, 1, 2, 4, 4, 4]
    jittered = BackoffConfig(initial_s=1, max_s=1, jitter=0.2)
    assert all(0.8 <= backoff_delay(jittered, 1000, rng) <= 1.2 for _ in range(100))
