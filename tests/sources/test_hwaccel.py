"""`source.decoder.hwaccel`: NVDEC where a CUDA device opens, software decoding (said once,
with the reason) where none does, through both readers and up to the stream's status.

This machine has no GPU: PyAV's FFmpeg knows CUDA (`hwdevices_available`) but cannot open
a device, so `cuda` runs in software. Where a device does open (`device_problem` is
None), the same tests expect the hardware decoder instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from appliance.config import ConfigError, parse_config
from appliance.runtime.runtime import Runtime
from appliance.sources import open_source
from appliance.sources.config import DecoderConfig, HWAccelName, SourceConfig
from appliance.sources.depacketize import rtp_payload
from appliance.sources.pyav import DecoderPlan, PyAVSource, device_problem
from appliance.sources.rtp import RtpSource, _Receiver
from tests.sources import WAIT_S, Harness
from tests.sources.test_rtp import rtp_packets, x264_access_units
from tests.support.appliance import DEMO_CLIP
from tests.support.media import MakeClip
from tests.support.rtsp import RtspServerFactory

NO_CUDA = device_problem("cuda", 0)  # None where a CUDA device opens
DECODES = "software" if NO_CUDA else "cuda"


def frames_only() -> dict[str, Any]:
    """A workflow with no model: the stream's frames go through as they are."""
    return {"name": "frames", "blocks": [], "outputs": {"frame": "frame"}}


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(lambda p: tmp_path / p)
    yield h
    h.stop_all()


def first_frames(source: PyAVSource | RtpSource, count: int) -> list[np.ndarray]:
    got: list[np.ndarray] = []
    try:
        for image, _pts in source.frames():
            got.append(image)
            if len(got) == count:
                break
    finally:
        source.close()
    return got


def test_cuda_without_a_device_runs_in_software_and_the_status_says_why(
    runtimes: list[Runtime], tmp_path: Path, make_clip: MakeClip, caplog: pytest.LogCaptureFixture
) -> None:
    clip = make_clip(seconds=1.0)  # 30 frames: 100 take four sessions (the clip loops)
    source = {"url": str(clip), "pace": "fast", "decoder": {"hwaccel": "cuda"}}
    doc = {"streams": [{"id": "cam", "source": source, "workflow": frames_only()}]}
    rt = Runtime(parse_config(doc, tmp_path), max_frames=100)
    runtimes.append(rt)
    with caplog.at_level(logging.INFO, logger="appliance.sources.grabber"):
        rt.start()
        assert rt.streams["cam"].done.wait(WAIT_S)
    status = rt.status().streams[0]
    assert status.frames_processed == 100
    assert status.decoder == f"h264 {DECODES}"
    if NO_CUDA:
        assert status.decoder_problem is not None
        assert status.decoder_problem.startswith("cuda requested: no CUDA device 0 (")
        assert "hwdevices_available" in status.decoder_problem
        assert status.decoder_problem.endswith("; decoding in software")
        # Said once, as a warning, although the clip looped (a new session each time).
        said = [r for r in caplog.records if "cuda requested" in r.getMessage()]
        assert [r.levelno for r in said] == [logging.WARNING], said
    else:
        assert status.decoder_problem is None


def test_auto_falls_back_with_a_note_not_a_warning(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="appliance.sources.grabber"):
        run = harness.start(str(DEMO_CLIP), pace="fast", decoder={"hwaccel": "auto"})
        frames = run.take(3)
    stats = run.grabber.stats
    assert stats.decoder == f"h264 {DECODES}"
    if NO_CUDA:
        assert stats.decoder_problem is not None
        assert stats.decoder_problem.startswith("auto requested: no CUDA device 0")
        said = [r for r in caplog.records if "auto requested" in r.getMessage()]
        assert [r.levelno for r in said] == [logging.INFO], said
    assert {f.image.shape for f in frames} == {(540, 960, 3)}


def test_none_decodes_in_software_with_no_problem(harness: Harness) -> None:
    run = harness.start(str(DEMO_CLIP), pace="fast", decoder={"hwaccel": "none"})
    run.take(2)
    assert (run.grabber.stats.decoder, run.grabber.stats.decoder_problem) == (
        "h264 software",
        None,
    )


