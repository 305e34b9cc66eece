"""Rewrite every BatchNorm left after folding as a depthwise 1x1 convolution.

An eval-mode BatchNorm is a per-channel affine ``y = x * scale + shift``, which is exactly a
depthwise 1x1 ``aten.conv2d`` (``groups = C``, weight ``scale`` shaped ``[C, 1, 1, 1]``, bias
``shift``): an op the quantizer and CMSIS-NN already handle.  Inputs of other ranks are reshaped
around it (static shapes, batch 1):

* 4-D ``[N, C, H, W]``: ``conv2d`` directly;
* 3-D ``[N, C, L]``: ``unsqueeze(x, 2)`` -> ``[N, C, 1, L]`` -> ``conv2d`` -> ``squeeze(·, 2)``;
* 2-D ``[N, C]``: ``view(x, [N, C, 1, 1])`` -> ``conv2d`` -> ``view(·, [N, C])``.

Afterwards no BatchNorm remains (checked in :meth:`BatchNormToDepthwiseConvPass.ensures`).
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.batch_norm import BatchNormMatch, batch_norms, is_batch_norm
from corten.aten_passes.graph_utils import AtenPassError, add_constant, finish_rewrite

aten = torch.ops.aten


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


class BatchNormToDepthwiseConvPass(PassBase):
    """Replace each remaining BatchNorm with an equivalent depthwise 1x1 ``aten.conv2d``."""

    def call(self, graph_module: GraphModule) -> PassResult:
        modified = False
        for bn in batch_norms(graph_module):
            bn.erase(graph_module, replacement=_depthwise_affine(graph_module, bn))
            modified = True
        if modified:
            finish_rewrite(graph_module)
        return PassResult(graph_module, modified)

    def ensures(self, graph_module: GraphModule) -> None:
        left = [n.name for n in graph_module.graph.nodes if is_batch_norm(n)]
        if left:
            raise AtenPassError(f"BatchNorm nodes {left} are still in the graph after {type(self).__name__}")
