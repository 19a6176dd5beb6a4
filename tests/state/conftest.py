"""Fixtures of the state tests: configs with a state folder, and cheap streams (the bundled
clip drawn on, no model) in runtimes that are stopped and built again on the same folder,
as a restarted process would be."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.config import load_config
from appliance.runtime.runtime import Runtime
from appliance.runtime.sharding import Shard
from tests.support.appliance import DEMO_CLIP

# Drawing on a copy of each frame: a stream that needs no model, so a start takes little.
DRAW = {"name": "draw", "blocks": [{"id": "drawn", "type": "annotate"}],
        "outputs": {"video": "drawn"}}  # fmt: skip


def cam(stream_id: str, url: Path = DEMO_CLIP, **source: Any) -> dict[str, Any]:
    """A stream of the bundled clip (or `url`), looping in real time, drawn on."""
    src = {"url": str(url), "loop": True, "pace": "realtime", **source}
    return {"id": stream_id, "source": src, "workflow": DRAW}


def config_doc(*streams: dict[str, Any], **server: Any) -> dict[str, Any]:
    """Streams, the state folder `state` beside the config, and the API's file roots."""
    roots = [".", str(DEMO_CLIP.parent)]
    return {"server": {"state_dir": "state", "file_roots": roots, **server},
            "streams": list(streams)}  # fmt: skip


def write_config(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


Boot = Callable[..., Runtime]


@pytest.fixture
def boot() -> Iterator[Boot]:
    """boot(config path, worker=None) -> a started Runtime of the file as it is now; the
    runtime booted before it is stopped first (a restart on the same state folder)."""
    running: list[Runtime] = []

    def start(path: Path, worker: Shard | None = None) -> Runtime:
        while running:
            running.pop().stop()
        index = None if worker is None else worker.index
        rt = Runtime(load_config(path), config_path=path, shard=worker, worker=index)
        running.append(rt)
        rt.start()
        return rt

    yield start
    for rt in running:
        rt.stop()


def origins(rt: Runtime) -> dict[str, str]:
    """Each running stream's id -> its origin (`config` or `api`)."""
    return {s.id: s.origin for s in rt.streams_status()}
