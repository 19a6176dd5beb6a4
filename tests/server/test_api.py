"""The control API on a live server with a real model and the bundled clip as a live
camera: streams added and removed at runtime, a camera outage seen over HTTP, one-image
runs, models and probes. Bad requests: test_errors.py."""

from __future__ import annotations

import base64
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cv2
import numpy as np
import pytest

from pipelines.types import iso_utc
from tests.server.conftest import WAIT_S, LiveFactory, config_doc
from tests.server.live import FORM_TYPE, LiveServer, multipart, wait_for, write_yaml
from tests.support.appliance import DEMO_CLIP, ROOT, detect_workflow
from tests.support.rtsp import RtspServerFactory


def stream_threads(stream_id: str) -> set[str]:
    names = {f"grab:{stream_id}", f"work:{stream_id}"}
    return {t.name for t in threading.enumerate() if t.name in names}


def test_a_stream_shows_its_figures_and_model_providers(cam_server: LiveServer) -> None:
    listed = {s["id"]: s for s in cam_server.get_json("/v1/streams")["streams"]}
    cam = cam_server.stream("cam")
    assert listed["cam"]["providers"] == cam["providers"] == {"person": ["CPUExecutionProvider"]}
    assert cam["state"] == "running"
    assert cam["workflow"] == "detect_person"
    assert [t["state"] for t in cam["transitions"]][:2] == ["starting", "running"]


def test_add_a_stream_then_remove_it_and_its_threads(
    cam_server: LiveServer, cam_untouched: None
) -> None:
    # A relative workflow path resolves against the config file's directory.
    write_yaml(cam_server.config_dir, detect_workflow(), "detect.yaml")
    body = {"id": "extra", "source": str(DEMO_CLIP), "workflow": "detect.yaml"}
    added = cam_server.call("POST", "/v1/streams", json_body=body)
    assert added.status == 201, added.body
    assert added.headers["location"] == "/v1/streams/extra"
    assert added.json()["id"] == "extra"
    wait_for(lambda: cam_server.stream("extra")["state"] == "running", WAIT_S, "extra running")
    wait_for(lambda: cam_server.stream("extra")["frames_processed"] > 0, WAIT_S, "extra frames")
    assert stream_threads("extra") == {"grab:extra", "work:extra"}

    removed = cam_server.call("DELETE", "/v1/streams/extra")
    assert removed.status == 200
    assert removed.json() == {"id": "extra", "removed": True, "threads_joined": True}
    assert cam_server.call("GET", "/v1/streams/extra").status == 404
    assert stream_threads("extra") == set()  # joined, not merely abandoned
    assert "extra" not in {s["id"] for s in cam_server.get_json("/v1/streams")["streams"]}


def test_concurrent_adds_of_one_id_start_one_stream(
    cam_server: LiveServer, cam_untouched: None
) -> None:
    body = {"id": "twin", "source": str(DEMO_CLIP), "workflow": detect_workflow()}
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: cam_server.call("POST", "/v1/streams", json_body=body),
                                range(4)))  # fmt: skip
    assert sorted(r.status for r in replies) == [201, 409, 409, 409]
    assert stream_threads("twin") == {"grab:twin", "work:twin"}
    assert cam_server.call("DELETE", "/v1/streams/twin").json()["threads_joined"] is True
    assert stream_threads("twin") == set()


@pytest.mark.rtsp
def test_a_camera_outage_and_a_restart_are_seen_as_transitions(
    cam_server: LiveServer, rtsp_server: RtspServerFactory, cam_untouched: None
) -> None:
    camera = rtsp_server(pattern="320x240@15")
    source = {"url": camera.url, "stall_timeout_s": 2, "backoff": {"initial_s": 0.2, "max_s": 0.5}}
    body = {"id": "door", "source": source, "workflow": detect_workflow()}
    assert cam_server.call("POST", "/v1/streams", json_body=body).status == 201
    try:
        wait_for(lambda: cam_server.stream("door")["state"] == "running", WAIT_S, "door running")
        camera.stop()
        wait_for(
            lambda: cam_server.stream("door")["state"] == "reconnecting", WAIT_S, "outage seen"
        )
        camera.start()
        wait_for(lambda: cam_server.stream("door")["state"] == "running", WAIT_S, "door back")
        states = [t["state"] for t in cam_server.stream("door")["transitions"]]
        assert states[:2] == ["starting", "running"]
        assert states[-2:] == ["reconnecting", "running"]
        assert cam_server.stream("door")["reconnects"] >= 1

        restarted = cam_server.call("POST", "/v1/streams/door/restart")
        assert restarted.status == 200
        assert restarted.json()["id"] == "door"
        wait_for(lambda: cam_server.stream("door")["state"] == "running", WAIT_S, "door restarted")
        states = [t["state"] for t in cam_server.stream("door")["transitions"]]
        assert states == ["starting", "running"]  # a new stream: its own history
    finally:
        assert cam_server.call("DELETE", "/v1/streams/door").status == 200


