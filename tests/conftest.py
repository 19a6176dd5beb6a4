"""Shared fixtures live in tests/support/, one module per real part they start."""

import os

# The suite's workers share two cores: models' idle threads sleep instead of spinning (a
# spin takes the core another worker's test needs; appliance/models/session.py). In
# the environment, so the `appliance serve` processes the tests start inherit it.
os.environ.setdefault("APPLIANCE_ORT_SPINNING", "0")

pytest_plugins = [
    "tests.support.media",
    "tests.support.rtsp",
    "tests.support.models",
    "tests.support.appliance",
    "tests.support.durations",
    "tests.support.quick",
    "tests.support.nodeids",
    "tests.support.order",
]
