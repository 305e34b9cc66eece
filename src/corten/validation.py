"""Checks that run before anything is traced, calibrated or written: bad inputs and bad numbers end
in an error that names the tensor, the module path or node, its source line and what to do,
never in a traceback from deep inside torch or in a silently wrong program.

* :func:`as_input_tuple` - ``example_inputs`` as a tuple (a bare tensor is taken as ``(x,)``);
* :func:`check_example_inputs` - zero-size dimensions, non-finite values;
* :func:`check_samples` - every calibration sample against the example inputs (arity, shape,
  dtype, finiteness) and calibration data that is constant (collapsed ranges);
* :func:`check_exported` - after ``torch.export``: zero-size intermediate tensors, non-finite parameters and buffers, BatchNorm with a negative variance;
* :func:`check_observers` - after calibration: non-finite, huge or collapsed activation ranges, and
  ranges narrower than one step of their int8 grid;
* :func:`table_saturation_warnings` - after calibration: lookup tables whose output range leaves out
  a share of the values they computed (:class:`record_table_batches` counts the batches);
* :func:`explain_calibration_failure` - the first float node giving NaN/Inf on a sample;
* :func:`check_lowered` - after lowering: biases that do not fit int32, requantization multipliers
  that underflow to 0, shifts out of range, int32 accumulators that can overflow.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Iterable

import torch

from corten.errors import CaptureError, QuantizationError, QuantizationWarning, UsageError
from corten.fixed_point import INT32_MAX, INT32_MIN, MAX_ACCUMULATOR_TAPS, SHIFT_MAX, SHIFT_MIN
from corten.fx_nodes import get_attr, node_args

__all__ = ["QuantizationWarning", "as_input_tuple", "check_example_inputs", "check_samples", "check_exported",
           "check_observers", "explain_calibration_failure", "check_lowered", "MAX_ACTIVATION_MAGNITUDE",
           "MAX_ACCUMULATOR_TAPS"]

# Beyond ~2**40 the float32 histogram observer loses the range (measured: a conv whose outputs reach
# 1.5e12 quantizes with cosine 0.9999 against float; 1.7e14 collapses to zero point 127, cosine 0.70).
MAX_ACTIVATION_MAGNITUDE = 2.0**40


# ----------------------------------------------------------------------------- inputs
def as_input_tuple(example_inputs: Any, what: str = "example_inputs") -> tuple:
    """A bare tensor is one input: ``x`` -> ``(x,)``; a list becomes a tuple; anything else that is
    not a tuple is refused with what to pass instead."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, list):
        return tuple(example_inputs)
    if not isinstance(example_inputs, tuple):
        raise CaptureError(f"{what} must be a tuple of float32 tensors (or one tensor), got "
                           f"{type(example_inputs).__name__}; pass (x,) or (x1, x2, ...)")
    return example_inputs


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


def check_example_inputs(example_inputs: tuple) -> None:
    """Tensors, float32, no zero-size dimension, finite values (the batch size and what torch.export
    needs are checked by :func:`corten.capture.capture`)."""
    if not example_inputs:
        raise CaptureError("example_inputs is an empty tuple; pass one float32 tensor per model input")
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise CaptureError(f"example_inputs[{i}] is a {type(x).__name__}, not a tensor; "
                               "pass a tuple of float32 tensors")
        if x.layout != torch.strided:
            raise CaptureError(f"example_inputs[{i}] is a {x.layout} tensor; pass dense tensors (x.to_dense())")
        if x.device.type != "cpu":
            raise CaptureError(f"example_inputs[{i}] is on device {x.device}; Corten captures and calibrates on "
                               "the CPU: pass CPU tensors holding real values (x.cpu())")
        if x.dtype != torch.float32:
            raise CaptureError(f"example_inputs[{i}] has dtype {x.dtype}; Corten quantizes float32 "
                               "models: pass float32 tensors (x.float())")
        if x.numel() == 0 or any(int(d) == 0 for d in x.shape):
            raise CaptureError(f"example_inputs[{i}] has shape {tuple(x.shape)} with a zero-size dimension; "
                               "Corten compiles static shapes with at least one element in every dimension")
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            raise CaptureError(f"example_inputs[{i}] holds {_non_finite_count(x)}; pass finite values")


