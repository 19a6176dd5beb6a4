"""The decode limit of bench/ceiling.py: the appliance's sources and nothing after them.

    .venv/bin/python bench/_bare_decode.py SPEC_JSON

For every URL of the spec (bench/_reference.py's `Spec`), the appliance's own `Grabber`
with its one-slot `LatestFrame` (the same reader, decoder threads and `pace: fast`
blocking hand-off as a stream of `appliance serve`), and a worker thread that only takes
each frame and counts it: what a stream costs before its workflow runs. No pipeline can
process more frames than this loop decodes. Prints `C MONOTONIC COUNT` lines like
`Counter` and stops when stdin closes.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from appliance.sources import Grabber, StreamState, slot_for
from appliance.sources.config import SourceConfig
from bench._reference import Counter, Spec, die_with_parent, wait_for_stdin_eof

GET_TIMEOUT_S = 0.25  # as a stream's worker (appliance/runtime/streams.py)


def take_frames(slot: object, count: Counter, stop: threading.Event) -> None:
    get = slot.get  # type: ignore[attr-defined]
    while not stop.is_set():
        if get(GET_TIMEOUT_S) is not None:
            count(0, None)


def main(argv: list[str]) -> int:
    die_with_parent()
    spec = Spec.from_json(argv[0])
    count, stop = Counter(), threading.Event()
    grabbers, workers = [], []
    for i, url in enumerate(spec.urls):
        cfg = SourceConfig(url=url, pace="fast", loop=True)
        slot = slot_for(cfg)
        grabbers.append(Grabber(f"s{i}", cfg, slot, _ignore_state, Path))
        workers.append(
            threading.Thread(
                target=take_frames, args=(slot, count, stop), name=f"work:s{i}", daemon=True
            )
        )
    for worker, grabber in zip(workers, grabbers, strict=True):
        worker.start()
        grabber.start()
    wait_for_stdin_eof()
    stop.set()
    for grabber in grabbers:
        grabber.stop(2.0)
    for worker in workers:
        worker.join(2.0)
    return 0


def _ignore_state(state: StreamState, reason: str) -> None:
    if state == StreamState.FAILED:
        print(f"source failed: {reason}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
