"""``CortenQuantizer``: the TFLite int8 scheme that CMSIS-NN implements, as a torchao PT2E quantizer.

* activations: int8 per-tensor asymmetric, range [-128, 127] (HistogramObserver in PTQ,
  moving-average min/max fake-quant in QAT);
* weights: int8 per-output-channel symmetric, range [-127, 127];
* bias: int32 with the derived scale ``input_scale * weight_scale[c]``.

Patterns are annotated on whole ops as they come out of ``torch.export`` (``aten.linear`` stays
whole: no addmm/permute decomposition), with the activation that follows a conv/linear/add fused
into it (the activation node carries the output quantization, so there is no quantize between the
op and its activation).  Pooling and shape-only ops share their input's quantization parameters,
as CMSIS-NN's pooling kernels do not requantize.

``transform_for_annotation`` runs Corten's ATen pass manager (BatchNorm folding, no-op removal)
before observers are placed.
"""
from __future__ import annotations

import operator
from typing import Callable, Iterable

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.fake_quantize import FusedMovingAvgObsFakeQuantize
from torchao.quantization.pt2e.observer import (
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
)
from torchao.quantization.pt2e.quantizer import (
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
)

from corten.fixed_point import INT8_MAX, INT8_MIN, INT16_MAX, INT16_MIN
from corten.ops._rules import ACTIVATIONS  # the fusable activations: fused into the op before them
from corten.quantizer.observers import PerChannelMseWeightObserver, observer_class

aten = torch.ops.aten

# Training-mode BatchNorm that QAT keeps between a conv and its activation.
QAT_BATCH_NORM_OPS = {aten.batch_norm.default, aten._native_batch_norm_legit.default,
                      aten._native_batch_norm_legit_no_training.default}


# ----------------------------------------------------------------------------- specs
def activation_qspec(is_qat: bool, observer: str = "histogram") -> QuantizationSpec:
    """int8 per-tensor affine activations; ``observer`` names the PTQ range rule (see
    :mod:`corten.quantizer.observers`), QAT always fake-quantizes with moving-average min/max."""
    if is_qat:
        ctr = FusedMovingAvgObsFakeQuantize.with_args(observer=MovingAverageMinMaxObserver, eps=2**-12)
    else:
        ctr = observer_class(observer).with_args(eps=2**-12)
    return QuantizationSpec(dtype=torch.int8, quant_min=INT8_MIN, quant_max=INT8_MAX,
                            qscheme=torch.per_tensor_affine, observer_or_fake_quant_ctr=ctr)


# int16 scales are 256x finer than int8 ones: the int8 floor of 2**-12 would cap their precision
INT16_EPS = 2**-24


# PTQ int16 ranges are widened 4x: 2 of int16's 15 bits (still 64x finer than int8) buy room for
# values the calibration never saw (measured: ae-small in benchmarks/bench_int16.py reconstructs
# with 0.098 relative error without it, 0.038 - its int8-weights floor - with it).
INT16_HEADROOM = 4.0
_HEADROOM_CLASSES: dict[type, type] = {}


def with_headroom(cls: type) -> type:
    """The observer ``cls`` whose scale is :data:`INT16_HEADROOM` times wider."""
    if cls not in _HEADROOM_CLASSES:
        def calculate_qparams(self):
            scale, zero_point = cls.calculate_qparams(self)
            return scale * INT16_HEADROOM, zero_point

        _HEADROOM_CLASSES[cls] = type(f"Int16Headroom{cls.__name__}", (cls,), {"calculate_qparams": calculate_qparams})
    return _HEADROOM_CLASSES[cls]


def activation_qspec16(is_qat: bool, observer: str = "histogram") -> QuantizationSpec:
    """TFLite's 16x8 activations: int16 per-tensor *symmetric* (zero point 0), range [-32768, 32767];
    in PTQ with :data:`INT16_HEADROOM`."""
    if is_qat:
        ctr = FusedMovingAvgObsFakeQuantize.with_args(observer=MovingAverageMinMaxObserver, eps=INT16_EPS)
    else:
        ctr = with_headroom(observer_class(observer)).with_args(eps=INT16_EPS)
    return QuantizationSpec(dtype=torch.int16, quant_min=INT16_MIN, quant_max=INT16_MAX,
                            qscheme=torch.per_tensor_symmetric, observer_or_fake_quant_ctr=ctr)


