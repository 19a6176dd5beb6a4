"""A live RTSP camera with a clock: every frame stamped with its index, every emission logged.

Runs with Debian's /usr/bin/python3 (it has `gi`, but no numpy), like rtsp_server.py:

    /usr/bin/python3 tests/support/clock_camera_server.py --size 640x480 --fps 15 \\
        --emissions emitted.txt [--background frames.i420] [--port 0] [--path /stream]

A thread ticks at the frame rate on the monotonic clock; each tick builds an I420 frame
(a background picture with the stamp band on top) and pushes it into `appsrc` →
`x264enc tune=zerolatency` (no B-frames, one keyframe a second) → `rtph264pay`. A probe on
the payloader's output sees each frame's first RTP packet leave and appends
"INDEX WALL_TIME" (time.time(), seconds) to the emissions file, flushed: the nearest point
to the wire inside the pipeline. The payloader keeps each input buffer's PTS, so PTS maps
the packet back to its index. Prints `READY <url>` once listening (port 0: any free port).

The stamp layout is defined here, next to the code that draws it, and imported by the
reader (tests/support/clock_camera.py); `gi` is imported in `main` only, so that the reader
can import this module without PyGObject.
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import sys
import threading
import time
from typing import IO, Any

STAMP_BITS = 16  # frame index modulo 65536: over an hour at 15 fps, 36 min at 30 fps
CHECK_BITS = 4  # a nibble that rejects unstamped or damaged frames
BLOCKS = STAMP_BITS + CHECK_BITS  # black/white blocks left to right, most significant first
MODULUS = 1 << STAMP_BITS
_CHECK_SALT = 0b1010  # so that all-black and all-white bands fail the check
Y_ON, Y_OFF, Y_GREY, CHROMA_NEUTRAL = 235, 16, 128, 128  # BT.601 studio-range white/black
MIN_WIDTH = BLOCKS * 8

_PR_SET_PDEATHSIG = 1  # prctl(2): signal this process when its parent dies
_NS = 1_000_000_000  # GStreamer times are in nanoseconds
_LAUNCH = (
    "( appsrc name=src is-live=true format=time do-timestamp=false max-buffers=2"
    " leaky-type=downstream caps=video/x-raw,format=I420,width={w},height={h},framerate={fps}/1"
    # threads=1: the camera is a separate device; one encoder thread keeps its share of
    # the machine's cores small and steady.
    " ! x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} bframes=0 threads=1"
    " ! rtph264pay name=pay0 pt=96 config-interval=1 )"
)


def band_rows(height: int) -> int:
    """Rows of the stamp band: about a tenth of the frame, whole 16-row macroblocks."""
    return max(16, height // 10 // 16 * 16)


def block_px(width: int) -> int:
    """Width of one stamp block: whole 8-pixel transform blocks, so edges do not blur in."""
    return width // BLOCKS // 8 * 8


def check_nibble(stamp: int) -> int:
    """The 4 check bits of a 16-bit stamp: XOR of its nibbles, salted."""
    return (stamp ^ stamp >> 4 ^ stamp >> 8 ^ stamp >> 12 ^ _CHECK_SALT) & 0xF


def stamp_bits(index: int) -> list[int]:
    """The BLOCKS bits drawn for a frame index (stamp, then check), most significant first."""
    stamp = index % MODULUS
    word = stamp << CHECK_BITS | check_nibble(stamp)
    return [(word >> (BLOCKS - 1 - i)) & 1 for i in range(BLOCKS)]


def stamp_band_y(index: int, width: int, height: int) -> bytes:
    """The luma rows of the stamp band of frame `index` (band_rows x width bytes)."""
    block = block_px(width)
    row = b"".join(bytes([Y_ON if bit else Y_OFF]) * block for bit in stamp_bits(index))
    row += bytes([Y_GREY]) * (width - len(row))
    return row * band_rows(height)


class Frames:
    """I420 frames of one size: background pictures cycled, the stamp band on top."""

    def __init__(self, width: int, height: int, background: bytes | None) -> None:
        if width < MIN_WIDTH or width % 2 or height % 2:
            raise ValueError(f"size {width}x{height}: even sides, width >= {MIN_WIDTH}")
        self.width, self.height = width, height
        self._luma, self._chroma = width * height, width * height // 4
        size = self._luma + 2 * self._chroma
        if background is None:  # plain dark grey
            grey, neutral = bytes([Y_GREY - 32]), bytes([CHROMA_NEUTRAL])
            background = grey * self._luma + neutral * (2 * self._chroma)
        if len(background) % size:
            raise ValueError(f"background: {len(background)} bytes is not a multiple of {size}")
        self._pictures = [
            memoryview(background)[i : i + size] for i in range(0, len(background), size)
        ]
        band = band_rows(height)
        self._band_y = band * width
        self._band_c = band // 2 * width // 2
        self._neutral = bytes([CHROMA_NEUTRAL]) * self._band_c

    def frame(self, index: int) -> bytes:
        """Frame `index`: one copy of its picture with the band replaced."""
        pic = self._pictures[index % len(self._pictures)]
        u, v = self._luma, self._luma + self._chroma
        return b"".join(
            (
                stamp_band_y(index, self.width, self.height),
                pic[self._band_y : u],
                self._neutral,
                pic[u + self._band_c : v],
                self._neutral,
                pic[v + self._band_c :],
            )
        )


class Emitter:
    """The camera's clock: pushes frame `n` at tick n, logs each index as it leaves."""

    def __init__(self, frames: Frames, fps: int, log: IO[str]) -> None:
        self._frames, self._fps, self._log = frames, fps, log
        self._src: Any = None  # the appsrc of the pipeline playing now, if any
        self._pending: dict[int, int] = {}  # running time (ns) -> index, pushed, not yet sent
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="emitter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)

    def attach(self, _factory: Any, media: Any) -> None:
        """media-configure: a (new) shared pipeline; feed its appsrc, watch its payloader."""
        from gi.repository import Gst

        element = media.get_element()
        pay = element.get_by_name("pay0").get_static_pad("src")
        pay.add_probe(Gst.PadProbeType.BUFFER | Gst.PadProbeType.BUFFER_LIST, self._on_sent)
        media.connect("unprepared", self._detach)
        with self._lock:
            self._src = element.get_by_name("src")
            self._pending.clear()

    def _detach(self, _media: Any) -> None:
        with self._lock:
            self._src = None

    def _run(self) -> None:
        period = 1.0 / self._fps
        start, tick = time.monotonic(), 0
        while not self._stop.is_set():
            tick += 1
            late = time.monotonic() - (start + tick * period)
            if late > period:  # stalled: a camera's clock keeps running, frames are lost
                tick += int(late / period)
            elif late < 0 and self._stop.wait(-late):
                return
            self._push(tick)

    def _push(self, index: int) -> None:
        from gi.repository import Gst

        with self._lock:
            src = self._src
        clock = src.get_clock() if src is not None else None
        if clock is None:  # no client playing: the pipeline is not running
            return
        buf = Gst.Buffer.new_wrapped(self._frames.frame(index))
        buf.pts = clock.get_time() - src.get_base_time()  # running time, what do-timestamp does
        buf.duration = _NS // self._fps
        with self._lock:
            self._pending[buf.pts] = index
        src.emit("push-buffer", buf)

    def _on_sent(self, pad: Any, info: Any) -> Any:
        """Pad probe, streaming thread: the first packet of a frame logs its emission."""
        from gi.repository import Gst

        now = time.time()
        if info.type & Gst.PadProbeType.BUFFER_LIST:
            buf = info.get_buffer_list().get(0)
        else:
            buf = info.get_buffer()
        # x264enc shifts PTS by 1000 hours (so DTS never goes negative) and shifts its
        # segment alike: the running time is what survives, the key `_push` used.
        segment = pad.get_sticky_event(Gst.EventType.SEGMENT, 0).parse_segment()
        running = segment.to_running_time(Gst.Format.TIME, buf.pts)
        with self._lock:
            index = self._pending.pop(running, None)
            for old in [pts for pts in self._pending if pts < running]:
                del self._pending[old]  # dropped by the leaky appsrc, never sent
        if index is not None:
            self._log.write(f"{index} {now:.6f}\n")
            self._log.flush()
        return Gst.PadProbeReturn.OK


