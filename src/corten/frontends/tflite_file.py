"""Reading a ``.tflite`` flatbuffer into plain Python values (the ``tflite`` package's generated
accessors, nothing else): tensors with their shapes, types, quantization and constant data, and
operators with their builtin name and options.  No interpretation happens here; the conversion to
Corten ops is :mod:`corten.frontends.tflite`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from corten.errors import ModelFileError

# TensorType enum -> numpy dtype (the types a quantized model's tensors use)
TENSOR_TYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_, 7: np.int16,
                9: np.int8, 10: np.float64}
TYPE_NAMES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 5: "string", 6: "bool", 7: "int16",
              8: "complex64", 9: "int8", 10: "float64", 17: "int4"}
PADDING = {0: "SAME", 1: "VALID"}
FUSED_ACTIVATIONS = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}


@dataclass
class Tensor:
    index: int
    name: str
    shape: tuple[int, ...]
    type: int  # TensorType enum
    scales: np.ndarray | None = None  # float32, one per channel (or one)
    zero_points: np.ndarray | None = None  # int64
    quantized_dimension: int = 0
    data: np.ndarray | None = None  # constant tensors: the values, shaped

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, f"type {self.type}")

    @property
    def dtype(self):
        return TENSOR_TYPES.get(self.type)

    @property
    def quantized(self) -> bool:
        return self.scales is not None and len(self.scales) > 0

    @property
    def scale(self) -> float:
        """The per-tensor scale (float32 value, as a Python float)."""
        return float(self.scales[0])

    @property
    def zero_point(self) -> int:
        return int(self.zero_points[0]) if self.zero_points is not None and len(self.zero_points) else 0

    def describe(self) -> str:
        return f"{self.name!r} ({self.type_name}{list(self.shape)})"


@dataclass
class Operator:
    index: int
    opcode: str  # the BuiltinOperator name, e.g. "CONV_2D", or "CUSTOM(name)"
    inputs: list[int]  # tensor indices, -1 for an omitted optional input
    outputs: list[int]
    options: dict = field(default_factory=dict)  # the builtin options as {field name: value}


@dataclass
class TfliteModel:
    path: str
    tensors: list[Tensor]
    operators: list[Operator]
    inputs: list[int]
    outputs: list[int]
    version: int = 3
    description: str = ""
    subgraphs: int = 1

    def where(self, op: Operator) -> str:
        """``file.tflite: operator 3 (CONV_2D, inputs 'a', 'w', outputs 'y')`` for messages."""
        ins = ", ".join(repr(self.tensors[i].name) for i in op.inputs if i >= 0)
        outs = ", ".join(repr(self.tensors[i].name) for i in op.outputs)
        return f"{Path(self.path).name}: operator {op.index} ({op.opcode}; inputs {ins}; outputs {outs})"


def _builtin_names() -> dict[int, str]:
    from tflite.BuiltinOperator import BuiltinOperator

    return {v: k for k, v in vars(BuiltinOperator).items() if not k.startswith("_") and isinstance(v, int)}


def _options_class_names() -> dict[int, str]:
    from tflite.BuiltinOptions import BuiltinOptions

    return {v: k for k, v in vars(BuiltinOptions).items() if not k.startswith("_") and isinstance(v, int)}


def _options(op) -> dict:
    """The operator's builtin options table as a dict of its scalar / vector fields."""
    import importlib

    kind = op.BuiltinOptionsType()
    table = op.BuiltinOptions()
    if kind == 0 or table is None:
        return {}
    cls_name = _options_class_names().get(kind)
    if cls_name is None:
        return {}
    cls = getattr(importlib.import_module(f"tflite.{cls_name}"), cls_name)
    opt = cls()
    opt.Init(table.Bytes, table.Pos)
    out = {}
    for attr in dir(cls):
        if attr.startswith("_") or attr in ("Init",) or attr.startswith("GetRootAs") or "BufferHasIdentifier" in attr \
                or attr.endswith("Length") or attr.endswith("IsNone"):
            continue
        fn = getattr(opt, attr)
        if not callable(fn):
            continue
        if hasattr(opt, attr + "AsNumpy"):
            vec = getattr(opt, attr + "AsNumpy")()
            out[attr] = [int(v) for v in vec] if isinstance(vec, np.ndarray) else []
            continue
        if attr.endswith("AsNumpy"):
            continue
        try:
            out[attr] = fn()
        except TypeError:  # an accessor that takes an index
            continue
    return out


