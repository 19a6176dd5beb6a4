"""The HTTP client and its CLI against a real `appliance serve`, one process per module.

`served_appliance` starts the console script the way tests/support/appliance.py's `serve`
fixture does, but for a module-scoped fixture: its config plays the bundled demo clip in
real time as one camera (`people-cam`, people_counter.yaml) behind a bearer token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.support.appliance import DEMO_CLIP, ROOT, Served, start_served

TOKEN = "client-tests-token"
CONFIGS = ROOT / "configs"
WORKFLOW = CONFIGS / "workflows" / "people_counter.yaml"
CONFIG_NAME = "appliance.yaml"


def stream_doc(stream_id: str, workflow: Path | dict[str, Any] = WORKFLOW) -> dict[str, Any]:
    """A stream as in the config file: the demo clip, looped in real time."""
    return {
        "id": stream_id,
        "source": {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime"},
        "workflow": workflow if isinstance(workflow, dict) else str(workflow),
    }


def write_demo_config(path: Path, extra: Sequence[dict[str, Any]] = ()) -> Path:
    """The config of the served appliance; `extra` streams after `people-cam`."""
    doc = {
        # The API may name the bundled clip and workflows (configs/) besides the config's.
        "server": {"host": "127.0.0.1", "token": TOKEN, "file_roots": [".", str(CONFIGS)]},
        "streams": [stream_doc("people-cam"), *extra],
    }
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def config_path(served: Served) -> Path:
    """The config file a `served_appliance` reads (and re-reads on reload)."""
    return served.log_path.with_name(CONFIG_NAME)


@contextmanager
def served_appliance(folder: Path) -> Iterator[Served]:
    """`appliance serve` on the demo config in `folder`, up (/health) until the block ends."""
    config = write_demo_config(folder / CONFIG_NAME)
    served = start_served(config, folder)
    try:
        yield served
        assert served.terminate() == 0, served.log()
    finally:
        served.stop()