def test_the_fallback_gives_the_same_bgr_frames_as_software() -> None:
    software = first_frames(open_pyav_file({"hwaccel": "none"}), 5)
    asked = first_frames(open_pyav_file({"hwaccel": "cuda"}), 5)
    assert [a.dtype for a in asked] == [np.dtype(np.uint8)] * 5
    if NO_CUDA:  # the same decoder: the same pixels
        assert all(np.array_equal(a, b) for a, b in zip(asked, software, strict=True))
    else:  # NVDEC rounds differently (NV12 from the device), the pictures are the same
        assert all(
            np.abs(a.astype(int) - b).mean() < 3 for a, b in zip(asked, software, strict=True)
        )


def open_pyav_file(decoder: dict[str, str]) -> PyAVSource:
    cfg = SourceConfig(url=str(DEMO_CLIP), decoder=decoder)  # type: ignore[arg-type]
    source = open_source(cfg, Path)
    assert isinstance(source, PyAVSource)
    return source


@pytest.mark.rtsp
def test_an_rtsp_camera_asked_for_cuda_is_read_by_the_rtp_reader(
    rtsp_server: RtspServerFactory,
) -> None:
    server = rtsp_server(pattern="160x120@15")
    cfg = SourceConfig(url=server.url, open_timeout_s=WAIT_S, decoder={"hwaccel": "cuda"})  # type: ignore[arg-type]
    source = open_source(cfg, Path, stop=threading.Event())
    assert isinstance(source, RtpSource)
    assert source.decoder == f"h264 {DECODES}"
    assert (source.decoder_problem is not None) == bool(NO_CUDA)
    got = first_frames(source, 5)
    assert {image.shape for image in got} == {(120, 160, 3)}


@pytest.mark.parametrize("hwaccel", ["cuda", "none"])
def test_the_rtp_reader_decodes_on_the_planned_decoder(hwaccel: HWAccelName) -> None:
    """The RTP reader's own H.264 decoder, fed a camera's packets (libx264's access units
    as aiortc packetizes them) without a server: the same fallback as FFmpeg's reader."""
    loop = asyncio.new_event_loop()
    receiver = _Receiver(96, loop)
    for packet in rtp_packets(x264_access_units(6, (160, 120))):
        parsed = rtp_payload(packet)
        assert parsed is not None
        receiver.packets.append((*parsed, time.perf_counter()))
    media = {"attributes": {"rtpmap": {"clockRate": 90000}}}
    plan = DecoderPlan.of(DecoderConfig(hwaccel=hwaccel))
    source = RtpSource(
        loop, contextlib.AsyncExitStack(), receiver, "h264", media,
        label="cam", stall_timeout_s=WAIT_S, stop=None, decoder_threads=0, plan=plan,
    )  # fmt: skip
    expected = "software" if hwaccel == "none" else DECODES
    assert source.decoder == f"h264 {expected}"
    assert source.decoder_problem == plan.problem
    assert (plan.problem is not None) == (hwaccel == "cuda" and NO_CUDA is not None)
    got = first_frames(source, 5)
    assert [(image.shape, image.dtype) for image in got] == [
        ((120, 160, 3), np.dtype(np.uint8))
    ] * 5


@pytest.mark.parametrize(
    ("decoder", "says"),
    [
        (
            {"hwaccel": "nvdec"},
            "streams[0].source.decoder.hwaccel: Input should be 'auto', 'cuda' or 'none'",
        ),
        ({"hwaccel": "cuda", "gpu": 1}, "streams[0].source.decoder.gpu: "),
        (
            {"device": -1},
            "streams[0].source.decoder.device: Input should be greater than or equal to 0",
        ),
    ],
)
def test_a_bad_decoder_is_a_config_error_naming_its_key(
    decoder: dict[str, Any], says: str, tmp_path: Path
) -> None:
    source = {"url": str(DEMO_CLIP), "decoder": decoder}
    doc = {"streams": [{"id": "cam", "source": source, "workflow": frames_only()}]}
    with pytest.raises(ConfigError) as caught:
        parse_config(doc, tmp_path)
    assert any(p.startswith(says) for p in caught.value.problems), caught.value.problems


def test_a_device_type_is_refused_with_what_ffmpeg_offers() -> None:
    from av.codec.hwaccel import hwdevices_available

    available = hwdevices_available()
    if "vulkan" not in available:
        assert device_problem("vulkan", 0) == (
            f"this FFmpeg has no vulkan support (hwdevices_available: {', '.join(available)})"
        )
    if "qsv" in available:  # a device type whose decoders are separate (h264_qsv)
        assert device_problem("qsv", 0) == "FFmpeg's h264 decoder has no qsv acceleration"
    if NO_CUDA:
        assert NO_CUDA.startswith("no CUDA device 0 (") or NO_CUDA.startswith("this FFmpeg")
