"""Culprits and victims: which of a comparison's slower rows got slower by their own doing,
and which only waited longer because the process or the host had more to do.

A row's own cost per run is its CPU time (judge.py: a block's on its stream's worker
thread, a model's on every thread of its run, per sample): it grows when the row does
more work, on a slower core or a slower memory system (the probe's share is taken out),
but not while its threads wait for a core. A row whose latency passed the gate while its
own cost did not is contended: a victim. Rows without an own cost (a frame age, a queue
wait) follow the others: slower while any row is contended, or while a change of the
appliance's own load settles, they are victims too. A queue wait is always one: it is the
time a sample waits for its model's runs and the other samples of its batch, so when
the model's runs did not grow it only waited longer for the others (the streams'
arrivals lining up differently with the batches: with a baseline learned in a minute,
four saturated CenterFace streams moved theirs x1.6 with nothing changed), and when
they did, the model is raised.

A block that runs a model holds the model's run in its latency, but not in its own cost
(its thread's CPU less the runs it made inline, which are the model's): it is raised with
its model when the model's own cost grew, and is a victim when the model only waited.
ONNX Runtime threads are attributed to the session that started them
(appliance/models/threads.py), so a model's own cost excludes other sessions' threads;
two models whose threads wait for each other's cores are victims of each other, and the
culprit is named only when one of them grew its own cost.

A change of load (a stream added, removed or restarted, a reload, a tune applied) names
the victims of the next `settle_s` as that change's (`load_changed`), not as contention
with no cause; once settled, their baselines follow the new load (watch.py re-learns
them), unless their own cost changed, which is a regression.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from appliance.watch.judge import Host, Judged
from appliance.watch.report import Change, ContentionEvent, Victim
from appliance.watch.rule import SLOWER
from pipelines.types import iso_utc

OWNLESS = ("queue", "frame age")  # rows with no own cost: they follow the others
KEPT = 50  # events kept for the API


@dataclass
class Contention:
    """The victims of the latest comparison and the events so far."""

    victims: set[str] = field(default_factory=set)
    events: deque[ContentionEvent] = field(default_factory=lambda: deque(maxlen=KEPT))

    def judge(
        self,
        judged: Sequence[Judged],
        load_settling: bool,
        block_model: Callable[[str], str | None] = lambda _name: None,
        after_change: Callable[[str], bool] = lambda _key: False,
        swapped: frozenset[str] = frozenset(),
    ) -> set[str]:
        """This comparison's victims (row keys); their earlier set is what `event`
        compares with. A block whose own model grew its own cost is not a victim: the
        inference it asks for is its work too (its own CPU leaves the model's run out,
        wherever it ran: appliance/models/threads.py). `after_change`: whether a change
        of load came after the row's baseline was learned; a row it slowed within what
        the waits explain (`Judged.excused`) is that change's victim too, so that it is
        named and its baseline follows the new load. `swapped`: blocks that run another
        model than their baseline's (a shadow promoted): their slowdown is their own."""
        grown = {j.name for j in judged if j.kind == "model" and (j.slower or j.grew)}

        def runs_grown_model(j: Judged) -> bool:
            return j.kind == "block" and (block_model(j.name) in grown or j.key in swapped)

        victims = {j.key for j in judged if j.contended and not runs_grown_model(j)}
        victims |= {
            j.key for j in judged if j.excused and not runs_grown_model(j) and after_change(j.key)
        }
        waiting = bool(victims) or load_settling
        victims |= {
            j.key
            for j in judged
            if j.kind in OWNLESS and j.row.verdict == SLOWER and (waiting or j.kind == "queue")
        }
        return victims

    def event(
        self,
        victims: set[str],
        judged: Iterable[Judged],
        culprits: list[str],
        change: Change | None,
        host: Host,
    ) -> ContentionEvent | None:
        """An event when rows became victims at this comparison (None otherwise)."""
        new, self.victims = victims - self.victims, victims
        if not new:
            return None
        rows = [
            Victim(j.key, j.raw_ratio, j.own_ratio)
            for j in sorted(judged, key=lambda j: j.key)
            if j.key in new
        ]
        kind = "load_changed" if change is not None else "contention"
        at = iso_utc(time.time())
        event = ContentionEvent(kind, at, rows, culprits, change, host.wait_ratio, host.probe_ratio)
        self.events.appendleft(event)
        return event