def _parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--path", default="/stream", help="mount point, starts with /")
    p.add_argument("--size", default="640x480", help="WxH, even sides")
    p.add_argument("--fps", type=int, default=15)
    p.add_argument("--background", help="raw I420 frames of --size, cycled")
    p.add_argument("--emissions", required=True, help="file to append 'index wall_time' to")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _parse_args(argv)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    import gi

    gi.require_version("Gst", "1.0")
    gi.require_version("GstRtspServer", "1.0")
    from gi.repository import GLib, Gst, GstRtspServer

    Gst.init(None)
    w, h = (int(x) for x in args.size.split("x"))
    background = None
    if args.background:
        with open(args.background, "rb") as f:
            background = f.read()
    emitter = Emitter(Frames(w, h, background), args.fps, open(args.emissions, "a"))  # noqa: SIM115
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(_LAUNCH.format(w=w, h=h, fps=args.fps))
    factory.set_shared(True)  # one encoder for every client, like a camera
    factory.set_eos_shutdown(False)
    factory.connect("media-configure", emitter.attach)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    server.get_mount_points().add_factory(args.path, factory)
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{args.port}", file=sys.stderr)
        return 1
    loop = GLib.MainLoop()
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, loop.quit)
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGINT, loop.quit)
    emitter.start()
    print(f"READY rtsp://127.0.0.1:{server.get_bound_port()}{args.path}", flush=True)
    loop.run()
    emitter.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
