"""`serve --workers 2 --state-dir D` as real processes: a camera added over the API comes
back, with origin `api`, when its worker is killed and started again by the supervisor.
The state folder is given on the gateway's command line only: the workers re-read a
config file that does not name it, so it reaches them through their own command line."""

from __future__ import annotations

import itertools
import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from appliance.runtime.sharding import assign
from tests.state.conftest import cam, config_doc, write_config
from tests.support.appliance import Served


def post(served: Served, path: str, body: Any) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(served.url + path, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def workers(served: Served) -> list[dict[str, Any]]:
    """The supervisor's view of each worker (/ready answers 503 while a stream starts)."""
    found: list[dict[str, Any]] = json.loads(served.get("/ready")[1])["workers"]
    return found


def listed(served: Served) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in served.json("/v1/streams")["streams"]}


def test_a_camera_added_over_the_api_survives_its_workers_crash(
    tmp_path: Path, serve: Callable[..., Served]
) -> None:
    doc = config_doc(cam("a"))
    del doc["server"]["state_dir"]  # given on the command line instead
    config = write_config(tmp_path / "config.yaml", doc)
    kept = tmp_path / "kept"
    served = serve(config, "--workers", "2", "--state-dir", str(kept))
    served.wait_for(lambda: served.get("/ready")[0] == 200, 60, "both workers ready")
    status, body = post(served, "/v1/streams", cam("x"))
    assert status == 201, body
    worker = listed(served)["x"]["worker"]
    assert (kept / f"worker-{worker}.json").is_file()
    victim = workers(served)[worker]["pid"]
    os.kill(victim, signal.SIGKILL)

    def back() -> bool:
        again = workers(served)[worker]
        stream = listed(served).get("x")
        return again["pid"] != victim and stream is not None and stream["state"] == "running"

    served.wait_for(back, 30, f"worker {worker} started again with x")
    x = listed(served)["x"]
    assert (x["origin"], x["worker"]) == ("api", worker)
    assert listed(served)["a"]["origin"] == "config"
    states = served.json("/ready")["states"]  # each worker's own document, by index
    assert states[str(worker)]["file"].endswith(f"worker-{worker}.json"), states
    assert states[str(worker)]["problem"] is None and states[str(worker)]["streams"] == 1


def test_fewer_workers_keep_the_cameras_of_the_workers_gone(
    tmp_path: Path, serve: Callable[..., Served]
) -> None:
    # Two config streams on workers 0 and 1 of 3: a camera added goes to worker 2, the
    # least loaded, which `--workers 2` no longer has (worker 0 takes its document over).
    names = [f"cam-{i}" for i in range(12)]
    pair = next(p for p in itertools.combinations(names, 2) if set(assign(p, 3).values()) == {0, 1})
    config = write_config(tmp_path / "config.yaml", config_doc(*map(cam, pair)))
    three = serve(config, "--workers", "3")
    three.wait_for(lambda: three.get("/ready")[0] == 200, 60, "every worker ready")
    status, body = post(three, "/v1/streams", cam("x"))
    assert status == 201, body
    assert listed(three)["x"]["worker"] == 2
    assert three.terminate() == 0

    two = serve(config, "--workers", "2")
    two.wait_for(lambda: "x" in listed(two), 60, "x started by worker 0")
    x = listed(two)["x"]
    assert (x["origin"], x["worker"]) == ("api", 0)
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["worker-0.json"]
