"""`appliance serve` on the embedded demo (what `make run` starts) and on a live camera."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.support.appliance import ROOT, Served
from tests.support.processes import free_port


def demo_copy(tmp_path: Path) -> Path:
    """configs/demo.yaml with its paths made absolute, so it runs from a temp folder."""
    doc = yaml.safe_load((ROOT / "configs/demo.yaml").read_text())
    base = ROOT / "configs"
    for stream in doc["streams"]:
        stream["source"]["url"] = str(base / stream["source"]["url"])
        stream["workflow"] = str(base / stream["workflow"])
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def streams(served: Served) -> dict[str, Any]:
    return {s["id"]: s for s in served.json("/v1/streams")["streams"]}


def test_demo_serves_health_metrics_and_processes_both_streams(
    serve: Callable[..., Served], tmp_path: Path
) -> None:
    served = serve(demo_copy(tmp_path), "--stats-interval", "1")
    assert served.json("/health") == {"status": "ok"}

    def both_processing() -> bool:
        s = streams(served)
        # The clip opens on an empty lawn: wait until people have walked in.
        return all(s[i]["detections"] > 0 for i in ("people-cam", "faces-cam"))

    served.wait_for(both_processing, 60, "both demo streams to process frames")
    s = streams(served)
    assert s["people-cam"]["state"] == "running"
    assert s["people-cam"]["frames_processed"] > 0
    assert s["faces-cam"]["workflow"] == "privacy_blur"
    assert served.get("/ready")[0] == 200

    status, body = served.get("/metrics")
    text = body.decode()
    assert status == 200
    assert (
        'appliance_block_latency_seconds_count{block="people",stream="people-cam",type="detect",'
        'variant="live"}' in text
    )
    assert 'appliance_model_batch_size_count{model="faces"}' in text
    assert 'appliance_frames_total{outcome="processed",stream="faces-cam"}' in text
    assert 'appliance_stream_up{stream="people-cam"} 1.0' in text

    one = served.json("/v1/streams/people-cam")
    assert [t["state"] for t in one["transitions"]][:2] == ["starting", "running"]
    assert served.get("/v1/streams/nope")[0] == 404

    # From the second line on, the rate over the line's own interval (issue 30, item 5).
    interval_line = re.compile(r"people-cam running: [\d.]+ fps over the last \d\.\d s ")
    served.wait_for(lambda: bool(interval_line.search(served.log())), 10, "an fps log line")
    # The promise (server.drain_timeout_s, README): the process exits within 5 s of SIGTERM.
    asked = time.perf_counter()
    assert served.terminate(timeout=10) == 0
    assert time.perf_counter() - asked < 5.0
    assert "runtime stopped" in served.log()
    assert "did not end" not in served.log()


def test_a_missing_source_file_fails_only_that_stream(
    serve: Callable[..., Served], tmp_path: Path, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    doc = yaml.safe_load(demo_copy(tmp_path).read_text())
    gone = tmp_path / "gone.mp4"  # source URLs are not checked by config validation
    doc["streams"][1]["source"]["url"] = str(gone)
    served = serve(write_config(doc))
    served.wait_for(lambda: streams(served)["faces-cam"]["state"] == "failed", 30, "failed")
    served.wait_for(lambda: streams(served)["people-cam"]["frames_processed"] > 3, 60, "frames")
    assert str(gone) in streams(served)["faces-cam"]["last_error"]
    assert served.terminate() == 0


def test_an_unreachable_camera_reconnects_while_the_others_run(
    serve: Callable[..., Served], tmp_path: Path, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    doc = yaml.safe_load(demo_copy(tmp_path).read_text())
    port = free_port()  # nothing listens there: connection refused, at once, every time
    doc["streams"][1]["source"] = {
        "url": f"rtsp://admin:hunter2@127.0.0.1:{port}/live",
        "backoff": {"initial_s": 0.2, "max_s": 0.5},
    }
    served = serve(write_config(doc))

    def retried_twice() -> bool:
        one = served.json("/v1/streams/faces-cam")
        return bool(sum(t["state"] == "reconnecting" for t in one["transitions"]) >= 2)

    served.wait_for(retried_twice, 30, "two reconnect attempts")
    served.wait_for(lambda: streams(served)["people-cam"]["frames_processed"] > 3, 60, "frames")
    cam = served.json("/v1/streams/faces-cam")
    assert cam["state"] == "reconnecting"
    assert cam["url"] == f"rtsp://***:***@127.0.0.1:{port}/live"
    refused = f"cannot connect to 127.0.0.1:{port} (connection refused: nothing listens there)"
    assert refused in cam["last_error"], cam
    assert refused in served.log()  # the reconnect warning says it in the same words
    assert "hunter2" not in served.log()
    assert "hunter2" not in str(cam)
    assert served.terminate() == 0
