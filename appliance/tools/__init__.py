"""Offline tools over traces and models, run from the CLI, never by the runtime.

`trace_cli` (`appliance trace summarize|diff|fingerprint`) reads traces through
`trace_file`; `fingerprint` summarises one, `regression` judges two (with the rule the
regression watch judges by, appliance/watch/rule.py), `baseline_file` makes a watch
baseline of one. `model_cli` (`appliance model bench`) times one model through
`model_bench`. The tools may import the runtime (`appliance.profiling`: the trace format,
the ORT profiler twin; `appliance.watch`: its rule and baselines); it never imports them
(tests/test_layers.py checks both).
"""
