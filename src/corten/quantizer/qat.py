"""Quantization-aware training: :func:`prepare_qat` and :func:`convert_qat`.

::

    qat = corten.prepare_qat(model, (x,), target="cortex-m55")   # a GraphModule in train mode
    ... fine-tune qat like any module (optimizer over qat.parameters()) ...
    prog = corten.compile(qat, (x,))                              # converts, then lowers

The module :func:`prepare_qat` returns is PT2E's: the model captured with ``torch.export`` in
training mode, with Corten's quantizer annotations as fake-quantize modules (moving-average
min/max activations, per-channel symmetric weights, BatchNorm folded into the conv weights while
training, as ``prepare_qat_pt2e`` does).  ``corten.compile`` recognises it (:func:`is_qat_module`),
switches it to eval mode on a copy, freezes the observers and converts it with ``convert_pt2e``;
calibration is not needed (the fake-quantizers carry the ranges learnt in training).
"""
from __future__ import annotations

import contextlib
import copy
import warnings

import torch

from corten.errors import UsageError

QAT_META_KEY = "corten_qat"


def _check_inputs(example_inputs) -> tuple[torch.Tensor, ...]:
    from corten.capture import CaptureError

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, tuple) or not example_inputs or \
            not all(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in example_inputs):
        raise CaptureError("prepare_qat: example_inputs must be a non-empty tuple of float32 tensors, "
                           "one per forward() argument")
    return example_inputs


# torchao's conv-BatchNorm QAT rewrites (``_fuse_conv_bn_qat`` in prepare, ``_fold_conv_bn_qat`` in
# convert) trace every pattern variant with ``torch.export`` for each of conv1d, conv2d,
# conv_transpose1d and conv_transpose2d: 112 exports per convert, about a minute for a one-conv
# model.  Two exact shortcuts: a conv function with no node in the graph cannot match, so its
# rewrite is skipped; and a traced pattern depends only on the pattern function (its code and the
# values it closes over) and the example inputs' shapes, so it is traced once per process.
_CONV_OP_NAMES = {"conv1d": ("conv1d",), "conv2d": ("conv2d",), "conv_transpose1d": ("conv_transpose1d",),
                  "conv_transpose2d": ("conv_transpose2d",)}
_PATTERN_CACHE: dict = {}


def _graph_calls(m: torch.fx.GraphModule, conv_fn) -> bool:
    names = _CONV_OP_NAMES.get(getattr(conv_fn, "__name__", ""))
    if names is None:
        return True  # unknown conv function: let torchao look
    for node in m.graph.nodes:
        if node.op == "call_function":
            packet = getattr(node.target, "_overloadpacket", node.target)
            if getattr(packet, "__name__", "") in names:
                return True
    return False


def _pattern_key(pattern, example_inputs, is_cuda, kwargs):
    def value(v):
        if isinstance(v, torch.Tensor):
            return ("tensor", tuple(v.shape), v.dtype)
        return v
    fn = getattr(pattern, "fn", pattern)  # torchao wraps pattern functions in a module
    code = getattr(fn, "__code__", None)
    if code is None:
        raise TypeError("not a plain function: trace it every time")
    cells = tuple(value(c.cell_contents) for c in (getattr(fn, "__closure__", None) or ()))
    return (code, cells, tuple(value(x) for x in example_inputs), is_cuda,
            tuple(sorted((k, value(v)) for k, v in kwargs.items())))


@contextlib.contextmanager
def fast_conv_bn_rewrites():
    from torchao.quantization.pt2e import qat_utils

    saved = {name: getattr(qat_utils, name) for name in
             ("_fuse_conv_bn_qat_helper", "_fold_conv_bn_qat_helper", "_get_aten_graph_module_for_pattern")}

    def only_present(helper):
        def run(m, conv_fn, example_inputs, is_cuda):
            return helper(m, conv_fn, example_inputs, is_cuda) if _graph_calls(m, conv_fn) else m
        return run

    def traced_once(pattern, example_inputs, is_cuda=False, **kwargs):
        try:
            key = _pattern_key(pattern, example_inputs, is_cuda, kwargs)
            hash(key)
        except (TypeError, ValueError):
            return saved["_get_aten_graph_module_for_pattern"](pattern, example_inputs, is_cuda, **kwargs)
        if key not in _PATTERN_CACHE:
            _PATTERN_CACHE[key] = saved["_get_aten_graph_module_for_pattern"](pattern, example_inputs, is_cuda,
                                                                              **kwargs)
        return copy.deepcopy(_PATTERN_CACHE[key])

    qat_utils._fuse_conv_bn_qat_helper = only_present(saved["_fuse_conv_bn_qat_helper"])
    qat_utils._fold_conv_bn_qat_helper = only_present(saved["_fold_conv_bn_qat_helper"])
    qat_utils._get_aten_graph_module_for_pattern = traced_once
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(qat_utils, name, fn)


