"""BatchNorm, one path: recognise each BatchNorm node, compute its per-channel affine form, and
either fold it into the conv / linear producing its input or rewrite it as a depthwise 1x1 conv.

In eval mode ``torch.export`` (torch 2.13, training IR, as returned by ``export(...).module()``)
emits ``aten.batch_norm.default(x, weight, bias, running_mean, running_var, training=False,
momentum, eps, cudnn_enabled)``.  After ``run_decompositions()`` the same BatchNorm is
``aten._native_batch_norm_legit_no_training.default`` followed by ``getitem(·, 0)``; both forms
(and ``native_batch_norm`` / ``_native_batch_norm_legit`` in eval mode) are handled.

In eval mode a BatchNorm is ``y = x * scale + shift`` per channel (dimension 1) with
``scale = gamma / sqrt(running_var + eps)`` and ``shift = beta - running_mean * scale``.
:class:`FoldBatchNormPass` applies that affine, for each BatchNorm in graph order, in one of two ways:

* **folded** into the producer of its input: ``BN(conv(x, W, b)) == conv(x, W * scale[o], (b - mean) *
  scale + beta)`` per output channel ``o`` (conv1d / conv2d incl. depthwise and grouped, transposed
  convs, ``aten.convolution``; ``aten.linear`` with a 2-D ``[N, C]`` output).  Only when exact: the
  producer's output is used by the BatchNorm alone (a skip connection needs the un-normalised value)
  and its weight and bias are constants.  Fused weights and biases are new parameters; the original
  ones (possibly shared with the user's model) are never modified.
* otherwise **rewritten** as a depthwise 1x1 ``aten.conv2d`` (``groups = C``, weight ``scale`` shaped
  ``[C, 1, 1, 1]``, bias ``shift``), with reshapes around it for other ranks: 3-D ``[N, C, L]`` via
  ``unsqueeze(x, 2)`` / ``squeeze(., 2)``, 2-D ``[N, C]`` via ``view(x, [N, C, 1, 1])`` / ``view(., [N, C])``.

Afterwards no BatchNorm remains (checked in :meth:`FoldBatchNormPass.ensures`).  This runs on the ATen
graph before quantization, so the quantizer sees (and calibrates) the fused convolution; torchao's
``prepare_pt2e`` would also fold conv + BN on its own, running this first makes Corten independent of
that.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Iterator

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.graph_utils import (AtenPassError, add_constant, constant_value,
                                            erase_if_unused, finish_rewrite, is_constant, set_arg)
from corten.fx_nodes import node_arg

aten = torch.ops.aten


@dataclass(frozen=True)
class _BatchNormSchema:
    training_index: int | None  # None: the op is eval-only
    eps_index: int
    returns_tuple: bool  # output is getitem(node, 0)


BATCH_NORM_OPS: dict[object, _BatchNormSchema] = {
    aten.batch_norm.default: _BatchNormSchema(5, 7, False),
    aten._native_batch_norm_legit_no_training.default: _BatchNormSchema(None, 6, True),
    aten._native_batch_norm_legit.default: _BatchNormSchema(5, 7, True),
    aten.native_batch_norm.default: _BatchNormSchema(5, 7, True),
}


def is_batch_norm(node: Node) -> bool:
    return node.op == "call_function" and node.target in BATCH_NORM_OPS


@dataclass(frozen=True)
class BatchNormMatch:
    """One eval-mode BatchNorm in the graph.

    ``node`` is the BatchNorm call, ``output`` the node carrying the normalised tensor (``node``
    itself, or its ``getitem(·, 0)`` for the tuple-returning forms), ``input`` the normalised value.
    """

    node: Node
    output: Node
    input: Node
    weight: Node | None
    bias: Node | None
    running_mean: Node
    running_var: Node
    eps: float

    @property
    def has_constant_parameters(self) -> bool:
        return all(is_constant(a) for a in (self.weight, self.bias, self.running_mean, self.running_var))

    def scale_and_shift(self, gm: GraphModule) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel ``(scale, shift)`` in float64 (the caller rounds once to the weight dtype)."""
        if not self.has_constant_parameters:
            raise AtenPassError(
                f"BatchNorm {self.node.name}: weight/bias/running statistics are not constants (get_attr); "
                "run the ATen passes on capture_module(...)'s GraphModule, not on ExportedProgram.graph")
        mean = constant_value(gm, self.running_mean).double()
        var = constant_value(gm, self.running_var).double()
        gamma = constant_value(gm, self.weight)
        beta = constant_value(gm, self.bias)
        gamma = torch.ones_like(mean) if gamma is None else gamma.double()
        beta = torch.zeros_like(mean) if beta is None else beta.double()
        scale = gamma / torch.sqrt(var + self.eps)
        return scale, beta - mean * scale

    def erase(self, gm: GraphModule, replacement: Node) -> None:
        """Send every use of the BatchNorm's output to ``replacement`` and erase the BatchNorm
        (with its getitems and the parameter get_attr nodes nothing else uses)."""
        self.output.replace_all_uses_with(replacement)
        for user in list(self.node.users):  # the getitems, all unused now (checked when matched)
            gm.graph.erase_node(user)
        gm.graph.erase_node(self.node)
        erase_if_unused(gm, (self.weight, self.bias, self.running_mean, self.running_var))


