"""The rule API: what a lowering rule sees, one quantized ATen op with its q/dq neighbourhood resolved.

This module sits below the op families (they import it at the top; it never imports a family or
:mod:`corten.lowering`); :mod:`corten.lowering` builds the :class:`Match` objects and calls the
rules the families registered with :func:`corten.ops.registry.lowers`.

In a PT2E-converted graph every int8 tensor is the output of a ``quantize_per_tensor`` node and is
read through ``dequantize_per_tensor`` nodes.  A compute op ``op(dq(x), dq_w(w), ...)`` followed by
an optional fused activation and ``quantize_per_tensor`` becomes one Corten op reading ``x`` (int8)
and replacing that final quantize.  The :class:`Match` hands a rule the int8 inputs with their
qparams, the constant int8 weights and int32 biases, the output qparams and the fused activation,
and lets it add constants and Corten nodes.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node

from corten.errors import LoweringError
from corten.fx_nodes import get_attr, node_arg
from corten.fixed_point import INT8_MAX, INT8_MIN, INT16_MAX, INT16_MIN, round_half_away_t
from corten.ops._qparams import QParams, activation_range
from corten.ops.registry import op as corten_op

aten = torch.ops.aten


class _QDQTargets:
    """The ``quantized_decomposed`` q/dq overloads PT2E's convert emits, resolved on first use (the
    namespace is registered on first use, keeping ``import corten`` light)."""

    def __init__(self, *names: str):
        self.names = names
        self._set: frozenset | None = None

    def _targets(self) -> frozenset:
        if self._set is None:
            from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401

            qd = torch.ops.quantized_decomposed
            self._set = frozenset(getattr(getattr(qd, op), ov) for op, ov in (n.split(".") for n in self.names))
        return self._set

    def __contains__(self, target) -> bool:
        return target in self._targets()


Q_PER_TENSOR = _QDQTargets("quantize_per_tensor.default", "quantize_per_tensor.tensor")
DQ_PER_TENSOR = _QDQTargets("dequantize_per_tensor.default", "dequantize_per_tensor.tensor")
DQ_PER_CHANNEL = _QDQTargets("dequantize_per_channel.default")
Q_PER_CHANNEL = _QDQTargets("quantize_per_channel.default")

# The one table of fusable activations: the quantizer fuses them into the op before them (no
# quantize in between) and the lowering folds them into activation_min/max.  (lo, hi) in real
# numbers for the node's arguments (None: unbounded).
ACTIVATIONS = {
    aten.relu.default: lambda n: (0.0, None),
    aten.relu_.default: lambda n: (0.0, None),
    aten.relu6.default: lambda n: (0.0, 6.0),
    aten.hardtanh.default: lambda n: (node_arg(n, "min_val", -1.0), node_arg(n, "max_val", 1.0)),
    aten.hardtanh_.default: lambda n: (node_arg(n, "min_val", -1.0), node_arg(n, "max_val", 1.0)),
    aten.clamp.default: lambda n: (node_arg(n, "min", None), node_arg(n, "max", None)),
    aten.clamp_.default: lambda n: (node_arg(n, "min", None), node_arg(n, "max", None)),
}


@dataclass
class Int8Value:
    """An int8 tensor of the lowered graph and its quantization parameters."""

    node: Node
    qparams: QParams


def qparams_of(q_or_dq: Node) -> QParams:
    scale, zp = q_or_dq.args[1], q_or_dq.args[2]
    if isinstance(scale, Node) or isinstance(zp, Node):
        raise LoweringError(f"{q_or_dq.name}: quantization parameters are not constants")
    dtype, qmin, qmax = q_or_dq.args[5], q_or_dq.args[3], q_or_dq.args[4]
    if dtype == torch.int16 and (qmin, qmax) == (INT16_MIN, INT16_MAX):
        if int(zp) != 0:
            raise LoweringError(f"{q_or_dq.name}: int16 activations must be symmetric (zero point 0, TFLite's "
                                f"16x8 scheme), got zero point {int(zp)}")
        return QParams(float(scale), 0, torch.int16)
    if dtype != torch.int8 or qmin != INT8_MIN or qmax != INT8_MAX:
        raise LoweringError(f"{q_or_dq.name}: only int8 [-128, 127] and int16 [-32768, 32767] quantization "
                            "is supported")
    return QParams(float(scale), int(zp))


def source_location(node: Node) -> str:
    """``file:line in fn`` of the user's code that created ``node`` (last frame of its stack trace)."""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip().startswith("File ")]
    if not lines:
        return "<unknown source>"
    # Prefer the innermost frame in the user's code over torch's own layers (nn.Conv2d.forward...).
    user = [ln for ln in lines if not _is_library_frame(ln)]
    # ... and over generated code (``<eval_with_key>``: torch.cond / while_loop subgraphs)
    user = [ln for ln in user if not ln.split('"')[1:2] == [] and not ln.split('"')[1].startswith("<")] or user
    # 'File "/path/m.py", line 12, in forward'
    last = (user or lines)[-1]
    try:
        path = last.split('"')[1]
        rest = last.split('"', 2)[2].strip(", ")
        return f"{path}:{rest.replace('line ', '').replace(', in ', ' in ')}"
    except IndexError:
        return last