def prepare_qat(model: torch.nn.Module, example_inputs, target: str = "cortex-m55",
                weights="int8") -> torch.fx.GraphModule:
    """Capture ``model`` for quantization-aware training with Corten's int8 scheme.

    ``weights``: ``"int8"`` (default), ``"int4"`` or ``{module path prefix | nn.Module type: "int8" |
    "int4"}`` - the conv/linear layers given int4 weights train with int4 fake-quantized weights
    ([-7, 7] per channel) and compile to int4 (A8W4) layers.
    Returns a ``GraphModule`` in train mode to fine-tune; compile it with ``corten.compile(qat,
    example_inputs)`` (or convert it yourself with :func:`convert_qat`).  The model may be in train
    or eval mode; BatchNorm layers train (and are folded) as ``prepare_qat_pt2e`` arranges.
    """
    from torchao.quantization.pt2e import allow_exported_model_train_eval, move_exported_model_to_train
    from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e

    from corten.capture import CaptureError, remove_guards_fn
    from corten.quantizer.quantizer import CortenQuantizer
    from corten.targets import get_target

    from corten.quantizer.quantizer import check_weights

    get_target(target)
    if weights == "auto":
        raise UsageError("prepare_qat: weights='auto' chooses layers by their post-training rounding error; "
                         "give the layers to train in int4 (weights='int4' or a dict of module paths / types)")
    weights = check_weights(weights)
    example_inputs = _check_inputs(example_inputs)
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"prepare_qat expects a torch.nn.Module, got {type(model).__name__}")
    if is_qat_module(model):
        raise CaptureError("prepare_qat: this module is already prepared for QAT; fine-tune it, then "
                           "pass it to corten.compile")
    model.train()
    ep = _export_any_batch(model, example_inputs)
    gm = ep.module()
    remove_guards_fn(gm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fast_conv_bn_rewrites():
            prepared = prepare_qat_pt2e(gm, CortenQuantizer(is_qat=True, weights=weights))
    move_exported_model_to_train(prepared)
    allow_exported_model_train_eval(prepared)  # so qat.train() / qat.eval() work as on any module
    prepared.meta[QAT_META_KEY] = {"target": target, "model": type(model).__name__,
                                   "input_shapes": [list(x.shape) for x in example_inputs]}
    return prepared


def _export_any_batch(model: torch.nn.Module, example_inputs: tuple) -> torch.export.ExportedProgram:
    """Export with a dynamic batch dimension (fine-tuning uses mini-batches), or with the example's
    static shapes when the model's code fixes the batch size."""
    from torch.export import Dim

    from corten.capture import CaptureError

    batch = Dim("batch", min=1)
    doubled = tuple(torch.cat([x, x]) if x.dim() else x for x in example_inputs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.export(model, doubled,
                                       dynamic_shapes=tuple({0: batch} if x.dim() else None for x in doubled))
    except Exception:
        pass
    try:
        return torch.export.export(model, example_inputs)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CaptureError(f"torch.export could not capture {type(model).__name__} for QAT: "
                           f"{type(exc).__name__}: {first}") from exc


def is_qat_module(model: object) -> bool:
    """True for a module :func:`prepare_qat` returned."""
    return isinstance(model, torch.fx.GraphModule) and QAT_META_KEY in getattr(model, "meta", {})


def convert_qat(prepared: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The int8 (q/dq) graph of a fine-tuned QAT module; ``prepared`` itself is left as it was
    (it can be trained further and converted again)."""
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    if not is_qat_module(prepared):
        raise UsageError("convert_qat expects the module corten.prepare_qat returned")
    with warnings.catch_warnings():  # torch's own deprecation chatter while copying the graph
        warnings.simplefilter("ignore")
        model = copy.deepcopy(prepared)
        move_exported_model_to_eval(model)
        for m in model.modules():  # the ranges learnt in training are final
            if hasattr(m, "disable_observer"):
                m.disable_observer()
        with fast_conv_bn_rewrites():
            return convert_pt2e(model)
