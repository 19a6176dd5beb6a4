"""A tune's report from its JSON: the table (every candidate, every reason), the Pareto
front, the plot, and the YAML patch, which loads as the config's `tuning:` and goes into
a config file without touching the rest of it (or not at all when it would not load).

The result comes from the real search (Tuner) on a scripted target: its windows' fps
and p99 are a table lookup of the settings, so the verdicts are known."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.config import ConfigError, load_config, parse_config
from appliance.tune import report
from appliance.tune.meter import Window
from appliance.tune.objective import Objective
from appliance.tune.results import result_json
from appliance.tune.search import Tuner
from appliance.tune.space import Knob, Settings
from tests.support.appliance import DEMO_CLIP, ROOT

BATCH, SPIN, THREADS = "person.max_batch_size", "person.allow_spinning", "sources.decoder_threads"
KNOBS = [
    Knob(BATCH, "person", "max_batch_size", (1, 2, 4), 1),
    Knob(SPIN, "person", "allow_spinning", (True, False), True),
    Knob(THREADS, "sources", "decoder_threads", (0, 1), 0, restarts=True),
]
FPS: dict[str, dict[Any, float]] = {
    BATCH: {1: 1.0, 2: 1.3, 4: 1.5},
    SPIN: {True: 1.0, False: 0.6},
    THREADS: {0: 1.0, 1: 1.01},
}


class Scripted:
    """Windows whose fps is 30 times each setting's factor, p99 falling as fps rises."""

    def __init__(self) -> None:
        self.applied: Settings = {}

    def apply(self, settings: Settings) -> None:
        self.applied = dict(settings)

    def measure(self, seconds: float, stop: threading.Event) -> Window:
        fps = 30.0
        for key, value in self.applied.items():
            fps *= FPS[key][value]
        p99 = 6000.0 / fps
        return Window(seconds, int(fps * seconds), fps, p99 / 2, p99, 30.0, fps / 2)

    def problem(self) -> None:
        return None


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    objective = Objective("fps", slo_ms=150.0)
    done = Tuner(Scripted(), KNOBS, objective, window_s=1.0, settle_s=0.0).run()
    return result_json(done)


def config_doc() -> dict[str, Any]:
    return {
        "profiling": {"enabled": False},
        "streams": [{"id": "cam", "source": {"url": str(DEMO_CLIP)},
                     "workflow": str(ROOT / "configs/workflows/people_counter.yaml")}],
        "tuning": {"models": {"person": {"max_batch_size": 8, "inter_op_threads": 1}},
                   "sources": {"reader": "ffmpeg"}},
    }  # fmt: skip


def test_the_table_lists_every_candidate_and_every_reason(result: dict[str, Any]) -> None:
    assert result["best"] == {BATCH: 4, SPIN: True, THREADS: 0}  # the script's best
    text = report.table(result)
    lines = text.splitlines()
    for c in result["candidates"]:
        label = f"{c['knob']}={report._value(c['value'])}"
        row = next(line for line in lines if line.startswith(label + " "))
        assert c["verdict"] in row and f"{c['ratio']:.3f}" in row
        low, high = c["interval"]
        assert f"[{low:.3f}–{high:.3f}]" in row
    spin = next(line for line in lines if line.startswith(f"{SPIN}=false "))
    assert spin.split()[1] == "worse" and spin.split()[-1] == "no"  # 27 fps: p99 222 ms, over 150
    assert next(line for line in lines if line.startswith("start (reference)"))
    for key, reason in result["reasons"].items():
        assert f"  {key}  " in text and reason in text
    assert f"winner: {BATCH} 1 → 4" in text
    assert "outcome: done" in text


def test_an_interrupted_tune_names_the_knobs_it_never_reached(result: dict[str, Any]) -> None:
    cut = {**result, "outcome": "interrupted", "reasons": {BATCH: result["reasons"][BATCH]}}
    text = report.table(cut)
    assert "best so far (not applied)" in text and "winner" not in text
    for key in (SPIN, THREADS):
        assert re.search(rf"^  {re.escape(key)} +not searched", text, re.MULTILINE), key


