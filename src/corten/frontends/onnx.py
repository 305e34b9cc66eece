"""A float ``.onnx`` model -> a ``torch.fx.GraphModule`` (``onnx2torch``) that the PyTorch pipeline
compiles like any ``nn.Module`` (capture, quantization with calibration, lowering).

``onnx2torch`` imports ``torchvision`` for two converters only (NonMaxSuppression, RoiAlign);
Corten pins torch and does not install torchvision, so when it is missing a stand-in module is
registered whose use raises: those two ONNX ops are refused, every other converter works.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

import torch

from corten.errors import ModelFileError

FALLBACK_OPSET = 17  # a model onnx2torch cannot convert at its own opset is tried again at this one


def _torchvision_stand_in() -> None:
    try:
        import torchvision  # noqa: F401
        return
    except ImportError:
        pass

    def refused(name):
        def fn(*args, **kwargs):
            raise ModelFileError(f"this ONNX model needs torchvision.ops.{name} (NonMaxSuppression / RoiAlign), "
                                 "which Corten does not compile")
        return fn

    tv = types.ModuleType("torchvision")
    ops = types.ModuleType("torchvision.ops")
    for name in ("roi_align", "nms", "batched_nms", "box_convert"):
        setattr(ops, name, refused(name))
    tv.ops = ops
    sys.modules.setdefault("torchvision", tv)
    sys.modules.setdefault("torchvision.ops", ops)


def _input_shapes(model) -> list[tuple[str, list[int]]]:
    inits = {i.name for i in model.graph.initializer}
    out = []
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        dims = inp.type.tensor_type.shape.dim
        shape = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims]
        elem = inp.type.tensor_type.elem_type
        if elem != 1:  # onnx.TensorProto.FLOAT
            raise ModelFileError(f"ONNX input {inp.name!r} has element type {elem}; Corten compiles float32 inputs")
        out.append((inp.name, shape))
    return out


def inline_constant_identities(model) -> int:
    """Replace each ``Identity`` of an initializer by an initializer of its own (``torch.onnx.export``
    shares equal parameters, e.g. zero biases, through Identity nodes; onnx2torch then no longer sees a
    constant bias and keeps a generic Gemm).  Returns how many were inlined."""
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    keep, n = [], 0
    for node in model.graph.node:
        if node.op_type == "Identity" and len(node.input) == 1 and node.input[0] in inits:
            t = numpy_helper.from_array(numpy_helper.to_array(inits[node.input[0]]), node.output[0])
            model.graph.initializer.append(t)
            inits[t.name] = t
            n += 1
        else:
            keep.append(node)
    if n:
        del model.graph.node[:]
        model.graph.node.extend(keep)
    return n


def onnx_module(path) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """``(module, example_inputs)`` of the ONNX model in ``path``: the converted ``torch.fx`` module in
    eval mode and zeros of its input shapes (a dynamic dimension becomes 1)."""
    path = Path(path)
    try:
        import onnx
    except ImportError as e:  # pragma: no cover - installed by scripts/setup.sh
        raise ModelFileError(f"{path}: reading ONNX needs the 'onnx' and 'onnx2torch' packages "
                             "(pip install onnx && pip install --no-deps onnx2torch)") from e
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    try:
        model = onnx.load(str(path))
    except Exception as e:  # noqa: BLE001 - not a protobuf
        raise ModelFileError(f"{path}: not an ONNX model ({type(e).__name__}: {e})") from e
    shapes = _input_shapes(model)
    inline_constant_identities(model)
    _torchvision_stand_in()
    from onnx2torch import convert

    try:
        try:
            module = convert(model)
        except NotImplementedError:
            # onnx2torch knows each op up to some opset version (AveragePool to 11, ...): newer
            # exports are converted down to opset 17 first when ONNX's version converter can
            from onnx import version_converter

            older = version_converter.convert_version(model, FALLBACK_OPSET)
            module = convert(older)
    except NotImplementedError as e:
        raise ModelFileError(f"{path}: onnx2torch has no converter for an operator of this model: {e}; "
                             "export the model from PyTorch and compile the nn.Module instead") from e
    except Exception as e:  # noqa: BLE001 - a converter failed: say which file
        raise ModelFileError(f"{path}: converting the ONNX graph to torch failed ({type(e).__name__}: {e})") from e
    module.eval()
    return module, tuple(torch.zeros(shape) for _, shape in shapes)
