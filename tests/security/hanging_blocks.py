"""Block types that hold their thread for real, published as a user's plugin would be
(a distribution's entry points on sys.path): `test_hang` waits on a gate the test opens,
`test_nap` sleeps. What they stand for: a block or model call that does not return.
`test_exit` ends its thread, as a bug outside the workflow's error handling would.
`test_linger` passes frames on, but leaves behind an object whose finalizer blocks when
the interpreter finalizes, as a C extension's destructor can (FFmpeg closing a network
input, a thread pool's join)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pipelines.blocks.base import BlockParams, BlockType, BuildContext, StepFactory, stateless
from pipelines.registry import DEFAULT_REGISTRY
from pipelines.types import Image

GATE = threading.Event()  # test_hang steps wait for it: a test opens it when done
HANG_TIMEOUT_S = 120.0  # a forgotten gate still lets the thread end, long after any test
# In-process tests load this group into the default registry; `appliance serve` children
# find the same blocks in the standard group.
TEST_GROUP = "appliance.blocks.security_tests"
BLOCKS = {
    "test_hang": "HangBlock",
    "test_nap": "NapBlock",
    "test_exit": "ExitBlock",
    "test_linger": "LingerBlock",
}
log = logging.getLogger("tests.security.nap")


class NapParams(BlockParams):
    seconds: float = 30.0


class HangBlock(BlockType):
    """Passes the image on once GATE opens."""

    type_name = "test_hang"
    inputs = {"image": ("image", "frame")}
    outputs = {"image": "image"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        def step(image: Image) -> Image:
            GATE.wait(HANG_TIMEOUT_S)
            return image

        return stateless(step)


class NapBlock(BlockType):
    """Sleeps `seconds`, then passes the image on; logs when the nap begins."""

    type_name = "test_nap"
    Params = NapParams
    inputs = {"image": ("image", "frame")}
    outputs = {"image": "image"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        seconds = float(params.seconds)

        def step(image: Image) -> Image:
            if seconds > 0:  # 0: a pass-through for streams, silent
                log.warning("nap started: %.1f s", seconds)
            time.sleep(seconds)  # the slow work itself, not a test waiting for something
            return image

        return stateless(step)


class ExitBlock(BlockType):
    """Raises SystemExit: the workflow's `except Exception` lets it through, and the thread
    ends at once (threading ignores SystemExit: no traceback, no warning)."""

    type_name = "test_exit"
    inputs = {"image": ("image", "frame")}
    outputs = {"image": "image"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        def step(image: Image) -> Image:
            raise SystemExit("test_exit")

        return stateless(step)


class _Lingers:
    """Blocks in its finalizer, which runs when the interpreter clears this module."""

    # Bound now: by the time the finalizer runs, this module's globals may be None.
    def __del__(self, sleep: Any = time.sleep, seconds: float = HANG_TIMEOUT_S) -> None:
        sleep(seconds)


LEFT_BEHIND: list[_Lingers] = []  # cleared only by the interpreter's finalization


class LingerBlock(BlockType):
    """Passes the image on; each build leaves a `_Lingers` behind for the finalization."""

    type_name = "test_linger"
    inputs = {"image": ("image", "frame")}
    outputs = {"image": "image"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        LEFT_BEHIND.append(_Lingers())
        return stateless(lambda image: image)


def write_distribution(folder: Path, group: str) -> Path:
    """A dist-info in `folder` publishing BLOCKS in `group`; put `folder` on sys.path."""
    info = folder / "appliance_security_test_blocks-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: appliance-security-test-blocks\nVersion: 1.0\n"
    )
    lines = [f"{name} = {__name__}:{cls}" for name, cls in BLOCKS.items()]
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "\n".join(lines) + "\n")
    return folder


def install_in_process(folder: Path) -> None:
    """Load the blocks into this process's registry (once per process: the registry
    loads each group once, and the import strings stay once loaded)."""
    write_distribution(folder, TEST_GROUP)
    sys.path.insert(0, str(folder))
    try:
        problems = DEFAULT_REGISTRY.load_plugins(TEST_GROUP)
    finally:
        sys.path.remove(str(folder))
    assert not problems, problems
    assert "test_hang" in DEFAULT_REGISTRY, "the test blocks did not load"
