"""`python -m appliance ARGS` for the tests, forked from a warm interpreter.

Every `appliance` command starts by importing the CLI and building its parser (about a
thousand modules: 1.3 s on the 2-core test machine when it is quiet, 3-6 s beside a busy
appliance), and the suite runs about a hundred one-shot commands. `run_appliance` runs
each in a child process forked from a server that has done that start once: the child
then does what `python -m appliance` does after its imports (`runpy` runs the
`appliance` package as __main__), in its own process, with its own arguments,
environment, working folder and stdin/stdout/stderr, and ends as the interpreter ends
(threads joined, atexit, streams flushed); its exit code or signal comes back as
`returncode`. What it cannot inherit falls back to a fresh `python -m appliance`: a
PYTHON* variable other than PYTHONUNBUFFERED (read when an interpreter starts), or
APPLIANCE_FRESH_CLI=1 in this process's environment (every call fresh: the check that
the two agree). The server refuses to start if its imports print anything, which a
fresh command would print on every run. Tests of the start itself (which modules it
imports, a reader that leaves early) and long-running `serve` processes start their own.

This module is also the server: `python -m tests.support.warm_cli SOCKET`.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import locale
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
FRESH_ENV = "APPLIANCE_FRESH_CLI"
START_TIMEOUT_S = 120.0
_lock = threading.Lock()
_server: _Server | None = None


def run_appliance(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """What `subprocess.run([python, -m, appliance, *args], capture_output=True,
    text=True, timeout=timeout, env=env, cwd=cwd, check=False)` returns."""
    command = [sys.executable, "-m", "appliance", *args]
    environ = dict(os.environ if env is None else env)
    if os.environ.get(FRESH_ENV) == "1" or _starts_differently(environ):
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False,
            env=env, cwd=cwd,
        )  # fmt: skip
    return _get_server().run(command, environ, os.path.abspath(cwd or os.getcwd()), timeout)


def _starts_differently(env: Mapping[str, str]) -> bool:
    """Whether `env` sets what an interpreter reads as it starts differently from ours."""
    start = {k for k in (*env, *os.environ) if k.startswith("PYTHON")} - {"PYTHONUNBUFFERED"}
    return any(env.get(k) != os.environ.get(k) for k in start)


def _get_server() -> _Server:
    global _server  # noqa: PLW0603 - one server per test process, started on first use
    with _lock:
        if _server is None or not _server.alive():
            _server = _Server()
            atexit.register(_server.close)
        return _server


class _Server:
    """The warm server, a child of this process; it ends when this process closes its stdin."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="warm-cli-")
        self.path = str(Path(self._folder.name) / "socket")
        log = Path(self._folder.name) / "server.log"
        with log.open("w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.warm_cli", self.path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                cwd=ROOT, env={k: v for k, v in os.environ.items() if k != FRESH_ENV},
            )  # fmt: skip
        assert self.process.stdout is not None
        line = _read_line(self.process.stdout, START_TIMEOUT_S)
        if line != "READY":
            printed = log.read_text()
            self.close()
            raise RuntimeError(f"the warm CLI server did not start: {line!r}\n{printed}")

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()  # the server's signal to end
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._folder.cleanup()

    def run(
        self, command: list[str], env: dict[str, str], cwd: str, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        header = json.dumps({"argv": command[3:], "env": env, "cwd": cwd}).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                try:
                    conn.connect(self.path)
                    socket.send_fds(conn, [header + b"\n"], [0, out_w, err_w])
                finally:
                    os.close(out_w)
                    os.close(err_w)
                return _collect(conn, out_r, err_r, command, timeout)
        finally:
            os.close(out_r)
            os.close(err_r)


def _collect(
    conn: socket.socket, out_r: int, err_r: int, command: list[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Read the child's stdout and stderr to their ends and its pid and status from
    `conn`, as `subprocess.run` does; kill it past `timeout`."""
    deadline = time.monotonic() + timeout
    got: dict[int, bytearray] = {out_r: bytearray(), err_r: bytearray(), conn.fileno(): bytearray()}
    pid: int | None = None
    status: int | None = None
    try:
        with selectors.DefaultSelector() as sel:
            for fd in got:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(
                        command, timeout, bytes(got[out_r]), bytes(got[err_r])
                    )
                for key, _ in sel.select(left):
                    fd = int(key.fd)
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        sel.unregister(fd)
                        continue
                    got[fd] += chunk
                    if fd == conn.fileno():
                        pid, status = _control(got[fd], pid, status)
    except BaseException:  # a timeout, or the test interrupted: as subprocess.run, kill it
        if pid is not None and status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise
    if status is None:
        raise RuntimeError(f"the warm CLI server lost {command[3:]}: {bytes(got[err_r])!r}")
    return subprocess.CompletedProcess(command, status, _text(got[out_r]), _text(got[err_r]))


def _control(data: bytearray, pid: int | None, status: int | None) -> tuple[int | None, int | None]:
    """The child's pid (first line) and exit status (second line) once they came."""
    lines = bytes(data).split(b"\n")
    if len(lines) > 1:
        pid = int(json.loads(lines[0])["pid"])
    if len(lines) > 2:
        status = int(json.loads(lines[1])["status"])
    return pid, status


def _text(data: bytes | bytearray) -> str:
    """As `subprocess.run(text=True)` decodes: the locale's encoding, universal newlines."""
    text = bytes(data).decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _read_line(stream: IO[str], timeout_s: float) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if sel.select(timeout_s):
            return stream.readline().strip()
    return ""


# -- the server ----------------------------------------------------------------------
def _warm_up() -> str:
    """Import what every `python -m appliance` imports before it runs a command; what
    that printed (it must print nothing: a fresh command would print it each time)."""
    with tempfile.TemporaryFile() as printed:
        saved = os.dup(1), os.dup(2)
        os.dup2(printed.fileno(), 1)
        os.dup2(printed.fileno(), 2)
        try:
            import appliance.cli.main

            appliance.cli.main._parser()  # registering the commands imports their modules
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        printed.seek(0)
        return printed.read().decode(errors="replace")


def serve(path: str) -> None:
    """Answer requests on the socket at `path` until stdin closes; each request forks."""
    printed = _warm_up()
    if printed:
        print(f"FAILED: starting the CLI printed: {printed!r}", flush=True)
        return
    if threading.active_count() != 1:
        print(f"FAILED: {threading.active_count()} threads after the imports", flush=True)
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    children: dict[int, tuple[socket.socket, int]] = {}  # pidfd: (conn, pid)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listener")
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    print("READY", flush=True)
    while True:
        for key, _ in sel.select():
            if key.data == "stdin":
                if not sys.stdin.readline():
                    return  # the test process closed it (or ended)
            elif key.data == "listener":
                conn, _ = listener.accept()
                try:
                    request, fds = _request(conn)
                except (OSError, ValueError):  # a caller that left before it asked
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    others = [listener, conn, *(c for c, _ in children.values())]
                    _child(request, fds, others, [*children])  # never returns
                for fd in fds:
                    os.close(fd)
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (conn, pid)
                sel.register(pidfd, selectors.EVENT_READ, "child")
            else:
                pidfd = int(key.fd)
                conn, pid = children.pop(pidfd)
                sel.unregister(pidfd)
                os.close(pidfd)
                _, wait_status = os.waitpid(pid, 0)
                code = os.waitstatus_to_exitcode(wait_status)
                with contextlib.suppress(OSError):  # the caller may have gone (a timeout)
                    conn.sendall(json.dumps({"status": code}).encode() + b"\n")
                conn.close()


def _request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """A request (one JSON line) and the three descriptors sent with it."""
    conn.settimeout(10.0)
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    data = bytearray(message)
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    conn.settimeout(None)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"{len(fds)} descriptors")
    return json.loads(data), fds


def _child(
    request: dict[str, Any], fds: list[int], sockets: list[socket.socket], pidfds: list[int]
) -> None:
    """In the forked child: become `python -m appliance ARGV`, run it and exit."""
    for sock in sockets:
        sock.close()
    for fd in pidfds:
        os.close(fd)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()  # TZ as a fresh process reads it
    _fresh_stdio(bool(os.environ.get("PYTHONUNBUFFERED")))
    sys.argv = ["", *request["argv"]]  # run_module sets argv[0] as `-m` does
    code = 0
    try:
        runpy.run_module("appliance", run_name="__main__", alter_sys=True)
    except SystemExit as end:
        code = _exit_code(end.code)
    except BaseException as error:  # uncaught: reported as the interpreter reports it
        sys.excepthook(type(error), error, error.__traceback__)
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    _finalize(code)


def _exit_code(code: object) -> int:
    """The status `sys.exit(code)` ends an interpreter with (a message: printed, 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finalize(code: int) -> None:
    """End as an interpreter ends (threads joined, atexit run, streams flushed), without
    the native libraries' exit handlers: ONNX Runtime's waits for a thread of the server
    that the fork did not copy. A negative code: the signal a fresh process dies of."""
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize calls first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _fresh_stdio(unbuffered: bool) -> None:
    """stdin/stdout/stderr on the new descriptors 0-2, buffered as a new interpreter
    buffers them (PYTHONUNBUFFERED: written through)."""
    streams: list[io.TextIOWrapper] = []
    for fd, old in enumerate((sys.__stdin__, sys.__stdout__, sys.__stderr__)):
        assert old is not None
        mode = "rb" if fd == 0 else "wb"
        raw = io.FileIO(fd, mode, closefd=False)
        tty = raw.isatty()
        buffered: Any
        if fd == 0:
            buffered = io.BufferedReader(raw)
        else:
            buffered = raw if unbuffered else io.BufferedWriter(raw)
        streams.append(
            io.TextIOWrapper(
                buffered,
                encoding=old.encoding,
                errors=old.errors,
                line_buffering=tty or fd == 2,
                write_through=unbuffered and fd != 0,
            )
        )
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]


if __name__ == "__main__":
    serve(sys.argv[1])
