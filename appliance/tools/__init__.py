"""Offline tools over traces and models, run from the CLI, never by the runtime.

`trace_cli` (`appliance trace summarize|diff`) reads traces through `trace_file`;
`fingerprint` summarises one, `regression` (with the rank statistics of `ranktest`)
judges two. `model_cli` (`appliance model bench`) times one model through `model_bench`.
The tools may import the runtime instrumentation (`appliance.profiling`: the trace
format, the ORT profiler twin); it never imports them (tests/test_layers.py checks both).
"""