# int4 weights (A8W4): symmetric per channel in [-7, 7], TFLite's narrow symmetric range as for int8
# ([-127, 127]); held in int8 tensors (the lowering reads the range back: weight_bits=4).
INT4_WEIGHT_MAX = 7


def weight_qspec(is_qat: bool, ch_axis: int = 0, int4: bool = False) -> QuantizationSpec:
    if is_qat:
        ctr = FusedMovingAvgObsFakeQuantize.with_args(observer=MovingAveragePerChannelMinMaxObserver, eps=2**-12)
    else:  # (int4: the per-channel range that minimises the weights' squared error)
        ctr = (PerChannelMseWeightObserver if int4 else PerChannelMinMaxObserver).with_args(eps=2**-12)
    top = INT4_WEIGHT_MAX if int4 else INT8_MAX
    return QuantizationSpec(dtype=torch.int8, quant_min=-top, quant_max=top,
                            qscheme=torch.per_channel_symmetric, ch_axis=ch_axis, observer_or_fake_quant_ctr=ctr)


def _derive_bias_qparams(obs_or_fqs) -> tuple[torch.Tensor, torch.Tensor]:
    act, weight = obs_or_fqs
    act_scale, _ = act.calculate_qparams()
    w_scale, _ = weight.calculate_qparams()
    scale = (act_scale * w_scale).to(torch.float32)
    return scale, torch.zeros_like(scale, dtype=torch.int32)


def bias_qspec(input_act: Node, weight: Node, node: Node) -> DerivedQuantizationSpec:
    return DerivedQuantizationSpec(
        derived_from=[(input_act, node), (weight, node)], derive_qparams_fn=_derive_bias_qparams,
        dtype=torch.int32, quant_min=-(2**31) + 1, quant_max=2**31 - 1,
        qscheme=torch.per_channel_symmetric, ch_axis=0,
    )


def _own_bias(node: Node, bias: Node) -> Node:
    """The bias ``get_attr`` of ``node``, made its own when other ops read it too.

    A module called on several inputs (an RNN's ``b_hh`` in every unrolled step, a GRUCell in a loop,
    a shared encoder) gives its ops one bias node; PT2E then shares one observer among their bias
    edges (its implicit sharing compares dtypes, not ``derived_from``), so every op's int32 bias had
    the first op's scale ``input_scale * weight_scale``, wrong for every op whose input scale differs.
    A fresh ``get_attr`` of the same attribute per op keeps each bias scale its own."""
    if bias.op != "get_attr" or len(bias.users) == 1:
        return bias
    with node.graph.inserting_before(node):
        own = node.graph.get_attr(bias.target)
    own.meta.update(bias.meta)
    node.replace_input_with(bias, own)
    return own


# ----------------------------------------------------------------------------- helpers
def _annotated(node: Node) -> bool:
    ann = node.meta.get("quantization_annotation")
    return ann is not None and ann._annotated


def _mark(node: Node, input_qspec_map=None, output_qspec=None) -> None:
    node.meta["quantization_annotation"] = QuantizationAnnotation(
        input_qspec_map=input_qspec_map or {}, output_qspec=output_qspec, _annotated=True)


def _single_user(node: Node) -> Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _is_fusable_activation(node: Node) -> bool:
    if node.target not in ACTIVATIONS:
        return False
    if node.target in (aten.clamp.default, aten.clamp_.default):
        # clamp(x, min, max) with constant bounds; tensor bounds are not an activation
        return all(not isinstance(a, Node) for a in node.args[1:])
    return True


