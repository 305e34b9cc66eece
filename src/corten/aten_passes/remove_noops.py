"""Remove nodes that return their input unchanged in an inference graph.

On torch 2.13 ``torch.export`` of an eval-mode model keeps ``nn.Dropout`` as
``aten.dropout.default(x, p, train=False)``; ``Tensor.clone()`` / ``.detach()`` appear as
``aten.clone.default`` / ``aten.detach.default``; ``.contiguous()`` on an already contiguous tensor
is traced away, but ``aten.contiguous`` / ``aten.alias`` may appear in other graphs; a cast to the
dtype a tensor already has (``x.float()``, ``x.to(torch.float32)``, ``x.to(y.dtype)``, ``x.type_as(y)``
on float32 tensors) is ``aten.to.dtype`` / ``_to_copy`` (with an ``_assert_tensor_metadata`` check
beside it); ``x + 0``, ``x - 0``, ``x * 1`` and ``x / 1`` (a number, or a constant tensor of that
value that does not broadcast ``x``) compute nothing either (kept, they would cost a kernel call and a
requantization whose multiplier underflows).  Each such node is removed and its users read its input
instead.

A node is kept when an in-place op (e.g. ``hardtanh_``) writes to its output or to its input while
the other one is still read: there the copy protects the original value.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.graph_utils import constant_value, finish_rewrite, is_mutating

aten = torch.ops.aten

IDENTITY_OPS = {
    aten.clone.default,
    aten.alias.default,
    aten.detach.default,
    aten.contiguous.default,
}
# Dropout variants: (input, p, train); identities when train is False or p == 0.  The in-place ones
# (``nn.Dropout(inplace=True)``, e.g. torchvision's MobileNetV3 classifier) write nothing then.
DROPOUT_OPS = {
    aten.dropout.default,
    aten.feature_dropout.default,
    aten.alpha_dropout.default,
    aten.feature_alpha_dropout.default,
    aten.dropout_.default,
    aten.feature_dropout_.default,
    aten.alpha_dropout_.default,
    aten.feature_alpha_dropout_.default,
}


# Casts: identities when the dtype does not change (``x.float()``, ``x.to(torch.float32)``,
# ``x.to(y.dtype)``, ``x.type(torch.float32)``, ``x.type_as(y)`` on float32 tensors; memory-format and
# copy arguments change no value).
CAST_OPS = {getattr(getattr(aten, op), overload) for op, overload in (
    ("to", "dtype"), ("to", "dtype_layout"), ("to", "other"), ("to", "device"), ("_to_copy", "default"),
    ("type_as", "default"), ("_assert_tensor_metadata", "default")) if hasattr(getattr(aten, op, None), overload)}


# ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1`` (MobileOne's ``identity_out = 0; out = scale_out +
# identity_out``): the operand that leaves x as it is, per op (a Python number or a constant tensor
# of that value that does not broadcast x to a larger shape).
NEUTRAL = {aten.add.Tensor: 0.0, aten.add.Scalar: 0.0, aten.sub.Tensor: 0.0, aten.sub.Scalar: 0.0,
           aten.mul.Tensor: 1.0, aten.mul.Scalar: 1.0, aten.div.Tensor: 1.0, aten.div.Scalar: 1.0}


def is_neutral_operand(node: Node, other) -> bool:
    """``other`` (the second operand of ``node``, a number or a constant tensor's value) leaves the
    first operand unchanged under ``node``'s op."""
    want = NEUTRAL.get(node.target)
    if want is None or len(node.args) < 2 or node.kwargs.get("rounding_mode") is not None:
        return False
    out, x = node.meta.get("val"), node.args[0].meta.get("val")
    if not (isinstance(out, torch.Tensor) and isinstance(x, torch.Tensor) and out.shape == x.shape
            and out.dtype == x.dtype and x.dtype.is_floating_point):
        return False
    if isinstance(other, bool) or not isinstance(other, (int, float, torch.Tensor)):
        return False
    if isinstance(other, torch.Tensor):
        return other.numel() > 0 and bool((other == want).all())
    return float(other) == want


def _same_dtype(node: Node) -> bool:
    out, src = node.meta.get("val"), node.args[0].meta.get("val")
    if node.target == aten._assert_tensor_metadata.default:
        return not node.users  # a check torch.export leaves behind casts; it computes nothing
    return (isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor) and out.dtype == src.dtype
            and out.shape == src.shape and out.device == src.device)


def is_noop(node: Node) -> bool:
    """True when ``node`` returns its first argument's value unchanged."""
    if node.op != "call_function" or not isinstance(node.args[0] if node.args else None, Node):
        return False
    if node.target in IDENTITY_OPS:
        return True
    if node.target in CAST_OPS:
        return _same_dtype(node)
    if node.target in NEUTRAL and not isinstance(node.args[1] if len(node.args) > 1 else None, Node):
        return is_neutral_operand(node, node.args[1])
    if node.target in DROPOUT_OPS:
        p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p")
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
        return train is False or p == 0
    return False


def copy_protects_input(node: Node) -> bool:
    """True when removing ``node`` would let an in-place op change a value still needed: a user
    writes to ``node``'s output while the input is read elsewhere (or is a graph input /
    parameter), or another user of the input writes to it while ``node``'s output is still read."""
    source = node.args[0]
    if any(is_mutating(user) for user in node.users):
        if source.op in ("placeholder", "get_attr") or len(source.users) > 1:
            return True
    return any(is_mutating(user) for user in source.users if user is not node)


def _neutral_constant(gm: GraphModule, node: Node) -> bool:
    """``x + zeros``, ``x * ones`` with a constant tensor (``get_attr``) of the neutral value."""
    other = node.args[1] if node.op == "call_function" and node.target in NEUTRAL and len(node.args) > 1 else None
    if not (isinstance(other, Node) and other.op == "get_attr" and isinstance(node.args[0], Node)):
        return False
    return is_neutral_operand(node, constant_value(gm, other))


class RemoveNoOpsPass(PassBase):
    """Remove eval-mode dropout, clone, alias, detach and contiguous nodes, casts to the dtype a
    tensor already has, and ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``."""

    def call(self, graph_module: GraphModule) -> PassResult:
        modified = False
        for node in list(graph_module.graph.nodes):
            if (is_noop(node) or _neutral_constant(graph_module, node)) and not copy_protects_input(node):
                node.replace_all_uses_with(node.args[0])
                graph_module.graph.erase_node(node)
                modified = True
        if modified:
            # without the copies a ``view`` may read a non-contiguous tensor (MultiheadAttention's
            # ``.contiguous()`` before ``select`` + ``view`` at batch > 1); the graph is functional by
            # now (in-place ops are gone), so the equivalent reshape computes the same values
            for node in graph_module.graph.nodes:
                if node.op == "call_function" and node.target == aten.view.default:
                    node.target = aten.reshape.default
            finish_rewrite(graph_module)
        return PassResult(graph_module, modified)
