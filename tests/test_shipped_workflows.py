"""The workflows shipped in configs/workflows/, end to end on real H.264 clips through the
real runtime: real models, the real tracker, counters, blur and OCR."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np

from appliance.config import parse_config
from appliance.runtime.runtime import Runtime
from pipelines.types import Detections, FrameResult, Texts
from tests.support.appliance import DEMO_CLIP, ROOT

WORKFLOWS = ROOT / "configs" / "workflows"


def run_file(
    clip: Path, workflow: str, tmp_path: Path, on_result: Callable[[FrameResult], None]
) -> None:
    """Play `clip` once, every frame (pace: fast), through a shipped workflow."""
    doc = {
        "streams": [{"id": "s", "source": {"url": str(clip), "pace": "fast", "loop": False},
                     "workflow": str(WORKFLOWS / workflow), "draw": "always"}],
    }  # fmt: skip
    rt = Runtime(parse_config(doc, tmp_path))
    rt.outputs.subscribe(on_result)
    rt.start()
    try:
        assert rt.wait_done(timeout=240)
    finally:
        rt.stop()
    assert rt.streams["s"].state.value == "stopped"


def decoded(clip: Path) -> list[np.ndarray]:
    with av.open(str(clip)) as container:
        return [f.to_ndarray(format="bgr24") for f in container.decode(video=0)]


def test_people_counter_counts_each_walker_once(tmp_path: Path) -> None:
    # The demo clip: the astronaut crosses left to right, then the cameraman right to left.
    results: list[FrameResult] = []
    run_file(DEMO_CLIP, "people_counter.yaml", tmp_path, results.append)
    assert len(results) == 240
    assert results[-1].outputs["crossings"] == {"in": 1, "out": 1, "total": 2}
    ids: set[int] = set()
    for r in results:
        tracks: Detections = r.outputs["people"]
        if tracks.tracker_id is not None:
            ids.update(tracks.tracker_id.tolist())
    assert ids == {1, 2}  # one stable id per person over the whole crossing
    assert results[-1].drawn().shape == (540, 960, 3)


def first_frames(clip: Path, frames: int, out: Path) -> Path:
    """The first `frames` frames of `clip` (no B-frames), its packets copied, not encoded
    again: they decode to the very same images."""
    with av.open(str(clip)) as src, av.open(str(out), "w") as dst:
        video_in = src.streams.video[0]
        video_out = dst.add_stream_from_template(video_in)
        for _, packet in zip(range(frames), src.demux(video_in), strict=False):
            packet.stream = video_out
            dst.mux(packet)
    return out


def test_privacy_blur_hides_faces_in_the_video(tmp_path: Path) -> None:
    # The start of the astronaut's crossing: the face shows from frame 23 on (to 102; the
    # cameraman's, on 135-218, is the same case again).
    clip = first_frames(DEMO_CLIP, 64, tmp_path / "astronaut.mp4")
    results: list[FrameResult] = []
    run_file(clip, "privacy_blur.yaml", tmp_path, results.append)
    assert len(results) == 64
    originals = decoded(clip)
    checked = 0
    for r in results:
        faces: Detections = r.outputs["faces"]
        for x1, y1, x2, y2 in faces.xyxy.astype(int):
            # The inner half of the face box: away from the drawn box outline.
            w, h = x2 - x1, y2 - y1
            inner = np.s_[y1 + h // 4 : y2 - h // 4, x1 + w // 4 : x2 - w // 4]
            before = originals[r.seq][inner].astype(np.int16)
            after = r.drawn()[inner].astype(np.int16)
            if before.size == 0:
                continue
            # Pixelated: the region is made of flat blocks, so most horizontal neighbours
            # are equal, where the photo's own pixels mostly differ.
            flat_before = (np.diff(before, axis=1) == 0).mean()
            flat_after = (np.diff(after, axis=1) == 0).mean()
            assert flat_after > 0.6 and flat_after > flat_before + 0.3, (
                r.seq,
                flat_before,
                flat_after,
            )
            checked += 1
    assert checked > 30  # faces on most frames where a person is in view
    untouched = np.s_[0:20, 0:20]  # a corner of lawn no face ever reaches
    assert np.array_equal(results[5].drawn()[untouched], originals[5][untouched])


def text_clip(path: Path, lines: list[tuple[str, tuple[int, int]]], frames: int = 3) -> None:
    grass = cv2.imread(str(ROOT / "configs/media/sources/grass.png"))
    assert grass is not None
    base = np.tile(grass, (2, 2, 1))[:540, :960].astype(np.uint8)
    for text, org in lines:
        cv2.putText(base, text, org, cv2.FONT_HERSHEY_SIMPLEX, 1.4, (255, 255, 255), 3)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 960, 540, "yuv420p"
        stream.options = {"crf": "18", "bf": "0"}
        for _ in range(frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(base, format="bgr24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def test_read_text_reads_an_overlay_from_video(tmp_path: Path) -> None:
    clip = tmp_path / "overlay.mp4"
    text_clip(clip, [("CAMERA 07 PARKING", (60, 80)), ("2026-11-29 14:30", (520, 500))])
    read: list[Any] = []
    run_file(clip, "read_text.yaml", tmp_path, lambda r: read.append(r.outputs))
    assert len(read) == 3
    texts = next(o for o in read[-1].values() if isinstance(o, Texts))
    found = {t.replace(" ", "") for t in texts.text}
    assert found == {"CAMERA07PARKING", "2026-11-2914:30"}