def test_the_pareto_front_is_every_point_no_other_beats() -> None:
    points = [(10.0, 100.0), (20.0, 150.0), (15.0, 200.0), (20.0, 140.0), (5.0, 50.0),
              (25.0, 300.0), (25.0, 300.0), (4.0, 60.0)]  # fmt: skip
    # (20, 150) loses to (20, 140); (15, 200) to (20, 140); (4, 60) to (5, 50); the
    # two equal points beat neither each other nor anything with more fps.
    assert report.pareto(points) == [4, 0, 3, 5, 6]
    assert report.pareto([]) == []
    assert report.pareto([(1.0, 1.0)]) == [0]


def test_the_plot_is_a_png_or_nothing_without_matplotlib(
    result: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    png = report.plot(result, tmp_path / "tune.png")
    assert png == tmp_path / "tune.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if not installed
    assert report.plot(result, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_the_patch_loads_as_the_best_settings_with_a_reason_each(result: dict[str, Any]) -> None:
    keep = {"models": {"person": {"max_batch_size": 8, "inter_op_threads": 1}},
            "sources": {"reader": "ffmpeg"}}  # fmt: skip
    patch = report.patch_yaml(result, keep)
    assert patch.startswith("tuning:\n")
    for key, reason in result["reasons"].items():
        line = next(x for x in patch.splitlines() if x.strip().startswith(key.split(".")[1]))
        assert line.endswith(f"# {reason}")
    config = parse_config({**config_doc(), **yaml.safe_load(patch)}, ROOT)
    person, sources = config.tuning.models["person"], config.tuning.sources
    assert person.max_batch_size == 4 and person.allow_spinning is True  # every knob searched
    assert sources.decoder_threads == 0
    assert person.inter_op_threads == 1 and sources.reader == "ffmpeg"  # kept: not searched
    bare = yaml.safe_load(report.patch_yaml(result))["tuning"]
    assert bare == {"models": {"person": {"max_batch_size": 4, "allow_spinning": True}},
                    "sources": {"decoder_threads": 0}}  # fmt: skip


CONFIG_TEXT = """\
# the appliance at the door
profiling:
  enabled: false   # not here
{tuning}streams:
  - id: cam        # the door camera
    source: {{url: {clip}}}
    workflow: {workflow}
# the end
"""
OLD_TUNING = """\
tuning:
  models:
    person: {max_batch_size: 8}   # from an older tune

"""


@pytest.mark.parametrize("old", ["", OLD_TUNING], ids=["appended", "replaced"])
def test_apply_puts_the_patch_in_and_leaves_the_rest(
    result: dict[str, Any], tmp_path: Path, old: str
) -> None:
    path = tmp_path / "config.yaml"
    workflow = ROOT / "configs/workflows/people_counter.yaml"
    before = CONFIG_TEXT.format(tuning=old, clip=DEMO_CLIP, workflow=workflow)
    path.write_text(before, encoding="utf-8")
    patch = report.patch_yaml(result)
    report.apply_to_file(path, patch)
    after = path.read_text(encoding="utf-8")
    if old:  # the old block's lines gave way to the patch's, the rest byte for byte
        assert after == before.replace(OLD_TUNING.rstrip("\n") + "\n", patch)
    else:  # at the end, after a blank line
        assert after == before + "\n" + patch
    assert "from an older tune" not in after
    person = load_config(path).tuning.models["person"]
    assert person.max_batch_size == 4 and person.allow_spinning is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]  # no temp file left


def test_apply_refuses_a_result_that_would_not_load(result: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    workflow = ROOT / "configs/workflows/people_counter.yaml"
    before = CONFIG_TEXT.format(tuning=OLD_TUNING, clip=DEMO_CLIP, workflow=workflow)
    path.write_text(before, encoding="utf-8")
    too_big = {**result, "best": {**result["best"], BATCH: 999}}  # over the 256 bound
    with pytest.raises(ConfigError, match=r"config\.yaml") as raised:
        report.apply_to_file(path, report.patch_yaml(too_big))
    assert any("max_batch_size" in p for p in raised.value.problems)
    assert path.read_text(encoding="utf-8") == before  # nothing written
    # A second `tuning:` further down would win over the patch: refused as well.
    path.write_text(before + "tuning: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="second `tuning:`"):
        report.apply_to_file(path, report.patch_yaml(result))
    assert path.read_text(encoding="utf-8") == before + "tuning: {}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
