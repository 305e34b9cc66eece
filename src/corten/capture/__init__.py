"""Capture an eval-mode nn.Module as an ATen graph with ``torch.export`` (static shapes: the example
inputs' shapes, any batch size, ranks 1 to 5).

* :func:`capture` -> ``torch.export.ExportedProgram`` (the training-IR export: ops such as
  ``aten.conv2d.default``, ``aten.batch_norm.default``, ``aten.linear.default``; parameters are
  lifted to placeholders in ``ep.graph``).
* :func:`capture_module` -> ``torch.fx.GraphModule`` = ``capture(...).module()`` with the
  parameters as ``get_attr`` nodes and torch's ``_guards_fn`` input-guard call removed, the form
  the ATen passes (:mod:`corten.aten_passes`) and the quantizer work on.

What ``capture_module`` graphs look like on torch 2.13 (eval mode, e.g. MobileNetV2):

* parameters / buffers: ``get_attr`` nodes named after the module path (``features.0.0.weight``);
  ``num_batches_tracked`` buffers appear as ``get_attr`` nodes without users;
* conv: ``aten.conv2d.default(x, w, b_or_None, stride, padding[, dilation[, groups]])`` (trailing
  default arguments are omitted), ``aten.conv1d.default``, ``aten.conv_transpose2d.input``;
* BatchNorm: ``aten.batch_norm.default(x, gamma, beta, mean, var, False, momentum, eps, False)``
  (``_native_batch_norm_legit_no_training`` + ``getitem`` only after ``run_decompositions()``);
* ``nn.ReLU6(inplace=True)``: ``aten.hardtanh_.default(x, 0.0, 6.0)`` (in place), residuals
  ``aten.add.Tensor``;
* ``adaptive_avg_pool2d(x, (1, 1))``: ``aten.adaptive_avg_pool2d.default(x, [1, 1])``;
  ``torch.flatten(x, 1)``: ``aten.flatten.using_ints(x, 1)``;
* ``nn.Dropout`` (eval): ``aten.dropout.default(x, p, False)``; ``nn.Linear``: ``aten.linear.default``.

Anything Corten cannot compile is refused up front with a :class:`CaptureError` that says what to
change: a model (or submodule) in training mode, example inputs that are not a tuple of float32
tensors of rank 1 to 5 (a Python scalar input is refused with what to do instead), or
``torch.export`` failing on the model.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from corten.capture.control_flow import unroll_constant_control_flow
from corten.errors import CaptureError

__all__ = ["CaptureError", "capture", "capture_module", "remove_guards_fn", "GUARDS_FN_NAME"]

GUARDS_FN_NAME = "_guards_fn"  # submodule torch.export's .module() adds to check input shapes


def _check_model(model: object) -> None:
    if not isinstance(model, nn.Module):
        raise CaptureError(f"capture expects a torch.nn.Module, got {type(model).__name__}")
    for kind, named in (("parameter", model.named_parameters), ("buffer", model.named_buffers)):
        for name, t in named():
            if t.device.type != "cpu" or t.layout != torch.strided:
                where = f"on device {t.device}" if t.device.type != "cpu" else f"a {t.layout} tensor"
                raise CaptureError(f"{type(model).__name__}: {kind} {name!r} is {where}; Corten reads the "
                                   "weights' values on the CPU: load real weights and call model.cpu() (dense "
                                   "tensors) before compiling")
    training = [name or type(model).__name__ for name, m in model.named_modules() if m.training]
    if training:
        shown = ", ".join(training[:3]) + (f" and {len(training) - 3} more" if len(training) > 3 else "")
        raise CaptureError(
            f"{type(model).__name__} is in training mode ({shown}); call model.eval() before "
            "capturing: Corten compiles inference graphs (BatchNorm running statistics, no dropout)")


def _check_inputs(example_inputs: object) -> None:
    if not isinstance(example_inputs, tuple):
        raise CaptureError(
            f"example_inputs must be a tuple of float32 tensors, got {type(example_inputs).__name__}; "
            "wrap a single tensor as (x,)")
    if not example_inputs:
        raise CaptureError("example_inputs is an empty tuple; pass one float32 tensor per model input")
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            hint = (" (a Python scalar input is not supported: make it a constant of the model - an attribute "
                    "or a default argument - or pass it as a float32 tensor)"
                    if isinstance(x, (bool, int, float)) else "")
            raise CaptureError(f"example_inputs[{i}] is a {type(x).__name__}, not a tensor{hint}; "
                               "pass a tuple of float32 tensors")
        if x.dtype != torch.float32:
            raise CaptureError(f"example_inputs[{i}] has dtype {x.dtype}; Corten quantizes float32 "
                               "models: pass float32 tensors (x.float())")
        if x.dim() == 0:
            raise CaptureError(f"example_inputs[{i}] is a rank 0 tensor (a scalar); Corten takes tensors of "
                               "rank 1 to 5: pass it as shape [1] (x.reshape(1))")
        if x.dim() > 5:
            raise CaptureError(f"example_inputs[{i}] has rank {x.dim()} (shape {tuple(x.shape)}); Corten takes "
                               "tensors of rank 1 to 5: fold dimensions together before the model")
        if any(d == 0 for d in x.shape):
            raise CaptureError(f"example_inputs[{i}] has shape {tuple(x.shape)} with no elements")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def capture(model: nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> torch.export.ExportedProgram:
    """Export ``model`` (eval mode) with ``torch.export.export`` on static-shape inputs.

    Raises :class:`CaptureError` for a model in training mode, inputs that are not a non-empty
    tuple of float32 tensors of rank 1 to 5, or when ``torch.export`` fails (the message names
    the model class and the first line of torch's error; the original is chained as ``__cause__``).
    """
    _check_model(model)
    _check_inputs(example_inputs)
    try:
        with _noop_autocast_regions_vanish(), _causal_mask_hint_from_argument():
            ep = torch.export.export(model, example_inputs)
            if _sets_grad_mode(ep):
                # a forward decorated with @torch.no_grad() (or a `with torch.no_grad():` block) exports as a
                # wrap_with_set_grad_enabled region; exported in no-grad mode the switch is a no-op and the
                # graph is the plain ops (inference graphs never need gradients)
                with torch.no_grad():
                    ep = torch.export.export(model, example_inputs)
    except Exception as exc:  # torch raises many types (UserError, Unsupported, RuntimeError, ...)
        raise CaptureError(
            f"torch.export could not capture {type(model).__name__}: {type(exc).__name__}: "
            f"{_first_line(exc)}. Make forward() traceable (no data-dependent Python control flow, "
            "no unsupported ops) and check it runs on the example inputs") from exc
    unroll_constant_control_flow(ep)  # cond on a constant, loops with a constant trip count
    return ep


def autocast_leaves_float32(device_type: str, dtype, enabled: bool) -> bool:
    """A ``torch.autocast`` region changes nothing in a float32 CPU model when it is disabled, casts
    to float32, or is for another device type (CUDA autocast on CPU tensors)."""
    return not enabled or dtype == torch.float32 or device_type != "cpu"


@contextlib.contextmanager
def _noop_autocast_regions_vanish():
    """While exporting: a ``with torch.autocast(...)`` region that leaves float32 as it is
    (:func:`autocast_leaves_float32`; timm's ``torch.autocast(device_type=..., enabled=False)``
    around a float32 computation) is not recorded, so its ops are plain ops of the graph; a region
    that would compute in bfloat16/float16 stays a ``wrap_with_autocast`` region (refused, naming
    its source line)."""
    cls = torch.amp.autocast_mode.autocast
    enter, exit_ = cls.__enter__, cls.__exit__

    def __enter__(self):
        self._corten_noop = autocast_leaves_float32(self.device, self.fast_dtype, self._enabled)
        return self if self._corten_noop else enter(self)

    def __exit__(self, *exc):
        return None if getattr(self, "_corten_noop", False) else exit_(self, *exc)

    cls.__enter__, cls.__exit__ = __enter__, __exit__
    try:
        yield
    finally:
        cls.__enter__, cls.__exit__ = enter, exit_


@contextlib.contextmanager
def _causal_mask_hint_from_argument():
    """While exporting: ``nn.TransformerEncoder`` / ``TransformerDecoder`` called with a ``mask`` and no
    ``is_causal`` (the PyTorch tutorial's ``generate_square_subsequent_mask`` buffer) compare the mask
    with a causal one to set a fast-path hint, ``bool((mask == causal).all())``, which torch.export
    cannot trace (a data-dependent guard).  The hint is only a hint (torch's own docstring: ``False``
    with a causal mask costs speed, the mask is applied as given), so here it is the ``is_causal``
    argument as the caller gave it and the mask itself is applied."""
    transformer = torch.nn.modules.transformer
    detect = transformer._detect_is_causal_mask

    def from_argument(mask, is_causal=None, size=None):
        return is_causal is True

    transformer._detect_is_causal_mask = from_argument
    try:
        yield
    finally:
        transformer._detect_is_causal_mask = detect


def _sets_grad_mode(ep: torch.export.ExportedProgram) -> bool:
    wrap = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
    return wrap is not None and any(n.op == "call_function" and n.target is wrap for n in ep.graph.nodes)


def remove_guards_fn(gm: torch.fx.GraphModule) -> bool:
    """Remove the input-guard call ``ExportedProgram.module()`` inserts (torch >= 2.9).

    On torch 2.13 it appears right after the placeholders as
    ``%_guards_fn = call_module[target=_guards_fn](args=(*inputs,))`` with no users, backed by a
    ``torch.export._unlift.GuardsFn`` submodule marked impure (so dead-code elimination keeps it).
    It only re-checks input shapes; Corten's graphs are static, so the node and the submodule are
    dropped to leave passes a graph of pure ATen ops.  Returns True when something was removed.
    """
    removed = False
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == GUARDS_FN_NAME:
            if node.users:
                raise CaptureError(f"{GUARDS_FN_NAME} node {node.name} has users {list(node.users)}; "
                                   "cannot remove it")
            gm.graph.erase_node(node)
            removed = True
    if hasattr(gm, GUARDS_FN_NAME):
        delattr(gm, GUARDS_FN_NAME)
        removed = True
    if removed:
        gm.graph.lint()
        gm.recompile()
    return removed


def capture_module(model: nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    """``capture(model, example_inputs).module()`` without the ``_guards_fn`` call.

    Parameters and buffers become ``get_attr`` nodes (e.g. ``features.0.0.weight``).  Calling the
    result takes the same positional inputs as ``model`` and returns the same (pytree) outputs.
    """
    gm = capture(model, example_inputs).module()
    remove_guards_fn(gm)
    return gm
