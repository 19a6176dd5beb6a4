"""Fixtures of the server tests: configs on disk and in-process servers stopped at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.live import LiveServer, wait_for, write_yaml
from tests.support.appliance import DEMO_CLIP, ROOT, detect_workflow, person_model

TOKEN = "test-token-3f9a"
MAX_BODY = 1 << 20  # 1 MiB for the cam server, so "too large" is cheap to send
CONFIGS = ROOT / "configs"
WAIT_S = 30.0  # for a stream to start, process or change state


def demo_stream(stream_id: str, **source: Any) -> dict[str, Any]:
    """The bundled clip as a live camera: real time, looping, detecting people."""
    src = {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime", **source}
    return {"id": stream_id, "source": src, "workflow": detect_workflow()}


def config_doc(*streams: dict[str, Any], **server: Any) -> dict[str, Any]:
    """A config whose API may name files beside it and the bundled ones (configs/)."""
    roots = [".", str(CONFIGS)]
    return {
        "server": {"token": TOKEN, "file_roots": roots, **server},
        "models": {"person": person_model()},
        "streams": list(streams),
    }


LiveFactory = Callable[..., LiveServer]


def _factory(folder: Path, started: list[LiveServer]) -> LiveFactory:
    def start(doc: dict[str, Any], *, environ: dict[str, str] | None = None,
              token: str | None = TOKEN) -> LiveServer:  # fmt: skip
        server = LiveServer(write_yaml(folder, doc, "config.yaml"), environ=environ, token=token)
        started.append(server)
        return server.start()

    return start


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveFactory]:
    """start(config document, environ=None, token=TOKEN) -> a running LiveServer."""
    started: list[LiveServer] = []
    yield _factory(tmp_path, started)
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveFactory]:
    """Like `live_server`, for one server shared by a module's tests."""
    started: list[LiveServer] = []
    yield _factory(tmp_path_factory.mktemp("server"), started)
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Debian's Chromium, driven by Playwright (tests/server/chromium.py): one a module."""
    from tests.server.chromium import launch

    yield from launch(tmp_path_factory.mktemp("chromium") / "profile")


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The module's Chromium, for one test: the tabs it opened are closed after it (a
    page of one test must not play on into the next; a tab's session storage is its own)."""
    yield chromium
    for tab in chromium.pages:
        tab.close()


@pytest.fixture(scope="module")
def cam_server(module_server: LiveFactory) -> LiveServer:
    live = module_server(config_doc(demo_stream("cam"), max_body_bytes=MAX_BODY))
    wait_for(lambda: live.stream("cam")["frames_processed"] > 0, WAIT_S, "cam processing")
    return live


@pytest.fixture
def cam_untouched(cam_server: LiveServer) -> Iterator[None]:
    """`cam_server`'s stream runs on, same object, through whatever the test does."""
    before = cam_server.runtime.streams["cam"]
    frames = before.rate.count
    yield
    assert cam_server.runtime.streams["cam"] is before
    wait_for(lambda: before.rate.count > frames, WAIT_S, "cam to keep processing")
    assert cam_server.stream("cam")["state"] == "running"
