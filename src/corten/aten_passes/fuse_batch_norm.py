"""Fold eval-mode BatchNorm into the convolution or linear layer that produces its input.

``BN(conv(x, W, b)) == conv(x, W * scale[o], (b - mean) * scale + beta)`` per output channel ``o``.
The fold is done only when it is exact: the producer's output is used by the BatchNorm alone (a
skip connection or any other consumer needs the un-normalised value, so the BatchNorm stays for
:class:`~corten.aten_passes.BatchNormToDepthwiseConvPass`), and the producer's weight and bias are
constants (``get_attr``).  Fused weights and biases are new parameters of the GraphModule; the
original ones (possibly shared with the user's model) are never modified.

These passes run on the ATen graph before quantization, so the quantizer sees (and calibrates) the
fused convolution.  Note that torchao's ``prepare_pt2e`` also folds conv + BN on its own; running
this first makes Corten independent of that.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.batch_norm import BatchNormMatch, batch_norms
from corten.aten_passes.graph_utils import (add_constant, arg_or_kwarg, constant_value, erase_if_unused,
                                            finish_rewrite, is_constant, set_arg)

aten = torch.ops.aten


@dataclass(frozen=True)
class _ConvSchema:
    transposed_index: int | None  # argument holding the 'transposed' flag (aten.convolution only)
    transposed: bool  # fixed value when transposed_index is None
    groups_index: int


CONV_OPS: dict[object, _ConvSchema] = {
    aten.conv1d.default: _ConvSchema(None, False, 6),
    aten.conv2d.default: _ConvSchema(None, False, 6),
    aten.conv1d.padding: _ConvSchema(None, False, 6),
    aten.conv2d.padding: _ConvSchema(None, False, 6),
    aten.conv_transpose1d.default: _ConvSchema(None, True, 6),
    aten.conv_transpose2d.input: _ConvSchema(None, True, 6),
    aten.convolution.default: _ConvSchema(6, False, 8),
}
LINEAR_OPS = {aten.linear.default}


def _is_transposed(conv: Node) -> bool:
    schema = CONV_OPS[conv.target]
    if schema.transposed_index is None:
        return schema.transposed
    return bool(conv.args[schema.transposed_index])


def _groups(conv: Node) -> int:
    return int(arg_or_kwarg(conv, CONV_OPS[conv.target].groups_index, "groups", 1))


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
    weight, bias = producer.args[1], arg_or_kwarg(producer, 2, "bias")
    if not (isinstance(weight, Node) and is_constant(weight) and is_constant(bias)):
        return None
    if not bn.has_constant_parameters:
        return None
    return producer


def _replace_weight_and_bias(gm: GraphModule, producer: Node, bn: BatchNormMatch,
                             weight: torch.Tensor, bias: torch.Tensor) -> None:
    old_weight, old_bias = producer.args[1], arg_or_kwarg(producer, 2, "bias")
    base = f"{producer.name}_bn_fused"
    producer.update_arg(1, add_constant(gm, f"{base}_weight", weight, before=producer))
    set_arg(producer, 2, "bias", add_constant(gm, f"{base}_bias", bias, before=producer))
    bn.erase(gm, replacement=producer)
    erase_if_unused(gm, (old_weight, old_bias))


def _fused_bias(old_bias: torch.Tensor | None, scale: torch.Tensor, shift: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
    bias = torch.zeros_like(scale) if old_bias is None else old_bias.double()
    return (bias * scale + shift).to(dtype)


class FuseBatchNormIntoConvPass(PassBase):
    """Fold BatchNorm into a preceding conv1d / conv2d (incl. depthwise and grouped) /
    conv_transpose1d / conv_transpose2d / aten.convolution, creating a bias when there was none."""

    def call(self, graph_module: GraphModule) -> PassResult:
        modified = False
        for bn in batch_norms(graph_module):
            conv = _foldable_producer(bn, CONV_OPS)
            if conv is None:
                continue
            weight = constant_value(graph_module, conv.args[1])
            transposed, groups = _is_transposed(conv), _groups(conv)
            scale, shift = bn.scale_and_shift(graph_module)
            if _conv_out_channels(weight, transposed, groups) != scale.numel():
                continue
            fused_weight = fold_scale_into_conv_weight(weight.double(), scale, transposed, groups)
            fused_bias = _fused_bias(constant_value(graph_module, arg_or_kwarg(conv, 2, "bias")),
                                     scale, shift, weight.dtype)
            _replace_weight_and_bias(graph_module, conv, bn, fused_weight.to(weight.dtype), fused_bias)
            modified = True
        if modified:
            finish_rewrite(graph_module)
        return PassResult(graph_module, modified)


def _rank(node: Node) -> int | None:
    val = node.meta.get("val")
    return val.dim() if isinstance(val, torch.Tensor) else None


class FuseBatchNormIntoLinearPass(PassBase):
    """Fold BatchNorm1d into a preceding ``aten.linear`` whose output is 2-D ``[N, C]``
    (for a 3-D linear output BatchNorm1d normalises dimension 1, which is not the feature
    dimension, so it is left alone)."""

    def call(self, graph_module: GraphModule) -> PassResult:
        modified = False
        for bn in batch_norms(graph_module):
            linear = _foldable_producer(bn, LINEAR_OPS)
            if linear is None or _rank(linear) != 2:
                continue
            weight = constant_value(graph_module, linear.args[1])
            scale, shift = bn.scale_and_shift(graph_module)
            if weight.shape[0] != scale.numel():
                continue
            fused_weight = (weight.double() * scale[:, None]).to(weight.dtype)
            fused_bias = _fused_bias(constant_value(graph_module, arg_or_kwarg(linear, 2, "bias")),
                                     scale, shift, weight.dtype)
            _replace_weight_and_bias(graph_module, linear, bn, fused_weight, fused_bias)
            modified = True
        if modified:
            finish_rewrite(graph_module)
        return PassResult(graph_module, modified)
