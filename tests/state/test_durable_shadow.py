"""A shadow started, stopped, promoted or rolled back over the API is kept in the state
folder like a stream changed there: a restarted process runs what the API left, until
the config file's entry for that stream changes (appliance/runtime/state.py's rule)."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.errors import NoShadowError
from appliance.runtime.promotion import PromoteRequest
from appliance.runtime.runtime import Runtime
from appliance.runtime.shadow import ShadowSpec
from tests.state.conftest import DRAW, Boot, cam, config_doc, write_config

CANDIDATE = {**DRAW, "name": "candidate"}  # another workflow: another version
SPEC = ShadowSpec(workflow=CANDIDATE, max_live_cost=1.0)


def version(rt: Runtime) -> str:
    return rt.streams.find("cam").workflow.version


def has_shadow(rt: Runtime) -> bool:
    try:
        return rt.shadows.find("cam").workflow.name == "candidate"
    except NoShadowError:
        return False


def test_a_shadow_and_its_promotion_outlive_a_restart(tmp_path: Path, boot: Boot) -> None:
    path = write_config(tmp_path / "config.yaml", config_doc(cam("cam")))
    rt = boot(path)
    live = version(rt)
    rt.shadows.start("cam", SPEC)
    rt = boot(path)  # a restart: the shadow starts again with its stream
    assert has_shadow(rt)
    promoted = rt.shadows.promote("cam", PromoteRequest())["workflow"]
    assert promoted != live
    rt = boot(path)  # the promoted workflow runs, without a shadow
    assert version(rt) == promoted and not has_shadow(rt)
    rt.restart_stream("cam")  # a stream's restart too
    assert version(rt) == promoted

    rt.shadows.start("cam", SPEC)
    rt.shadows.stop("cam")
    rt = boot(path)  # stopped over the API: stays stopped
    assert not has_shadow(rt) and version(rt) == promoted


def promoted(rt: Runtime) -> str:
    """Start the candidate's shadow on `cam` and promote it: the version the stream ran."""
    live = version(rt)
    rt.shadows.start("cam", SPEC)
    rt.shadows.promote("cam", PromoteRequest())
    return live


def test_a_rollback_outlives_a_restart(tmp_path: Path, boot: Boot) -> None:
    path = write_config(tmp_path / "config.yaml", config_doc(cam("cam")))
    rt = boot(path)
    live = promoted(rt)
    assert rt.shadows.rollback("cam")["workflow"] == live
    rt = boot(path)
    assert version(rt) == live and not has_shadow(rt)


def test_the_config_file_wins_once_its_entry_changes(tmp_path: Path, boot: Boot) -> None:
    path = write_config(tmp_path / "config.yaml", config_doc(cam("cam")))
    rt = boot(path)
    live = promoted(rt)
    write_config(path, config_doc(cam("cam", pace="realtime", loop=True, open_timeout_s=9)))
    rt = boot(path)  # the operator edited the stream: the file's workflow runs again
    assert version(rt) == live and not has_shadow(rt)


@pytest.mark.parametrize("shadow", [True, False])
def test_without_a_state_folder_nothing_is_kept(tmp_path: Path, boot: Boot, shadow: bool) -> None:
    doc = config_doc(cam("cam"))
    del doc["server"]["state_dir"]
    path = write_config(tmp_path / "config.yaml", doc)
    rt = boot(path)
    live = version(rt)
    rt.shadows.start("cam", SPEC)
    if not shadow:
        rt.shadows.promote("cam", PromoteRequest())
    rt = boot(path)
    assert version(rt) == live and not has_shadow(rt)
    assert not (tmp_path / "state").exists()
