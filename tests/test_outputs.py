"""Outputs routing: each stream's results reach only its own subscribers and sinks, through
the filters its outputs declare; sinks are checked against the config at load."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from appliance.config import ConfigError, OutputConfig, parse_config
from appliance.runtime.outputs import OutputFilter
from appliance.runtime.runtime import Runtime
from pipelines.types import Detections, FrameResult
from tests.support.appliance import DEMO_CLIP, detect_workflow, person_model

WAIT_S = 30.0


def result(seq: int, done: float, **outputs: Any) -> FrameResult:
    image = np.zeros((4, 4, 3), np.uint8)
    return FrameResult("cam", seq, None, 0.0, done - 0.01, done - 0.005, done, image, outputs)


def people(*names: str) -> Detections:
    n = len(names)
    boxes = np.tile(np.array([[0, 0, 1, 1]], np.float32), (n, 1))
    return Detections(boxes, np.ones(n, np.float32), np.zeros(n, np.int64), names)


def passed(cfg: dict[str, Any], results: list[FrameResult]) -> list[int]:
    keep = OutputFilter(OutputConfig.model_validate({"sink": "s", **cfg}))
    return [r.seq for r in results if keep(r)]


def test_every_s_lets_one_result_through_per_interval() -> None:
    results = [result(i, 10.0 + i * 0.25) for i in range(9)]  # 4 results per second
    assert passed({"every_s": 1.0}, results) == [0, 4, 8]
    assert passed({}, results) == list(range(9))


def test_on_change_lets_a_result_through_when_a_named_output_changes() -> None:
    counts = [{"in": 0}, {"in": 0}, {"in": 1}, {"in": 1}, {"in": 2}]
    results = [result(i, 10.0 + i, line=c, noise=i) for i, c in enumerate(counts)]
    assert passed({"on_change": ["line"]}, results) == [0, 2, 4]  # `noise` is not watched


def test_classes_let_a_result_through_when_one_of_them_is_seen() -> None:
    seen = [people(), people("car"), people("person", "car"), people("person")]
    results = [result(i, 10.0 + i, dets=d) for i, d in enumerate(seen)]
    assert passed({"classes": ["person"]}, results) == [2, 3]
    assert passed({"classes": ["person"], "every_s": 1.5}, results) == [2]


def test_outputs_name_declared_sinks_or_the_config_is_refused(tmp_path: Path) -> None:
    stream = {"id": "cam", "source": str(DEMO_CLIP), "workflow": detect_workflow(),
              "outputs": ["mqtt://localhost/topic", {"sink": "hook", "every_s": 0}]}  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        parse_config({"models": {"person": person_model()}, "streams": [stream]}, tmp_path)
    # In one pass: the invalid value, and the references of the rest.
    assert refused.value.problems == [
        "streams[0].outputs[1].every_s: Input should be greater than 0 (got 0)",
        "streams[0].outputs[0].sink: unknown sink 'mqtt://localhost/topic' (declared: none); "
        "declare the destination under `sinks:` (e.g. bus: {type: mqtt, host: ...}) and "
        "name it here",
        "streams[0].outputs[1].sink: unknown sink 'hook' (declared: none)",
    ]
    stream["outputs"] = ["bus"]
    with pytest.raises(ConfigError, match=r"streams\[0\].outputs\[0\].sink: unknown sink 'bus'"):
        parse_config({"models": {"person": person_model()}, "streams": [stream]}, tmp_path)


def test_a_sink_of_an_unknown_type_is_refused_with_its_location(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"sinks": {"bus": {"type": "kafka"}, "x": {"host": "h"}}}, tmp_path)
    assert refused.value.problems == [
        "sinks.bus.type: unknown sink type 'kafka' (known: mqtt, webhook)",
        "sinks.x.type: required (known: mqtt, webhook)",
    ]


class Collector:
    def __init__(self, n: int) -> None:
        self.ids: list[str] = []
        self.enough = threading.Event()
        self._n = n

    def __call__(self, r: FrameResult) -> None:
        self.ids.append(r.stream_id)
        if len(self.ids) >= self._n:
            self.enough.set()


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    streams = [
        {"id": s, "source": {"url": str(DEMO_CLIP), "pace": "realtime", "loop": True},
         "workflow": detect_workflow()}
        for s in ("a", "b")
    ]  # fmt: skip
    rt = Runtime(parse_config({"models": {"person": person_model()}, "streams": streams}, tmp_path))
    yield rt
    rt.stop()


def test_subscribers_get_only_the_streams_they_asked_for(runtime: Runtime) -> None:
    only_a, only_b, every = Collector(10), Collector(10), Collector(20)
    runtime.outputs.subscribe(only_a, "a")
    runtime.outputs.subscribe(only_b, "b")
    runtime.outputs.subscribe(every)
    runtime.start()
    assert only_a.enough.wait(WAIT_S) and only_b.enough.wait(WAIT_S)
    assert every.enough.wait(WAIT_S)
    assert set(only_a.ids) == {"a"} and set(only_b.ids) == {"b"}
    assert set(every.ids) == {"a", "b"}


def test_a_stream_added_with_an_undeclared_sink_is_refused(runtime: Runtime) -> None:
    runtime.start()
    cfg = runtime.config.streams[0].model_copy(update={"id": "c", "outputs": [
        OutputConfig(sink="nowhere")]})  # fmt: skip
    with pytest.raises(ConfigError, match=r"outputs\[0\].sink: unknown sink 'nowhere'"):
        runtime.add_stream(cfg, requested=True)
    assert "c" not in runtime.streams


def test_a_bad_sink_field_is_located_without_echoing_its_value(tmp_path: Path) -> None:
    hook = {"type": "webhook", "url": "http://127.0.0.1:9/x", "secret": 12345, "retries": -1}
    with pytest.raises(ConfigError) as refused:
        parse_config({"sinks": {"hook": hook}}, tmp_path)
    assert refused.value.problems == [
        "sinks.hook.secret: Input should be a valid string",
        "sinks.hook.retries: Input should be greater than or equal to 0",
    ]
    assert "12345" not in str(refused.value)
