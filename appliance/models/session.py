"""ONNX Runtime sessions built from a model's config: providers with fallback, options, info.

`load_model` is called once per model at startup or reload. It opens the session on the
providers the config asks for (TensorRT, CUDA, CPU; CPU is always appended last), and when
the preferred one is not available it says so in exactly one warning, instead of ONNX
Runtime's screens of provider-library errors. It then describes the graph as a
`pipelines.models.ModelInfo`, with class labels from the config or the model's metadata.

`preprocess` (auto, graph, host) decides where a decoder's pixel preprocessing runs: in
the graph, the session opens the model composed with the decoder's `Prologue`
(appliance/models/prologue.py) and takes the decoder's BGR uint8 images; `ModelInfo`
still describes the model file's own input and carries the prologue.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnxruntime as ort

from appliance.models.errors import ModelLoadError, describe_ort_error
from appliance.models.providers import provider_entries
from appliance.models.threads import open_session
from appliance.models.warmup import warm_up
from pipelines.decoders import DecoderError
from pipelines.models import Dim, ModelInfo, TensorInfo
from pipelines.spec import ModelSpec, SessionSpec

if TYPE_CHECKING:  # imported where it is used: it imports onnx (see _in_graph)
    from appliance.models.prologue import Composed

logger = logging.getLogger("appliance.models")

PROVIDERS = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
_INSTALL_HINTS = {
    "tensorrt": "install TensorRT and appliance[cuda]",
    "cuda": "install appliance[cuda]",
}
_DISPLAY_NAMES = {"tensorrt": "TensorRT", "cuda": "CUDA"}
_OPTIMIZATION = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
# ORT type strings whose element name is not already a numpy dtype name.
_DTYPES = {"float": "float32", "double": "float64"}
# ORT log severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal. A missing CUDA or
# TensorRT library is logged at 3 by ORT's default logger, so that one gets 4; sessions
# log at 3. Every error that matters is also raised, and reported by us.
_ORT_ERROR = 3
_ORT_FATAL = 4


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """An open session and what a batcher needs to feed it (the session itself is mutable)."""

    info: ModelInfo
    session: ort.InferenceSession
    input_name: str
    output_names: tuple[str, ...]
    requested_providers: tuple[str, ...]  # ORT names, in order of preference
    # What ONNX Runtime opened: the model file's path, or the composed model (a cached
    # file's path, or its bytes). A twin session (profiling) opens the same.
    source: str | bytes

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def session_input(self) -> TensorInfo:
        """The input the session takes (uint8 [N,H,W,3] when composed; else info.input)."""
        return _tensor_info(self.session.get_inputs()[0])


def load_model(
    model_id: str,
    cfg: ModelSpec,
    resolve: Callable[[Path], Path],
    *,
    read_text: Callable[[Path], str] | None = None,
    cache_dir: Path | None = None,
) -> LoadedModel:
    """Open `cfg.path` (made absolute by `resolve`, e.g. `AppConfig.resolve`) on the
    configured providers. Raises `ModelLoadError` for a missing file, a file that is not
    an ONNX model, a model with more than one input, or `preprocess: graph` that cannot
    be had. `read_text` reads the labels file (the runtime passes its file-access
    policy's reader); `cache_dir` keeps composed models (None: composed in memory)."""
    path = resolve(cfg.path)
    if not path.is_file():
        raise ModelLoadError(f"model {model_id!r}: file not found: {path}")
    # Providers the config names are asked for, and a miss is warned about. The default
    # (GPU first) asks only for those whose libraries load here: a CPU-only machine
    # runs on the CPU without a warning about a GPU nobody asked for.
    explicit = "providers" in cfg.model_fields_set
    asked = cfg.providers if explicit else [n for n in cfg.providers if not provider_problem(n)]
    requested = requested_providers(asked)
    on_gpu = any(n != "cpu" and not provider_problem(n) for n in asked)
    composed = _in_graph(model_id, cfg, path, cache_dir, on_gpu)
    ort.set_default_logger_severity(_ORT_FATAL)  # provider-library errors: we warn once
    session, first_error, composed = _open(model_id, cfg, path, composed, requested)
    obtained = tuple(session.get_providers())
    _report_providers(model_id, (asked or ["cpu"])[0], obtained, first_error, warn=explicit)
    inputs = tuple(_tensor_info(a) for a in session.get_inputs())
    if composed is not None:
        inputs = composed.inputs  # the model file's own: what the decoder checks
    if len(inputs) != 1:
        names = ", ".join(i.name for i in inputs)
        raise ModelLoadError(
            f"model {model_id!r}: {path} has {len(inputs)} inputs ({names}); "
            "only single-input models are supported"
        )
    outputs = tuple(_tensor_info(a) for a in session.get_outputs())
    metadata = dict(session.get_modelmeta().custom_metadata_map)
    info = ModelInfo(
        id=model_id,
        path=str(path),
        inputs=inputs,
        outputs=outputs,
        decoder=cfg.decoder or "",
        labels=_labels(model_id, cfg, resolve, metadata, read_text or _read_text),
        input_size=cfg.input_size,
        metadata=metadata,
        providers=obtained,
        prologue=None if composed is None else composed.prologue,
    )
    feed = session.get_inputs()[0].name
    source = str(path) if composed is None else composed.source
    loaded = LoadedModel(info, session, feed, tuple(o.name for o in outputs), requested, source)
    warmup = cfg.session.warmup
    if warmup is True or (warmup == "auto" and obtained[0] != PROVIDERS["cpu"]):
        warm_up(loaded, cfg)
    return loaded


def _open(
    model_id: str,
    cfg: ModelSpec,
    path: Path,
    composed: Composed | None,
    requested: tuple[str, ...],
) -> tuple[ort.InferenceSession, str | None, Composed | None]:
    """The session of the composed model, else of the file; under `auto`, a composed
    model that ONNX Runtime refuses falls back to the file, with one warning."""
    if composed is None:
        return (*_open_session(model_id, path, str(path), cfg.session, requested), None)
    try:
        return (*_open_session(model_id, path, composed.source, cfg.session, requested), composed)
    except ModelLoadError as exc:
        if cfg.preprocess == "graph":
            raise
        logger.warning("model %r: preprocessing stays on the host: %s", model_id, exc)
    return (*_open_session(model_id, path, str(path), cfg.session, requested), None)


def _in_graph(
    model_id: str, cfg: ModelSpec, path: Path, cache_dir: Path | None, on_gpu: bool
) -> Composed | None:
    """The model composed with its decoder's prologue, or None: preprocessing on the
    host (`preprocess: host`; auto, when the decoder has none, the model does not fit
    it, or the graph does not compose: the last with one warning). `graph` that cannot
    be had is a ModelLoadError saying why."""
    if cfg.preprocess == "host" or (cfg.preprocess == "auto" and not on_gpu):
        # auto on the CPU: host. ONNX Runtime's cast, scale and transpose cost the process
        # more CPU per frame than numpy's (bench/results/data_path.json, the `graph` arm
        # against `today`: faces.graph.c_ratio and fps_ratio).
        return None
    # Imported here: `onnx` takes about 1 s to import (ml_dtypes' extension, seen with
    # python -X importtime), which every CLI command and worker process would pay.
    from appliance.models.prologue import PrologueError, UnreadableModelError, compose_for_decoder

    graph = cfg.preprocess == "graph"
    try:
        composed = compose_for_decoder(model_id, path, cfg.decoder, cfg.input_size, cache_dir)
    except DecoderError as exc:  # the compiler reports it again for the workflow
        if graph:
            reason = str(exc).removeprefix(f"model {model_id!r}: ")
            raise ModelLoadError(f"model {model_id!r}: preprocess 'graph': {reason}") from exc
        return None
    except PrologueError as exc:
        if graph:
            raise ModelLoadError(f"model {model_id!r}: preprocess 'graph': {exc}") from exc
        if isinstance(exc, UnreadableModelError):
            return None  # opening the file reports why, once
        logger.warning("model %r: preprocessing stays on the host: %s", model_id, exc)
        return None
    if composed is None and graph:
        raise ModelLoadError(
            f"model {model_id!r}: preprocess 'graph': "
            + (
                f"decoder {cfg.decoder!r} has no pixel preprocessing to move into the graph"
                if cfg.decoder
                else "the model has no decoder, so no pixel preprocessing to move"
            )
            + "; use 'auto' or 'host'"
        )
    return composed


def requested_providers(names: Sequence[str]) -> tuple[str, ...]:
    """Config provider names → ORT provider names, in the order given, CPU appended."""
    return tuple(dict.fromkeys([*(PROVIDERS[n] for n in names), PROVIDERS["cpu"]]))


@dataclass
class _ProcessDefaults:
    # Intra-op threads of a model that leaves it to us (0): ORT's default (one per core),
    # unless this process is one of `serve --workers N` (share_cores).
    intra_op_threads: int = 0
    # Where the pool's models composed with a preprocessing prologue are cached (None:
    # composed in memory at each load, about 0.1 s for CenterFace). The runtime sets
    # it at startup with `cache_composed_models`.
    model_cache: Path | None = None


# APPLIANCE_ORT_SPINNING=0: no model of the process lets its idle intra-op threads spin,
# whatever its `session.allow_spinning`. For a host shared with other work (a CI runner,
# the test suite's parallel workers): there a spin takes a core another process needs,
# and `allow_spinning: false` gave the same frames for half the CPU below saturation
# (bench/spinning.py; docs/performance.md). Read at each session's creation.
SPINNING_ENV = "APPLIANCE_ORT_SPINNING"


PROCESS = _ProcessDefaults()


def cache_composed_models(folder: Path | None) -> None:
    """Keep the pool's composed models in `folder` (created 0700 on first write)."""
    PROCESS.model_cache = folder


def share_cores(processes: int) -> int:
    """This process is one of `processes` on this machine: models that leave their
    intra-op threads to us get this process's share of the cores (at least 1), not one
    thread per core each. N processes × all cores of threads fight over the cores:
    bench/workers.py (2 cores, 16 cameras) ran 2 workers at 0.73x one process's fps with
    2 threads each, and at 1.14-1.22x with 1. Returns the share."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    PROCESS.intra_op_threads = max(1, (cores or 1) // processes)
    return PROCESS.intra_op_threads


def session_options(cfg: SessionSpec) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.log_severity_level = _ORT_ERROR
    # 0: ORT picks (one per core), or this process's share (share_cores)
    options.intra_op_num_threads = cfg.intra_op_threads or PROCESS.intra_op_threads
    options.inter_op_num_threads = cfg.inter_op_threads
    options.graph_optimization_level = _OPTIMIZATION[cfg.graph_optimization]
    options.enable_cpu_mem_arena = cfg.memory_arena
    # Idle intra-op threads spin for a while before sleeping: lowest latency on a
    # dedicated machine, but the spin steals cores from decoding and other models when
    # the CPU is shared (ORT docs, "Thread management").
    options.add_session_config_entry(
        "session.intra_op.allow_spinning",
        "1" if cfg.allow_spinning and os.environ.get(SPINNING_ENV) != "0" else "0",
    )
    return options


def _open_session(
    model_id: str,
    path: Path,
    source: str | bytes,
    spec: SessionSpec,
    providers: tuple[str, ...],
) -> tuple[ort.InferenceSession, str | None]:
    """Open `source` (the file at `path`, or its composed model), trying the providers,
    dropping the first one each time creation fails (TensorRT raises when its libraries
    are missing; CUDA is dropped silently by ORT itself). A failure with CPU alone is the
    model's fault. Returns the session and the first failure's reason."""
    first_error: str | None = None
    options = session_options(spec)
    for i in range(len(providers)):
        try:
            # enable_fallback=0: ORT's own fallback prints banners to stdout; we do ours.
            session = open_session(
                source,
                options,
                providers=provider_entries(providers[i:], spec),
                enable_fallback=0,
            )
        except Exception as exc:  # ORT's exception types share no base class but Exception
            reason = describe_ort_error(exc)
            if i == len(providers) - 1:
                raise ModelLoadError(
                    f"model {model_id!r}: not a valid ONNX model: {path}: {reason}"
                ) from exc
            first_error = first_error or reason
        else:
            return session, first_error
    raise AssertionError("unreachable: providers always ends with CPU")


def _report_providers(
    model_id: str, asked: str, obtained: tuple[str, ...], error: str | None, *, warn: bool
) -> None:
    """One warning when the preferred provider is missing (`warn`: the config asked for
    it), one info line with the result."""
    if obtained[0] != PROVIDERS[asked] and warn:
        reason = provider_problem(asked) or error or "provider not available"
        hint = _INSTALL_HINTS.get(asked)
        logger.warning(
            "model %r: asked for %s, running on %s (%s%s)",
            model_id,
            asked,
            obtained[0],
            reason,
            f"; {hint}" if hint else "",
        )
    logger.info("model %r: providers %s", model_id, ", ".join(obtained))


@functools.cache  # a library that does not load now will not load later in this process
def provider_problem(name: str) -> str | None:
    """Why a provider's shared library does not load (e.g. "libcublasLt.so.13: cannot open
    shared object file"), found by loading it the way ORT does; None if it loads. (Model
    loading and `appliance doctor` ask.)"""
    if name == "cpu":
        return None
    capi = Path(ort.__file__).parent / "capi"
    library = next(iter(capi.glob(f"*onnxruntime_providers_{name}.*")), None)
    if library is None:
        return f"this onnxruntime build has no {PROVIDERS[name]}"
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        return f"{_DISPLAY_NAMES[name]} libraries not found: {exc}"
    return None


def _tensor_info(arg: Any) -> TensorInfo:
    """An `ort.NodeArg` ("tensor(float)", [None, 3, "h", "w"]) as a TensorInfo."""
    element = str(arg.type).removeprefix("tensor(").removesuffix(")")
    shape: tuple[Dim, ...] = tuple(d if isinstance(d, int | str) else None for d in arg.shape)
    return TensorInfo(name=arg.name, shape=shape, dtype=_DTYPES.get(element, element))


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _labels(
    model_id: str,
    cfg: ModelSpec,
    resolve: Callable[[Path], Path],
    metadata: Mapping[str, str],
    read_text: Callable[[Path], str],
) -> tuple[str, ...]:
    """Config labels, else the labels file, else the model's metadata, else none."""
    if cfg.labels is not None:
        return tuple(cfg.labels)
    if cfg.labels_file is not None:
        path = resolve(cfg.labels_file)
        try:
            text = read_text(path)
        except OSError as exc:
            raise ModelLoadError(
                f"model {model_id!r}: cannot read labels file {path}: {exc.strerror or exc}"
            ) from exc
        return tuple(line.strip() for line in text.splitlines() if line.strip())
    return labels_from_metadata(metadata)


def labels_from_metadata(metadata: Mapping[str, str]) -> tuple[str, ...]:
    """Class names from model metadata: Ultralytics' "names" (a Python dict literal such
    as "{0: 'Normal', 1: 'Fall'}"), else "labels"/"classes" as a JSON list or a comma- or
    newline-separated string."""
    if "names" in metadata:
        try:
            names = ast.literal_eval(metadata["names"])
        except (ValueError, SyntaxError):
            names = None
        if isinstance(names, dict):
            return tuple(str(names[k]) for k in sorted(names))
        if isinstance(names, list | tuple):
            return tuple(str(n) for n in names)
    for key in ("labels", "classes"):
        if key in metadata:
            return _split_labels(metadata[key])
    return ()


def _split_labels(text: str) -> tuple[str, ...]:
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            items = None
        if isinstance(items, list):
            return tuple(str(i) for i in items)
    parts = text.splitlines() if "\n" in text else text.split(",")
    return tuple(p.strip() for p in parts if p.strip())
