"""A decoder's `Prologue` composed into its model's ONNX graph, and the composed file cached.

The composed model takes BGR uint8 [N,H,W,3] images (the decoder's geometry output) under
a new input name; a few nodes turn them into the original input, whose name becomes an
inner tensor, so the original graph, its outputs and its metadata are untouched:

    image (uint8 NHWC BGR) -> [zero pad H, W up to a multiple] -> [Gather C: BGR -> RGB]
      -> [Transpose to NCHW] -> Cast -> [Mul scale] -> [Add offset] -> [Cast] -> original

Every node exists since opset 9 with these semantics (ConstantOfShape is the youngest),
so the model keeps its own opset and IR version. Channel reversal and padding run on
uint8, before the cast: a quarter of the bytes of float32. Cast then Mul then Add is
what numpy does on the host path, so the two agree bit for bit (tests/models/test_prologue.py).

A composed model is cached as `<cache_dir>/<stem>-<key>.onnx`, the key hashing the model
file's sha256, the prologue and COMPOSER_VERSION: a changed model, prologue or composer
gets a new file. Files are written atomically (temporary file, then rename) with mode
0600; a cached file that does not parse as a composed model is rebuilt, and a cache that
cannot be written leaves the model composed in memory, with a warning.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from onnx import TensorProto, helper, numpy_helper

from appliance.atomic import write_atomic
from pipelines.decoders import decoder_prologue
from pipelines.decoders.prologue import Prologue
from pipelines.models import Dim, ModelInfo, TensorInfo

logger = logging.getLogger("appliance.models")

COMPOSER_VERSION = 1  # bump when compose() builds a different graph for the same inputs
MIN_OPSET = 9  # ConstantOfShape (padding) and Cast with `to` as an int
_DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "uint8": TensorProto.UINT8}


class PrologueError(Exception):
    """The model's graph is not one a prologue can be composed with; the message says why."""


class UnreadableModelError(PrologueError):
    """The file cannot be read or is no ONNX model: opening it says so in its own words."""


def describe_graph(model: onnx.ModelProto) -> tuple[tuple[TensorInfo, ...], tuple[TensorInfo, ...]]:
    """The graph's inputs (initializers excluded, as ONNX Runtime lists them) and outputs."""
    weights = {i.name for i in model.graph.initializer}
    inputs = tuple(_tensor_info(v) for v in model.graph.input if v.name not in weights)
    return inputs, tuple(_tensor_info(v) for v in model.graph.output)


def compose(model: onnx.ModelProto, prologue: Prologue) -> onnx.ModelProto:
    """A copy of `model` whose single image input is fed through `prologue`."""
    opset = _default_opset(model)
    if opset < MIN_OPSET:
        raise PrologueError(f"the model's opset {opset} is older than {MIN_OPSET}")
    original = _single_input(model, prologue)
    taken = _names(model)
    prefix = _unique("prologue", taken)
    image = _unique("image_bgr_uint8", taken)
    nodes = _Nodes(prefix, image)
    if prologue.pad_multiple > 1:
        nodes.pad(prologue.pad_multiple)
    if prologue.reverse_channels:
        nodes.add("Gather", [nodes.const("bgr", np.array([2, 1, 0], np.int64))], axis=3)
    if prologue.layout == "NCHW":
        nodes.add("Transpose", [], perm=[0, 3, 1, 2])
    if prologue.dtype != "uint8":
        _affine(nodes, prologue)
    nodes.rename_last(original.name)
    composed = onnx.ModelProto()
    composed.CopyFrom(model)
    graph = composed.graph
    graph.input.remove(next(v for v in graph.input if v.name == original.name))
    graph.input.insert(0, _image_input(image, original, prologue))
    for node in reversed(nodes.nodes):
        graph.node.insert(0, node)
    try:
        onnx.checker.check_model(composed)
    except onnx.checker.ValidationError as exc:
        raise PrologueError(f"the composed graph does not check: {exc}") from exc
    return composed


def composed_source(
    data: bytes, model: onnx.ModelProto, prologue: Prologue, name: str, cache_dir: Path | None
) -> str | bytes:
    """What ONNX Runtime opens for `model` (whose file holds `data`) with `prologue`: the
    cached composed file's path, or the composed bytes when there is no cache (None) or
    it cannot be written. Raises PrologueError when the graph does not compose."""
    if cache_dir is None:
        return _serialized(compose(model, prologue))
    path = cache_dir / f"{Path(name).stem}-{cache_key(data, prologue)}.onnx"
    if _usable(path, model):
        return str(path)
    blob = _serialized(compose(model, prologue))
    try:
        write_atomic(path, blob)
    except OSError as exc:
        logger.warning("model cache %s: cannot write (%s); composed in memory", path, exc)
        return blob
    return str(path)