def _fused_tail(node: Node, allow_bn: bool = False) -> list[Node]:
    """``node`` followed by the nodes fused into it: an optional (QAT) BatchNorm and one activation."""
    chain = [node]
    nxt = _single_user(node)
    if allow_bn and nxt is not None and nxt.target in QAT_BATCH_NORM_OPS:
        chain.append(nxt)
        getitem = _single_user(nxt)
        if nxt.target != aten.batch_norm.default and getitem is not None and getitem.target == operator.getitem:
            chain.append(getitem)
        nxt = _single_user(chain[-1])
    if nxt is not None and _is_fusable_activation(nxt) and not _annotated(nxt):
        chain.append(nxt)
    return chain


# ----------------------------------------------------------------------------- the quantizer
class CortenQuantizer(Quantizer):
    """PT2E quantizer for Corten (CMSIS-NN int8).  ``is_qat`` selects fake-quant modules;
    ``observer`` the PTQ range rule of intermediate activations (``"histogram"``, ``"minmax"``,
    ``"percentile"``, ``"mse"``).  Program outputs are observed with min/max in PTQ whatever
    ``observer`` says: a clipped logit can no longer win the argmax."""

    def __init__(self, is_qat: bool = False, aten_passes: bool | None = None, observer: str = "histogram",
                 precision="int8", input_ranges: dict[int, tuple[float, float]] | None = None, weights="int8"):
        super().__init__()
        self.weights = check_weights(weights)
        self.int4_nodes: list[str] = []  # the weighted nodes annotated with int4 weights (for reports)
        self.input_ranges = dict(input_ranges or {})  # program input index -> declared (lo, hi)
        self.is_qat = is_qat
        observer_class(observer)  # validates the name
        self.observer = observer
        self.precision = check_precision(precision)
        self.int16_nodes: list[str] = []  # the compute nodes annotated int16 (for reports)
        # The ATen passes fold inference BatchNorms; QAT trains through its BatchNorms, which
        # prepare_qat_pt2e folds itself, so they are off by default there.
        self.aten_passes = (not is_qat) if aten_passes is None else aten_passes
        self.transformed_graph_text: str | None = None  # the graph after the ATen passes, for reports

    # -- torchao Quantizer API
    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        import corten.ops  # noqa: F401  (the families register their ATen rewrites on import)
        from corten.aten_passes import AtenPassManager
        from corten.aten_passes.pass_manager import default_passes
        from corten.ops.registry import aten_rewrites

        # The op families' rewrites (e.g. nn.LSTM into layers) are needed for lowering: always run.
        model = AtenPassManager([*(default_passes() if self.aten_passes else []), *aten_rewrites()])(model)
        if not self.aten_passes:
            return model
        self.transformed_graph_text = model.print_readable(print_output=False, include_stride=False,
                                                           include_device=False)
        return model

    def annotate(self, model: GraphModule) -> GraphModule:
        """Annotate every op an op family declared (``corten.ops.registry.annotates``)."""
        import corten.ops  # noqa: F401  (the families declare their annotations on import)
        from corten.ops.registry import annotation_for, lowers_format

        act8 = act = activation_qspec(self.is_qat, self.observer)
        acts = {torch.int8: act8, torch.int16: activation_qspec16(self.is_qat, self.observer)}
        # Compute ops first; shared-qparam ops last, so that their producers are annotated.
        for shared_pass in (False, True):
            for node in model.graph.nodes:
                if node.op != "call_function" or _annotated(node):
                    continue
                ann = annotation_for(node.target)
                if ann is None or (ann.kind == "shared") != shared_pass:
                    continue
                if not (_float_tensors_only(node, constant_indices=ann.kind == "shared")
                        or (ann.kind == "shared" and _has_float_input(node))):
                    continue
                # the activation width: the layer's precision where its lowering rule has that format
                # (shared qparams: the producer's), else int8
                want = (_producer_dtype(node) if ann.kind == "shared"
                        else getattr(torch, precision_of(node, self.precision)))
                act = act8
                if (want != torch.int8 and want in acts and lowers_format(node, act=want)
                        and (ann.kind != "binary" or _two_activations(node))
                        and (ann.kind != "fixed" or want in ann.fixed)):
                    act = acts[want]
                    if ann.kind != "shared":
                        self.int16_nodes.append(node.name)
                if ann.kind == "weighted":
                    wdt = getattr(torch, precision_of(node, self.weights))  # torch.int8 | torch.int4
                    int4 = wdt == torch.int4 and lowers_format(node, act=act.dtype, weight=wdt)
                    if int4:
                        self.int4_nodes.append(node.name)
                    self._annotate_weighted(node, act, ann.weight_axis, int4)
                elif ann.kind == "binary":
                    self._annotate_binary(node, act)
                elif ann.kind == "unary":
                    _mark(node, {node.args[0]: _input_qspec(node.args[0], act)}, act) if isinstance(node.args[0], Node) else None
                elif ann.kind == "fixed":
                    self._annotate_fixed(node, act, ann.fixed[act.dtype])
                else:
                    self._annotate_shared(node, act)
        self._annotate_float_outputs(model, act)
        if not self.is_qat:
            _observe_outputs_unclipped(model)
        _declare_input_ranges(model, self.input_ranges)
        _share_with_roots(model)
        return model

    def _annotate_float_outputs(self, model: GraphModule, act: QuantizationSpec) -> None:
        """A program output no annotated op produces (``return x``, a graph of no-ops) is observed
        on the output edge, so even a program without compute has int8 inputs and outputs."""
        out = model.graph.output_node()
        tensors = [a for a in _flat_args(out) if isinstance(a, Node) and not _annotated(a)
                   and isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].dtype.is_floating_point]
        if tensors:
            _mark(out, {a: act for a in dict.fromkeys(tensors)}, None)

    def validate(self, model: GraphModule) -> None:
        pass

    # -- patterns
    def _annotate_weighted(self, node: Node, act: QuantizationSpec, weight_axis: int = 0, int4: bool = False) -> None:
        x, w = node.args[0], node.args[1]
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        if not isinstance(x, Node) or not isinstance(w, Node):
            return
        if weight_axis == 1 and _transposed_groups(node) != 1:
            return  # grouped transposed conv: per-channel scales along axis 1 cover only C_out/groups
        inputs = {x: _input_qspec(x, act), w: weight_qspec(self.is_qat, weight_axis, int4)}
        if isinstance(bias, Node) and act.dtype == torch.int8:  # (16x8: an int64 bias, quantized in lowering)
            bias = _own_bias(node, bias)
            inputs[bias] = bias_qspec(x, w, node)
        chain = _fused_tail(node, allow_bn=self.is_qat)
        if len(chain) == 1:
            _mark(node, inputs, act)
            return
        _mark(node, inputs, None)
        for mid in chain[1:-1]:
            _mark(mid)
        _mark(chain[-1], None, act)

    def _annotate_binary(self, node: Node, act: QuantizationSpec) -> None:
        inputs = {a: _input_qspec(a, act) for a in node.args[:2] if isinstance(a, Node)}
        if not inputs:
            return  # (an unsupported variant such as add with alpha != 1 is refused, with its reason, by its lowering rule)
        chain = _fused_tail(node)
        _mark(node, inputs, act if len(chain) == 1 else None)
        if len(chain) > 1:
            _mark(chain[-1], None, act)

    def _annotate_fixed(self, node: Node, act: QuantizationSpec, fixed: tuple[float, int]) -> None:
        x = node.args[0]
        if not isinstance(x, Node):
            return
        scale, zero_point = fixed
        wide = act.dtype == torch.int16  # TFLite 16x8: symmetric int16 (softmax, sigmoid, tanh: 1/32768, 0)
        out = FixedQParamsQuantizationSpec(dtype=act.dtype, scale=scale, zero_point=zero_point,
                                           quant_min=INT16_MIN if wide else INT8_MIN,
                                           quant_max=INT16_MAX if wide else INT8_MAX,
                                           qscheme=torch.per_tensor_symmetric if wide else torch.per_tensor_affine)
        _mark(node, {x: _input_qspec(x, act)}, out)

    def _annotate_shared(self, node: Node, act: QuantizationSpec) -> None:
        """Output and every float tensor input share the first float input's qparams (e.g. pooling,
        reshape, cat, where).  Non-float tensors (a ``where`` condition) are not quantized; a
        non-float output (a comparison's bool, argmax's indices) gets no qparams; of a tuple output
        (``max.dim``, ``adaptive_max_pool2d``: values and indices) the values ``getitem(., 0)`` do."""
        # each tensor once: ``cat([y, y])`` lists y twice, and y sharing with itself would loop
        # (integer tensors - the constant indices of an index_select or gather, a where's bool
        # condition - are not quantized)
        tensors = list(dict.fromkeys(a for a in _flat_args(node) if isinstance(a, Node) and _is_float(a)))
        if not tensors:
            return
        first = tensors[0]
        # int16: after a fixed-qparams op (sigmoid, tanh, softmax) the int16 values are read as they
        # are (see _fixed_output_spec); int8 keeps its observer.
        inputs = {first: _input_qspec(first, act) if act.dtype == torch.int16 else act}
        for other in tensors[1:]:
            inputs[other] = SharedQuantizationSpec((first, node))
        val = node.meta.get("val")
        if isinstance(val, (tuple, list)):
            _mark(node, inputs, None)
            for user in node.users:
                if user.target is operator.getitem and user.args[1] == 0:
                    _mark(user, None, SharedQuantizationSpec((first, node)))
            return
        _mark(node, inputs, SharedQuantizationSpec((first, node)) if _is_float(node) else None)


