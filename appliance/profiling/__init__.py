"""Runtime instrumentation: tracer, hooks, rolling Chrome traces, windows, ORT profiles.

The offline tools that read these traces live apart, in `appliance.tools`.

Trace conventions (Chrome Trace Event Format, `{"traceEvents": [...], "displayTimeUnit":
"ms", "otherData": {...}}`, timestamps in microseconds):

| event | ph | cat | name | args |
|---|---|---|---|---|
| a workflow run | X | workflow | `workflow.run` | stream, workflow, seq, age_ms (capture->result) |
| a block run | X | block | the block id | stream, type |
| a sample's wait for its batch | X | queue | `queue.wait` | model, stream |
| a model batch | X | model | `session.run` | model, batch_size, streams |
| a decoded frame | X | grab | `decode` | stream, seq |
| an ONNX Runtime operator | X | Node | `<node>_kernel_time` | op_name, provider, ... (ORT's own) |
| counters | C | counter | `queue_depth`, `batch_size`, `frame_age_ms` | {value} |
| process and thread names | M | - | `process_name`, `thread_name` | name |
"""
