"""The RTP reader (appliance/sources/rtp.py, depacketize.py): access units rebuilt from
real encoders' packets, damaged ones dropped whole, and frames handed over before the
camera sends the next one."""

from __future__ import annotations

import itertools
import statistics
import struct
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from aiortc.codecs.h264 import H264Encoder

from appliance.sources import open_source
from appliance.sources.config import SourceConfig
from appliance.sources.depacketize import (
    MAX_ACCESS_UNIT_BYTES,
    AccessUnit,
    Depacketizer,
    parameter_sets,
    rtp_payload,
)
from appliance.sources.pyav import PyAVSource
from appliance.sources.rtp import RtpSource
from tests.sources import WAIT_S
from tests.support.clock_camera import ClockCamera
from tests.support.rtsp import RtspServerFactory


def x264_access_units(count: int, size: tuple[int, int] = (320, 240)) -> list[bytes]:
    """`count` Annex B access units from libx264 (keyframe first), with moving content so
    that P-frames are not empty."""
    codec = av.CodecContext.create("libx264", "w")
    codec.width, codec.height, codec.pix_fmt = *size, "yuv420p"
    codec.time_base = Fraction(1, 15)
    codec.options = {"preset": "ultrafast", "tune": "zerolatency", "g": "30", "bf": "0"}
    noise = np.random.default_rng(3).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    units: list[bytes] = []
    for i in range(count):
        frame = av.VideoFrame.from_ndarray(np.roll(noise, 8 * i, axis=1), format="bgr24")
        frame = frame.reformat(format="yuv420p")
        frame.pts = i
        units += [bytes(p) for p in codec.encode(frame)]
    return units


def rtp_packets(units: list[bytes], seq: int = 65530) -> list[bytes]:
    """RTP packets of the access units as aiortc's H.264 payloader cuts them (STAP-A,
    FU-A, single NAL units), the marker on each unit's last packet, 90 kHz timestamps
    (the sequence numbers wrap past 65535 on purpose)."""
    packets = []
    for i, unit in enumerate(units):
        payloads = H264Encoder._packetize(H264Encoder._split_bitstream(unit))
        for j, payload in enumerate(payloads):
            marker = 0x80 if j == len(payloads) - 1 else 0
            header = struct.pack("!BBHII", 0x80, marker | 96, seq & 0xFFFF, 6000 * i, 1234)
            packets.append(header + payload)
            seq += 1
    return packets


def depacketize(packets: list[bytes], codec: str = "h264") -> tuple[list[AccessUnit], int]:
    depacketizer = Depacketizer("hevc" if codec == "hevc" else "h264")
    units: list[AccessUnit] = []
    for packet in packets:
        parsed = rtp_payload(packet)
        assert parsed is not None
        units += depacketizer.push(*parsed)
    return units, depacketizer.dropped


def decoded_count(units: list[AccessUnit]) -> int:
    decoder = av.CodecContext.create("h264", "r")
    return sum(len(decoder.decode(av.Packet(u.data))) for u in units)


def test_access_units_come_back_whole_at_each_marker() -> None:
    sent = x264_access_units(12)
    packets = rtp_packets(sent)
    assert len(packets) > 2 * len(sent)  # the keyframe at least is cut into FU-A fragments
    units, dropped = depacketize(packets)
    assert dropped == 0
    assert [u.keyframe for u in units] == [True] + [False] * 11
    assert [u.timestamp for u in units] == [6000 * i for i in range(12)]
    assert decoded_count(units) == 12  # the decoder takes each one as a whole frame


def test_a_lost_packet_drops_its_access_unit_and_no_other() -> None:
    sent = x264_access_units(6)
    packets = rtp_packets(sent)
    first_of_frame_1 = len(rtp_packets(sent[:1]))
    del packets[first_of_frame_1]
    units, dropped = depacketize(packets)
    assert dropped == 1
    assert [u.timestamp for u in units] == [0, 12000, 18000, 24000, 30000]


def test_a_unit_without_its_marker_ends_when_the_next_one_starts() -> None:
    """A camera that omits the marker bit: each unit is still whole, only one packet late.
    A lost last packet (the marker with it) drops its unit and, since the loss may have
    reached into it, the one that follows."""
    sent = x264_access_units(3)
    packets = rtp_packets(sent)
    last_of_frame_0 = len(rtp_packets(sent[:1])) - 1
    unmarked = bytearray(packets[last_of_frame_0])
    unmarked[1] &= 0x7F  # the marker bit is gone, the packet itself arrived
    units, dropped = depacketize(
        [*packets[:last_of_frame_0], bytes(unmarked), *packets[last_of_frame_0 + 1 :]]
    )
    assert dropped == 0 and [u.timestamp for u in units] == [0, 6000, 12000]
    assert decoded_count(units) == 3
    units, dropped = depacketize(packets[:last_of_frame_0] + packets[last_of_frame_0 + 1 :])
    assert dropped == 2 and [u.timestamp for u in units] == [12000]


def test_rtp_header_extension_csrcs_and_padding_are_stripped() -> None:
    payload = b"\x65payload"
    header = struct.pack("!BBHII", 0x80 | 0x20 | 0x10 | 2, 0x80 | 96, 7, 90000, 1)
    csrcs = struct.pack("!II", 11, 12)
    extension = struct.pack("!HH", 0xBEDE, 1) + b"\x10\xaa\x00\x00"
    padding = b"\x00\x00\x03"
    assert rtp_payload(header + csrcs + extension + payload + padding) == (
        payload,
        7,
        90000,
        True,
    )
    assert rtp_payload(b"\x40" + bytes(20)) is None  # version 1: no RTP packet


