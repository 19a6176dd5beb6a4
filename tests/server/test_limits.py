"""Resource limits against a live server (issue 8, part 2): every limit that is hit is
refused with its name and value, counted in `appliance_limit_hits_total{limit}`, and
the running stream goes on untouched."""

from __future__ import annotations

import asyncio
import base64
import resource
import shutil
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest

from appliance.config import ConfigError, parse_config
from appliance.errors import LimitError
from appliance.server.limits import WorkSlots
from tests.server.conftest import TOKEN, WAIT_S, LiveFactory, config_doc, demo_stream
from tests.server.live import LiveServer, Reply, wait_for, write_yaml
from tests.support.appliance import MODELS, detect_workflow, person_model

VALIDATE = "/v1/workflows/validate"
RUN = "/v1/workflows/run"
LIMITS = {
    "max_streams": 2,
    "max_models": 3,
    "idle_models": 1,
    "max_concurrent_runs": 1,
    "request_timeout_s": 2.0,  # runs on a loaded CI machine take well under this
    "max_image_pixels": 1_000_000,
}


@pytest.fixture(scope="module")
def limited(module_server: LiveFactory, tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    doc = {**config_doc(demo_stream("cam")), "limits": LIMITS}
    server = module_server(doc)
    for i in range(4):  # models an API workflow may declare: copies under the roots
        shutil.copy(MODELS / "person_ssdlite.onnx", server.config_dir / f"m{i}.onnx")
    wait_for(lambda: server.stream("cam")["frames_processed"] > 0, WAIT_S, "cam processing")
    return server


def _limit_hits(server: LiveServer, limit: str) -> float:
    for line in server.call("GET", "/metrics").body.decode().splitlines():
        if line.startswith(f'appliance_limit_hits_total{{limit="{limit}"}}'):
            return float(line.split()[-1])
    return 0.0


def _refused(reply: Reply, status: int, limit: str, value: object) -> None:
    assert reply.status == status, reply.body
    assert f"{limit} = {value}" in reply.error["message"], reply.error
    assert reply.error["details"] == [f"{limit}: {value}"]


def _jpeg(width: int, height: int) -> str:
    ok, jpg = cv2.imencode(".jpg", np.zeros((height, width, 3), np.uint8))
    assert ok
    return base64.b64encode(jpg.tobytes()).decode()


def _own_model(i: int) -> dict[str, object]:
    return {
        **detect_workflow(f"m{i}"),
        "models": {f"m{i}": {**person_model(), "path": f"m{i}.onnx"}},
    }


def test_an_image_over_the_pixel_limit_is_refused_from_its_header(limited: LiveServer) -> None:
    # 20000 x 20000 black PNG: 1.2 MB on the wire, 1.2 GB once decoded.
    _, png = cv2.imencode(".png", np.zeros((20000, 20000, 3), np.uint8))
    body = {"image": base64.b64encode(png.tobytes()).decode(), "workflow": detect_workflow()}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    del png
    hits = _limit_hits(limited, "limits.max_image_pixels")
    reply = limited.call("POST", RUN, json_body=body)
    _refused(reply, 413, "limits.max_image_pixels", 1_000_000)
    assert "image: over 178956970 pixels" in reply.error["message"]  # Pillow's own guard
    # Under Pillow's guard the size is read and named.
    _, big = cv2.imencode(".png", np.zeros((1200, 1000, 3), np.uint8))
    body_big = {**body, "image": base64.b64encode(big.tobytes()).decode()}
    reply = limited.call("POST", RUN, json_body=body_big)
    _refused(reply, 413, "limits.max_image_pixels", 1_000_000)
    assert "image: 1000x1200 is 1200000 pixels" in reply.error["message"]
    # Nothing was decoded: the peak RSS did not grow by anything like 1.2 GB.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300 * 1024
    assert _limit_hits(limited, "limits.max_image_pixels") == hits + 2
    assert limited.call("POST", RUN, json_body={**body, "image": _jpeg(640, 480)}).status == 200


def test_streams_beyond_the_limit_are_refused(limited: LiveServer) -> None:
    extra = {**demo_stream("extra"), "workflow": detect_workflow()}
    assert limited.call("POST", "/v1/streams", json_body=extra).status == 201
    try:
        third = limited.call("POST", "/v1/streams", json_body={**extra, "id": "third"})
        _refused(third, 409, "limits.max_streams", 2)
        assert limited.call("GET", "/v1/streams/third").status == 404
        assert _limit_hits(limited, "limits.max_streams") >= 1
    finally:
        assert limited.call("DELETE", "/v1/streams/extra").status == 200
    assert limited.stream("cam")["state"] == "running"


def test_models_of_api_workflows_are_released_when_idle(limited: LiveServer) -> None:
    for i in range(4):
        assert limited.call("POST", VALIDATE, json_body={"workflow": _own_model(i)}).status == 200
        loaded = {m["id"]: m for m in limited.get_json("/v1/models")["models"]}
        assert set(loaded) == {"person", f"m{i}"}  # idle_models = 1: the newest stays
        assert loaded["person"]["pinned"] and not loaded[f"m{i}"]["pinned"]
        assert loaded[f"m{i}"]["users"] == 0
    metrics = limited.call("GET", "/metrics").body.decode()
    assert 'model="m0"' not in metrics  # a released model's series go with it
    # A run reuses the idle model, then leaves it idle again.
    reply = limited.call("POST", RUN, json_body={"image": _jpeg(64, 48), "workflow": _own_model(3)})
    assert reply.status == 200, reply.body


def test_models_in_use_are_never_released_and_the_limit_holds(limited: LiveServer) -> None:
    # max_models = 3: the config's person, a stream's own m0 in use, and one more.
    own = {**demo_stream("own0"), "workflow": _own_model(0)}
    assert limited.call("POST", "/v1/streams", json_body=own).status == 201
    try:
        for i in (2, 3):  # each load releases the one idle model to make room
            reply = limited.call("POST", VALIDATE, json_body={"workflow": _own_model(i)})
            assert reply.status == 200, reply.body
            expected = {"person": 1, "m0": 1, f"m{i}": 0}  # m{i}: idle once validated

            def users() -> dict[str, int]:
                return {m["id"]: m["users"] for m in limited.get_json("/v1/models")["models"]}

            # A lease ends when its thread does, which may be just after the answer.
            def settled(want: dict[str, int] = expected) -> bool:
                return users() == want

            wait_for(settled, WAIT_S, f"users {expected}")
    finally:
        assert limited.call("DELETE", "/v1/streams/own0").status == 200
    assert limited.stream("cam")["state"] == "running"


def test_a_load_past_max_models_with_every_model_in_use_is_refused(
    live_server: LiveFactory,
) -> None:
    doc = {**config_doc(demo_stream("cam")), "limits": {"max_models": 2, "idle_models": 0}}
    server = live_server(doc)
    for i in range(2):
        shutil.copy(MODELS / "person_ssdlite.onnx", server.config_dir / f"m{i}.onnx")
    own = {**demo_stream("own"), "workflow": _own_model(0)}
    assert server.call("POST", "/v1/streams", json_body=own).status == 201
    reply = server.call("POST", VALIDATE, json_body={"workflow": _own_model(1)})
    _refused(reply, 409, "limits.max_models", 2)
    assert {m["id"] for m in server.get_json("/v1/models")["models"]} == {"person", "m0"}


def test_concurrent_runs_beyond_the_limit_get_429_with_retry_after(limited: LiveServer) -> None:
    body = {"image": _jpeg(1000, 1000), "workflow": detect_workflow()}
    start = threading.Barrier(6)

    def run(_: int) -> Reply:
        start.wait()
        return limited.call("POST", RUN, json_body=body)

    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(run, range(6)))
    statuses = sorted(r.status for r in replies)
    assert set(statuses) <= {200, 429} and 200 in statuses and 429 in statuses, statuses
    for reply in replies:
        if reply.status == 429:
            _refused(reply, 429, "limits.max_concurrent_runs", 1)
            assert reply.headers["retry-after"] == "1"