def _two_activations(node: Node) -> bool:
    """Both operands of a binary op are computed tensors (the 16x8 add and mul take two int16
    tensors, no constant operand).  The output of a fixed-qparams op (sigmoid, tanh, softmax) is one:
    of the op's width it is read as it is, of the other width it is observed on the edge and
    requantized (:func:`_input_qspec`)."""
    return all(isinstance(a, Node) and a.op != "get_attr" for a in node.args[:2])


def _input_qspec(arg: Node, act: QuantizationSpec):
    """The qspec of an input edge: the activation spec, except after an op with a fixed output
    quantization (softmax, sigmoid, tanh) of the same width, whose output is read as it is (a
    separate observer would leave a requantizing dequantize/quantize pair between the two ops).  A
    fixed output of the other width (an int8 sigmoid feeding an int16 op, or the reverse) gets the
    edge's own observer: the lowering puts a ``quantized_requantize`` there."""
    spec = _fixed_output_spec(arg, follow_shared=act.dtype == torch.int16)
    if spec is not None and spec.dtype == act.dtype:
        return SharedQuantizationSpec(arg)
    return act


def _fixed_output_spec(node: Node, follow_shared: bool) -> FixedQParamsQuantizationSpec | None:
    """The fixed output qspec of ``node`` (sigmoid, tanh, softmax), or - ``follow_shared`` - of the op
    whose qparams ``node`` shares (an int16-capable flatten or pool after it).  int16 follows the shared ops: a
    second observer there would need an int16 -> int16 requantize, which Corten has not; int8 keeps
    its observer after them (the lowering maps the two grids with a 256-entry table)."""
    from corten.ops.registry import annotation_for, lowers_format

    seen: set = set()
    while isinstance(node, Node) and node not in seen:
        seen.add(node)
        ann = node.meta.get("quantization_annotation")
        spec = getattr(ann, "output_qspec", None)
        if isinstance(spec, FixedQParamsQuantizationSpec):
            return spec
        if not (follow_shared and lowers_format(node, act=torch.int16)):  # (an int8-only shared op observes anew)
            return None
        if isinstance(spec, SharedQuantizationSpec):
            e = spec.edge_or_node
            node = e[0] if isinstance(e, tuple) else e
        elif ann is None and getattr(annotation_for(node.target), "kind", None) == "shared":
            # a shared-qparams op not annotated yet (they come last): it will share its first input's
            node = next((a for a in _flat_args(node) if isinstance(a, Node) and _is_float(a)), None)
        else:
            return None
    return None


