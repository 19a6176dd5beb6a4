"""Outputs: each stream's results routed to the sinks it names and to in-process
subscribers. This replaces the one global subscriber list the runtime had.

    worker thread ─ publish(result) ─┬─ filter ─► sink.offer  (bounded queue, never blocks)
                                     └─ subscribers of this stream (tests, WebRTC tracks)

Routes are bound when a stream starts (`publisher`): the per-frame path holds a tuple of
(filter, sink) and calls them, nothing is looked up. Sinks do their I/O on one event loop
of their own, on the `sinks` thread, so a slow broker or webhook can never stall the HTTP
API's loop, and the appliance works the same headless (`appliance run`) as served.
Sinks start before the streams and stop after them, with a drain timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, SecretStr

from appliance.config import ConfigError, OutputConfig, unknown_sink
from appliance.errors import FileAccessError
from appliance.observe.metrics import Metrics
from appliance.policy.files import FileKind, FilePolicy
from appliance.policy.masking import mask_url
from appliance.profiling.hooks import SinkDeliveries
from appliance.profiling.tracer import Tracer
from pipelines.types import Detections, FrameResult
from sinks.base import KeptDocument, Sink, SinkContext, SinkStatus
from sinks.mqtt.commands import CommandHandler
from sinks.registry import sink_class

log = logging.getLogger("appliance.outputs")

T = TypeVar("T")
Subscriber = Callable[[FrameResult], None]
Publish = Callable[[FrameResult], None]
START_TIMEOUT_S = 10.0  # a sink's start only begins connecting; it never waits for a peer


class OutputFilter:
    """One output's filters (OutputConfig), with the state they need, for one stream."""

    def __init__(self, cfg: OutputConfig) -> None:
        self._every_s = cfg.every_s
        self._on_change = tuple(cfg.on_change or ())
        self._classes = frozenset(cfg.classes or ())
        self._last_sent = float("-inf")  # done_mono of the last result let through
        self._last_values: str | None = None

    def __call__(self, result: FrameResult) -> bool:
        if self._every_s is not None and result.done_mono - self._last_sent < self._every_s:
            return False
        if self._classes and not self._has_class(result):
            return False
        if self._on_change:
            values = json.dumps([_jsonable(result.outputs.get(k)) for k in self._on_change])
            if values == self._last_values:
                return False
            self._last_values = values
        self._last_sent = result.done_mono
        return True

    def _has_class(self, result: FrameResult) -> bool:
        return any(
            isinstance(v, Detections) and not self._classes.isdisjoint(v.class_name)
            for v in result.outputs.values()
        )


def _jsonable(value: Any) -> Any:
    to_json = getattr(value, "to_json", None)
    return to_json() if callable(to_json) else value


