"""The config's `tuning:` applied to a running runtime (appliance tune, a reload): models
change live (ModelPool.retune: batching at once, session options on a session opened
again and swapped in), and only streams whose source settings change restart.
`Runtime.retune` calls it under its control lock, with itself as the `Tunable`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from appliance.config import AppConfig, StreamConfig, TuningConfig
from appliance.models.pool import ModelPool
from appliance.runtime.running import RunningStreams, tuned_stream
from appliance.runtime.streams import Stream

log = logging.getLogger("appliance.runtime")


class Tunable(Protocol):
    """What a retune reads and changes of a runtime: its config (the `tuning:` goes in),
    its models, and the streams it restarts on a new source setting."""

    config: AppConfig

    @property
    def pool(self) -> ModelPool: ...

    @property
    def streams(self) -> RunningStreams:
        """The running streams, each also as declared (before `tuning:`)."""
        ...

    def restart_stream(self, stream_id: str, cfg: StreamConfig | None = None) -> Stream: ...


@dataclass
class Retuned:
    """What a retune changed: models tuned live, streams restarted."""

    models: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)


def apply_tuning(rt: Tunable, tuning: TuningConfig) -> Retuned:
    """Make `tuning` the runtime's: every model runs with it, and each stream whose
    source it changes restarts. A model whose session fails to open leaves everything
    as it was, and raises ModelLoadError."""
    old = rt.config.tuning
    rt.config = rt.config.model_copy(update={"tuning": tuning})
    return retune_running(rt, old)


def retune_running(rt: Tunable, old: TuningConfig, skip: frozenset[str] = frozenset()) -> Retuned:
    """The running models and streams, tuned with `old`, moved to the config's `tuning`
    (a reload passes `skip`: the streams it just started on it)."""
    tuning = rt.config.tuning
    try:
        done = Retuned(models=rt.pool.retune(tuning.models))
    except BaseException:
        rt.config = rt.config.model_copy(update={"tuning": old})
        rt.pool.retune(old.models)  # those it changed go back (they opened before)
        raise
    if tuning.sources != old.sources:
        for sid, declared in list(rt.streams.declared.items()):
            before = tuned_stream(declared, old.sources)
            if sid not in skip and before != tuned_stream(declared, tuning.sources):
                rt.restart_stream(sid, declared)
                done.restarted.append(sid)
    if done.models or done.restarted:
        log.info("tuning applied: models %s, streams restarted %s", done.models, done.restarted)
    return done
