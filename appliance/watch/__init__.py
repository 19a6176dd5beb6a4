"""The regression watch: the appliance notices its own slowdowns, tells a block's from the
host's, and records the evidence itself (docs/profiling.md, "Regression watch").

recorder.py samples frames and batches, baseline.py keeps what each row is judged against,
probe.py times the host, judge.py applies trace diff's rule, rows.py turns verdicts into
regressions, watch.py runs it all on one thread, setup.py builds it for a runtime.
"""