class SinkLoop:
    """The `sinks` thread's event loop; coroutines are handed to it explicitly."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="sinks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float) -> bool:
        if not self._thread.is_alive():
            return True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
            # Sinks write dead letters on the loop's executor: let those writes finish.
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()


class Outputs:
    """The sinks of one runtime and the routes to them; `start` once, `stop` once."""

    def __init__(
        self,
        configs: Mapping[str, BaseModel],
        metrics: Metrics,
        data_dir: Path,
        on_command: CommandHandler | None = None,
        files: FilePolicy | None = None,
        client_suffix: str = "",
        take_commands: bool = True,
        documents: Callable[[str], KeptDocument] | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self._configs = dict(configs)
        self._tracer = tracer  # each frame's deliveries go on its trace (SinkDeliveries)
        # Each sink's document across restarts, by its name (None: no server.state_dir).
        self._documents = documents
        # False: MQTT sinks leave commands off whatever their config says (the workers of
        # `serve --workers` but one: appliance/workers/commands.py).
        self._take_commands = take_commands
        self._client_suffix = client_suffix  # appended to MQTT client ids: one per process
        self._files = files  # the config's paths (TLS files) go through it
        self._on_command = on_command  # the runtime's: sinks that take commands call it
        self._metrics = metrics
        self._data_dir = data_dir
        self.sinks: dict[str, Sink] = {}
        self._subscribers: tuple[tuple[str | None, Subscriber], ...] = ()
        self._lock = threading.Lock()
        self._loop: SinkLoop | None = None
        self._reported: dict[str, dict[str, int]] = {}  # counters already in metrics

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Build and start every sink on the `sinks` loop (before any stream starts).
        A destination that is down does not fail this: sinks keep reconnecting."""
        if not self._configs:
            return
        self._loop = SinkLoop()
        self._loop.start()
        for name, cfg in self._configs.items():
            sink = self._build(name, cfg)
            self._loop.call(sink.start(), START_TIMEOUT_S)
            self.sinks[name] = sink
            log.info("sink %s (%s) started", name, sink.status().type)

    def stop(self, drain_timeout_s: float) -> bool:
        """Drain and stop every sink (after the streams stopped); True when all ended."""
        if self._loop is None:
            return True
        ok = True
        for name, sink in self.sinks.items():
            try:
                self._loop.call(sink.stop(drain_timeout_s), drain_timeout_s + 2.0)
            except Exception as exc:  # one sink's failure must not keep the others up
                ok = False
                log.error("sink %s did not stop cleanly: %s", name, mask_url(str(exc)))
        self.sync_metrics()
        return self._loop.stop(2.0) and ok

    def _build(self, name: str, cfg: BaseModel) -> Sink:
        """Every kind alike: its class from the registry builds it from the config (its
        files read through the policy) and what the runtime offers every sink."""
        kind = str(cfg.model_dump()["type"])  # every sink config has one (sinks.registry)
        context = SinkContext(
            data_dir=self._data_dir,
            observe_send=self._metrics.sink_send_seconds.labels(name).observe,
            on_delivered=None if self._tracer is None else SinkDeliveries(self._tracer, name),
            on_command=self._on_command,
            client_suffix=self._client_suffix,
            take_commands=self._take_commands,
            kept=None if self._documents is None else self._documents(name),
        )
        return sink_class(kind).build(name, _with_checked_files(name, cfg, self._files), context)

    # -- routing -----------------------------------------------------------------------
    def sends_images(self, outputs: Sequence[OutputConfig]) -> bool:
        """Whether a sink these outputs route to sends the video's images (snapshots): then
        the stream draws every frame, whoever watches."""
        return any(getattr(self.sinks.get(o.sink), "sends_images", False) for o in outputs)

    def publisher(self, stream_id: str, outputs: Sequence[OutputConfig]) -> Publish:
        """The per-frame publish of one stream: its own filters, its sinks, and the
        subscribers of the moment (read without a lock: a copy-on-write tuple)."""
        self.check(outputs)
        routes = tuple((OutputFilter(o), self.sinks[o.sink]) for o in outputs)

        def publish(result: FrameResult) -> None:
            for passes, sink in routes:
                try:
                    if passes(result):
                        sink.offer(result)
                except Exception:  # a sink's bug must not take down the stream
                    log.exception("sink %s failed to take %s#%d", sink.name, stream_id, result.seq)
            for wanted, fn in self._subscribers:
                if wanted is None or wanted == stream_id:
                    _deliver(fn, result)

        return publish

    def shadow_publisher(self, outputs: Sequence[OutputConfig]) -> Publish:
        """A shadow's publish: its candidate results to the stream's sinks that take them
        (MQTT's `shadow` topic), none else."""
        sinks = [
            s for o in outputs if (s := getattr(self.sinks.get(o.sink), "publish_shadow", None))
        ]

        def publish(result: FrameResult) -> None:
            for send in sinks:
                try:
                    send(result)
                except Exception:  # a sink's bug must not take down the shadow
                    log.exception("a sink failed to take a shadow result of %s", result.stream_id)

        return publish

    def stream_state(self, stream_id: str, state: str, reason: str) -> None:
        """A stream's state changed (any thread): sinks that publish states are told."""
        for sink in self.sinks.values():
            publish = getattr(sink, "publish_stream_status", None)
            if publish is not None:
                publish(stream_id, state, mask_url(reason))

    def publish_event(self, streams: list[str] | None, event: dict[str, Any]) -> None:
        """An event not made by a frame (the regression watch's), for these streams (None:
        the appliance as a whole), to every sink that sends events (any thread)."""
        for sink in self.sinks.values():
            publish = getattr(sink, "publish_event", None)
            if publish is None:
                continue
            for stream_id in streams if streams is not None else [None]:
                try:
                    publish(stream_id, event)
                except Exception:  # a sink's bug must not stop the watch
                    log.exception("sink %s failed to take a %s event", sink.name, event["type"])

    def check(self, outputs: Sequence[OutputConfig]) -> None:
        """ConfigError unless every output names a running sink (a stream added over the
        API is checked here; the config's streams were checked at load)."""
        problems = [
            f"outputs[{i}].sink: {unknown_sink(o.sink, self.sinks)}"
            for i, o in enumerate(outputs)
            if o.sink not in self.sinks
        ]
        if problems:
            raise ConfigError(problems, "stream")

    def subscribe(self, fn: Subscriber, stream_id: str | None = None) -> Callable[[], None]:
        """Call `fn` on the worker thread with every result (of `stream_id` only, if
        given); it must be quick. Returns the function that removes it."""
        entry = (stream_id, fn)
        with self._lock:
            self._subscribers = (*self._subscribers, entry)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not entry)

        return unsubscribe

    # -- views ---------------------------------------------------------------------------
    def statuses(self) -> list[SinkStatus]:
        """Every sink's status, its last error and details masked once more."""
        return [_masked(sink.status()) for sink in self.sinks.values()]

    def sync_metrics(self) -> None:
        """Sink counters into Prometheus (called by the stats loop and /metrics)."""
        m = self._metrics
        for status in self.statuses():
            m.sink_queue_depth.labels(status.name).set(status.queue_depth)
            m.sink_up.labels(status.name).set(1 if status.up else 0)
            seen = self._reported.setdefault(status.name, {})
            for outcome in ("sent", "retried", "dropped", "dead_lettered"):
                now = int(getattr(status, outcome))
                m.sink_messages.labels(status.name, outcome).inc(max(0, now - seen.get(outcome, 0)))
                seen[outcome] = now


