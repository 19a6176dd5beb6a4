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
| a decoded frame | X | grab | `grab` (holds `read`, `decode`) | stream, seq |
| an ONNX Runtime operator | X | Node | `<node>_kernel_time` | op_name, provider, ... (ORT's own) |
| counters | C | counter | `frame_age_ms:<stream>`, `batch_size:<model>`, ... | value |
| process and thread names | M | - | `process_name`, `thread_name` | name |

Counters `frame_age_ms:<stream>`, `batch_size:<model>` and `queue_depth:<model>`: a name
per stream or model, as viewers draw one track per process and name. Flows:
a frame's `grab` span carries `bind_id` and `flow_out`, its `workflow.run` the same
`bind_id` and `flow_in`; each sample's `queue.wait` starts an "s" (cat flow, name
`sample`) that an "f" (`"bp": "e"`) ends in the `session.run` that served it.
docs/profiling.md shows how Perfetto draws all of it, and what `appliance trace` reads.
"""
