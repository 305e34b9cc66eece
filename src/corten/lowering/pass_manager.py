"""``CortenPassManager``: a PT2E-converted (quantized) graph -> a fully lowered Corten program.

Passes, in order (each a small class with a ``__call__(gm) -> gm``):

1. :class:`LowerInputQuantizePass`  ``placeholder -> quantize_per_tensor`` becomes ``corten.quantize_per_tensor``.
2. :class:`LowerComputeOpsPass`     every quantized ATen op with a lowering rule (found through the op
   registry) becomes Corten ops; its q/dq neighbours fold into the op's qparams, a following
   activation into activation_min/max, and multipliers, shifts and kernel sums are computed here.
3. :class:`LowerRequantizePass`     a ``quantize(dequantize(x))`` pair left between lowered ops (sigmoid's fixed
   output qparams feeding a conv) becomes a requantizing lookup table.
4. :class:`LowerOutputDequantizePass`  the ``dequantize_per_tensor`` feeding a program output becomes
   ``corten.dequantize_per_tensor``.
5. :class:`RemoveDeadCodePass`      the float nodes the lowering bypassed, and unused constants, go.

What is left that is neither a Corten op nor a registered view op (``aten.reshape``) is *unlowered*
(one definition, :func:`corten.ops.registry.is_lowered_node`, shared with the memory planner and the
C generator): it is reported by :func:`unlowered_nodes` with its source location.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

from corten.errors import LoweringError
from corten.ops._qparams import requantize_args
from corten.ops._rules import (
    ACTIVATIONS,
    DQ_PER_CHANNEL,
    DQ_PER_TENSOR,
    Q_PER_CHANNEL,
    Q_PER_TENSOR,
    Int8Value,
    Match,
    qparams_of,
    source_location,
)
from corten.fixed_point import ScaleError
from corten.ops.registry import is_lowered_node, lowering_rule, lowers_format, op, op_name_of

aten = torch.ops.aten


class LowerInputQuantizePass:
    """Each program input is quantized once (the C library takes one buffer per input).  An input
    that int16 and int8 ops both read (``precision="int16"`` where only some consumers have 16x8
    kernels) was given one quantize per width: the widest stays, the others become a
    ``quantized_requantize`` of it (TFLite's Requantize; one grid's values onto the other's)."""

    def __call__(self, gm: GraphModule) -> GraphModule:
        by_input: dict[Node, list[Node]] = {}
        for node in gm.graph.nodes:
            if node.target in Q_PER_TENSOR and node.args[0].op == "placeholder":
                by_input.setdefault(node.args[0], []).append(node)
        for quants in by_input.values():
            at = quants[0]  # the new nodes go where the input was first quantized
            quants = sorted(quants, key=lambda n: -torch.iinfo(qparams_of(n).dtype).bits)  # widest first
            first, q_first = None, None
            for node in quants:
                q = qparams_of(node)
                new = first
                with gm.graph.inserting_before(at):
                    if first is None:
                        new = first = gm.graph.call_function(op("quantize_per_tensor"),
                                                             (node.args[0], q.scale, q.zero_point, *_bits_arg(q)))
                        q_first = q
                        new.meta.update(node.meta)
                    elif q != q_first:
                        new = gm.graph.call_function(op("quantized_requantize"), requantize_args(q_first, q, first))
                        new.meta.update(node.meta)
                node.replace_all_uses_with(new)
                if node is not at:
                    gm.graph.erase_node(node)
            gm.graph.erase_node(at)
        return gm


def _edge_op(gm: GraphModule, node: Node, name: str) -> None:
    """Replace the q/dq ``node`` at a program edge by Corten's ``name`` op with its qparams."""
    q = qparams_of(node)
    with gm.graph.inserting_before(node):
        new = gm.graph.call_function(op(name), (node.args[0], q.scale, q.zero_point, *_bits_arg(q)))
    new.meta.update(node.meta)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)


def _bits_arg(q) -> tuple:
    """The edge ops' ``bits`` argument: omitted for int8 (the default), 16 for int16."""
    return () if q.dtype == torch.int8 else (16,)


