"""A promotion the regression watch undoes: CenterFace at 960 x 544 promoted over the same
model at 320 x 192 makes the stream's `faces` block several times slower for real (the
watch's own cause of slowness, tests/watch/conftest.py); the watch raises it against the
baseline it learned, and the stream rolls back by itself within its promotion's
`rollback_s`, says so on a real mosquitto and a real HTTP receiver, and is audited as the
watch's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.errors import NoRollbackError
from appliance.runtime.promotion import PromoteRequest
from appliance.runtime.runtime import Runtime
from appliance.runtime.shadow import ShadowSpec
from tests.sinks.conftest import Subscriber
from tests.watch.conftest import LARGE, Learned, wait_until

FOUND_S = 40.0  # a few 1 s intervals after the switch's warm-up (test_watch_live.py)
SHADOW_S = 60.0  # the candidate's first frames: a slow model on two busy cores


def heavier(setup_workflow: Path, folder: Path) -> Path:
    """The stream's workflow with its faces model at LARGE, under an id of its own (a
    changed model loads beside the live one)."""
    doc = yaml.safe_load(setup_workflow.read_text(encoding="utf-8"))
    model = doc["models"].pop("faces")
    doc["models"]["faces_large"] = {**model, "input_size": LARGE}
    for block in doc["blocks"]:
        if block.get("model") == "faces":
            block["model"] = "faces_large"
    path = folder / "heavier.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


TOPIC = "t/faces-cam/events"


def events(sub: Subscriber) -> list[dict[str, Any]]:
    """The stream's events so far (the watch's and the shadow's; a frame's left out)."""
    docs = [json.loads(m.payload) for m in sub.on(TOPIC)]
    return [d for d in docs if "type" in d and "seq" not in d]


def await_event(sub: Subscriber, since: int, kind: str, timeout: float) -> dict[str, Any]:
    """The first of the stream's events of that type after the first `since`."""

    def found() -> list[dict[str, Any]]:
        return [e for e in events(sub)[since:] if e["type"] == kind]

    sub.wait_for(lambda _messages: bool(found()), timeout)
    return found()[0]


def test_a_regression_after_a_promotion_rolls_it_back(learned: Learned) -> None:
    setup, sub, rt = learned.setup, learned.sub, learned.rt
    live = rt.streams.find("faces-cam").workflow.version
    candidate = heavier(setup.workflow, setup.folder)
    # No budget: the candidate is meant to be slow (tests/shadow/test_budget.py).
    rt.shadows.start("faces-cam", ShadowSpec(workflow=candidate, max_live_cost=1.0))
    wait_until(lambda: rt.shadows.find("faces-cam").ran >= 2, SHADOW_S, "the candidate's frames")
    seen = len(events(sub))

    promoted = rt.shadows.promote("faces-cam", PromoteRequest(rollback_s=120))
    assert promoted["previous"] == live and promoted["workflow"] != live

    back = await_event(sub, seen, "shadow_rolled_back", FOUND_S)
    assert back["automatic"] is True and back["workflow"] == live
    assert back["previous"] == promoted["workflow"]
    assert "faces-cam/faces" in back["reason"] or "model:faces_large" in back["reason"]
    kinds = [e["type"] for e in events(sub)[seen:]]
    assert kinds.index("shadow_promoted") < kinds.index("regression_started")
    assert kinds.index("regression_started") < kinds.index("shadow_rolled_back")

    # The stream runs the workflow it ran before, and its results say so.
    stream = rt.streams.find("faces-cam")
    assert stream.workflow.version == live
    wait_until(lambda: _newest_version(rt) == live, 10, "a result of the old workflow")
    # Nothing is kept any more: a rollback by hand has nothing to undo.
    with pytest.raises(NoRollbackError):
        rt.shadows.rollback("faces-cam")
    [entry] = [e for e in rt.audit.recent() if e.action == "shadow.rollback"]
    assert entry.who == "watch" and entry.target == "faces-cam" and entry.outcome == "ok"
    # The same event as a webhook delivery, named by its type.
    wait_until(
        lambda: any(r.headers.get("x-appliance-event") == "shadow_rolled_back"
                    for r in learned.hook.requests),
        15, "the webhook's shadow_rolled_back",
    )  # fmt: skip


def _newest_version(rt: Runtime) -> str | None:
    latest = rt.latest.get("faces-cam")
    return None if latest is None else latest.result.version