def test_a_request_past_its_time_is_cut_short_with_408(limited: LiveServer) -> None:
    # A client that announces a body and never sends it holds its handler in read().
    with socket.create_connection(("127.0.0.1", limited.port), timeout=10) as conn:
        conn.sendall(
            f"POST {VALIDATE} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
        )
        answer = conn.recv(65536).decode()
    assert answer.startswith("HTTP/1.1 408"), answer
    assert "limits.request_timeout_s = 2.0" in answer


def test_a_yaml_alias_bomb_is_refused_without_expanding(limited: LiveServer) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    write_yaml(limited.config_dir, {}, "bomb.yaml").write_text("\n".join(lines) + "\n")
    reply = limited.call("POST", VALIDATE, json_body={"workflow": "bomb.yaml"})
    assert reply.status == 422, reply.body
    assert "aliases" in " ".join(reply.error["details"])


def test_a_config_with_more_streams_than_the_limit_is_refused(tmp_path: Path) -> None:
    streams = [demo_stream(f"c{i}") for i in range(3)]
    with pytest.raises(ConfigError, match=r"3 streams, over limits.max_streams = 2"):
        parse_config({"streams": streams, "limits": {"max_streams": 2}}, tmp_path)


@pytest.fixture
def slots() -> Iterator[WorkSlots]:
    work = WorkSlots(1)
    yield work
    work.close()


def test_a_slot_is_held_until_its_thread_ends_not_until_the_answer(slots: WorkSlots) -> None:
    release = threading.Event()

    async def scenario() -> None:
        first = asyncio.ensure_future(slots.run(release.wait, 30))
        await asyncio.sleep(0)  # let the first take its slot
        with pytest.raises(LimitError) as refused:
            await slots.run(lambda: None)
        assert (refused.value.status, refused.value.retry_after_s) == (429, 1.0)
        first.cancel()  # the answer is given up (time limit) but the thread still works
        with pytest.raises(LimitError):
            await slots.run(lambda: None)
        release.set()
        while slots.busy:
            await asyncio.sleep(0.01)
        assert await slots.run(lambda: 7) == 7

    asyncio.run(scenario())