def _declare_input_ranges(model: GraphModule, ranges: dict[int, tuple[float, float]]) -> None:
    """The edges out of a program input whose range the user declared read it through a
    :class:`~corten.quantizer.observers.DeclaredRangeObserver` of that range (one spec per input
    and width, so the input is quantized once per width); calibration does not move it."""
    from corten.quantizer.observers import DeclaredRangeObserver

    if not ranges:
        return
    inputs = [n for n in model.graph.nodes if n.op == "placeholder"]
    for idx, (lo, hi) in ranges.items():
        specs: dict = {}
        for user in inputs[idx].users:
            ann = user.meta.get("quantization_annotation")
            spec = None if ann is None else ann.input_qspec_map.get(inputs[idx])
            if type(spec) is not QuantizationSpec:  # shared / fixed edges follow their group
                continue
            if spec.dtype not in specs:
                eps = 2**-12 if spec.dtype == torch.int8 else INT16_EPS
                specs[spec.dtype] = QuantizationSpec(
                    dtype=spec.dtype, quant_min=spec.quant_min, quant_max=spec.quant_max, qscheme=spec.qscheme,
                    observer_or_fake_quant_ctr=DeclaredRangeObserver.with_args(lo=lo, hi=hi, eps=eps))
            ann.input_qspec_map[inputs[idx]] = specs[spec.dtype]


