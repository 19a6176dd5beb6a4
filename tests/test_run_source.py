"""`appliance run --source URL --workflow FILE`: a workflow tried on one source without a
config (issue 30, item 8f), with the errors a config gets, each named by its flag."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.appliance import ROOT
from tests.support.warm_cli import run_appliance

CONFIGS = ROOT / "configs"


def test_a_shipped_workflow_runs_on_the_demo_clip(tmp_path: Path) -> None:
    lines = tmp_path / "results.jsonl"
    # Relative paths, as a user types them: from the current folder.
    source = ["--source", "media/demo.mp4", "--workflow", "workflows/people_counter.yaml"]
    saved = ["--max-frames", "20", "--json", "--save-json", str(lines)]
    done = run_appliance(["run", *source, *saved], cwd=CONFIGS)
    assert done.returncode == 0, done.stderr
    streams = json.loads(done.stdout)["streams"]
    assert list(streams) == ["source"]
    summary = streams["source"]
    assert (summary["state"], summary["workflow"]) == ("stopped", "people_counter")
    assert summary["frames_processed"] == 20 and summary["providers"] == {
        "person": ["CPUExecutionProvider"]  # the workflow's own model, as it declares it
    }
    assert summary["outputs"] == {"crossings": {"in": 0, "out": 0, "total": 0}}
    results = [json.loads(line) for line in lines.read_text().splitlines()]
    assert len(results) == 20 and {r["stream"] for r in results} == {"source"}
    assert set(results[0]["outputs"]) == {"people", "crossings"}


def test_config_or_source_is_a_usage_error_naming_both() -> None:
    neither = run_appliance(["run", "--max-frames", "1"])
    assert neither.returncode == 2
    assert "one of the arguments --config --source is required" in neither.stderr
    both = run_appliance(["run", "--config", "c.yaml", "--source", "a.mp4", "--workflow", "w"])
    assert both.returncode == 2
    assert "argument --source: not allowed with argument --config" in both.stderr
    alone = run_appliance(["run", "--source", "a.mp4"])
    assert alone.returncode == 2 and "--source needs --workflow FILE" in alone.stderr
    stray = run_appliance(["run", "--config", "c.yaml", "--workflow", "w.yaml"])
    assert stray.returncode == 2 and "--workflow goes with --source URL" in stray.stderr


def test_bad_input_gets_the_configs_errors_named_by_flag(tmp_path: Path) -> None:
    workflow = str(CONFIGS / "workflows" / "people_counter.yaml")
    missing = run_appliance(["run", "--source", "a.mp4", "--workflow", "nowhere/flow.yaml"])
    assert missing.returncode == 1, missing.stderr
    assert "  --workflow: file not found: nowhere/flow.yaml" in missing.stderr.splitlines()
    scheme = run_appliance(["run", "--source", "rtmp://me:s3cret@cam/live", "--workflow", workflow])
    assert scheme.returncode == 1
    assert "  --source: unsupported URL scheme 'rtmp' (supported: rtsp," in scheme.stderr
    assert "s3cret" not in scheme.stderr
    # A workflow that does not compile: located by its flag and file, every problem.
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "name: broken\nblocks:\n  - {id: a, type: nosuch}\n  - {id: b, type: track}\n"
        "outputs: {a: a}\n"
    )
    bad = run_appliance(["run", "--source", "a.mp4", "--workflow", str(broken)])
    assert bad.returncode == 1
    assert f"  --workflow ({broken}): workflow 'broken': blocks[0].type: unknown block type" in (
        bad.stderr
    )
    # A camera that never answers: the run ends (exit 3), its URL masked.
    gone = run_appliance(
        ["run", "--source", "rtsp://me:s3cret@127.0.0.1:1/none", "--workflow", workflow, "--json"],
        timeout=60,
    )
    assert gone.returncode == 3, gone.stderr
    source = json.loads(gone.stdout)["streams"]["source"]
    assert source["last_error"].startswith("never connected: rtsp://***:***@127.0.0.1:1/none")
    assert "s3cret" not in gone.stdout + gone.stderr
