"""RTP payloads of H.264 (RFC 6184) and H.265 (RFC 7798) back into Annex B access units.

An access unit (one frame's NAL units) is complete at the packet that carries the RTP
marker bit (RFC 6184 5.1, RFC 7798 4.1): the reader can decode it at once instead of
waiting for the next frame's first packet, as FFmpeg's parser does. A gap in sequence
numbers or a fragment without its start marks the access unit damaged; it is dropped
whole rather than handed to the decoder half-filled.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Literal

START_CODE = b"\x00\x00\x00\x01"
Codec = Literal["h264", "hevc"]
# RTP encoding names (SDP rtpmap, case-insensitive) -> FFmpeg decoder names.
CODECS: dict[str, Codec] = {"H264": "h264", "H265": "hevc"}

# H.264 NAL unit types (ITU-T H.264 table 7-1; RFC 6184 5.2).
_H264_IDR, _H264_STAP_A, _H264_FU_A = 5, 24, 28
# H.265 NAL unit types (ITU-T H.265 table 7-1; RFC 7798 4.4): IRAP pictures are 16-21.
_HEVC_IRAP = range(16, 22)
_HEVC_AP, _HEVC_FU = 48, 49
_RTP_HEADER = 12  # bytes, without CSRCs
# Largest access unit kept, bytes: a 4K keyframe is 1-2 MB; a camera that never sets the
# marker nor changes its timestamp must not grow one without bound.
MAX_ACCESS_UNIT_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class AccessUnit:
    data: bytes  # Annex B: each NAL unit behind a start code
    timestamp: int  # RTP timestamp (90 kHz for video), not unwrapped
    keyframe: bool  # holds an IDR (H.264) or IRAP (H.265) picture


def rtp_payload(packet: bytes) -> tuple[bytes, int, int, bool] | None:
    """(payload, sequence number, timestamp, marker) of one RTP packet (RFC 3550 5.1),
    with CSRCs, header extension and padding stripped; None when it is no RTP packet."""
    if len(packet) < _RTP_HEADER or packet[0] >> 6 != 2:
        return None
    body = packet[_RTP_HEADER + 4 * (packet[0] & 0x0F) :]
    payload = strip_payload(body, bool(packet[0] & 0x10), bool(packet[0] & 0x20))
    if payload is None:
        return None
    seq = int.from_bytes(packet[2:4], "big")
    timestamp = int.from_bytes(packet[4:8], "big")
    return payload, seq, timestamp, bool(packet[1] & 0x80)


def strip_payload(body: bytes, extension: bool, padding: bool) -> bytes | None:
    """The payload in what follows an RTP header and its CSRCs: the header extension
    (16-bit profile, 16-bit length in 32-bit words) and the padding (its count in the
    last byte) removed; None when they do not fit."""
    start = 0
    if extension:
        if len(body) < 4:
            return None
        start = 4 + 4 * int.from_bytes(body[2:4], "big")
    end = len(body) - (body[-1] if padding and body else 0)
    return body[start:end] if start <= end else None


class Depacketizer:
    """Collects one stream's RTP payloads into access units (H.264 or H.265).

    `push` returns the access units a packet completes (the marker bit ends one).
    """

    def __init__(self, codec: Codec) -> None:
        self._hevc = codec == "hevc"
        self._parts: list[bytes] = []
        self._size = 0
        self._timestamp: int | None = None
        self._seq: int | None = None
        self._keyframe = False
        self._damaged = False
        self._in_fragment = False
        self.dropped = 0  # access units dropped as damaged

    def push(
        self, payload: bytes, seq: int, timestamp: int, marker: bool
    ) -> tuple[AccessUnit, ...]:
        """The access units this packet completes: its own on the marker bit, and the
        previous one when it never got its marker (a camera that omits it: that unit is
        whole, only late). Usually empty or one."""
        # A lost packet belonged to this access unit, or to the previous one and then
        # maybe to this one too: either way this one is not whole.
        gap = self._seq is not None and seq != (self._seq + 1) & 0xFFFF
        self._seq = seq
        done: tuple[AccessUnit, ...] = ()
        if self._timestamp is not None and timestamp != self._timestamp:
            late = self._finish(damaged=gap)
            done = (late,) if late is not None else ()
        self._damaged = self._damaged or gap
        self._timestamp = timestamp
        if payload and not self._damaged:
            self._size += len(payload)
            if self._size > MAX_ACCESS_UNIT_BYTES:
                self._damaged, self._parts = True, []
            else:
                self._add(payload)
        if marker:
            unit = self._finish()
            done = (*done, unit) if unit is not None else done
        return done

    def _finish(self, damaged: bool = False) -> AccessUnit | None:
        parts = self._parts
        damaged = damaged or self._damaged or self._in_fragment
        unit = None
        if parts and not damaged and self._timestamp is not None:
            unit = AccessUnit(b"".join(parts), self._timestamp, self._keyframe)
        elif parts or damaged:
            self.dropped += 1
        self._parts, self._size, self._timestamp, self._keyframe = [], 0, None, False
        self._damaged = self._in_fragment = False
        return unit

    def _add(self, payload: bytes) -> None:
        if self._hevc:
            self._add_hevc(payload)
        else:
            self._add_h264(payload)

    def _add_h264(self, p: bytes) -> None:
        kind = p[0] & 0x1F
        if kind == _H264_FU_A:
            if len(p) < 3:
                self._damaged = True
                return
            self._fragment(p[2:], p[1] & 0x80, p[1] & 0x40, bytes([(p[0] & 0xE0) | (p[1] & 0x1F)]))
        elif kind == _H264_STAP_A:
            self._aggregate(p, 1)
        elif 1 <= kind <= 23:
            self._nal(p)
        else:  # STAP-B, MTAP, FU-B: interleaved modes a camera must not send unasked
            self._damaged = True

    def _add_hevc(self, p: bytes) -> None:
        if len(p) < 2:
            self._damaged = True
            return
        kind = (p[0] >> 1) & 0x3F
        if kind == _HEVC_FU:
            if len(p) < 4:
                self._damaged = True
                return
            fu = p[2]
            header = bytes([(p[0] & 0x81) | ((fu & 0x3F) << 1), p[1]])
            self._fragment(p[3:], fu & 0x80, fu & 0x40, header)
        elif kind == _HEVC_AP:
            self._aggregate(p, 2)
        elif kind < _HEVC_AP:
            self._nal(p)
        else:  # PACI and reserved types
            self._damaged = True

    def _nal(self, nal: bytes) -> None:
        if self._in_fragment:  # a fragmented NAL unit never got its end
            self._damaged = True
        self._parts += (START_CODE, nal)
        self._keyframe = self._keyframe or self._is_key(nal)

    def _aggregate(self, p: bytes, header: int) -> None:
        """An aggregation packet: NAL units, each behind its 16-bit size."""
        at = header
        while at + 2 <= len(p):
            size = int.from_bytes(p[at : at + 2], "big")
            at += 2
            if size == 0 or at + size > len(p):
                self._damaged = True
                return
            self._nal(p[at : at + size])
            at += size

    def _fragment(self, data: bytes, start: int, end: int, header: bytes) -> None:
        if start:
            self._nal(header)
            self._in_fragment = True
        elif not self._in_fragment:  # the fragment's start was lost
            self._damaged = True
            return
        self._parts.append(data)
        if end:
            self._in_fragment = False

    def _is_key(self, nal: bytes) -> bool:
        if self._hevc:
            return ((nal[0] >> 1) & 0x3F) in _HEVC_IRAP
        return (nal[0] & 0x1F) == _H264_IDR


def parameter_sets(codec: Codec, fmtp: dict[str, str]) -> bytes:
    """The SDP's out-of-band parameter sets (fmtp `sprop-parameter-sets`, or H.265's
    `sprop-vps`/`sprop-sps`/`sprop-pps`) as Annex B, for the decoder's extradata; b""
    when the SDP carries none (the camera then sends them in band) or they are not base64."""
    keys = ("sprop-vps", "sprop-sps", "sprop-pps") if codec == "hevc" else ("sprop-parameter-sets",)
    out = []
    for key in keys:
        for item in fmtp.get(key, "").split(","):
            if not item.strip():
                continue
            try:
                out.append(START_CODE + base64.b64decode(item.strip(), validate=True))
            except (binascii.Error, ValueError):
                return b""
    return b"".join(out)
