"""Execution providers with their options, from a model's `session:` settings.

ONNX Runtime takes each provider as a name or as (name, options). TensorRT's and CUDA's
options come from `models.<id>.session.tensorrt` / `.cuda`; the CPU provider has none.
The option names are ONNX Runtime's own (docs: execution-providers/TensorRT-ExecutionProvider
"Configurations", CUDA-ExecutionProvider "Configuration Options"); every value is passed as
a string, which is how the Python API hands them over anyway.

`resolve_session_paths` checks the settings once, when a model is declared: options for a
provider the model does not ask for, CUDA graphs on an input whose size changes, INT8 on
a model with nothing quantized, and the engine cache folder against the file policy. Each
refusal names its config key.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from appliance.models.errors import ModelLoadError
from pipelines.models import Dim
from pipelines.spec import ModelSpec, SessionSpec

if TYPE_CHECKING:  # appliance.policy.files imports the config, which imports this package
    from appliance.policy.files import FilePolicy

ProviderEntry = str | tuple[str, dict[str, Any]]

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
_MIB = 1 << 20  # trt_max_workspace_size is in bytes; the config says MB
# Nodes that make a model explicitly quantized: TensorRT takes INT8 scales from them
# instead of a calibration table (TensorRT docs, "Explicit Quantization").
_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})


def user_cache_dir() -> Path:
    """The appliance's folder in the user's cache ($XDG_CACHE_HOME, else ~/.cache): what
    can be rebuilt (TensorRT engines, composed models), kept across restarts."""
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".cache") / "appliance"


def default_engine_cache() -> Path:
    """Where TensorRT engines go when `session.tensorrt.engine_cache` is not set: the
    user's cache folder, not the model's folder, which may be read-only. ORT names each
    engine by the model's hash, its input shapes and the GPU, so models share it safely."""
    return user_cache_dir() / "tensorrt"


def provider_entries(names: Sequence[str], session: SessionSpec) -> list[ProviderEntry]:
    """ORT provider names (as `requested_providers` gives them) with their options."""
    entries: list[ProviderEntry] = []
    for name in names:
        if name == TENSORRT:
            entries.append((name, tensorrt_options(session)))
        elif name == CUDA:
            entries.append((name, cuda_options(session)))
        else:
            entries.append(name)
    return entries


def tensorrt_options(session: SessionSpec) -> dict[str, Any]:
    """The TensorRT provider's options. Engines and the timing cache are always kept: a
    restart would otherwise rebuild every engine (minutes for a large model)."""
    trt = session.tensorrt
    cache = str(trt.engine_cache or default_engine_cache())
    options: dict[str, Any] = {
        "device_id": str(session.cuda.device_id),  # the same GPU as its CUDA fallback
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": cache,
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": cache,
        "trt_fp16_enable": _flag(trt.fp16),
        "trt_int8_enable": _flag(trt.int8),
    }
    if trt.workspace_mb is not None:  # None: TensorRT's default (the GPU's memory)
        options["trt_max_workspace_size"] = str(trt.workspace_mb * _MIB)
    return options


def cuda_options(session: SessionSpec) -> dict[str, Any]:
    """The CUDA provider's options."""
    cuda = session.cuda
    return {"device_id": str(cuda.device_id), "enable_cuda_graph": _flag(cuda.graphs)}


def _flag(value: bool) -> str:
    return "1" if value else "0"


def resolve_session_paths(spec: ModelSpec, files: FilePolicy, where: str) -> ModelSpec:
    """The spec with its engine cache folder absolute and allowed by `files`, once its
    session settings are found consistent. `where` is the model's config key
    (`models.<id>`); `spec.path` should already be the checked, absolute model path.

    ModelLoadError naming the key for settings that cannot work; FileAccessError for a
    folder the policy refuses."""
    problems = session_problems(spec, where)
    if problems:
        raise ModelLoadError("; ".join(problems))
    engine_cache = spec.session.tensorrt.engine_cache
    if engine_cache is None:
        return spec
    folder = _checked_folder(files, engine_cache, f"{where}.session.tensorrt.engine_cache")
    tensorrt = spec.session.tensorrt.model_copy(update={"engine_cache": folder})
    session = spec.session.model_copy(update={"tensorrt": tensorrt})
    return spec.model_copy(update={"session": session})


def session_problems(spec: ModelSpec, where: str) -> list[str]:
    """What in `spec.session` cannot work, each `key: why`; [] when all can."""
    session, key = spec.session, f"{where}.session"
    problems = []
    asks = set(spec.providers)
    if session.tensorrt.model_fields_set and "tensorrt" not in asks:
        problems.append(
            f"{key}.tensorrt: TensorRT options, but `providers` ({', '.join(spec.providers)}) "
            "does not ask for tensorrt; add it or remove the options"
        )
    if session.cuda.model_fields_set and not asks & {"cuda", "tensorrt"}:
        problems.append(
            f"{key}.cuda: CUDA options, but `providers` ({', '.join(spec.providers)}) asks "
            "for neither cuda nor tensorrt; add one or remove the options"
        )
    if session.cuda.graphs or session.tensorrt.int8:
        problems += _graph_problems(spec, key)
    return problems


def _graph_problems(spec: ModelSpec, key: str) -> list[str]:
    """The checks that read the model's graph (only when graphs or int8 ask for them)."""
    import onnx

    from appliance.models.prologue import describe_graph  # imports onnx: only here

    try:
        model = onnx.load(str(spec.path), load_external_data=False)
    except Exception as exc:  # OSError, protobuf's DecodeError: said, not swallowed
        return [f"{key}: cannot read the model's graph to check these options: {exc}"]
    problems = []
    inputs, _ = describe_graph(model)
    if spec.session.cuda.graphs and inputs:
        problems += _cuda_graph_problems(spec, inputs[0].shape, key)
    if spec.session.tensorrt.int8 and not any(n.op_type in _QDQ for n in model.graph.node):
        problems.append(
            f"{key}.tensorrt.int8: the model has no QuantizeLinear/DequantizeLinear nodes, "
            "and INT8 needs them here (no calibration table is configured): quantize the "
            "model (onnxruntime.quantization, QDQ format) or set int8: false"
        )
    return problems


def _cuda_graph_problems(spec: ModelSpec, dims: tuple[Dim, ...], key: str) -> list[str]:
    """CUDA graphs replay one captured run, so every input dim must stay the same."""
    problems = []
    if not all(isinstance(d, int) for d in dims[1:]) and spec.input_size is None:
        problems.append(
            f"{key}.cuda.graphs: the model's input size is not fixed ({_shape(dims)}) and "
            "no input_size is configured; CUDA graphs need fixed shapes: set input_size "
            "or graphs: false"
        )
    if not isinstance(dims[0], int) and spec.batching.max_batch_size > 1:
        problems.append(
            f"{key}.cuda.graphs: batches of 1 to {spec.batching.max_batch_size} change "
            "the input's batch dim, and a CUDA graph replays one shape: set "
            "batching.max_batch_size: 1 or graphs: false"
        )
    return problems


def _shape(dims: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else "?" for d in dims) + "]"


def _checked_folder(files: FilePolicy, name: Path, where: str) -> Path:
    """A folder the appliance writes into, checked like any path the config names: under
    the file roots for a request; not a file. It may not exist yet (ORT creates it)."""
    from appliance.policy.files import FileKind

    # Engines are built from, and belong with, the model: the model's rules.
    return files.folder(name, FileKind.MODEL, where)