# A secret a sink may read from a file: the file's field, and the field it fills.
_SECRET_FILES = {"password_file": "password", "secret_file": "secret"}


def _with_checked_files(name: str, cfg: BaseModel, files: FilePolicy | None) -> BaseModel:
    """The sink's config with its TLS files checked by the access policy and made
    absolute (relative to the config file, like every path of the config), and a
    `password_file` or `secret_file` read through the policy into `password`, `secret`."""
    commands = getattr(cfg, "commands", None)  # MQTT's commands.secret_file, the same way
    if isinstance(commands, BaseModel):
        read = _with_checked_files(f"{name}.commands", commands, files)
        cfg = cfg.model_copy(update={"commands": read})
    for file_field, value_field in _SECRET_FILES.items():
        secret_file = getattr(cfg, file_field, None)
        if secret_file is None or files is None:
            continue
        where = f"sinks.{name}.{file_field}"
        # One line: the value, without the newline an editor or `echo` adds.
        text = files.read_text(secret_file, FileKind.SECRET, where).strip("\r\n")
        if not text:  # a mount that did not happen: never sign or log in with ""
            raise FileAccessError(FileKind.SECRET, str(secret_file), "empty", where, 422)
        cfg = cfg.model_copy(update={value_field: SecretStr(text), file_field: None})
    tls = getattr(cfg, "tls", None)
    if tls is None or files is None:
        return cfg
    checked = {
        field: files.path(path, FileKind.CERTIFICATE, f"sinks.{name}.tls.{field}")
        for field in ("ca_file", "cert_file", "key_file")
        if (path := getattr(tls, field, None)) is not None
    }
    return cfg.model_copy(update={"tls": tls.model_copy(update=checked)})


def _deliver(fn: Subscriber, result: FrameResult) -> None:
    try:
        fn(result)
    except Exception:  # a broken subscriber must not take down the stream
        log.exception("subscriber %r failed on %s#%d", fn, result.stream_id, result.seq)


def _masked(status: SinkStatus) -> SinkStatus:
    """The status with every string that could hold a credential masked: a sink masks its
    own, and this is the second line for a URL that slipped into an error message."""
    error = None if status.last_error is None else mask_url(status.last_error)
    extra = {k: mask_url(v) if isinstance(v, str) else v for k, v in status.extra.items()}
    return dataclasses.replace(status, last_error=error, extra=extra)
