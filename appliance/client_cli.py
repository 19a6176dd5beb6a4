"""CLI subcommands that talk to a running appliance through `ApplianceClient`."""

from __future__ import annotations

import argparse
from typing import Any


def add_client_commands(sub: Any) -> None:
    """Register `streams ...` and `status` on the `appliance` parser's subparsers."""
    del sub  # filled in by the client work: see appliance/client.py
