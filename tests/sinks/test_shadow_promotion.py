"""A shadow promoted under a live MQTT QoS 1 subscriber and a webhook receiver: every
frame's result arrives once on both, sequence numbers go on without a gap, and each
result names the workflow version that made it, switching once at the promotion (and
back at a rollback). The candidate's results, asked for, arrive on the MQTT `shadow`
topic only."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from appliance.config import parse_config
from appliance.runtime.promotion import PromoteRequest
from appliance.runtime.runtime import Runtime
from appliance.runtime.shadow import ShadowSpec
from tests.sinks.conftest import Broker, Received, Subscriber
from tests.sinks.receiver import Receiver
from tests.support.appliance import DEMO_CLIP, detect_workflow, person_model

WAIT_S = 60.0
TOPIC = "site/cam/predictions"


def candidate() -> dict[str, Any]:
    workflow = detect_workflow()
    workflow["blocks"][0]["confidence"] = 0.5  # another document: another version
    return workflow


def predictions(messages: list[Received]) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in messages if m.topic == TOPIC]


def runs(results: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """Consecutive runs of one workflow version: (version, how many results)."""
    out: list[tuple[str, int]] = []
    for result in results:
        if out and out[-1][0] == result["workflow"]:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((result["workflow"], 1))
    return out


def wait(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_promotion_and_a_rollback_lose_no_frame_on_either_sink(
    mosquitto: Broker, subscriber: Callable[..., Subscriber], tmp_path: Path
) -> None:
    sub = subscriber(mosquitto, "site/#")
    with Receiver() as rx:
        bus = {"type": "mqtt", "port": mosquitto.port, "qos": 1, "topic_prefix": "site"}
        doc = {
            "models": {"person": person_model()},
            "sinks": {"bus": bus, "hook": {"type": "webhook", "url": rx.url}},
            # `pace: fast`: every frame is processed, so every seq must arrive.
            "streams": [{"id": "cam", "workflow": detect_workflow(), "outputs": ["bus", "hook"],
                         "source": {"url": str(DEMO_CLIP), "loop": True, "pace": "fast"}}],
        }  # fmt: skip
        rt = Runtime(parse_config(doc, tmp_path))
        rt.start()
        try:
            live = rt.streams["cam"].workflow.version
            spec = ShadowSpec(workflow=candidate(), max_live_cost=1.0, publish=True)
            rt.shadows.start("cam", spec)
            wait(lambda: rt.shadows.find("cam").report()["comparison"]["frames"] >= 5, "pairs")
            promoted = rt.shadows.promote("cam", PromoteRequest(rollback_s=60))
            assert (promoted["previous"], promoted["applied"]) == (live, True)
            new = promoted["workflow"]
            assert new != live and rt.streams["cam"].workflow.version == new
            mark = _seq_at(rt) + 20
            wait(lambda: _seq_at(rt) > mark, "frames after the promotion")
            back = rt.shadows.rollback("cam")
            assert (back["workflow"], back["previous"]) == (live, new)
            last = _seq_at(rt) + 20
            wait(lambda: _seq_at(rt) > last, "frames after the rollback")
        finally:
            rt.stop()
        mqtt = predictions(
            sub.wait_for(lambda ms: any(p["seq"] >= last for p in predictions(ms)), WAIT_S)
        )
        hooks = [r.json() for r in rx.requests if r.json().get("seq") is not None]
    # The candidate's results, asked for (`publish`), on the shadow topic only, before
    # the promotion: MQTT alone carries them (the webhook took predictions only, above).
    shadows = [json.loads(m.payload) for m in sub.messages if m.topic == "site/cam/shadow"]
    assert len(shadows) >= 5 and {r["workflow"] for r in shadows} == {new}
    assert max(r["seq"] for r in shadows) < min(r["seq"] for r in mqtt if r["workflow"] == new)
    for results in (mqtt, hooks):
        seqs = [r["seq"] for r in results if r["seq"] <= last]
        assert seqs == list(range(seqs[0], last + 1))  # in order, none lost, none twice
        switched = runs([r for r in results if r["seq"] <= last])
        assert [v for v, _ in switched] == [live, new, live], switched
        assert all(n >= 2 for _, n in switched), switched


def _seq_at(rt: Runtime) -> int:
    latest = rt.latest.get("cam")
    return -1 if latest is None else latest.result.seq
