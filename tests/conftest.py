"""Shared fixtures live in tests/support/, one module per real part they start."""

pytest_plugins = [
    "tests.support.media",
    "tests.support.rtsp",
    "tests.support.models",
    "tests.support.appliance",
    "tests.support.durations",
    "tests.support.quick",
    "tests.support.nodeids",
]