def match_batch_norm(node: Node) -> BatchNormMatch | None:
    """The :class:`BatchNormMatch` for ``node``, or None when ``node`` is not a BatchNorm.

    Raises :class:`AtenPassError` for a training-mode BatchNorm or one without running statistics
    (``track_running_stats=False``): both normalise with batch statistics, which Corten cannot
    compile.
    """
    if not is_batch_norm(node):
        return None
    schema = BATCH_NORM_OPS[node.target]
    args = node.args
    if schema.training_index is not None and args[schema.training_index]:
        raise AtenPassError(f"BatchNorm {node.name} is in training mode (uses batch statistics); "
                            "call model.eval() before capture")
    if args[3] is None or args[4] is None:
        raise AtenPassError(f"BatchNorm {node.name} has no running statistics (track_running_stats=False) "
                            "and normalises with batch statistics; Corten needs running_mean/running_var")
    output = node
    if schema.returns_tuple:
        firsts = [u for u in node.users if u.target is operator.getitem and u.args[1] == 0]
        if len(firsts) != 1:
            raise AtenPassError(f"BatchNorm {node.name}: expected exactly one getitem(·, 0) user, "
                                f"found users {[u.name for u in node.users]}")
        output = firsts[0]
        used_stats = [u.name for u in node.users if u is not output and u.users]
        if used_stats:
            raise AtenPassError(f"BatchNorm {node.name}: its saved mean / invstd outputs {used_stats} are "
                                "used; only eval-mode BatchNorm (normalised output only) is supported")
    return BatchNormMatch(node=node, output=output, input=args[0], weight=args[1], bias=args[2],
                          running_mean=args[3], running_var=args[4], eps=float(args[schema.eps_index]))


def batch_norms(gm: GraphModule) -> Iterator[BatchNormMatch]:
    """Every BatchNorm in ``gm`` in graph order, each matched when reached so that rewriting
    one BatchNorm (e.g. the producer of the next) while iterating is safe."""
    for node in list(gm.graph.nodes):
        match = match_batch_norm(node)
        if match is not None:
            yield match


# ---------------------------------------------------------------------------- folding
# conv ops -> whether their weight is transposed ([Cin, Cout/groups, *k]); None: the ``transposed`` argument says
CONV_OPS: dict[object, bool | None] = {
    aten.conv1d.default: False, aten.conv2d.default: False, aten.conv1d.padding: False, aten.conv2d.padding: False,
    aten.conv_transpose1d.default: True, aten.conv_transpose2d.input: True, aten.convolution.default: None,
}
LINEAR_OPS = {aten.linear.default}


def _is_transposed(conv: Node) -> bool:
    fixed = CONV_OPS[conv.target]
    return bool(node_arg(conv, "transposed")) if fixed is None else fixed


def _groups(conv: Node) -> int:
    return int(node_arg(conv, "groups", 1))