def _non_finite_count(t: torch.Tensor) -> str:
    nan = int(torch.isnan(t).sum())
    inf = int(torch.isinf(t).sum())
    parts = ([f"{nan} NaN"] if nan else []) + ([f"{inf} Inf"] if inf else [])
    return " and ".join(parts) + f" value(s) (of {t.numel()})"


def check_samples(samples: Iterable, example_inputs: tuple, what: str = "calibration",
                  declared: Iterable[int] = ()) -> list[tuple]:
    """Every sample checked against the example inputs' signature: a tuple (or one tensor for a
    one-input model) of float32 tensors of the example shapes with finite values.  Returns the
    samples as tuples.  Calibration whose values are constant for an input (all zeros, all ones...)
    is refused: every range derived from it collapses (unless its range is ``declared``: the
    indices of ``input_ranges``)."""
    declared = set(declared)
    if isinstance(samples, torch.Tensor):
        raise UsageError(f"{what} is one tensor; pass a list of input tuples, e.g. [(x1,), (x2,)] "
                         "(or None for random samples)")
    try:
        samples = list(samples)
    except TypeError:
        raise UsageError(f"{what} must be an iterable of input tuples, got {type(samples).__name__}") from None
    if not samples:
        raise UsageError(f"{what} is empty: pass at least one input tuple (or None for random samples)")
    n_in = len(example_inputs)
    out = []
    for k, s in enumerate(samples):
        if isinstance(s, torch.Tensor):
            s = (s,)
        elif isinstance(s, list):
            s = tuple(s)
        if not isinstance(s, tuple):
            raise UsageError(f"{what} sample {k} is {_describe(s)}; each sample must be a tuple of "
                             f"{n_in} float32 tensor(s), like example_inputs")
        if len(s) != n_in:
            raise UsageError(f"{what} sample {k} has {len(s)} tensor(s) but the model takes {n_in} input(s) "
                             f"(example_inputs); pass one tensor per input")
        for i, (x, ex) in enumerate(zip(s, example_inputs)):
            where = f"{what} sample {k}, input {i}"
            if not isinstance(x, torch.Tensor):
                raise UsageError(f"{where} is {_describe(x)}, not a tensor")
            if x.dtype != ex.dtype:
                raise UsageError(f"{where} has dtype {x.dtype}; the example input has {ex.dtype} (use .float())")
            if tuple(x.shape) != tuple(ex.shape):
                raise UsageError(f"{where} has shape {tuple(x.shape)}; the example input (the compiled "
                                 f"shape) is {tuple(ex.shape)}")
            if x.is_floating_point() and not bool(torch.isfinite(x).all()):
                raise UsageError(f"{where} holds {_non_finite_count(x)}; calibration data must be finite")
        out.append(s)
    for i in range(n_in):
        xs = [s[i] for s in out]
        # one value in every sample: a one-element input (``torch.tensor([t])``, a broadcast operand) is
        # constant within each sample by nature, but samples that differ calibrate a real range
        if i not in declared and all(bool((x == xs[0].flatten()[0]).all()) for x in xs):
            vals = sorted({float(x.flatten()[0]) for x in xs})
            shown = ", ".join(f"{v:g}" for v in vals[:3]) + (" ..." if len(vals) > 3 else "")
            raise QuantizationError(
                f"{what} data for input {i} is constant in every sample (value(s) {shown}): the int8 ranges "
                "calibrated on it collapse and real inputs would be clipped; pass representative samples "
                "(real data, or calibration=None for random normal samples), or, if you know the values the "
                f"input really takes, declare its range: corten.compile(..., input_ranges={{{i}: (lo, hi)}}) "
                "(an index or the forward argument's name)")
    return out


