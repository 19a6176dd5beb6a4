"""`appliance tune`: the best batching and threading for this machine's own cameras and
models, found on the live workload (docs/performance.md, "Tuning").

- space.py: the knobs and their values, bounded by the hardware;
- meter.py: processed fps and frame age over a measuring window;
- objective.py: what "best" means (most fps under a frame-age SLO, or lowest p99);
- search.py: coordinate descent that alternates the best-so-far with each candidate,
  and the exhaustive grid it is measured against;
- target.py: a running runtime as the thing tuned (settings applied through its retune).
"""
