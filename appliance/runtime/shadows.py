"""The runtime's shadows: at most one per stream, started and stopped over the API.

A shadow's workflow is read through the API's file policy and compiled like a stream's
(the same checks and limits, its models loaded or shared through the pool), and leased
until the shadow stops. A shadow belongs to the running stream: removing, restarting or
reloading the stream ends it (its final report is then gone with it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from appliance.errors import NoShadowError, ShadowExistsError
from appliance.policy.files import FilePolicy
from appliance.runtime.running import RunningStreams
from appliance.runtime.shadow import Shadow, ShadowSpec
from appliance.runtime.workflows import WorkflowRef
from pipelines.executor import CompiledWorkflow


class Compile(Protocol):
    def __call__(
        self, workflow: WorkflowRef, where: str, files: FilePolicy
    ) -> CompiledWorkflow: ...


class Shadows:
    """Stream id -> its shadow; `start` and `stop` take the runtime's change lock."""

    def __init__(
        self,
        streams: RunningStreams,
        compile_workflow: Compile,
        release: Callable[[CompiledWorkflow], None],
        files: Callable[[], FilePolicy],
    ) -> None:
        self._streams = streams
        self._find = streams.find  # UnknownStreamError when no stream runs with that id
        self._compile = compile_workflow
        self._release = release
        self._files = files  # the API's file policy, as it is now (a reload replaces it)
        # The runtime's one-change-at-a-time lock (appliance/runtime/control.py), set by
        # the runtime: a shadow's compile does not race a reload.
        self.control: threading.RLock | threading.Lock = threading.Lock()
        self._shadows: dict[str, Shadow] = {}
        self._lock = threading.Lock()

    def start(self, stream_id: str, spec: ShadowSpec) -> Shadow:
        """Compile the candidate and start it beside the stream's live workflow."""
        with self.control:
            stream = self._find(stream_id)
            if stream_id in self._shadows:
                raise ShadowExistsError(stream_id)
            where = f"stream {stream_id!r} shadow"
            workflow = self._compile(spec.workflow, f"{where}.workflow", self._files())
            shadow = Shadow(stream_id, spec, workflow, on_stopped=self._stopped)
            with self._lock:
                self._shadows[stream_id] = shadow
            shadow.start()
            stream.shadow = shadow  # the live worker offers from its next frame on
            stream.on_stop(shadow.stop)
            return shadow

    def find(self, stream_id: str) -> Shadow:
        """The stream's shadow: UnknownStreamError without the stream, NoShadowError
        without a shadow."""
        self._find(stream_id)
        with self._lock:
            shadow = self._shadows.get(stream_id)
        if shadow is None:
            raise NoShadowError(stream_id)
        return shadow

    def stop(self, stream_id: str, timeout: float = 3.0) -> Shadow:
        """Stop the stream's shadow: the stopped shadow, for its final report."""
        with self.control:
            shadow = self.find(stream_id)
            stream = self._streams.get(stream_id)
            if stream is not None and stream.shadow is shadow:
                stream.shadow = None
            shadow.stop(timeout)
            return shadow

    def running(self) -> list[Shadow]:
        """Every shadow now, for the metrics (a snapshot: they start and stop meanwhile)."""
        with self._lock:
            return list(self._shadows.values())

    def _stopped(self, shadow: Shadow) -> None:
        """A shadow ended (stopped here, or with its stream): its lease goes."""
        with self._lock:
            if self._shadows.get(shadow.stream_id) is shadow:
                del self._shadows[shadow.stream_id]
        self._release(shadow.workflow)