def _serialized(model: onnx.ModelProto) -> bytes:
    blob: bytes = model.SerializeToString()
    return blob


def cache_key(data: bytes, prologue: Prologue) -> str:
    """24 hex digits of sha256(model sha256, prologue, composer version)."""
    model_sha = hashlib.sha256(data).hexdigest()
    return hashlib.sha256(f"{model_sha}|{prologue!r}|{COMPOSER_VERSION}".encode()).hexdigest()[:24]


class _Nodes:
    """The prologue's nodes as a chain: each `add` takes the previous output first."""

    def __init__(self, prefix: str, source: str) -> None:
        self.prefix = prefix
        self.last = source
        self.nodes: list[onnx.NodeProto] = []

    def name(self, label: str) -> str:
        return f"{self.prefix}/{label}_{len(self.nodes)}"

    def const(self, label: str, value: npt.NDArray[Any]) -> str:
        out = self.name(label)
        tensor = numpy_helper.from_array(value, out)
        self.nodes.append(helper.make_node("Constant", [], [out], out, value=tensor))
        return out

    def op(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], out, **attrs))
        return out

    def add(self, op_type: str, extra: list[str], **attrs: Any) -> None:
        self.last = self.op(op_type, [self.last, *extra], **attrs)

    def rename_last(self, name: str) -> None:
        self.nodes[-1].output[0] = name

    def pad(self, multiple: int) -> None:
        """Zero rows, then columns, concatenated bottom/right up to `multiple` (uint8 NHWC;
        a zero-sized block where the side fits already)."""
        for axis in (1, 2):
            shape = self.op("Shape", [self.last])
            side = self.op("Gather", [shape, self.const("axis", np.array([axis], np.int64))])
            step = self.const("multiple", np.array([multiple], np.int64))
            # ceil(side / m) * m - side with integer ops: ((side + m - 1) / m) * m - side
            up = self.op("Add", [side, self.const("m_1", np.array([multiple - 1], np.int64))])
            padded = self.op("Mul", [self.op("Div", [up, step]), step])
            extra = self.op("Sub", [padded, side])
            dims = [self._dim(shape, i) if i != axis else extra for i in range(4)]
            block = self.op(
                "ConstantOfShape",
                [self.op("Concat", dims, axis=0)],
                value=numpy_helper.from_array(np.zeros(1, np.uint8)),
            )
            self.add("Concat", [block], axis=axis)

    def _dim(self, shape: str, index: int) -> str:
        return self.op("Gather", [shape, self.const("axis", np.array([index], np.int64))])


def _affine(nodes: _Nodes, prologue: Prologue) -> None:
    """Cast to float32, multiply, add, cast to the model's dtype: the host's float32 maths."""
    nodes.add("Cast", [], to=TensorProto.FLOAT)
    shape = (1, 3, 1, 1) if prologue.layout == "NCHW" else (1, 1, 1, 3)
    if prologue.scales:
        scale = np.array(prologue.scale, np.float32).reshape(shape)
        nodes.add("Mul", [nodes.const("scale", scale)])
    if prologue.offsets:
        offset = np.array(prologue.offset, np.float32).reshape(shape)
        nodes.add("Add", [nodes.const("offset", offset)])
    if prologue.dtype != "float32":
        nodes.add("Cast", [], to=_DTYPES[prologue.dtype])


def _single_input(model: onnx.ModelProto, prologue: Prologue) -> onnx.ValueInfoProto:
    """The one image input, of the dtype and rank the prologue produces."""
    weights = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in weights]
    if len(inputs) != 1:
        raise PrologueError(f"the model has {len(inputs)} inputs; a prologue needs one")
    tensor = inputs[0].type.tensor_type
    want = _DTYPES[prologue.dtype]
    if tensor.elem_type != want or len(tensor.shape.dim) != 4:
        actual = _tensor_info(inputs[0])
        raise PrologueError(
            f"input {actual.name!r} is {actual.dtype} of rank {len(actual.shape)}; "
            f"the prologue makes {prologue.dtype} of rank 4"
        )
    image: onnx.ValueInfoProto = inputs[0]
    return image


