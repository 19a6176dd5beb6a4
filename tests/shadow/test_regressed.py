"""Which regressions roll a promotion back (Shadows.on_regressions, the watch's listener),
on a running stream with cheap workflows: one on the stream's own rows or on a model it
runs, within `rollback_s`, unless the promotion said `auto_rollback: false`; never one
on another stream, nor after the window. The watch raising one for real:
test_shadow_rollback.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.config import parse_config
from appliance.errors import NoRollbackError
from appliance.runtime.promotion import PromoteRequest
from appliance.runtime.runtime import Runtime
from appliance.runtime.shadow import ShadowSpec
from appliance.watch.report import Regression
from tests.state.conftest import DRAW, cam

CANDIDATE = {**DRAW, "name": "candidate"}


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    folder: Path = tmp_path_factory.mktemp("regressed")
    runtime = Runtime(parse_config({"streams": [cam("cam"), cam("other")]}, folder))
    runtime.start()
    try:
        yield runtime
    finally:
        runtime.stop()


def regression(stream: str | None, model: str | None = None) -> Regression:
    name = f"{stream}/drawn" if stream else f"model:{model}"
    return Regression(
        "r1", "block" if stream else "model", name, stream, "drawn" if stream else None, model,
        "2026-12-07T00:00:00Z", 1.0, 2.0, 3.0, 6.0, 3.0,
    )  # fmt: skip


def promote(rt: Runtime, **request: float | bool) -> str:
    rt.shadows.start("cam", ShadowSpec(workflow=CANDIDATE, max_live_cost=1.0))
    return str(rt.shadows.promote("cam", PromoteRequest(**request))["workflow"])  # type: ignore[arg-type]


def version(rt: Runtime) -> str:
    return rt.streams.find("cam").workflow.version


def rolled_back_by_watch(rt: Runtime) -> int:
    return sum(1 for e in rt.audit.recent() if e.action == "shadow.rollback" and e.who == "watch")


def test_only_the_streams_own_regressions_roll_it_back_within_its_window(rt: Runtime) -> None:
    live = version(rt)
    promoted = promote(rt, rollback_s=60)
    audited = rolled_back_by_watch(rt)
    rt.shadows.on_regressions([regression("other")], {}, rt.audit)  # another stream's
    assert version(rt) == promoted
    rt.shadows.on_regressions([regression(None, "m")], {"m": {"cam"}}, rt.audit)  # its model's
    assert version(rt) == live and rolled_back_by_watch(rt) == audited + 1
    with pytest.raises(NoRollbackError):  # nothing kept any more
        rt.shadows.rollback("cam")


def test_auto_rollback_false_or_an_ended_window_keeps_the_promotion(rt: Runtime) -> None:
    live = version(rt)
    promoted = promote(rt, rollback_s=60, auto_rollback=False)
    rt.shadows.on_regressions([regression("cam")], {}, rt.audit)
    assert version(rt) == promoted  # kept: the operator said so
    assert rt.shadows.rollback("cam")["workflow"] == live  # by hand, it still can
    promoted = promote(rt, rollback_s=0)
    rt.shadows.on_regressions([regression("cam")], {}, rt.audit)
    assert version(rt) == promoted  # the window is over: nothing to go back to