def _output_chain(node: Node) -> tuple[Node | None, Node | None]:
    """(fused activation or None, final quantize) after ``node``, or (None, None) when absent.  Of
    an op returning (values, indices) with the indices unused, the chain follows ``getitem(., 0)``."""
    users = [u for u in node.users if not (u.target is operator.getitem and not u.users)]
    if len(users) == 1 and users[0].target is operator.getitem and users[0].args[1] == 0:
        users = list(users[0].users)
    if len(users) != 1:
        return None, None
    nxt, act = users[0], None
    if nxt.target in ACTIVATIONS:
        act = nxt
        users = list(act.users)
        if len(users) != 1:
            return None, None
        nxt = users[0]
    if nxt.target in Q_PER_TENSOR:
        return act, nxt
    return None, None


def build_match(gm: GraphModule, node: Node) -> Match | None:
    """The quantized pattern around ``node``, or None when ``node`` was not quantized."""
    inputs = []
    for arg in node.args:
        # a list argument (``aten.cat``'s tensors) contributes its elements, in order
        for a in arg if isinstance(arg, (list, tuple)) else (arg,):
            if isinstance(a, Node) and a.target in DQ_PER_TENSOR and a.args[0].op != "get_attr":
                inputs.append(Int8Value(a.args[0], qparams_of(a)))
    if not inputs:
        return None
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and not val.dtype.is_floating_point:
        # a comparison (bool) or argmax (int64): no output quantization; the rule's result replaces
        # the node itself (Match.output is None)
        return Match(gm, node, inputs, node, None, None)
    act, out_q = _output_chain(node)
    if out_q is None:
        return None
    return Match(gm, node, inputs, out_q, qparams_of(out_q), act)


class LowerComputeOpsPass:
    def __init__(self) -> None:
        self.refusals: dict[str, str] = {}  # node name -> why its rule refused it

    def __call__(self, gm: GraphModule) -> GraphModule:
        for node in list(gm.graph.nodes):
            if node.op != "call_function":
                continue
            rule = lowering_rule(node.target)
            if rule is None:
                continue
            if node.meta.get("corten_refusal"):  # an ATen pass found it cannot be expressed (e.g. an
                continue                          # in-place write into a view another view still reads)
            match = build_match(gm, node)
            if match is None:
                self.refusals[node.name] = "its inputs/outputs are not quantized by CortenQuantizer"
                continue
            wide = [q.dtype for q in [*(v.qparams for v in match.inputs), match.output]
                    if q is not None and not lowers_format(node, act=q.dtype)]
            if wide:
                width = str(wide[0]).replace("torch.", "")
                self.refusals[node.name] = (f"{op_display_name(node.target)} has no {width} "
                                            f"{'(16x8) ' if wide[0] == torch.int16 else ''}kernel in Corten; keep "
                                            "this module int8 (precision={'<module path>': 'int8'})")
                continue
            try:
                try:
                    result = rule(match)
                except ScaleError as e:
                    from corten.errors import QuantizationError
                    from corten.validation import module_path

                    mod = module_path(node)
                    raise QuantizationError(
                        f"{node.name}{f' in {mod}' if mod else ''} at {source_location(node)}: {e}; the int8 "
                        "scales of its inputs, weights and output are too far apart (rescale the layer or "
                        "calibrate with representative data)") from None
            except LoweringError as e:
                self.refusals[node.name] = str(e)
                for n in reversed(match.new_nodes):
                    if not n.users:
                        gm.graph.erase_node(n)
                continue
            match.out_q.replace_all_uses_with(result)
        return gm


class LowerOutputDequantizePass:
    def __call__(self, gm: GraphModule) -> GraphModule:
        out = gm.graph.output_node()
        for node in list(out.all_input_nodes):
            if node.target in DQ_PER_TENSOR:
                _edge_op(gm, node, "dequantize_per_tensor")
        return gm