_IMPLICIT_SHARING_ATTRS = ("dtype", "is_dynamic", "quant_min", "quant_max", "qscheme", "ch_axis", "scale", "zero_point")


def _same_quantization(a, b) -> bool:
    """torchao's test for sharing one tensor's observer between its uses: each attribute equal or
    absent from both specs."""
    missing = object()
    return all(getattr(a, k, missing) == getattr(b, k, missing) for k in _IMPLICIT_SHARING_ATTRS)


def _share_with_roots(model: GraphModule) -> None:
    """Rewrite the annotations so each observer group has one member holding a real spec (its first
    member in graph order) and every other member a ``SharedQuantizationSpec`` pointing straight at it.

    The groups are exactly torchao's: ``SharedQuantizationSpec`` links, joined by its implicit
    sharing of one tensor's uses (its output and its input edges into ops allowing implicit sharing)
    when their specs quantize alike.  torchao's union-find (``_get_edge_or_node_to_group_id``) joins
    in graph order and can make a member holding a shared spec the root of its own target's tree
    (``t0 = cat([x, x]); t1 = cat([t0, x]); cat([t1, t0])``, or a multi-head attention block's
    transposes and matmuls): resolving that spec then never ends (RecursionError).  With every link
    one step to the group's first member its cycle check (``_union``) reverses each such join, so the
    first member stays root.  Observers are unchanged: torchao builds a group's observer from the spec
    of its first member, which is the spec that member now holds."""
    def spec_of(e):
        ann = (e[1] if isinstance(e, tuple) else e).meta.get("quantization_annotation")
        if ann is None:
            return None
        return ann.input_qspec_map.get(e[0]) if isinstance(e, tuple) else ann.output_qspec

    def set_spec(e, spec):
        ann = (e[1] if isinstance(e, tuple) else e).meta["quantization_annotation"]
        if isinstance(e, tuple):
            ann.input_qspec_map[e[0]] = spec
        else:
            ann.output_qspec = spec

    entries = []  # every annotated edge and node, in the order torchao visits them
    for node in model.graph.nodes:
        ann = node.meta.get("quantization_annotation")
        if ann is not None:
            entries.extend((src, node) for src in ann.input_qspec_map)
            if ann.output_qspec is not None:
                entries.append(node)
    order = {e: k for k, e in enumerate(entries)}
    parent = {e: e for e in entries}

    def find(e):
        while parent[e] != e:
            parent[e] = parent[parent[e]]
            e = parent[e]
        return e

    def union(a, b):
        a, b = find(a), find(b)
        if a != b:
            a, b = (a, b) if order[a] < order[b] else (b, a)
            parent[b] = a

    for e in entries:  # explicit sharing
        spec = spec_of(e)
        if isinstance(spec, SharedQuantizationSpec):
            if spec.edge_or_node not in parent:
                return  # a link to an unannotated edge: torchao reports it as written
            union(e, spec.edge_or_node)

    def real_spec(e):  # the one non-shared spec of an explicit tree (None on a cycle of links)
        seen = set()
        spec = spec_of(e)
        while isinstance(spec, SharedQuantizationSpec) and e not in seen:
            seen.add(e)
            e = spec.edge_or_node
            spec = spec_of(e)
        return None if isinstance(spec, SharedQuantizationSpec) else spec

    real = {e: real_spec(e) for e in entries}
    for e in entries:  # implicit sharing between one tensor's uses
        if not isinstance(e, tuple) or not e[1].meta["quantization_annotation"].allow_implicit_sharing:
            continue
        arg, n = e
        for other in [(arg, u) for u in arg.users if u is not n] + [arg]:
            if other in parent and real[e] is not None and real[other] is not None \
                    and _same_quantization(real[e], real[other]):
                union(e, other)

    groups: dict = {}
    for e in entries:
        groups.setdefault(find(e), []).append(e)
    for first, members in groups.items():
        if not any(isinstance(spec_of(m), SharedQuantizationSpec) for m in members) \
                or any(real[m] is None or isinstance(real[m], DerivedQuantizationSpec) for m in members):
            continue  # no links to follow, or a group torchao resolves (or reports) as written
        set_spec(first, real[first])
        link = SharedQuantizationSpec(first)
        for m in members[1:]:
            set_spec(m, link)