def read_tflite(path: str | Path) -> TfliteModel:
    """The model in ``path`` (first subgraph), or :class:`ModelFileError` naming the file."""
    import tflite

    path = Path(path)
    try:
        buf = path.read_bytes()
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read the model file: {e.strerror or e}") from e
    if len(buf) < 8 or buf[4:8] != b"TFL3":
        raise ModelFileError(f"{path}: not a TFLite flatbuffer (no 'TFL3' identifier); pass a .tflite file "
                             "written by the TFLite converter")
    try:
        model = tflite.Model.GetRootAsModel(buf, 0)
        if model.SubgraphsLength() < 1:
            raise ModelFileError(f"{path}: the model has no subgraph")
        g = model.Subgraphs(0)
        names = _builtin_names()
        tensors = []
        for i in range(g.TensorsLength()):
            t = g.Tensors(i)
            shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
            q = t.Quantization()
            scales = zps = None
            qdim = 0
            if q is not None and q.ScaleLength():
                scales = q.ScaleAsNumpy().astype(np.float32)
                zps = q.ZeroPointAsNumpy().astype(np.int64) if q.ZeroPointLength() else np.zeros(len(scales), np.int64)
                qdim = int(q.QuantizedDimension())
            data = None
            b = model.Buffers(t.Buffer()) if t.Buffer() < model.BuffersLength() else None
            if b is not None and b.DataLength():
                raw = b.DataAsNumpy().tobytes()
                dtype = TENSOR_TYPES.get(t.Type())
                if dtype is not None:
                    data = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
            elif b is not None and b.Offset() > 1:  # a buffer stored after the flatbuffer (models > 2 GB)
                dtype = TENSOR_TYPES.get(t.Type())
                if dtype is not None:
                    raw = buf[b.Offset():b.Offset() + b.Size()]
                    data = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
            name = t.Name().decode("utf-8", "replace") if t.Name() else f"tensor{i}"
            tensors.append(Tensor(i, name, shape, int(t.Type()), scales, zps, qdim, data))
        ops = []
        for i in range(g.OperatorsLength()):
            op = g.Operators(i)
            code = model.OperatorCodes(op.OpcodeIndex())
            builtin = max(int(code.BuiltinCode()), int(code.DeprecatedBuiltinCode()))
            opcode = names.get(builtin, f"BUILTIN_{builtin}")
            if opcode == "CUSTOM":
                cname = code.CustomCode()
                opcode = f"CUSTOM({cname.decode() if cname else '?'})"
            ins = [int(v) for v in op.InputsAsNumpy()] if op.InputsLength() else []
            outs = [int(v) for v in op.OutputsAsNumpy()] if op.OutputsLength() else []
            ops.append(Operator(i, opcode, ins, outs, _options(op)))
        inputs = [int(v) for v in g.InputsAsNumpy()] if g.InputsLength() else []
        outputs = [int(v) for v in g.OutputsAsNumpy()] if g.OutputsLength() else []
        desc = model.Description().decode("utf-8", "replace") if model.Description() else ""
        return TfliteModel(str(path), tensors, ops, inputs, outputs, int(model.Version()), desc,
                           int(model.SubgraphsLength()))
    except ModelFileError:
        raise
    except Exception as e:  # noqa: BLE001 - a truncated or corrupt flatbuffer
        raise ModelFileError(f"{path}: cannot parse the TFLite flatbuffer ({type(e).__name__}: {e}); the file "
                             "is truncated or not a TFLite model") from e