class LowerRequantizePass:
    """A ``dequantize -> quantize`` pair left between two lowered ops (e.g. a sigmoid's fixed output
    grid feeding a maximum that needs its other input's grid) becomes one ``quantized_lut``: the
    256-entry table maps each int8 value of the first grid to the second, rounding as the program's
    edge quantize does.  Identical grids vanish."""

    def __call__(self, gm: GraphModule) -> GraphModule:
        for node in list(gm.graph.nodes):
            if node.target not in Q_PER_TENSOR or not isinstance(node.args[0], Node):
                continue
            dq = node.args[0]
            if dq.target not in DQ_PER_TENSOR or not isinstance(dq.args[0], Node):
                continue
            src = dq.args[0]
            try:
                q_in, q_out = qparams_of(dq), qparams_of(node)
            except LoweringError:
                continue
            widths_differ = q_in.dtype != q_out.dtype
            if src.op != "call_function" or (op_name_of(src.target) is None
                                             and not (widths_differ and is_lowered_node(src))):
                continue  # only between Corten ops / views (the float ops around it are reported as unlowered)
            if q_in == q_out:
                node.replace_all_uses_with(src)
                continue
            if q_in.dtype != torch.int8 or q_out.dtype != torch.int8:
                # where an int16 region meets an int8 one: one quantized_requantize (TFLite's Requantize)
                with gm.graph.inserting_before(node):
                    new = gm.graph.call_function(op("quantized_requantize"), requantize_args(q_in, q_out, src))
                new.meta.update({k: v for k, v in node.meta.items() if k != "quantization_annotation"})
                new.meta["corten_source"] = node.name
                node.replace_all_uses_with(new)
                continue
            levels = torch.arange(-128, 128, dtype=torch.int8)
            real = torch.ops.corten.dequantize_per_tensor(levels, q_in.scale, q_in.zero_point)
            table = torch.ops.corten.quantize_per_tensor(real, q_out.scale, q_out.zero_point)
            name = f"_corten_{node.name}_requantize_table"
            while hasattr(gm, name):
                name += "_"
            gm.register_buffer(name, table.contiguous())
            with gm.graph.inserting_before(node):
                t = gm.graph.get_attr(name)
                new = gm.graph.call_function(op("quantized_lut"), (src, t))
            new.meta.update({k: v for k, v in node.meta.items() if k != "quantization_annotation"})
            new.meta["corten_source"] = node.name
            node.replace_all_uses_with(new)
        return gm


class RemoveDeadCodePass:
    """Drops nodes nothing reads.  In-place activations (``relu_``, ``hardtanh_``) and dropout count
    as removable too: once lowered, what they wrote to is itself dead."""

    def __call__(self, gm: GraphModule) -> GraphModule:
        # (an op an ATen pass refused stays, to be reported: an in-place write it could not make
        # functional has no users, yet dropping it would silently drop the write)
        gm.graph.eliminate_dead_code(is_impure_node=lambda n: n.op in ("placeholder", "output", "call_module")
                                     or bool(n.meta.get("corten_refusal")))
        used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
        for name, _ in list(gm.named_buffers()) + list(gm.named_parameters()):
            if name not in used and "." not in name:
                delattr(gm, name)
        gm.delete_all_unused_submodules()
        gm.recompile()
        return gm


@dataclass
class UnloweredNode:
    name: str
    op: str
    location: str
    reason: str = ""

    def __str__(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.op} [{self.name}] at {self.location}{why}"


is_lowered = is_lowered_node  # the one definition (corten.ops.registry), shared with memory and codegen



def op_display_name(target) -> str:
    name = getattr(target, "__name__", str(target))
    ns = getattr(target, "namespace", None)
    return f"{ns}.{name}" if ns else name


_SORTING = ("sorting and top-k selection have no int8 kernel: return the scores and select in the caller (top-1: "
            "argmax, or amax for the value)")
_SPECTRAL = ("spectral transforms have no int8 kernel: compute the spectrogram / MFCC features before the program "
             "(the usual MCU front-end) and pass them as the input, or write a fixed filterbank as a Conv1d")
