"""What the fault tests share: a real mosquitto (tests/sinks/conftest.py's Broker)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sinks.conftest import Broker
from tests.support.processes import free_port


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A real mosquitto on a free loopback port, persisting sessions."""
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed: run sh tests/install_deps.sh")
    folder = tmp_path / "broker"
    folder.mkdir()
    running = Broker(free_port(), folder)
    running.start()
    yield running
    running.stop()