def test_h265_fragments_and_aggregates_rebuild_nal_units() -> None:
    vps, sps = b"\x40\x01\x0c\x01", b"\x42\x01\x01\x02"
    idr = b"\x26\x01" + bytes(range(200))  # IDR_W_RADL, type 19
    aggregate = b"\x60\x01" + len(vps).to_bytes(2, "big") + vps + len(sps).to_bytes(2, "big") + sps
    fu = [
        b"\x62\x01" + bytes([0x80 | 19]) + idr[2:100],
        b"\x62\x01" + bytes([19]) + idr[100:150],
        b"\x62\x01" + bytes([0x40 | 19]) + idr[150:],
    ]
    depacketizer = Depacketizer("hevc")
    got = [depacketizer.push(p, n, 3000, n == 3) for n, p in enumerate([aggregate, *fu])]
    assert got[:3] == [(), (), ()]
    (unit,) = got[3]
    assert unit.keyframe
    assert unit.data == b"".join(b"\x00\x00\x00\x01" + n for n in (vps, sps, idr))


def test_parameter_sets_from_the_sdp() -> None:
    h264 = {"sprop-parameter-sets": "Z0IAKeKQFAe2AtwEBAaQeJEV,aM48gA=="}
    assert parameter_sets("h264", h264).count(b"\x00\x00\x00\x01") == 2
    assert parameter_sets("hevc", {"sprop-vps": "QAEMAf//", "sprop-sps": "QgEB"}).startswith(
        b"\x00\x00\x00\x01\x40\x01"
    )
    assert parameter_sets("h264", {"sprop-parameter-sets": "not base64!"}) == b""
    assert parameter_sets("h264", {}) == b""


def read(source: RtpSource | PyAVSource, count: int) -> list[tuple[np.ndarray, float]]:
    frames = source.frames()
    got = []
    for image, _pts in frames:
        got.append((image, time.time()))
        if len(got) == count:
            break
    return got


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.mark.rtsp
def test_each_frame_is_handed_over_before_the_camera_sends_the_next(
    _gst_rtsp_available: None, tmp_path: Path
) -> None:
    """At 5 fps a frame interval is 200 ms. FFmpeg's reader cannot hand frame N over
    before frame N+1's first packet; the RTP reader does so as N's last packet lands."""
    with ClockCamera(320, 240, 5, workdir=tmp_path) as camera:
        source = open_source(SourceConfig(url=camera.url), Path)
        assert isinstance(source, RtpSource)
        try:
            got = read(source, 12)
        finally:
            source.close()
    found = [camera.frame_index(image) for image, _ in got]
    indices = [i for i in found if i is not None]
    assert len(indices) == len(found), found
    newest = [camera.emissions.newest_at(at) for _, at in got]
    ahead = [n == i for n, i in zip(newest, indices, strict=True)]
    assert sum(ahead) >= 10, list(zip(indices, newest, strict=True))  # 12 minus stragglers
    assert [b - a for a, b in itertools.pairwise(indices)] == [1] * 11


@pytest.mark.rtsp
def test_an_h265_camera_is_read_by_the_rtp_reader(rtsp_server: RtspServerFactory) -> None:
    server = rtsp_server(pattern="160x120@15", codec="h265")
    source = open_source(SourceConfig(url=server.url, open_timeout_s=WAIT_S), Path)
    assert isinstance(source, RtpSource)
    try:
        got = read(source, 10)
    finally:
        source.close()
    assert {image.shape for image, _ in got} == {(120, 160, 3)}
    assert source.fps == pytest.approx(15)
    moving = [float(np.abs(a.astype(int) - b).mean()) for (a, _), (b, _) in itertools.pairwise(got)]
    assert statistics.median(moving) > 0  # the ball moves: real pictures, not one repeated


@pytest.mark.rtsp
def test_ffmpeg_options_or_reader_ffmpeg_choose_ffmpegs_reader(
    rtsp_server: RtspServerFactory,
) -> None:
    url = rtsp_server(pattern="160x120@15").url
    for cfg in (
        SourceConfig(url=url, reader="ffmpeg"),
        SourceConfig(url=url, options={"analyzeduration": "200000"}),
    ):
        source = open_source(cfg, Path)
        try:
            assert isinstance(source, PyAVSource) and len(read(source, 2)) == 2
        finally:
            source.close()


def test_an_access_unit_past_the_size_cap_is_dropped() -> None:
    depacketizer = Depacketizer("h264")
    chunk = b"\x41" + bytes(1024 * 1024)  # a 1 MiB non-IDR slice NAL unit
    count = MAX_ACCESS_UNIT_BYTES // len(chunk) + 1
    for seq in range(count):
        assert depacketizer.push(chunk, seq, 0, False) == ()
    assert depacketizer.push(chunk, count, 0, True) == ()
    assert depacketizer.dropped == 1
    (unit,) = depacketizer.push(b"\x65" + bytes(10), count + 1, 3000, True)  # the next is fine
    assert unit.keyframe