# ----------------------------------------------------------------------------- after torch.export
def _location(node: torch.fx.Node) -> str:
    from corten.ops._rules import source_location

    return source_location(node)


def module_path(node: torch.fx.Node) -> str | None:
    """The module path (``features.3.conv.0``) and class of the module that created ``node``."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    path, cls = list(stack.values())[-1]
    cls = str(getattr(cls, "__name__", cls)).rsplit(".", 1)[-1]
    return f"module '{path}' ({cls})" if path else f"the top-level module ({cls})"


def _where(node: torch.fx.Node) -> str:
    mod = module_path(node)
    return (f"in {mod} " if mod else "") + f"at {_location(node)}"


def check_exported(ep: torch.export.ExportedProgram, model_name: str) -> None:
    """Zero-size intermediate tensors, non-finite constants, negative BatchNorm variances (the
    outputs' structure and types are checked by ``corten.compiler.check_exported_ops``)."""
    sig = ep.graph_signature
    fqn = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
           **getattr(sig, "inputs_to_lifted_tensor_constants", {})}
    consts = {**ep.state_dict, **ep.constants}
    buffers = set(sig.inputs_to_buffers.values()) | set(getattr(sig, "inputs_to_lifted_tensor_constants", {}).values())
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in fqn:
            name = fqn[node.name]
            t = consts.get(name)
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()) \
                    and not (name in buffers and _additive_mask(t)):
                raise QuantizationError(
                    f"{_const_label(name)} of {model_name} holds {_non_finite_count(t)}{_used_at(node)}; "
                    "int8 quantization needs finite weights: fix or retrain the model (check the checkpoint "
                    "that was loaded)")
        val = node.meta.get("val")
        if node.op in ("placeholder", "call_function") and isinstance(val, torch.Tensor) and val.numel() == 0:
            raise CaptureError(f"{model_name}: tensor {node.name!r} {_where(node)} has shape "
                               f"{tuple(val.shape)}, with no elements; Corten cannot compile zero-size tensors")
        if node.op == "call_function" and node.target in _BATCH_NORMS:
            _check_batch_norm(node, fqn, consts, model_name)


def check_transformed_constants(gm: torch.fx.GraphModule, model_name: str) -> None:
    """After the ATen passes (before calibration): no constant an op reads holds non-finite values.
    A -inf mask buffer (accepted by :func:`check_exported`) is gone by then where it masks a softmax
    (``masked_fill(mask, -inf)``, an additive ``attn_mask``: a 0/1 ``keep`` constant instead); one
    still read is refused here, naming the op and line (an observer would skip the batches holding it)."""
    for node in gm.graph.nodes:
        if node.op != "get_attr" or not node.users:
            continue
        t = get_attr(gm, node)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            observed = [u for u in node.users if u.op == "call_module"]  # (its observer, then the op)
            used = _used_at(observed[0]) if observed else _used_at(node)
            raise QuantizationError(
                f"constant {node.target!r} of {model_name} holds {_non_finite_count(t)}{used}; an int8 "
                "tensor cannot hold it. A -inf attention mask works as masked_fill(mask, float('-inf')) or an "
                "additive attn_mask of 0 / -inf right before a softmax; elsewhere use a finite value (e.g. -1e4)")


def _additive_mask(t: torch.Tensor) -> bool:
    """A buffer of finite values and -inf: an additive attention mask (``generate_square_subsequent_mask``),
    never a weight; where it reaches an activation other than a masked softmax, the calibration
    check reports the non-finite range by tensor and line."""
    return not bool(torch.isnan(t).any()) and not bool((t == float("inf")).any())


_BATCH_NORMS = {torch.ops.aten.batch_norm.default, torch.ops.aten._native_batch_norm_legit_no_training.default}


