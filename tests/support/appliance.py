"""Fixtures that run the real appliance: configs on disk and `appliance serve` processes.

`served` starts the console script in a subprocess on an unused loopback port (uvicorn's
`run_server` practice) and always stops it at teardown.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.runtime.runtime import Runtime
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "configs" / "models"
DEMO_CLIP = ROOT / "configs" / "media" / "demo.mp4"
APPLIANCE = [sys.executable, "-m", "appliance"]


def person_model(**batching: Any) -> dict[str, Any]:
    return {
        "path": str(MODELS / "person_ssdlite.onnx"),
        "decoder": "tf_od",
        "labels": ["person"],
        "providers": ["cpu"],
        "batching": batching or {"max_batch_size": 4, "max_queue_delay_ms": 2},
        # The suite shares two cores between two xdist workers and their appliances: ORT's
        # idle threads spinning after each run cost a realtime demo camera 5.7 s of CPU
        # in 10 s against 3.9 s not spinning, for the same frames (measured here under
        # the suite's load; the setting's trade-off: docs/performance.md, bench/spinning.py).
        "session": {"allow_spinning": False},
    }


def detect_workflow(model: str = "person", block: str = "people") -> dict[str, Any]:
    return {
        "name": f"detect_{model}",
        "blocks": [{"id": block, "type": "detect", "model": model, "confidence": 0.4}],
        "outputs": {block: block},
    }


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    """Write a config document as YAML in a fresh folder; returns its path."""
    counter = iter(range(1000))

    def write(doc: dict[str, Any]) -> Path:
        path = tmp_path / f"config{next(counter)}.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        return path

    return write


@dataclass
class Served:
    """A running `appliance serve` process; `context`: the client's TLS context (its CA)
    when it serves https."""

    process: subprocess.Popen[str]
    url: str
    log_path: Path
    context: ssl.SSLContext | None = None

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(
                self.url + path, timeout=timeout, context=self.context
            ) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as err:
            return int(err.code), bytes(err.read())

    def json(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def wait_for(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll an HTTP-observable condition (the process is outside ours) until true."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"appliance exited ({self.process.returncode}): {self.log()}")
            try:
                if check():
                    return
            except (OSError, AssertionError):
                pass  # not up yet
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-4000:]

    def stop(self) -> None:
        """Kill the process if it still runs (teardown)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def terminate(self, timeout: float = 10.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


CLIENT_ENV = ("APPLIANCE_URL", "APPLIANCE_API_TOKEN")  # tests set these themselves


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the appliance's variables (an inherited
    APPLIANCE_API_TOKEN would override a test config's token), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def start_served(
    config: Path,
    log_dir: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    port: int | None = None,
    tls: ssl.SSLContext | None = None,
) -> Served:
    """`appliance serve --config PATH --port PORT ...` in a subprocess, up (/health);
    a free port unless one is given (an appliance started again where it was). `tls`:
    it serves https (server.tls), and this client context trusts its certificate."""
    port = port or free_port()
    argv = ["serve", "--config", str(config), "--port", str(port), *extra]
    served = launch(argv, port, log_dir, env=env, tls=tls)
    try:
        served.wait_for(lambda: served.get("/health")[0] == 200, 60, "/health")
    except BaseException:
        served.stop()
        raise
    return served


def launch(
    argv: list[str],
    port: int,
    log_dir: Path,
    *,
    name: str = "",
    env: dict[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
) -> Served:
    """`python -m appliance ARGV` (a `serve`, a `gateway`) in a subprocess that answers on
    `port`, its output in a log file of `log_dir` (`name`: the file's, by default the
    command's); not waited for: the caller waits for what it needs (/health, /ready).
    `tls`: it serves https, and this client context trusts its certificate."""
    log_path = log_dir / f"{name or argv[0]}-{port}-{time.monotonic_ns()}.log"
    with log_path.open("w") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [*APPLIANCE, *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=env or clean_env(),
        )
    scheme = "http" if tls is None else "https"
    return Served(proc, f"{scheme}://127.0.0.1:{port}", log_path, tls)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Start `appliance serve --config PATH` on a free port; waits for /health."""
    started: list[Served] = []

    def start(config: Path, *extra: str, env: dict[str, str] | None = None) -> Served:
        served = start_served(config, tmp_path, *extra, env=env)
        started.append(served)
        return served

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def runtimes() -> Iterator[list[Runtime]]:
    """In-process runtimes a test started (append them): each stopped at teardown."""
    started: list[Runtime] = []
    yield started
    for rt in started:
        rt.stop()
