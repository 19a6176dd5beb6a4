"""A real RTSP camera for tests: tests/support/rtsp_server.py in its own process.

    @pytest.mark.rtsp
    def test_x(rtsp_server):
        server = rtsp_server()               # loops a small H.264 clip
        server = rtsp_server(clip=path)      # or a given clip
        server = rtsp_server(once=True)      # the clip played once per client, then it ends
        server = rtsp_server(pattern="320x240@15")   # or a live, encoded test pattern
        server.url                           # rtsp://127.0.0.1:PORT/stream
        server.stop(); server.start()        # an outage, then the camera back on the same port
        server.suspend(); server.resume()    # SIGSTOP/SIGCONT: a hung camera

Every server is killed at teardown. The server runs with Debian's /usr/bin/python3,
which has PyGObject and GStreamer's RTSP server; the venv does not need them.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from tests.support.media import MakeClip
from tests.support.processes import end_process, free_port, read_line

SYSTEM_PYTHON = "/usr/bin/python3"
SCRIPT = Path(__file__).with_name("rtsp_server.py")
READY_TIMEOUT_S = 15.0  # GStreamer's first start loads plugins: ~1 s, more on a busy box
_PACKAGES = (
    "gir1.2-gst-rtsp-server-1.0 python3-gi gstreamer1.0-plugins-base "
    "gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly gstreamer1.0-plugins-bad"
)
_GI_CHECK = (
    "import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstRtspServer', '1.0')"
)


class RtspServer:
    """One RTSP server process on a fixed loopback port; can be stopped and started again."""

    def __init__(self, source_args: list[str], port: int, path: str, log_path: Path) -> None:
        self.port = port
        self.path = path
        self._args = [SYSTEM_PYTHON, str(SCRIPT), "--port", str(port), "--path", path]
        self._args += source_args
        self._log_path = log_path
        self._proc: subprocess.Popen[str] | None = None
        self._suspended = False
        self.crashed: int | None = None  # exit status, when it exited without stop()

    @property
    def url(self) -> str:
        return f"rtsp://127.0.0.1:{self.port}{self.path}"

    def url_with_credentials(self, user: str, password: str) -> str:
        return f"rtsp://{user}:{password}@127.0.0.1:{self.port}{self.path}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the process and wait for its READY line (the port is listening then)."""
        assert not self.running, "server already running"
        log = self._log_path.open("a")
        self._proc = subprocess.Popen(
            self._args, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True
        )
        log.close()  # the child holds its own copy
        assert self._proc.stdout is not None
        line = read_line(self._proc.stdout, READY_TIMEOUT_S)
        if not line.startswith("READY"):
            self.stop()
            raise RuntimeError(f"RTSP server did not start: {line!r}\n{self.log()}")

    def stop(self) -> None:
        """End the process (SIGTERM, then SIGKILL): to clients, the camera is gone."""
        self.resume()  # a stopped process would not act on SIGTERM
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is not None:
            self.crashed = proc.returncode
        end_process(proc)

    def suspend(self) -> None:
        """SIGSTOP: the server keeps its sockets open but sends nothing (a hung camera)."""
        assert self._proc is not None, "server not running"
        os.kill(self._proc.pid, signal.SIGSTOP)
        self._suspended = True

    def resume(self) -> None:
        """SIGCONT after suspend(); nothing otherwise."""
        if self._suspended and self._proc is not None:
            os.kill(self._proc.pid, signal.SIGCONT)
        self._suspended = False

    def log(self) -> str:
        return self._log_path.read_text(errors="replace")


class RtspServerFactory(Protocol):
    def __call__(
        self,
        clip: Path | None = None,
        *,
        pattern: str | None = None,
        codec: str = "h264",
        path: str = "/stream",
        auth: str | None = None,
        once: bool = False,
    ) -> RtspServer: ...


@pytest.fixture(scope="session")
def _gst_rtsp_available() -> None:
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", _GI_CHECK], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        pytest.fail(
            f"{SYSTEM_PYTHON} cannot load GStreamer's RTSP server ({probe.stderr.strip()}).\n"
            f"Install: apt-get install -y --no-install-recommends {_PACKAGES}",
            pytrace=False,
        )


@pytest.fixture
def rtsp_server(
    _gst_rtsp_available: None, make_clip: MakeClip, tmp_path: Path
) -> Iterator[RtspServerFactory]:
    """Factory: rtsp_server(clip=None, *, pattern=None, codec="h264", path="/stream",
    auth=None, once=False) -> RtspServer. `codec` (h264, h265) applies to a pattern.

    Default source: a 2 s 160x120 15 fps clip, looped (`once`: played once per client, each
    session then ends). `auth="user:pass"` requires Basic auth.
    """
    servers: list[RtspServer] = []

    def start(
        clip: Path | None = None,
        *,
        pattern: str | None = None,
        codec: str = "h264",
        path: str = "/stream",
        auth: str | None = None,
        once: bool = False,
    ) -> RtspServer:
        if pattern is not None:
            args = ["--pattern", pattern, "--codec", codec]
        else:
            args = ["--clip", str(clip or make_clip(160, 120, fps=15, seconds=2.0))]
            args += ["--once"] if once else []
        if auth is not None:
            args += ["--auth", auth]
        log_path = tmp_path / f"rtsp-server-{len(servers)}.log"
        server = RtspServer(args, free_port(), path, log_path)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()
    for server in servers:
        if server.crashed is not None:
            pytest.fail(f"RTSP server exited by itself ({server.crashed}):\n{server.log()}")