def _const_label(fqn: str) -> str:
    module, _, attr = fqn.rpartition(".")
    return f"{attr} of module '{module}'" if module else f"tensor '{fqn}'"


def _used_at(node: torch.fx.Node) -> str:
    for u in node.users:
        loc = _location(u)
        if loc != "<unknown source>":
            return f" (used by {u.name} {_where(u)})"
    return ""


def _check_batch_norm(node: torch.fx.Node, fqn: dict, consts: dict, model_name: str) -> None:
    var_arg = node.args[4] if len(node.args) > 4 else None
    eps = node.args[7] if node.target == torch.ops.aten.batch_norm.default else node.args[6]
    if not isinstance(var_arg, torch.fx.Node) or var_arg.name not in fqn:
        return
    var = consts.get(fqn[var_arg.name])
    if not isinstance(var, torch.Tensor):
        return
    bad = (var + float(eps)) <= 0
    if bool(bad.any()):
        ch = int(bad.nonzero()[0, 0])
        raise QuantizationError(
            f"BatchNorm {fqn[var_arg.name].rpartition('.')[0]!r} of {model_name} at {_location(node)}: "
            f"running_var {float(var[ch]):g} (channel {ch}; {int(bad.sum())} channel(s) with var + eps <= 0): "
            "its output is NaN; running variances must be positive (reset or re-estimate the statistics)")


# ----------------------------------------------------------------------------- calibration
def _observers(prepared: torch.fx.GraphModule):
    """(observer module, the observed fx node, the observer's call node) for each activation observer."""
    from torchao.quantization.pt2e.observer import ObserverBase

    for node in prepared.graph.nodes:
        if node.op != "call_module":
            continue
        mod = prepared.get_submodule(node.target)
        if not isinstance(mod, ObserverBase) or not hasattr(mod, "min_val"):
            continue
        src = node.args[0] if node.args else None
        if not isinstance(src, torch.fx.Node) or src.op == "get_attr":
            continue  # weights: checked as constants
        yield mod, src, node


def _observed_label(src: torch.fx.Node) -> str:
    if src.op == "placeholder":
        return f"model input {src.name!r}"
    return f"tensor {src.name!r} ({getattr(src.target, '__name__', src.target)}) {_where(src)}"


def observed_any(prepared: torch.fx.GraphModule) -> bool:
    """True when at least one activation observer has seen a value (observers start at
    ``min_val = +inf``, ``max_val = -inf``, or empty); a graph without observers counts as observed."""
    seen = None
    for mod, _, _ in _observers(prepared):
        lo, hi = mod.min_val, mod.max_val
        seen = bool(seen)
        if lo.numel() and hi.numel() and float(lo.min()) <= float(hi.max()):
            return True
    return seen is None