# why an op no family lowers cannot run, and what to write instead (when no rule or rewrite gave a reason)
UNSUPPORTED_HINTS = {
    "embedding": ("a table lookup with computed indices: look the vectors up before the program and pass them "
                  "as the input (a lookup with constant indices, self.emb(self.idx) of a buffer, is folded)"),
    "to.dtype": ("a cast to an integer or other non-float32 dtype (x.long(), x.int(), x.half()): the program "
                 "computes float32 values in int8; do index and integer arithmetic outside the program"),
    "_to_copy": ("a cast to an integer or other non-float32 dtype (x.long(), x.int(), x.half()): the program "
                 "computes float32 values in int8; do index and integer arithmetic outside the program"),
    "topk": _SORTING, "sort": _SORTING, "argsort": _SORTING, "kthvalue": _SORTING, "median": _SORTING,
    "stft": _SPECTRAL, "istft": _SPECTRAL, "fft_fft": _SPECTRAL, "fft_rfft": _SPECTRAL, "fft_irfft": _SPECTRAL,
    "fft_ifft": _SPECTRAL, "_fft_r2c": _SPECTRAL, "_fft_c2r": _SPECTRAL, "_fft_c2c": _SPECTRAL,
    "nonzero": "an output whose shape depends on the values (nonzero / masked_select): use torch.where with "
               "a fixed shape, or select in the caller",
    "masked_select": "an output whose shape depends on the values (nonzero / masked_select): use torch.where "
                     "with a fixed shape, or select in the caller",
}


def _hint(target) -> str:
    name = getattr(target, "__name__", "")
    return UNSUPPORTED_HINTS.get(name) or UNSUPPORTED_HINTS.get(name.split(".")[0], "")


def unlowered_nodes(gm_or_graph, refusals: dict[str, str] | None = None) -> list[UnloweredNode]:
    graph = getattr(gm_or_graph, "graph", gm_or_graph)
    refusals = refusals or {}
    out = []
    for n in graph.nodes:
        if is_lowered(n):
            continue
        if _is_qdq(n):
            if _touches_float_op(n):
                continue  # the q/dq around a float op are reported through that op
            out.append(UnloweredNode(n.name, op_display_name(n.target), source_location(n),
                                     "a quantize/dequantize left between lowered ops (no Corten op expresses it)"))
            continue
        # a rule's refusal, else the reason an ATen rewrite left on the node (meta "corten_refusal")
        reason = refusals.get(n.name) or n.meta.get("corten_refusal", "") or _hint(n.target)
        out.append(UnloweredNode(n.name, op_display_name(n.target), source_location(n), reason))
    return out


def _is_qdq(n: Node) -> bool:
    return (n.target in DQ_PER_TENSOR or n.target in Q_PER_TENSOR or n.target in DQ_PER_CHANNEL
            or n.target in Q_PER_CHANNEL)


def _touches_float_op(n: Node, seen: set | None = None) -> bool:
    """Whether a q/dq node reaches an unlowered (float) compute op through q/dq nodes only."""
    seen = set() if seen is None else seen
    seen.add(n)
    for m in [*n.all_input_nodes, *n.users]:
        if m in seen or m.op != "call_function":
            continue
        if _is_qdq(m):
            if _touches_float_op(m, seen):
                return True
        elif not is_lowered(m):
            return True
    return False


class CortenPassManager:
    """Runs the lowering passes; ``refusals`` keeps why rules declined nodes."""

    def __init__(self) -> None:
        self.compute = LowerComputeOpsPass()
        self.passes = [LowerInputQuantizePass(), self.compute, LowerRequantizePass(), LowerOutputDequantizePass(),
                       RemoveDeadCodePass()]

    @property
    def refusals(self) -> dict[str, str]:
        return self.compute.refusals

    def __call__(self, gm: GraphModule) -> GraphModule:
        import corten.ops  # noqa: F401  (registers the lowering rules)

        for p in self.passes:
            gm = p(gm)
        gm.graph.lint()
        return gm