def fold_scale_into_conv_weight(weight: torch.Tensor, scale: torch.Tensor, transposed: bool,
                                groups: int) -> torch.Tensor:
    """Multiply each output channel of a conv weight by ``scale``.

    Conv weights are ``[Cout, Cin/groups, *k]`` (output channel first).  Transposed conv weights
    are ``[Cin, Cout/groups, *k]``: group ``g`` holds input channels ``g*Cin/groups ...`` and its
    ``j``-th column feeds output channel ``g*Cout/groups + j``.
    """
    kernel_dims = [1] * (weight.dim() - 2)
    if not transposed:
        return weight * scale.reshape(-1, 1, *kernel_dims)
    cin, cout_per_group = weight.shape[:2]
    grouped = weight.reshape(groups, cin // groups, cout_per_group, *weight.shape[2:])
    return (grouped * scale.reshape(groups, 1, cout_per_group, *kernel_dims)).reshape(weight.shape)


def _conv_out_channels(weight: torch.Tensor, transposed: bool, groups: int) -> int:
    return weight.shape[1] * groups if transposed else weight.shape[0]


def _foldable_producer(bn: BatchNormMatch, targets) -> Node | None:
    producer = bn.input
    if not (isinstance(producer, Node) and producer.op == "call_function" and producer.target in targets):
        return None
    if len(producer.users) != 1:  # a skip connection or another consumer needs the raw output
        return None
    weight, bias = producer.args[1], node_arg(producer, "bias", None)
    if not (isinstance(weight, Node) and is_constant(weight) and is_constant(bias)):
        return None
    if not bn.has_constant_parameters:
        return None
    return producer


def _replace_weight_and_bias(gm: GraphModule, producer: Node, bn: BatchNormMatch,
                             weight: torch.Tensor, bias: torch.Tensor) -> None:
    old_weight, old_bias = producer.args[1], node_arg(producer, "bias", None)
    base = f"{producer.name}_bn_fused"
    producer.update_arg(1, add_constant(gm, f"{base}_weight", weight, before=producer))
    set_arg(producer, 2, "bias", add_constant(gm, f"{base}_bias", bias, before=producer))
    bn.erase(gm, replacement=producer)
    erase_if_unused(gm, (old_weight, old_bias))


def _fused_bias(old_bias: torch.Tensor | None, scale: torch.Tensor, shift: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
    bias = torch.zeros_like(scale) if old_bias is None else old_bias.double()
    return (bias * scale + shift).to(dtype)


def _rank(node: Node) -> int | None:
    val = node.meta.get("val")
    return val.dim() if isinstance(val, torch.Tensor) else None



# ---------------------------------------------------------------------------- depthwise rewrite
def _input_shape(bn: BatchNormMatch) -> torch.Size:
    val = bn.input.meta.get("val") if isinstance(bn.input, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        raise AtenPassError(f"BatchNorm {bn.node.name}: the shape of its input {bn.input} is unknown "
                            "(no meta['val']); run the pass on a torch.export graph (capture_module)")
    return val.shape


def _copy_origin(new: Node, bn: BatchNormMatch) -> None:
    for key in ("nn_module_stack", "stack_trace", "source_fn_stack"):
        if key in bn.node.meta:
            new.meta[key] = bn.node.meta[key]
    new.meta["corten_from"] = f"batch_norm:{bn.node.name}"


def _depthwise_affine(gm: GraphModule, bn: BatchNormMatch) -> Node:
    """Insert the depthwise conv (with the reshapes its rank needs) replacing ``bn``; return its output."""
    shape = _input_shape(bn)
    if len(shape) not in (2, 3, 4):
        raise AtenPassError(f"BatchNorm {bn.node.name} normalises a {len(shape)}-D tensor {tuple(shape)}; "
                            "only 2-D, 3-D and 4-D inputs (BatchNorm1d / BatchNorm2d) are supported")
    channels = shape[1]
    scale, shift = bn.scale_and_shift(gm)
    dtype = bn.input.meta["val"].dtype
    base = f"{bn.node.name}_depthwise"
    weight = add_constant(gm, f"{base}_weight", scale.to(dtype).reshape(channels, 1, 1, 1), before=bn.node)
    bias = add_constant(gm, f"{base}_bias", shift.to(dtype), before=bn.node)
    graph = gm.graph
    with graph.inserting_before(bn.node):
        if len(shape) == 4:
            x = bn.input
        elif len(shape) == 3:
            x = graph.call_function(aten.unsqueeze.default, (bn.input, 2))
        else:
            x = graph.call_function(aten.view.default, (bn.input, [shape[0], channels, 1, 1]))
        y = graph.call_function(aten.conv2d.default,
                                (x, weight, bias, [1, 1], [0, 0], [1, 1], channels))
        out = y
        if len(shape) == 3:
            out = graph.call_function(aten.squeeze.dim, (y, 2))
        elif len(shape) == 2:
            out = graph.call_function(aten.view.default, (y, list(shape)))
    for new in {x, y, out} - {bn.input}:
        _copy_origin(new, bn)
    return out


def _fold_into_conv(gm: GraphModule, bn: BatchNormMatch) -> bool:
    conv = _foldable_producer(bn, CONV_OPS)
    if conv is None:
        return False
    weight = constant_value(gm, conv.args[1])
    transposed, groups = _is_transposed(conv), _groups(conv)
    scale, shift = bn.scale_and_shift(gm)
    if _conv_out_channels(weight, transposed, groups) != scale.numel():
        return False
    fused_weight = fold_scale_into_conv_weight(weight.double(), scale, transposed, groups)
    fused_bias = _fused_bias(constant_value(gm, node_arg(conv, "bias", None)), scale, shift, weight.dtype)
    _replace_weight_and_bias(gm, conv, bn, fused_weight.to(weight.dtype), fused_bias)
    return True


def _fold_into_linear(gm: GraphModule, bn: BatchNormMatch) -> bool:
    """BatchNorm1d after an ``aten.linear`` whose output is 2-D ``[N, C]`` (on a 3-D linear output
    BatchNorm1d normalises dimension 1, which is not the feature dimension)."""
    linear = _foldable_producer(bn, LINEAR_OPS)
    if linear is None or _rank(linear) != 2:
        return False
    weight = constant_value(gm, linear.args[1])
    scale, shift = bn.scale_and_shift(gm)
    if weight.shape[0] != scale.numel():
        return False
    fused_weight = (weight.double() * scale[:, None]).to(weight.dtype)
    fused_bias = _fused_bias(constant_value(gm, node_arg(linear, "bias", None)), scale, shift, weight.dtype)
    _replace_weight_and_bias(gm, linear, bn, fused_weight, fused_bias)
    return True


class FoldBatchNormPass(PassBase):
    """Every BatchNorm, in graph order: folded into its conv / linear producer when exact, else
    rewritten as a depthwise 1x1 conv (see the module docstring).  ``steps`` restricts the pass to
    some of the three (``"conv"``, ``"linear"``, ``"depthwise"``), in that order of preference: the
    names below keep the three passes Corten had before this one path."""

    STEPS = ("conv", "linear", "depthwise")

    def __init__(self, steps: tuple[str, ...] = STEPS) -> None:
        super().__init__()
        unknown = set(steps) - set(self.STEPS)
        if unknown:
            raise ValueError(f"FoldBatchNormPass steps {sorted(unknown)}: use {self.STEPS}")
        self.steps = tuple(s for s in self.STEPS if s in steps)

    def call(self, graph_module: GraphModule) -> PassResult:
        folds = {"conv": _fold_into_conv, "linear": _fold_into_linear}
        modified = False
        for bn in batch_norms(graph_module):
            if any(folds[s](graph_module, bn) for s in self.steps if s in folds):
                modified = True
            elif "depthwise" in self.steps:
                bn.erase(graph_module, replacement=_depthwise_affine(graph_module, bn))
                modified = True
        if modified:
            finish_rewrite(graph_module)
        return PassResult(graph_module, modified)

    def ensures(self, graph_module: GraphModule) -> None:
        left = [n.name for n in graph_module.graph.nodes if is_batch_norm(n)]
        if left and "depthwise" in self.steps:
            raise AtenPassError(f"BatchNorm nodes {left} are still in the graph after {type(self).__name__}")


class FuseBatchNormIntoConvPass(FoldBatchNormPass):
    """:class:`FoldBatchNormPass` folding into convolutions only (the others stay)."""

    def __init__(self) -> None:
        super().__init__(("conv",))


class FuseBatchNormIntoLinearPass(FoldBatchNormPass):
    """:class:`FoldBatchNormPass` folding into 2-D ``aten.linear`` only."""

    def __init__(self) -> None:
        super().__init__(("linear",))


class BatchNormToDepthwiseConvPass(FoldBatchNormPass):
    """:class:`FoldBatchNormPass` rewriting every BatchNorm as a depthwise 1x1 conv (no fold)."""

    def __init__(self) -> None:
        super().__init__(("depthwise",))