def check_observers(prepared: torch.fx.GraphModule, model_name: str) -> None:
    """After calibration: every observed activation range finite, not beyond
    :data:`MAX_ACTIVATION_MAGNITUDE`; a range that stayed a single value gets a warning."""
    collapsed, tiny = [], []
    for mod, src, _ in _observers(prepared):
        lo, hi = mod.min_val, mod.max_val
        if lo.numel() == 0 or hi.numel() == 0:
            continue  # never ran (e.g. a branch the samples did not reach)
        lo_f, hi_f = float(lo.min()), float(hi.max())
        if lo_f > hi_f:  # observers start at +inf / -inf: not observed
            continue
        if not (math.isfinite(lo_f) and math.isfinite(hi_f)):
            raise QuantizationError(
                f"{_observed_label(src)} of {model_name} reached non-finite values [{lo_f:g}, {hi_f:g}] during "
                "calibration (float overflow or NaN); rescale the weights or the inputs so that every "
                "activation stays finite")
        mag = max(abs(lo_f), abs(hi_f))
        if mag > MAX_ACTIVATION_MAGNITUDE:
            raise QuantizationError(
                f"{_observed_label(src)} of {model_name} reaches {mag:.3g} during calibration, beyond the "
                f"{MAX_ACTIVATION_MAGNITUDE:.3g} Corten can calibrate reliably (the float32 histogram loses "
                "the range and the int8 program would be wrong); rescale the weights or inputs (e.g. "
                "normalise them)")
        if lo_f == hi_f and src.op != "placeholder":
            collapsed.append(src)
        elif 0 < hi_f - lo_f < float(getattr(mod, "eps", torch.finfo(torch.float32).eps)):
            tiny.append((src, lo_f, hi_f, float(getattr(mod, "eps", torch.finfo(torch.float32).eps))))
    if tiny:  # the smallest scale an observer gives is eps: the whole range falls within one step
        shown = "; ".join(f"{_observed_label(s)}: [{lo:.3g}, {hi:.3g}]" for s, lo, hi, _ in tiny[:3])
        more = f" and {len(tiny) - 3} more" if len(tiny) > 3 else ""
        warnings.warn(QuantizationWarning(
            f"{model_name}: {len(tiny)} tensor(s) span less than one step of their int8 grid on the calibration "
            f"data (the smallest step is {tiny[0][3]:.3g}): {shown}{more}; every value quantizes to the same level "
            "or two, so the program computes (almost) nothing there. Check the weights (a model at its plain "
            "initialisation: load trained weights) or rescale that layer"), stacklevel=3)
    if collapsed:
        shown = "; ".join(_observed_label(s) for s in collapsed[:3])
        more = f" and {len(collapsed) - 3} more" if len(collapsed) > 3 else ""
        warnings.warn(QuantizationWarning(
            f"{model_name}: {len(collapsed)} tensor(s) held one constant value on every calibration sample "
            f"({shown}{more}); their int8 range is degenerate, so other inputs may be clipped. Calibrate "
            "with representative samples"), stacklevel=3)


# A lookup table saturating on more than this share of the values it reads in calibration does so
# as a rule, not on outliers (a histogram observer clips ~0.01-1% of a tensor's values).
TABLE_SATURATION_SHARE = 0.05


def _tables(prepared: torch.fx.GraphModule):
    """(table op node, input observer, output observer) of every lookup-table op (a ``unary``
    annotation: rsqrt, exp, hardswish, ...) observed on both sides."""
    from corten.ops.registry import annotation_for
    from torchao.quantization.pt2e.observer import ObserverBase

    def observer(n):
        mod = prepared.get_submodule(n.target) if isinstance(n, torch.fx.Node) and n.op == "call_module" else None
        return mod if isinstance(mod, ObserverBase) and hasattr(mod, "min_val") else None

    for node in prepared.graph.nodes:
        ann = annotation_for(node.target) if node.op == "call_function" else None
        if getattr(ann, "kind", None) != "unary" or not node.args:
            continue
        obs_in = observer(node.args[0])
        obs_out = next((m for m in map(observer, node.users) if m is not None), None)
        if obs_in is not None and obs_out is not None:
            yield node, obs_in, obs_out


class record_table_batches:
    """Around calibration: the (min, max) each calibration batch gives every lookup table's input
    observer (a forward hook; two numbers per batch), for :func:`table_saturation_warnings`."""

    def __init__(self, prepared: torch.fx.GraphModule):
        self.prepared, self.batches, self._hooks = prepared, {}, []

    def __enter__(self):
        for node, obs_in, _ in _tables(self.prepared):
            seen = self.batches.setdefault(node, [])

            def hook(m, args, out, seen=seen):
                x = args[0]
                if isinstance(x, torch.Tensor) and x.numel():
                    seen.append((float(x.min()), float(x.max())))
            self._hooks.append(obs_in.register_forward_hook(hook))
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        return False