def _observe_outputs_unclipped(model: GraphModule) -> None:
    """Give the tensors the program returns a min/max observer (follows shared-qparam ops such as
    flatten back to the op that sets the qparams)."""
    out = model.graph.output_node()
    pending = [a for a in _flat_args(out) if isinstance(a, Node)]
    unclipped = {torch.int8: activation_qspec(False, "minmax"), torch.int16: activation_qspec16(False, "minmax")}
    seen: set[Node] = set()
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        ann = node.meta.get("quantization_annotation")
        spec = getattr(ann, "output_qspec", None)
        if isinstance(spec, SharedQuantizationSpec):
            src = spec.edge_or_node
            pending.append(src[0] if isinstance(src, tuple) else src)
        elif isinstance(spec, QuantizationSpec) and not isinstance(spec, FixedQParamsQuantizationSpec):
            ann.output_qspec = unclipped[spec.dtype]


# ----------------------------------------------------------------------------- precision (A16W8)
PRECISIONS = ("int8", "int16")


WEIGHT_WIDTHS = ("int8", "int4")


def _check_width_map(arg: str, value, widths: tuple[str, ...]):
    """``value`` is one of ``widths`` or ``{key: width}`` where a key is a module-path prefix (``""``:
    the whole model, ``"encoder"``: ``encoder`` and everything under it; the longest prefix wins) or
    an ``nn.Module`` subclass (any module of that type; a type beats a path)."""
    from corten.errors import UsageError

    choices = " | ".join(repr(w) for w in widths)
    if isinstance(value, str):
        if value not in widths:  # ("auto" is resolved by corten.compile into one of these)
            raise UsageError(f"{arg} must be {choices}, 'auto' or a dict of module path / type -> {choices}, "
                             f"got {value!r}")
        return value
    if not isinstance(value, dict):
        raise UsageError(f"{arg} must be a string or a dict, got {type(value).__name__}")
    for k, v in value.items():
        if not (isinstance(k, str) or (isinstance(k, type) and issubclass(k, torch.nn.Module))):
            raise UsageError(f"{arg} key {k!r}: expected a module path prefix (str) or an nn.Module subclass")
        if v not in widths:
            raise UsageError(f"{arg}[{k!r}] = {v!r}: expected {choices}")
    return dict(value)


