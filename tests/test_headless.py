"""`appliance run` as a user runs it: results saved as JSON lines (one per processed
frame) and as video, the workflow's outputs in the summary, and an end on its own: at
--duration, or when a camera was never reachable (exit 3) instead of waiting forever."""

from __future__ import annotations

import json
from pathlib import Path

import av

from tests.support.appliance import DEMO_CLIP, ROOT
from tests.support.media import MakeClip
from tests.test_cli import WriteConfig, appliance

PEOPLE_COUNTER = ROOT / "configs" / "workflows" / "people_counter.yaml"


def counter_stream(stream_id: str, url: str, **source: object) -> dict[str, object]:
    return {"id": stream_id, "workflow": str(PEOPLE_COUNTER),
            "source": {"url": url, "pace": "fast", "loop": False, **source}}  # fmt: skip


def test_run_saves_every_result_and_the_video(write_config: WriteConfig, tmp_path: Path) -> None:
    config = write_config({"streams": [counter_stream("cam", str(DEMO_CLIP))]})
    lines, video = tmp_path / "results.jsonl", tmp_path / "out.mp4"
    done = appliance("run", "--config", str(config), "--max-frames", "30", "--json",
                     "--save-json", str(lines), "--save-video", str(video))  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)["streams"]["cam"]
    results = [json.loads(line) for line in lines.read_text().splitlines()]
    assert len(results) == summary["frames_processed"] == 30
    assert [r["seq"] for r in results] == sorted(r["seq"] for r in results)
    assert {r["stream"] for r in results} == {"cam"}
    assert set(results[0]["outputs"]) == {"people", "crossings"}  # the video output is not JSON
    assert set(summary["outputs"]) == {"crossings"}  # counts in the summary, not detections
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
    assert len(frames) == 30
    with av.open(str(DEMO_CLIP)) as source:
        clip = source.streams.video[0]
        assert (frames[0].width, frames[0].height) == (clip.width & ~1, clip.height & ~1)
        # Stamped with the file's own timestamps: 30 frames play as 2 s of a 15 fps clip.
        rate = clip.average_rate
        assert rate is not None
        assert abs(float(frames[-1].time) - 29 / float(rate)) < 0.1


def test_run_prints_the_workflows_outputs(write_config: WriteConfig) -> None:
    config = write_config({"streams": [counter_stream("cam", str(DEMO_CLIP))]})
    done = appliance("run", "--config", str(config), "--max-frames", "120")
    assert done.returncode == 0, done.stderr
    # The demo's first 120 frames: the astronaut has crossed (the cameraman comes later).
    assert '  crossings: {"in": 0, "out": 1, "total": 1}' in done.stdout.splitlines()


def test_run_ends_when_a_camera_was_never_reachable(
    write_config: WriteConfig, make_clip: MakeClip
) -> None:
    config = write_config({"streams": [
        counter_stream("good", str(make_clip(seconds=2.0))),
        {**counter_stream("gone", "rtsp://127.0.0.1:1/none"),
         "source": {"url": "rtsp://127.0.0.1:1/none", "open_timeout_s": 2}},
    ]})  # fmt: skip
    done = appliance("run", "--config", str(config), "--json", timeout=60)
    assert done.returncode == 3, done.stderr
    streams = json.loads(done.stdout)["streams"]
    assert streams["good"]["frames_processed"] == 60  # the whole 2 s, 30 fps clip, unaffected
    assert streams["gone"]["state"] == "failed"
    assert streams["gone"]["last_error"].startswith("never connected: rtsp://127.0.0.1:1/none")


def test_run_stops_at_its_duration(write_config: WriteConfig) -> None:
    looping = counter_stream("loop", str(DEMO_CLIP), loop=True, pace="realtime")
    config = write_config({"streams": [looping]})
    done = appliance("run", "--config", str(config), "--duration", "3", "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    processed = json.loads(done.stdout)["streams"]["loop"]["frames_processed"]
    assert 0 < processed < 240  # a looping 15 fps camera, cut after 3 s
