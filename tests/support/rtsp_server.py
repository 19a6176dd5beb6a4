"""A real RTSP camera for tests: GStreamer's RTSP server on 127.0.0.1.

Runs with Debian's /usr/bin/python3 (it has `gi`), not the project venv:

    /usr/bin/python3 tests/support/rtsp_server.py --port 8554 --clip clip.mp4
    /usr/bin/python3 tests/support/rtsp_server.py --port 8554 --pattern 320x240@15

`--clip` serves an H.264 MP4 as is (no re-encoding, so it costs almost no CPU) and loops
it with segment seeks, so RTP timestamps keep growing like a live camera's; with `--once`
it plays once per client and ends there (RTCP BYE), like a camera's stream that ends. `--pattern`
encodes a live videotestsrc. `--auth user:pass` requires Basic authentication.
Prints `READY <url>` on stdout once the port is listening; the fixture waits for it.
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

_PR_SET_PDEATHSIG = 1  # prctl(2): signal this process when its parent dies

_CLIP = (
    '( filesrc location="{clip}" ! qtdemux ! h264parse'
    " ! rtph264pay name=pay0 pt=96 config-interval=1 )"
)
_PATTERN = (
    "( videotestsrc is-live=true pattern=ball ! video/x-raw,width={w},height={h},framerate={fps}/1"
    " ! videoconvert ! {encoder} )"
)
_ENCODERS = {
    "h264": "x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps}"
    " ! rtph264pay name=pay0 pt=96 config-interval=1",
    # x265enc is in gstreamer1.0-plugins-bad; parameter sets go in the SDP and in band.
    "h265": "x265enc tune=zerolatency speed-preset=ultrafast key-int-max={fps}"
    " ! rtph265pay name=pay0 pt=96 config-interval=1",
}


def _loop_media(_factory: GstRtspServer.RTSPMediaFactory, media: GstRtspServer.RTSPMedia) -> None:
    """Restart the file at its end instead of sending EOS to the client.

    The first end of the file is an EOS: it is dropped and replaced by a flushing
    segment seek to the start; later ends are SEGMENT_DONE messages, answered by a
    non-flushing segment seek (no gap). No seek happens before that: a flushing seek
    while a client's PLAY is answered trips an assertion in gst-rtsp-server 1.22
    (gst_rtsp_media_get_rates) and aborts the server.
    """
    element = media.get_element()

    def seek(flags: Gst.SeekFlags) -> bool:
        element.seek_simple(Gst.Format.TIME, Gst.SeekFlags.SEGMENT | flags, 0)
        return False  # run once from GLib.idle_add

    def on_sync(_bus: Gst.Bus, message: Gst.Message) -> None:
        if message.type == Gst.MessageType.SEGMENT_DONE:
            GLib.idle_add(seek, Gst.SeekFlags.NONE)

    def on_event(_pad: Gst.Pad, info: Gst.PadProbeInfo) -> Gst.PadProbeReturn:
        if info.get_event().type != Gst.EventType.EOS:
            return Gst.PadProbeReturn.OK
        GLib.idle_add(seek, Gst.SeekFlags.FLUSH)
        return Gst.PadProbeReturn.DROP

    pay = element.get_by_name("pay0")
    pay.get_static_pad("sink").add_probe(Gst.PadProbeType.EVENT_DOWNSTREAM, on_event)
    bus = (element.get_parent() or element).get_bus()
    bus.enable_sync_message_emission()
    bus.connect("sync-message", on_sync)


def _parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", default="/stream", help="mount point, starts with /")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--clip", help="H.264 MP4 file to loop")
    src.add_argument("--pattern", help="WxH@FPS of a live test pattern")
    p.add_argument("--codec", choices=sorted(_ENCODERS), default="h264", help="of --pattern")
    p.add_argument("--once", action="store_true", help="play --clip once, do not loop it")
    p.add_argument("--auth", help="user:pass required from clients (Basic)")
    return p.parse_args(argv)


def _factory(args: argparse.Namespace) -> GstRtspServer.RTSPMediaFactory:
    factory = GstRtspServer.RTSPMediaFactory()
    if args.clip:
        factory.set_launch(_CLIP.format(clip=args.clip))
        if not args.once:
            factory.connect("media-configure", _loop_media)
        # One pipeline per client: a joining client's PLAY seeks the pipeline it plays.
        factory.set_shared(False)
    else:
        size, fps = args.pattern.split("@")
        w, h = size.split("x")
        encoder = _ENCODERS[args.codec].format(fps=int(fps))
        factory.set_launch(_PATTERN.format(w=int(w), h=int(h), fps=int(fps), encoder=encoder))
        factory.set_shared(True)  # one live encoder for all clients, like a camera
    factory.set_eos_shutdown(False)
    return factory


def _protect(
    server: GstRtspServer.RTSPServer, factory: GstRtspServer.RTSPMediaFactory, cred: str
) -> None:
    user, password = cred.split(":", 1)
    auth = GstRtspServer.RTSPAuth()
    token = GstRtspServer.RTSPToken()
    token.set_string(GstRtspServer.RTSP_TOKEN_MEDIA_FACTORY_ROLE, "user")
    auth.add_basic(GstRtspServer.RTSPAuth.make_basic(user, password), token)
    server.set_auth(auth)
    factory.add_role_from_structure(
        Gst.Structure.from_string(
            "user, media.factory.access=(boolean)true, media.factory.construct=(boolean)true"
        )[0]
    )


def main(argv: list[str]) -> int:
    args = _parse_args(argv)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = _factory(args)
    if args.auth:
        _protect(server, factory, args.auth)
    server.get_mount_points().add_factory(args.path, factory)
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{args.port}", file=sys.stderr)
        return 1
    loop = GLib.MainLoop()
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, loop.quit)
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGINT, loop.quit)
    print(f"READY rtsp://127.0.0.1:{args.port}{args.path}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
