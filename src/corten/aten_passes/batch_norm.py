"""Recognise BatchNorm nodes in ATen graphs and compute their per-channel affine form.

In eval mode ``torch.export`` (torch 2.13, training IR, as returned by ``export(...).module()``)
emits ``aten.batch_norm.default(x, weight, bias, running_mean, running_var, training=False,
momentum, eps, cudnn_enabled)``.  After ``run_decompositions()`` the same BatchNorm is
``aten._native_batch_norm_legit_no_training.default`` followed by ``getitem(·, 0)``; both forms
(and ``native_batch_norm`` / ``_native_batch_norm_legit`` in eval mode) are handled.

In eval mode a BatchNorm is ``y = x * scale + shift`` per channel (dimension 1) with
``scale = gamma / sqrt(running_var + eps)`` and ``shift = beta - running_mean * scale``.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Iterator

import torch
from torch.fx import GraphModule, Node

from corten.aten_passes.graph_utils import AtenPassError, constant_value, erase_if_unused, is_constant

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
