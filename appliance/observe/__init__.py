"""What the appliance says about itself: Prometheus metrics (`metrics.py`), per-stream
statistics (`stats.py`, `blocklatency.py`), the newest results (`latest.py`), headless
recording (`recording.py`) and the frozen status snapshots everything outside the runtime
reads (`status.py`). Imported by runtime/ and above; imports none of them.
"""
