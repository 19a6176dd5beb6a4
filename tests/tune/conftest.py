"""A running runtime to tune: the bundled clip as two live cameras, `faces-cam` on a copy of
privacy_blur.yaml (its own `faces` model, CenterFace at a small input) and `people-cam` on
the config's `person` model, both models copied into the test's folder (so a test can
break a file); the config's `tuning:` section as the test gives it."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.config import load_config
from appliance.models.session import SPINNING_ENV
from appliance.runtime.runtime import Runtime
from tests.server import live
from tests.support.appliance import DEMO_CLIP, MODELS, ROOT, detect_workflow, person_model

WAIT_S = 30.0
BLUR = ROOT / "configs" / "workflows" / "privacy_blur.yaml"  # declares its own `faces`
STREAMS = ("faces-cam", "people-cam")
# As the files declare them: privacy_blur.yaml's faces, and person_model()'s batching.
DECLARED_BATCH, DECLARED_DELAY_MS = 4, 2.0


class TuneSetup:
    """The config and workflow files in `folder`, its models copies in it too (a test may
    break one); `start_runtime` starts a runtime on them. `streams`: those of STREAMS the
    config runs; those in `fast` play their file as fast as it goes (every frame, the
    CPU saturated), the others in real time (15 fps)."""

    def __init__(
        self,
        folder: Path,
        tuning: dict[str, Any] | None = None,
        *,
        streams: tuple[str, ...] = STREAMS,
        fast: tuple[str, ...] = (),
    ) -> None:
        self.folder, self.streams, self.fast = folder, streams, fast
        self.config = folder / "config.yaml"
        self.models = {"faces": folder / "centerface.onnx", "person": folder / "person.onnx"}
        shutil.copyfile(MODELS / "centerface.onnx", self.models["faces"])
        shutil.copyfile(MODELS / "person_ssdlite.onnx", self.models["person"])
        doc = yaml.safe_load(BLUR.read_text(encoding="utf-8"))
        faces = doc["models"]["faces"]
        faces.update(path=str(self.models["faces"]), providers=["cpu"], input_size=[320, 192])
        faces["session"] = {"intra_op_threads": 1}
        (folder / "blur.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
        self.write(tuning)

    def write(self, tuning: dict[str, Any] | None) -> None:
        """The config file, with `tuning` as its `tuning:` section (None: none)."""
        workflows = {"faces-cam": "blur.yaml", "people-cam": detect_workflow()}
        doc: dict[str, Any] = {
            "profiling": {"dir": "traces"},
            # ONNX Runtime's own session defaults (spinning on), which the tunes here move
            # away from; the suite's person_model() turns spinning off.
            "models": {
                "person": {**person_model(), "path": str(self.models["person"]), "session": {}}
            },
            "streams": [
                {"id": sid, "source": self.source(sid), "workflow": workflows[sid]}
                for sid in self.streams
            ],
        }
        if tuning is not None:
            doc["tuning"] = tuning
        self.config.write_text(yaml.safe_dump(doc), encoding="utf-8")

    def source(self, stream_id: str) -> dict[str, Any]:
        pace = "fast" if stream_id in self.fast else "realtime"
        return {"url": str(DEMO_CLIP), "loop": True, "pace": pace}

    def break_model(self, model_id: str = "faces") -> None:
        """The model's file is garbage from now on: a session opened again fails."""
        self.models[model_id].write_bytes(b"not an onnx model" * 64)


StartRuntime = Callable[["TuneSetup"], Runtime]


def wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    live.wait_for(check, timeout, what)


def processing(rt: Runtime, sid: str) -> None:
    """The stream (the object running under that id now) processes more frames."""
    stream = rt.streams[sid]
    count = stream.rate.count
    wait_for(lambda: stream.rate.count > count + 2, f"{sid} processing")


def all_processing(rt: Runtime, streams: tuple[str, ...] = STREAMS) -> None:
    """The streams run (those ids, no other) and each processes more frames."""
    assert sorted(rt.streams) == sorted(streams)
    for sid in streams:
        processing(rt, sid)


@pytest.fixture
def tune_setup(tmp_path: Path) -> TuneSetup:
    return TuneSetup(tmp_path)


def started(setup: TuneSetup) -> Runtime:
    """A runtime on the setup's config file, started, every stream processing."""
    rt = Runtime(load_config(setup.config), config_path=setup.config)
    try:
        rt.start()
        all_processing(rt, setup.streams)
    except BaseException:
        rt.stop()
        raise
    return rt


@pytest.fixture
def start_runtime() -> Iterator[StartRuntime]:
    """Start a runtime on a setup's config file, every stream processing; stopped after."""
    runtimes: list[Runtime] = []

    def start(setup: TuneSetup) -> Runtime:
        runtimes.append(started(setup))
        return runtimes[-1]

    yield start
    for rt in runtimes:
        rt.stop()


@pytest.fixture(autouse=True, scope="module")
def spinning_as_configured() -> Iterator[None]:
    """`allow_spinning` is a knob here: its sessions get what the config says, not the
    suite's override that keeps every other test's threads from spinning
    (tests/conftest.py, APPLIANCE_ORT_SPINNING). Module-wide: before a module's runtime."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(SPINNING_ENV, raising=False)
        yield