def _grid(obs) -> tuple[float, int, int, int]:
    scale, zp = (float(v) for v in obs.calculate_qparams())
    return scale, int(zp), int(obs.quant_min), int(obs.quant_max)


def table_saturation_warnings(prepared: torch.fx.GraphModule, model_name: str,
                              batches: dict | None = None) -> None:
    """After calibration: a lookup table maps each input level to an output level; warn when the
    input levels whose function value lies beyond the table's output range (``rsqrt`` of the level
    0 is infinite) hold more than :data:`TABLE_SATURATION_SHARE` of the values the table read in
    calibration - e.g. a single-group GroupNorm, whose one variance per sample falls into the
    lowest level of the rsqrt table's input on a quarter or more of the samples."""
    for node, obs_in, obs_out in _tables(prepared):
        hist = getattr(obs_in, "histogram", None)
        lo_seen, hi_seen = float(obs_in.min_val.min()), float(obs_in.max_val.max())
        if not isinstance(hist, torch.Tensor) or float(hist.sum()) <= 0 or not hi_seen > lo_seen \
                or not (math.isfinite(lo_seen) and math.isfinite(hi_seen)):
            continue
        s_in, z_in, qmin, qmax = _grid(obs_in)
        s_out, z_out, omin, omax = _grid(obs_out)
        levels = torch.arange(qmin, qmax + 1, dtype=torch.float64)
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                y = node.target(((levels - z_in) * s_in).float(), *node.args[1:], **node.kwargs).double()
        except Exception:  # noqa: BLE001 - a table whose function cannot run on the grid: no verdict
            continue
        if tuple(y.shape) != tuple(levels.shape):
            continue  # not elementwise on its own (a reduction annotated alike): no verdict
        lo, hi = s_out * (omin - z_out), s_out * (omax - z_out)
        bad = ~torch.isfinite(y) | (y > hi + s_out / 2) | (y < lo - s_out / 2)
        if not bool(bad.any()):
            continue
        edges = torch.linspace(lo_seen, hi_seen, hist.numel() + 1, dtype=torch.float64)
        q = (((edges[:-1] + edges[1:]) / 2) / s_in).round().add(z_in).clamp(qmin, qmax).long() - qmin
        share = float(hist.double()[bad[q]].sum()) / float(hist.sum())
        if share <= TABLE_SATURATION_SHARE:
            continue

        def saturates(v: float) -> bool:
            return bool(bad[int(min(max(round(v / s_in) + z_in, qmin), qmax)) - qmin])
        seen = (batches or {}).get(node, [])
        hit = sum(1 for a, b in seen if saturates(a) or saturates(b))
        per = f" on {hit} of {len(seen)} calibration batches" if seen else ""
        warnings.warn(QuantizationWarning(
            f"{model_name}: the lookup table of {_observed_label(node)} saturates{per} ({100 * share:.0f}% of "
            f"the values it read): its input levels {_levels(bad, qmin)} give values beyond its output range "
            f"[{lo:.4g}, {hi:.4g}]. Use observer='minmax', or change the layer so its input stays clear of them "
            "(e.g. GroupNorm with more than one group, a larger eps)"), stacklevel=3)


def _levels(bad: torch.Tensor, qmin: int) -> str:
    idx = [int(i) + qmin for i in torch.nonzero(bad).flatten()]
    return ", ".join(map(str, idx[:4])) + (f" ... ({len(idx)} levels)" if len(idx) > 4 else "")


