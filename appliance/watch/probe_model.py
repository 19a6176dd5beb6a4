"""The host probe's ONNX work: a small fixed convolutional model, built in memory and run
with ONNX Runtime on the calling thread, so that its thread CPU time is the work's cost.

The streams' models are convolutional networks run by ONNX Runtime's kernels (MLAS), and
those kernels feel a slower core or memory system more than a pure-Python loop does
(issue 41: every model ×1.4 with the loop unmoved). The probe's model is of that kind:
`layers` pairs of a 3×3 Conv (`CHANNELS` in and out, padded, so the shape holds) and a
Relu, on a 1 × `CHANNELS` × `SIDE` × `SIDE` float input; ONNX Runtime fuses each pair as it
does a detector's. Each layer is 2 × 16 × 16 × 9 × 64 × 64 ≈ 9.4 MFLOP, about 0.18 ms of
one core of this machine (docs/profiling.md, "Regression watch").

One run must stay on the calling thread: one intra-op and one inter-op thread (ORT then
starts no pool thread, and runs each kernel on the caller), and no spinning, which would
only matter with a pool. CPU time then does not grow while the thread waits for a core,
but it does with a slower core. Weights and input are drawn from a fixed seed and, with
the output, allocated once and bound to the session once (an IO binding): a run is the
kernels and little else.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

CHANNELS = 16  # the Convs' input and output channels
SIDE = 64  # the input's height and width (pixels)
OPSET = 13  # Conv and Relu as every ONNX Runtime since 1.7 runs them
IR_VERSION = 8  # ONNX 1.10's; onnx's own default can be newer than ORT reads
SEED = 41  # weights and input: the same numbers in every process
_ORT_ERROR = 3  # ORT's log severity: errors only (its warnings go to stderr otherwise)


def probe_graph(layers: int) -> onnx.ModelProto:
    """`layers` × (Conv 3×3 + Relu) on [1, CHANNELS, SIDE, SIDE], checked by onnx."""
    rng = np.random.default_rng(SEED)
    shape = [1, CHANNELS, SIDE, SIDE]
    nodes, weights = [], []
    last = "x"
    for i in range(layers):
        # He's scale, sqrt(2 / fan-in) (fan-in 16 × 9): activations keep their size
        # through the Relus, far from denormals, which would time a slower path.
        w = rng.normal(0.0, (2 / (CHANNELS * 9)) ** 0.5, (CHANNELS, CHANNELS, 3, 3))
        weights.append(numpy_helper.from_array(w.astype(np.float32), f"w{i}"))
        out = "y" if i == layers - 1 else f"relu{i}"
        nodes.append(helper.make_node("Conv", [last, f"w{i}"], [f"conv{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [out]))
        last = out
    graph = helper.make_graph(
        nodes,
        "host_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        weights,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model)  # a bad graph fails here, named, not inside ORT
    return model


class ProbeModel:
    """The probe's session on `providers`, opened and run once (ORT allocates and packs
    its weights on the first run), then `run()` per tick on the caller's thread."""

    def __init__(self, layers: int, providers: Sequence[str]) -> None:
        options = ort.SessionOptions()
        options.log_severity_level = _ORT_ERROR
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        model = probe_graph(layers).SerializeToString()
        self.session = ort.InferenceSession(model, options, providers=list(providers))
        shape = (1, CHANNELS, SIDE, SIDE)
        self._input = np.random.default_rng(SEED).standard_normal(shape).astype(np.float32)
        self._output = np.empty(shape, np.float32)
        self._binding = self.session.io_binding()
        self._binding.bind_cpu_input("x", self._input)
        self._binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(self._output))
        self.run()

    @property
    def providers(self) -> list[str]:
        """The providers ORT gave the session (it may fall back to CPU)."""
        return list(self.session.get_providers())

    def run(self) -> tuple[int, int]:
        """One run: (wall µs, thread CPU µs)."""
        wall, cpu = time.perf_counter(), time.thread_time()
        self.session.run_with_iobinding(self._binding)
        return round((time.perf_counter() - wall) * 1e6), round((time.thread_time() - cpu) * 1e6)
