"""Fixtures of the security tests: a real mosquitto per module (each test isolated by its
own topic prefix or client ids), and MQTT clients closed at teardown."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator

import pytest

from tests.sinks.conftest import Broker, Subscriber, free_port


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A mosquitto on a free loopback port, for the module's tests."""
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed: run sh tests/install_deps.sh")
    broker = Broker(free_port(), tmp_path_factory.mktemp("broker"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def subscriber() -> Iterator[Callable[..., Subscriber]]:
    """subscriber(broker, topic, ...) -> a connected MQTT client; closed at teardown."""
    made: list[Subscriber] = []

    def make(broker: Broker, *topics: str) -> Subscriber:
        made.append(Subscriber(broker, list(topics)))
        return made[-1]

    yield make
    for client in made:
        client.close()