def camera_jpeg() -> bytes:
    image = cv2.imread(str(ROOT / "configs/media/sources/camera.png"))
    assert image is not None
    ok, data = cv2.imencode(".jpg", image)
    assert ok
    return data.tobytes()


def assert_person_found(answer: dict[str, Any]) -> None:
    assert answer["workflow"] == "detect_person"
    assert answer["image_size"] == [512, 512]
    people = answer["outputs"]["people"]
    assert [p["class"] for p in people] == ["person"]
    assert people[0]["confidence"] > 0.5
    assert set(answer["timings_ms"]["blocks"]) == {"people"}


def test_run_a_workflow_on_a_photo_as_json_with_a_trace(cam_server: LiveServer) -> None:
    image = base64.b64encode(camera_jpeg()).decode()
    body = {"image": image, "workflow": detect_workflow(), "profile": True}
    reply = cam_server.call("POST", "/v1/workflows/run", json_body=body)
    assert reply.status == 200, reply.body
    answer = reply.json()
    assert_person_found(answer)
    events = answer["trace"]["traceEvents"]
    assert [(e["name"], e["args"]["type"]) for e in events if e.get("cat") == "block"] == [
        ("people", "detect")
    ]
    plain = cam_server.call("POST", "/v1/workflows/run", json_body={**body, "profile": False})
    assert "trace" not in plain.json()


def test_run_a_workflow_on_a_photo_as_multipart(cam_server: LiveServer) -> None:
    path = write_yaml(cam_server.config_dir, detect_workflow(), "people.yaml")
    form = multipart({"image": camera_jpeg(), "workflow": str(path).encode()})
    reply = cam_server.call("POST", "/v1/workflows/run", body=form, headers=FORM_TYPE)
    assert reply.status == 200, reply.body
    assert_person_found(reply.json())
    assert "trace" not in reply.json() and "video" not in reply.json()


def test_a_run_answers_its_video_output_as_an_image_on_request(live_server: LiveFactory) -> None:
    server = live_server(config_doc())  # of its own: the faces model stays loaded after
    blur = ROOT / "configs" / "workflows" / "privacy_blur.yaml"
    form = multipart({"image": camera_jpeg(), "workflow": str(blur).encode(), "video": b"true"})
    reply = server.call("POST", "/v1/workflows/run", body=form, headers=FORM_TYPE)
    assert reply.status == 200, reply.body
    jpeg = base64.b64decode(reply.json()["video"])
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.shape[:2] == (512, 512)
    original = cv2.imdecode(np.frombuffer(camera_jpeg(), np.uint8), cv2.IMREAD_COLOR)
    assert original is not None
    diff = cv2.absdiff(image, original).mean(axis=2)
    x0, y0, x1, y1 = (round(v) for v in reply.json()["outputs"]["faces"][0]["box"])
    inside = diff[y0:y1, x0:x1].mean()
    assert inside > 10 and inside > 5 * diff.mean()  # the face pixelated, the rest as sent


def test_validate_a_workflow(cam_server: LiveServer) -> None:
    reply = cam_server.call(
        "POST", "/v1/workflows/validate", json_body={"workflow": detect_workflow()}
    )
    assert reply.status == 200
    assert reply.json() == {
        "valid": True,
        "summary": "workflow 'detect_person': 1 block(s) [people:detect], outputs ['people']",
    }


def test_models_describe_interface_providers_and_batching(cam_server: LiveServer) -> None:
    (model,) = cam_server.get_json("/v1/models")["models"]
    assert model["id"] == "person"
    assert model["providers"] == ["CPUExecutionProvider"]
    assert model["batching"] == {"max_batch_size": 4, "max_queue_delay_ms": 2.0}
    assert model["inputs"][0]["dtype"] == "uint8"
    assert model["samples"] > 0  # cam's frames went through it


def test_probes_and_metrics(cam_server: LiveServer) -> None:
    assert cam_server.get_json("/health") == {"status": "ok"}
    ready = cam_server.get_json("/ready")
    profiling = ready.pop("profiling")
    started, uptime = ready.pop("started_at"), ready.pop("uptime_s")
    assert ready == {"ready": True, "models": ["person"], "waiting": [], "stalled": {},
                     "insecure": False, "tls": False, "sinks": {}, "shard": None,
                     "state": None}  # fmt: skip
    assert started == iso_utc(cam_server.runtime.started_at) and uptime >= 0
    assert profiling["enabled"] is True and profiling["window_active"] is False
    assert profiling["last_write_error"] is None
    # As the config names it (the default, `traces`), not the host's absolute path.
    assert profiling["trace_dir"] == "traces"
    metrics = cam_server.call("GET", "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert b'appliance_stream_up{stream="cam"} 1.0' in metrics.body