def _image_input(
    name: str, original: onnx.ValueInfoProto, prologue: Prologue
) -> onnx.ValueInfoProto:
    """uint8 [N,H,W,3] with the original's batch, height and width dims as declared (a
    padded side is symbolic: the image is smaller than the padded input)."""
    dims = list(original.type.tensor_type.shape.dim)
    h, w = (dims[2], dims[3]) if prologue.layout == "NCHW" else (dims[1], dims[2])
    value = helper.make_tensor_value_info(name, TensorProto.UINT8, None)
    shape = value.type.tensor_type.shape
    for dim, label in ((dims[0], "batch"), (h, "height"), (w, "width")):
        new = shape.dim.add()
        if label == "batch" or prologue.pad_multiple == 1:
            new.CopyFrom(dim)
        else:
            new.dim_param = f"{name}_{label}"
    shape.dim.add().dim_value = 3
    return value


def _usable(path: Path, model: onnx.ModelProto) -> bool:
    """A cached file that parses as the model with a prologue: one uint8 input, more
    nodes, and the model's outputs, opsets and metadata (a file cut short at a field
    boundary still parses, but loses some of these)."""
    try:
        cached = onnx.load_model_from_string(path.read_bytes())
    except FileNotFoundError:
        return False
    except (OSError, DecodeError) as exc:
        logger.warning("model cache %s: unreadable (%s); composing it again", path, exc)
        return False
    inputs, outputs = describe_graph(cached)
    if (
        len(inputs) == 1
        and inputs[0].dtype == "uint8"
        and outputs == describe_graph(model)[1]
        and len(cached.graph.node) > len(model.graph.node)
        and list(cached.opset_import) == list(model.opset_import)
        and list(cached.metadata_props) == list(model.metadata_props)
    ):
        return True
    logger.warning("model cache %s: not the composed model; composing it again", path)
    return False


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _names(model: onnx.ModelProto) -> set[str]:
    graph = model.graph
    names = {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    names |= {i.name for i in graph.initializer}
    names |= {n.name for n in graph.node} | {o for n in graph.node for o in n.output}
    return names


def _unique(base: str, taken: set[str]) -> str:
    name, n = base, 1
    while any(t == name or t.startswith(f"{name}/") for t in taken):
        name, n = f"{base}_{n}", n + 1
    return name


def _tensor_info(value: onnx.ValueInfoProto) -> TensorInfo:
    tensor = value.type.tensor_type
    shape: tuple[Dim, ...] = tuple(
        d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in tensor.shape.dim
    )
    dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else "?"
    return TensorInfo(value.name, shape, dtype)


@dataclass(frozen=True, slots=True)
class Composed:
    """A model composed with its decoder's prologue, ready for ONNX Runtime."""

    source: str | bytes  # the cached file's path, or the model's bytes
    prologue: Prologue
    inputs: tuple[TensorInfo, ...]  # the model file's own inputs, as the decoder checks them


def compose_for_decoder(
    model_id: str,
    path: Path,
    decoder: str | None,
    input_size: tuple[int, int] | None,
    cache_dir: Path | None,
) -> Composed | None:
    """The model at `path` composed with `decoder`'s prologue; None when there is no
    decoder or it has none. DecoderError when the model does not fit the decoder;
    PrologueError when the file does not parse or its graph does not compose."""
    if not decoder:
        return None
    try:
        data = path.read_bytes()
        model = onnx.load_model_from_string(data)
    except OSError as exc:
        raise UnreadableModelError(f"cannot read the model file: {exc.strerror or exc}") from exc
    except DecodeError as exc:
        raise UnreadableModelError(f"the file does not parse as an ONNX model: {exc}") from exc
    if any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer):
        # Its weights live beside the file; a composed copy elsewhere would lose them.
        raise PrologueError("the model keeps its weights in external data files")
    inputs, outputs = describe_graph(model)
    info = ModelInfo(
        id=model_id,
        path=str(path),
        inputs=inputs,
        outputs=outputs,
        decoder=decoder,
        input_size=input_size,
        metadata={p.key: p.value for p in model.metadata_props},
    )
    prologue = decoder_prologue(info)
    if prologue is None:
        return None
    return Composed(composed_source(data, model, prologue, path.name, cache_dir), prologue, inputs)
