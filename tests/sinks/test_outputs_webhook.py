"""A stream's results reach a real webhook receiver through the runtime's outputs: the
config declares the sink, the stream names it with a filter; the key may come from a
`secret_file`, read through the file policy; a receiver that hangs costs the stream
nothing (its results are dropped at the sink's bound, and counted)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.client import verify_webhook
from appliance.config import parse_config
from appliance.errors import FileAccessError, LimitError
from appliance.runtime.runtime import Runtime
from tests.server.live import wait_for
from tests.sinks.receiver import Answer, Receiver
from tests.support.appliance import DEMO_CLIP, detect_workflow, person_model

SECRET = "hook-secret-9d2"
WAIT_S = 30.0

Start = Callable[..., Runtime]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    started: list[Runtime] = []

    def run(url: str, output: dict[str, Any], **hook: Any) -> Runtime:
        """`hook`'s fields override the sink's; a field given None is left out."""
        sink = {k: v for k, v in {"type": "webhook", "url": url, "secret": SECRET, **hook}.items()
                if v is not None}  # fmt: skip
        doc = {
            "models": {"person": person_model()},
            "sinks": {"hook": sink},
            "streams": [{"id": "cam", "workflow": detect_workflow(), "outputs": [output],
                         "source": {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime"}}],
        }  # fmt: skip
        rt = Runtime(parse_config(doc, tmp_path))
        started.append(rt)
        rt.start()
        return rt

    yield run
    for rt in started:
        rt.stop()


def test_results_arrive_signed_in_order_at_the_filtered_rate(start: Start) -> None:
    with Receiver() as rx:
        rt = start(rx.url, {"sink": "hook", "every_s": 0.2})
        got = rx.wait_for(4, WAIT_S)
        for request in got:
            delivery = verify_webhook(SECRET, request.headers, request.body)
            assert delivery.event == "prediction"
            body = request.json()
            assert body["stream"] == "cam" and set(body["outputs"]) == {"people"}
        seqs = [r.json()["seq"] for r in got]
        assert seqs == sorted(seqs)
        # every_s 0.2: no two results that went out were done less than 0.2 s apart (the
        # filter's rule, on each result's done time: its capture plus its latency). Not
        # "never two frames in a row": on a loaded machine two frames can finish 0.2 s
        # apart (seqs 3, 4 in one run).
        done = [r.json()["capture_time"] + r.json()["latency_ms"] / 1000 for r in got]
        assert all(b - a >= 0.2 - 0.001 for a, b in itertools.pairwise(done)), done  # rounding
        assert len(set(seqs)) == len(seqs)
        status = rt.outputs.statuses()[0]
        assert (status.name, status.type, status.up) == ("hook", "webhook", True)
        assert status.sent >= 3
        rt.sync_metrics()
        sent = rt.metrics.registry.get_sample_value(
            "appliance_sink_messages_total", {"sink": "hook", "outcome": "sent"}
        )
        assert sent is not None and sent >= 3


def test_a_hanging_receiver_costs_the_stream_nothing(start: Start) -> None:
    with Receiver(default=Answer(hang=True)) as rx:
        # The attempt's timeout well past the wait below: at its 5 s default, a loaded
        # machine's 30 frames took longer than that, and the retry made a second request.
        rt = start(
            rx.url, {"sink": "hook"}, concurrency=1, queue={"max_messages": 5}, timeout_s=120
        )
        rx.wait_for(1, WAIT_S)  # the first delivery hangs, holding the only slot
        stream = rt.streams["cam"]
        before = stream.rate.count
        # The worker goes on while the hook hangs: 30 more frames, 2 s of a 15 fps camera.
        wait_for(lambda: stream.rate.count - before >= 30, WAIT_S, "30 more frames")
        assert len(rx.requests) == 1  # all the while, the first delivery hung
        status = rt.outputs.statuses()[0]
        assert status.queue_depth <= 5 and status.dropped >= 10


def test_the_key_can_come_from_a_secret_file(start: Start, tmp_path: Path) -> None:
    """`secret_file` (a mounted secret): read at start through the file policy, its
    trailing newline dropped; deliveries verify with it; it shows nowhere."""
    (tmp_path / "hook-secret").write_text("key-from-a-file\n")
    with Receiver() as rx:
        rt = start(rx.url, {"sink": "hook", "every_s": 0.5}, secret=None, secret_file="hook-secret")
        got = rx.wait_for(2, WAIT_S)
        for request in got:
            verify_webhook("key-from-a-file", request.headers, request.body)
        status = rt.outputs.statuses()[0]
        assert status.up and "key-from-a-file" not in repr(status)


@pytest.mark.parametrize(
    ("content", "refused", "why"),
    [
        (None, FileAccessError, "file not found"),
        ("x" * 10_000, LimitError, "over the size limit"),  # a key is small: 4 KiB at most
        ("\n", FileAccessError, "empty"),  # a mount that did not happen
    ],
)
def test_a_bad_secret_file_is_a_clear_error(
    start: Start, tmp_path: Path, content: str | None, refused: type[Exception], why: str
) -> None:
    if content is not None:
        (tmp_path / "hook-secret").write_text(content)
    with pytest.raises(refused, match=why) as caught:
        start("http://127.0.0.1:9/hook", {"sink": "hook"}, secret=None, secret_file="hook-secret")
    assert "sinks.hook.secret_file: " in str(caught.value) and "hook-secret" in str(caught.value)
