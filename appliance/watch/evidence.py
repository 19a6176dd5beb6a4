"""The regression watch's evidence: on a new regression it opens a profiling window itself
(ONNX Runtime's operators too when a model is involved), at most once per stream per
`cooldown_s`, and the regression links it. A regression raised while the watch's own
window still records its streams (a block one interval after its model: their rows can
reach enough samples one interval apart) is linked to that window: it is recording that
regression's evidence, and no second window can open beside it."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from appliance.watch.config import WatchConfig
from appliance.watch.report import Evidence, Regression

log = logging.getLogger("appliance.watch")


class EvidenceWindows:
    """The windows opened so far, for their cooldowns and the one still recording."""

    def __init__(
        self,
        config: WatchConfig,
        open_window: Callable[[float, list[str] | None, bool], str],
        model_streams: Callable[[], dict[str, set[str]]],
    ) -> None:
        self.config = config
        self._open_window = open_window
        self._model_streams = model_streams
        self._at: dict[str, float] = {}  # cooldown key -> monotonic time of its last window
        # The last window opened: its evidence, streams (None: all) and when.
        self._opened: tuple[Evidence, frozenset[str] | None, float] | None = None

    def open(self, raised: list[Regression]) -> tuple[Evidence | None, bool]:
        """One profiling window on the regressions raised together (one runs at a time:
        a window per regression would leave all but the first without), over their
        streams whose last window is older than cooldown_s; None when all are younger,
        or another window runs. True with it when it was opened now."""
        keys: dict[str, list[str] | None] = {}  # cooldown key -> its streams (None: all)
        for r in raised:
            if r.stream is not None:
                keys[r.stream] = [r.stream]
            elif r.model is not None:
                keys[f"model:{r.model}"] = sorted(self._model_streams().get(r.model, set()))
            else:
                keys["host"] = None  # the host: every stream
        now = time.monotonic()
        cooldown = self.config.cooldown_s
        due = {k: v for k, v in keys.items() if now - self._at.get(k, -math.inf) >= cooldown}
        if not due:
            return None, False
        lists = list(due.values())
        streams = None if None in lists else sorted({s for v in lists if v for s in v}) or None
        ort = any(r.model is not None for r in raised)
        evidence, opened = self._recording(streams, ort, now), False
        if evidence is None:
            try:
                window = self._open_window(self.config.evidence_s, streams, ort)
            except Exception as exc:  # another window runs, profiling is off, ...
                log.info("regression watch: no evidence window for %s: %s", sorted(due), exc)
                return None, False
            evidence, opened = Evidence(window, f"/v1/profiling/{window}/trace", ort), True
            covered = None if streams is None else frozenset(streams)
            self._opened = (evidence, covered, now)
        for key in due:
            self._at[key] = now
        return evidence, opened

    def _recording(self, streams: list[str] | None, ort: bool, now: float) -> Evidence | None:
        """The watch's own window when it still records these streams (with ONNX Runtime's
        operators, if `ort`): it opened less than evidence_s ago, so it runs yet."""
        if self._opened is None:
            return None
        evidence, covered, opened = self._opened
        if now - opened >= self.config.evidence_s or (ort and not evidence.ort_operators):
            return None
        if covered is not None and (streams is None or not covered.issuperset(streams)):
            return None
        return evidence