def check_precision(precision):
    """``"int8"`` | ``"int16"`` | ``{key: "int8" | "int16"}`` (activation widths; keys as in
    :func:`_check_width_map`)."""
    return _check_width_map("precision", precision, PRECISIONS)


def check_weights(weights):
    """``"int8"`` | ``"int4"`` | ``{key: "int8" | "int4"}`` (weight widths of the conv/linear layers;
    keys as in :func:`_check_width_map`; layers without an int4 kernel keep int8)."""
    return _check_width_map("weights", weights, WEIGHT_WIDTHS)


def _path_matches(prefix: str, path: str) -> bool:
    return prefix == "" or path == prefix or path.startswith(prefix + ".")


def _type_name(t) -> str:
    return t if isinstance(t, str) else f"{t.__module__}.{t.__qualname__}"


def precision_of(node: Node, precision) -> str:
    """The width ``precision`` (see :func:`_check_width_map`: a precision or weights request) asks
    for ``node`` ("int8" where no key matches)."""
    if isinstance(precision, str):
        return precision
    from corten.ops._rules import module_path

    stack = [v for v in (node.meta.get("nn_module_stack") or {}).values() if isinstance(v, tuple) and len(v) > 1]
    for t, want in precision.items():  # module types first: innermost module of that type
        if isinstance(t, type) and any(_type_name(v[1]) == _type_name(t) for v in stack):
            return want
    path = module_path(node)
    best = None
    for k, want in precision.items():
        if isinstance(k, str) and _path_matches(k, path) and (best is None or len(k) > len(best[0])):
            best = (k, want)
    return best[1] if best else "int8"


def _producer_dtype(node: Node) -> torch.dtype:
    """The dtype of the first float input's quantization (following shared specs back)."""
    tensors = [a for a in _flat_args(node) if isinstance(a, Node) and _is_float(a)]
    seen: set = set()
    src = tensors[0] if tensors else None
    while isinstance(src, Node) and src not in seen:
        seen.add(src)
        spec = getattr(src.meta.get("quantization_annotation"), "output_qspec", None)
        if isinstance(spec, SharedQuantizationSpec):
            e = spec.edge_or_node
            src = e[0] if isinstance(e, tuple) else e
            continue
        return getattr(spec, "dtype", torch.int8) if spec is not None else torch.int8
    return torch.int8


def _transposed_groups(node: Node) -> int:
    """``groups`` of ``aten.conv_transpose{1,2}d.input(x, w, b, stride, padding, output_padding, groups, ...)``."""
    return int(node.args[6]) if len(node.args) > 6 else int(node.kwargs.get("groups", 1))


def _integer_valued(a) -> bool:
    val = a.meta.get("val") if isinstance(a, Node) else None
    return isinstance(val, torch.Tensor) and not val.dtype.is_floating_point


def _float_tensors_only(node: Node, constant_indices: bool = False) -> bool:
    """Only float activations are quantized (``num_batches_tracked += 1`` in QAT graphs is not).
    ``constant_indices``: integer tensor arguments computed without the model's inputs (the index
    of an ``index_select`` / ``gather``) are allowed; the output must still be float."""
    if _integer_valued(node):
        return False
    for a in _flat_args(node):
        if _integer_valued(a) and not (constant_indices and _input_free(a)):
            return False
    return True


def _input_free(node: Node) -> bool:
    """True when ``node`` is computed from constants only (no placeholder upstream)."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            return False
        todo.extend(n.all_input_nodes)
    return True


def _is_float(node: Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype.is_floating_point


def _has_float_input(node: Node) -> bool:
    return any(isinstance(a, Node) and _is_float(a) for a in _flat_args(node))


def _flat_args(node: Node) -> list:
    out = []
    for a in node.args:
        out.extend(a if isinstance(a, (list, tuple)) else [a])
    return out


def quantizable_ops() -> Iterable[Callable]:
    """Every ATen op the quantizer annotates (the lowering covers the same set)."""
    import corten.ops  # noqa: F401
    from corten.ops.registry import annotated_aten_ops

    return set(annotated_aten_ops()) | set(ACTIVATIONS)