def module_path(node: Node) -> str:
    """Dotted path of the innermost ``nn.Module`` that created ``node`` (``"features.3.conv.1"``;
    ``""`` for code in the root module's forward), from torch.export's ``nn_module_stack``."""
    stack = node.meta.get("corten_module_path")
    if isinstance(stack, str):
        return stack
    stack = node.meta.get("nn_module_stack") or {}
    paths = [v[0] for v in stack.values() if isinstance(v, tuple) and v and isinstance(v[0], str)]
    path = paths[-1] if paths else ""
    # torch.export spells module paths as attribute accesses in some versions: L['self'].features[3]
    for junk in ("L['self'].", "L['self']"):
        path = path.replace(junk, "")
    return path.replace("[", ".").replace("]", "").replace("'", "").strip(".")


def _is_library_frame(line: str) -> bool:
    import os

    path = line.split('"')[1] if line.count('"') >= 2 else line
    roots = [os.path.dirname(torch.__file__)]
    torchao = sys.modules.get("torchao")  # loaded when the graph was quantized; never imported here
    if torchao is not None and getattr(torchao, "__file__", None):
        roots.append(os.path.dirname(torchao.__file__))
    return any(path.startswith(r + os.sep) for r in roots)


@dataclass
class Match:
    gm: GraphModule
    node: Node  # the ATen compute node
    inputs: list[Int8Value]  # the dequantized activation arguments, in argument order
    out_q: Node  # the quantize_per_tensor that ends the pattern (replaced by the rule's result)
    output: QParams
    activation: Node | None = None
    new_nodes: list[Node] = field(default_factory=list)

    # -- reading the pattern
    @property
    def activation_bounds(self) -> tuple[int, int]:
        if self.activation is None:
            return self.output.qmin, self.output.qmax
        lo, hi = ACTIVATIONS[self.activation.target](self.activation)
        return activation_range(self.output, lo, hi)

    def constant(self, node: Node) -> torch.Tensor:
        if node.op != "get_attr":
            src = node  # the op that computes it, behind the quantize/dequantize the quantizer put on it
            while isinstance(src, Node) and src.args and isinstance(src.args[0], Node) and (
                    src.target in Q_PER_TENSOR or src.target in DQ_PER_TENSOR or src.target in Q_PER_CHANNEL
                    or src.target in DQ_PER_CHANNEL):
                src = src.args[0]
            raise LoweringError(
                f"{self.node.name}: its weight (or bias) is computed in forward by {src.name} "
                f"({getattr(src.target, '__name__', src.target)}), not a parameter or buffer: Corten compiles "
                "constant weights only, so input-dependent weights (dynamic convolution, CondConv, hypernetworks) "
                "are not supported. Keep the weights as nn.Parameter / buffers; for a mixture of expert kernels "
                "run every expert and mix their outputs (sum_k r[k] * conv(x, W_k) equals conv(x, sum_k r[k] * W_k))")
        return get_attr(self.gm, node).detach()

    def quantized_constant(self, dq: Node) -> tuple[torch.Tensor, torch.Tensor, int | None]:
        """``dequantize_per_channel/tensor(const)`` -> (integer tensor, scales, channel axis)."""
        if not isinstance(dq, Node):
            raise LoweringError(f"{self.node.name}: expected a quantized constant argument, got {dq!r}")
        if dq.target in DQ_PER_CHANNEL:
            values = self.constant(dq.args[0])
            scales = self.constant(dq.args[1])
            zps = self.constant(dq.args[2])
            if torch.any(zps != 0):
                raise LoweringError(f"{self.node.name}: weights must be symmetric (zero point 0)")
            return values, scales.to(torch.float64), int(dq.args[3])
        if dq.target in DQ_PER_TENSOR:
            values = self.constant(dq.args[0])
            if int(dq.args[2]) != 0:
                raise LoweringError(f"{self.node.name}: weights must be symmetric (zero point 0)")
            return values, torch.tensor([float(dq.args[1])], dtype=torch.float64), None
        raise LoweringError(f"{self.node.name}: argument {dq.name} is not a quantized constant "
                            "(weights must be constants quantized by CortenQuantizer)")

    def weight_bits(self, dq: Node) -> int:
        """4 when the quantized constant ``dq`` was quantized to int4 (the quantizer's weight range
        [-7, 7], or any range within [-8, 7]), else 8: the ``weight_bits`` of the op reading it."""
        if isinstance(dq, Node) and (dq.target in DQ_PER_CHANNEL or dq.target in DQ_PER_TENSOR):
            lo_hi = dq.args[4:6] if dq.target in DQ_PER_CHANNEL else dq.args[3:5]
            if len(lo_hi) == 2 and -8 <= int(lo_hi[0]) and int(lo_hi[1]) <= 7:
                return 4
        return 8

    def bias_int32(self, bias_arg, input_scale: float, weight_scales: torch.Tensor) -> torch.Tensor | None:
        """The int32 bias: from its quantized constant, or - for a float bias the quantizer did not
        see (QAT's conv-BN folding adds one) - quantized here with scale input_scale * weight_scale."""
        if bias_arg is None:
            return None
        if isinstance(bias_arg, Node) and bias_arg.op == "get_attr":
            b = self.constant(bias_arg).to(torch.float64)
            q = b / (float(input_scale) * weight_scales.to(torch.float64))
            q = round_half_away_t(q)
            return q.clamp(-(2**31) + 1, 2**31 - 1).to(torch.int32)
        return self.quantized_constant(bias_arg)[0].to(torch.int32)

    def bias_int64(self, bias_arg, input_scale: float, weight_scales: torch.Tensor, channels: int) -> torch.Tensor:
        """The int64 bias of a 16x8 op (TFLite's 16x8 scheme), quantized here from the float bias
        (the quantizer leaves it float) with scale ``input_scale * weight_scale[c]``; zeros without
        a bias (CMSIS-NN's s16 kernels add the bias unconditionally in Corten's calls)."""
        if bias_arg is None:
            return torch.zeros(channels, dtype=torch.int64)
        if isinstance(bias_arg, Node) and bias_arg.op == "get_attr":
            b = self.constant(bias_arg).to(torch.float64)
        else:  # a quantized constant (dequantized int32): its real value
            q, scales, _ = self.quantized_constant(bias_arg)
            b = q.to(torch.float64) * scales
        q = round_half_away_t(b / (float(input_scale) * weight_scales.to(torch.float64)))
        limit = 2**40  # far below int64; and |acc * multiplier| stays < 2**63 with 2**22-bounded products
        if bool((q.abs() > limit).any()):
            raise LoweringError(f"{self.node.name}: an int64 bias beyond 2**40 steps (the input or weight scale "
                                "is tiny against the bias); calibrate with representative data")
        return q.to(torch.int64).expand(channels).contiguous() if q.numel() == 1 else q.to(torch.int64).contiguous()

    @staticmethod
    def reduced_shift(shift: torch.Tensor) -> torch.Tensor:
        """The shifts of a 16x8 op: ``arm_nn_requantize_s64`` needs ``shift <= 14``."""
        from corten.fixed_point import REDUCED_SHIFT_MAX, ScaleError

        if shift.numel() and int(shift.max()) > REDUCED_SHIFT_MAX:
            raise ScaleError(f"a 16x8 requantization shift of {int(shift.max())} (> {REDUCED_SHIFT_MAX}: the "
                             "effective scale is >= 2**14)")
        return shift

    # -- building the replacement
    def add_constant(self, tensor: torch.Tensor, hint: str) -> Node:
        # Named after the node it serves, so that compiling a model twice gives the same program.
        name = f"_corten_{self.node.name}_{hint}"
        while hasattr(self.gm, name):
            name += "_"
        self.gm.register_buffer(name, tensor.detach().clone().contiguous())
        with self.gm.graph.inserting_before(self.out_q):
            n = self.gm.graph.get_attr(name)
        self.new_nodes.append(n)
        return n

    def call(self, op_name: str, *args) -> Node:
        with self.gm.graph.inserting_before(self.out_q):
            n = self.gm.graph.call_function(corten_op(op_name), tuple(args))
        n.meta["stack_trace"] = self.node.meta.get("stack_trace")
        n.meta["nn_module_stack"] = self.node.meta.get("nn_module_stack")
        n.meta["corten_source"] = self.node.name
        n.meta["corten_module_path"] = module_path(self.node)
        # which float tensor this op's int8 output stands for, and its qparams (corten.compare)
        if self.output is not None:  # (a comparison's bool output has no qparams)
            n.meta["corten_output_of"] = (getattr(self.out_q.args[0], "name", None), self.output.scale,
                                          self.output.zero_point)
        # The quantize this node replaces has its int8 shape; the final export recomputes it.
        n.meta["val"] = self.out_q.meta.get("val")
        self.new_nodes.append(n)
        return n

    def call_aten(self, target, *args) -> Node:
        with self.gm.graph.inserting_before(self.out_q):
            n = self.gm.graph.call_function(target, tuple(args))
        n.meta["stack_trace"] = self.node.meta.get("stack_trace")
        n.meta["val"] = self.out_q.meta.get("val")
        self.new_nodes.append(n)
        return n