def explain_calibration_failure(gm: torch.fx.GraphModule, sample: tuple, index: int, model_name: str,
                                exc: BaseException) -> Exception:
    """The error to raise when calibration raised ``exc`` on ``sample``: the first float node of the
    captured module ``gm`` that gives NaN/Inf, or a generic message naming the sample."""
    env_bad = None

    class _Finder(torch.fx.Interpreter):
        def run_node(self, n):
            nonlocal env_bad
            out = super().run_node(n)
            if env_bad is None and n.op == "call_function" and isinstance(out, torch.Tensor) \
                    and out.is_floating_point() and not bool(torch.isfinite(out).all()):
                env_bad = (n, out)
            return out

    try:
        with torch.no_grad():
            _Finder(gm).run(*sample)
    except Exception:  # noqa: BLE001 - the original error is reported below
        pass
    if env_bad is not None:
        n, out = env_bad
        return QuantizationError(
            f"calibration sample {index}: {_observed_label(n)} of {model_name} gives {_non_finite_count(out)} "
            "in float; the int8 ranges cannot be calibrated. Rescale the weights or inputs so that every "
            "activation stays finite")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return QuantizationError(f"calibration of {model_name} failed on sample {index}: {type(exc).__name__}: {first}")


# ----------------------------------------------------------------------------- after lowering
def _tensor_arg(gm: torch.fx.GraphModule, a) -> torch.Tensor | None:
    return get_attr(gm, a) if isinstance(a, torch.fx.Node) and a.op == "get_attr" else None


def check_lowered(gm: torch.fx.GraphModule, model_name: str) -> None:
    """Numeric guards on the lowered graph's constants (see the module docstring)."""
    from corten.ops.registry import accumulator_taps, op_name_of, unused_args

    underflows = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        op = op_name_of(node.target)
        if op is None or not hasattr(node.target, "_schema"):
            continue
        args = node_args(node)
        where = f"{op} node {node.meta.get('corten_source', node.name)!r} of {model_name} {_where(node)}"
        bias = _tensor_arg(gm, args.get("bias"))
        if bias is not None and bias.dtype == torch.int32 and bias.numel():
            b = bias.to(torch.int64)
            if bool(((b <= INT32_MIN + 1) | (b >= INT32_MAX)).any()):
                raise QuantizationError(
                    f"{where}: the bias does not fit int32 once divided by input_scale * weight_scale (it "
                    "saturates, so the int8 output would be wrong); the bias is far larger than what the "
                    "weights contribute: rescale the layer (smaller bias or larger weights) or fold the "
                    "constant offset out of the model")
        unused = unused_args(node)
        for name, v in args.items():
            if name in unused:
                continue
            if name.endswith("multiplier"):
                t = _tensor_arg(gm, v)
                values = t.flatten().tolist() if t is not None else ([v] if isinstance(v, int) else [])
                if any(int(m) == 0 for m in values):
                    underflows.append(f"{where} ({name})")
            if name.endswith("shift") and name != "left_shift":
                t = _tensor_arg(gm, v)
                values = t.flatten().tolist() if t is not None else ([v] if isinstance(v, int) else [])
                bad = [int(s) for s in values if not SHIFT_MIN <= int(s) <= SHIFT_MAX]
                if bad:
                    raise QuantizationError(f"{where}: requantization shift {bad[0]} ({name}) is outside "
                                            f"[{SHIFT_MIN}, {SHIFT_MAX}]; rescale the layer")
        taps = accumulator_taps(node)
        if taps is not None and taps > MAX_ACCUMULATOR_TAPS:
            raise QuantizationError(
                f"{where}: each output sums {taps:,} int8 products, more than the {MAX_ACCUMULATOR_TAPS:,} that "
                "always fit an int32 accumulator (it could overflow); split the layer (fewer input channels "
                "or a smaller kernel)")
    if underflows:
        warnings.warn(QuantizationWarning(
            f"{model_name}: {len(underflows)} requantization multiplier(s) underflow to 0 (scale ratio below "
            f"2**-32), so what they scale contributes nothing to the int8 output: {underflows[0]}"
            + (f" and {len(underflows) - 1} more" if len(underflows) > 1 else "") + ". The program computes "
            "this correctly rounded, but the layer's output range is vastly larger than what its inputs "
            "produce (e.g. tiny weights or a huge bias): check the model or the calibration data"), stacklevel=3)
