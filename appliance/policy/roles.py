"""Roles: what a token may do (docs/security.md, "Roles"). Each route of the API declares
the least role it needs (appliance/server/routing.py), each MQTT command the role of the
route that does the same (appliance/runtime/commands.py); the auth policy compares."""

from __future__ import annotations

import enum


class Role(enum.IntEnum):
    """Ordered, so `held >= needed` is the whole check: each role may do everything the
    ones below it may."""

    VIEWER = 1  # read streams, results, video, WebRTC viewing, metrics
    OPERATOR = 2  # + profiling windows and traces, baselines, stream restarts, tune (no apply)
    ADMIN = 3  # everything: streams added and removed, reloads, workflows, models, tune apply

    @property
    def label(self) -> str:
        """As the config and the answers write it: `viewer`, `operator`, `admin`."""
        return self.name.lower()

    @classmethod
    def named(cls, label: str) -> Role:
        return cls[label.upper()]
