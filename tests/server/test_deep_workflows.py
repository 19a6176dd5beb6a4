"""Deep workflows against a live server (issue 23, item 6): a workflow over
limits.max_blocks is refused on its count and counted; under a raised limit a deep one
compiles in linear time; the threads validation uses are bounded pools that stay so."""

from __future__ import annotations

import base64
import os
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from appliance.errors import LimitError
from tests.server.conftest import LiveFactory, config_doc, demo_stream
from tests.server.live import LiveServer, write_yaml

VALIDATE = "/v1/workflows/validate"
RUN = "/v1/workflows/run"
RAISED = 2000  # limits.max_blocks of the `raised` server
RUNS = 4  # its limits.max_concurrent_runs: the `run` threads of WorkSlots
QUICK_S = 5.0  # a refusal on the count is milliseconds; the recursive compiler took 10 s
# asyncio's default executor (ThreadPoolExecutor's default size), where request bodies
# are parsed: it grows to this many threads and stays.
DEFAULT_EXECUTOR = min(32, (os.cpu_count() or 1) + 4)


def chain(n: int, name: str = "chain") -> dict[str, Any]:
    """n rate_limit pass-throughs, each reading the one before: one path n blocks deep."""
    blocks = [
        {"id": f"b{i}", "type": "rate_limit", "every_n_frames": 1, "value": f"b{i - 1}"}
        for i in range(n)
    ]
    blocks[0]["value"] = "frame"
    return {"name": name, "blocks": blocks, "outputs": {"video": f"b{n - 1}"}}


def _limit_hits(server: LiveServer) -> float:
    prefix = 'appliance_limit_hits_total{limit="limits.max_blocks"}'
    for line in server.call("GET", "/metrics").body.decode().splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


def _refused_on_count(server: LiveServer, path: str, body: dict[str, Any], n: int) -> None:
    limit = server.runtime.limits.max_blocks
    t0 = time.monotonic()
    reply = server.call("POST", path, json_body=body)
    assert time.monotonic() - t0 < QUICK_S
    assert reply.status == 413, reply.body[:500]
    message = reply.error["message"]
    assert f"workflow 'chain' has {n} blocks (limits.max_blocks = {limit})" in message
    assert reply.error["details"] == [f"limits.max_blocks: {limit}"]


def test_a_1000_block_chain_is_refused_on_its_count_and_counted(
    cam_server: LiveServer, cam_untouched: None
) -> None:
    """Once a 500 (RecursionError) after 10 s of compiling: now 413, on both routes."""
    hits = _limit_hits(cam_server)
    _refused_on_count(cam_server, VALIDATE, {"workflow": chain(1000)}, 1000)
    ok, jpg = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))
    assert ok
    image = base64.b64encode(jpg.tobytes()).decode()
    _refused_on_count(cam_server, RUN, {"image": image, "workflow": chain(257)}, 257)
    assert _limit_hits(cam_server) == hits + 2
    valid = cam_server.call("POST", VALIDATE, json_body={"workflow": chain(256)})
    assert valid.status == 200, valid.body[:500]  # the limit itself is allowed


@pytest.fixture(scope="module")
def raised(module_server: LiveFactory) -> LiveServer:
    limits = {"max_blocks": RAISED, "max_concurrent_runs": RUNS}
    return module_server({**config_doc(), "limits": limits})


def test_with_the_limit_raised_a_1000_block_chain_validates(raised: LiveServer) -> None:
    reply = raised.call("POST", VALIDATE, json_body={"workflow": chain(1000)})
    assert reply.status == 200, reply.body[:500]
    assert reply.json()["summary"].startswith("workflow 'chain': 1000 block(s) [b0:rate_limit")
    _refused_on_count(raised, VALIDATE, {"workflow": chain(RAISED + 1)}, RAISED + 1)


def test_a_config_workflow_over_the_limit_is_refused_at_start(
    live_server: LiveFactory, tmp_path: Path
) -> None:
    """The error names the stream, the workflow file and the limit."""
    write_yaml(tmp_path, chain(300), "deep.yaml")
    stream = {**demo_stream("cam"), "workflow": "deep.yaml"}
    with pytest.raises(LimitError) as caught:
        live_server(config_doc(stream))
    assert str(caught.value) == (  # the file named as the config names it
        "streams[0].workflow (deep.yaml): workflow 'chain' has 300 blocks (limits.max_blocks = 256)"
    )


def _threads() -> Counter[str]:
    """The process's threads by name, numbers stripped (`run_3` -> `run`)."""
    return Counter(t.name.rstrip("0123456789").rstrip("_-") for t in threading.enumerate())


def test_threads_after_large_validations_are_the_bounded_pools(raised: LiveServer) -> None:
    """Waves of 1000-block validations, more at once than there are run slots: what
    stays after them is the run slots' pool and asyncio's default executor, each within
    its size, and later waves add nothing to them."""
    baseline = _threads()

    def validate(i: int) -> int:
        body = {"workflow": chain(1000, f"wave{i}")}  # each its own digest: a compile
        return raised.call("POST", VALIDATE, json_body=body).status

    after: list[Counter[str]] = []
    for wave in range(3):
        with ThreadPoolExecutor(2 * RUNS, thread_name_prefix="client") as clients:
            statuses = set(clients.map(validate, range(wave * 100, wave * 100 + 2 * RUNS)))
        assert statuses <= {200, 429}, statuses  # 429: every run slot busy
        after.append(_threads() - baseline)
    for grown in after:
        assert set(grown) <= {"run", "asyncio"}, grown
        assert grown["run"] <= RUNS and grown["asyncio"] <= DEFAULT_EXECUTOR, grown
