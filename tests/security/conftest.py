"""Fixtures of the security tests: a real mosquitto per module (each test isolated by its
own topic prefix or client ids), and MQTT clients closed at teardown. Both are the sink
tests' own (tests/sinks/conftest.py), taken here by name."""

from __future__ import annotations

from tests.sinks.conftest import broker, subscriber

__all__ = ["broker", "subscriber"]  # pytest finds fixtures by their names in a conftest
