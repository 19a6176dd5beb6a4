"""The config's `tuning:` applied to a running runtime (appliance tune, a reload): models
change live (ModelPool.retune: batching at once, session options on a session opened
again and swapped in), and only streams whose source settings change restart.
`Runtime.retune` calls it under its control lock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from appliance.config import StreamConfig, TuningConfig
from appliance.sections import SourceTuning

if TYPE_CHECKING:
    from appliance.runtime.runtime import Runtime

log = logging.getLogger("appliance.runtime")


@dataclass
class Retuned:
    """What a retune changed: models tuned live, streams restarted."""

    models: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)


def tuned_stream(cfg: StreamConfig, tuning: SourceTuning) -> StreamConfig:
    """The stream as declared, with the tuning's source settings over its own."""
    update = {k: v for k, v in tuning if v is not None}
    source = cfg.source.model_copy(update=update) if update else cfg.source
    return cfg if source == cfg.source else cfg.model_copy(update={"source": source})


def apply_tuning(rt: Runtime, tuning: TuningConfig) -> Retuned:
    """Make `tuning` the runtime's: every model runs with it, and each stream whose
    source it changes restarts. A model whose session fails to open leaves everything
    as it was, and raises ModelLoadError."""
    old = rt.config.tuning
    rt.config = rt.config.model_copy(update={"tuning": tuning})
    return retune_running(rt, old)


def retune_running(rt: Runtime, old: TuningConfig, skip: frozenset[str] = frozenset()) -> Retuned:
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
        for sid, declared in list(rt.declared_streams.items()):
            before = tuned_stream(declared, old.sources)
            if sid not in skip and before != tuned_stream(declared, tuning.sources):
                rt.restart_stream(sid, declared)
                done.restarted.append(sid)
    if done.models or done.restarted:
        log.info("tuning applied: models %s, streams restarted %s", done.models, done.restarted)
    return done
