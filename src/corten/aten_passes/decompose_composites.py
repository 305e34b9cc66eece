"""Spell out composite ATen ops that people write every day as the ops Corten lowers one by one.

``torch.export`` keeps these whole; each is replaced, before quantization, by the graph of a
small Python function (traced with ``make_fx``) written with the ops of Corten's families, so
every intermediate gets its own observer:

==========================================  ==================================================
``einsum`` (any equation)                    ATen's own einsum: permute, reshape, bmm, mul, sum
``addmm`` / ``baddbmm``                      ``beta * input + alpha * (a @ b)``
``glu(x, dim)``                              ``a * sigmoid(b)`` of the two halves
``var`` / ``std`` (any dims, correction)     ``mean``, ``sub``, ``d * d``, ``sum``, ``/ (n - c)``, ``sqrt``
``group_norm`` / ``instance_norm``           mean and variance per group (input statistics), ``rsqrt``, affine
``logsumexp``                                ``log(sum(exp(x - amax))) + amax``
``linalg_vector_norm`` (``ord`` 1, 2, inf)   ``sqrt(sum(x * x))``, ``sum(abs)``, ``amax(abs)`` (``x.norm``, ``F.normalize``)
``prelu``                                    ``where(x > 0, x, weight * x)``
``upsample_bilinear2d`` / ``_linear1d``      ``x @ Mw`` then ``Mh @ .``: constant interpolation matrices
                                             (any size / scale_factor / align_corners)
==========================================  ==================================================

The new nodes keep the original node's source line and module path, so a refusal further down
still names the line the user wrote.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from corten.aten_passes.graph_utils import add_constant, finish_rewrite

aten = torch.ops.aten


def _dims(dim, rank: int) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(rank))
    return sorted({int(d) % rank for d in (dim if isinstance(dim, (list, tuple)) else [dim])})


def _var(x, dim, correction, keepdim):
    dims = _dims(dim, x.dim())
    n = 1
    for d in dims:
        n *= x.shape[d]
    d = x - x.mean(dims, keepdim=True)
    return (d * d).sum(dims, keepdim=keepdim) / max(n - correction, 1)


def _var_args(node: Node):
    """(dim, correction, keepdim) of var/std ``.correction`` / ``.dim`` / ``.default``."""
    a, kw = node.args, node.kwargs
    if node.target in (aten.var.dim, aten.std.dim):
        dim = a[1] if len(a) > 1 else kw.get("dim")
        unbiased = a[2] if len(a) > 2 else kw.get("unbiased", True)
        keepdim = a[3] if len(a) > 3 else kw.get("keepdim", False)
        return dim, 1 if unbiased else 0, keepdim
    if node.target in (aten.var.default, aten.std.default):
        unbiased = a[1] if len(a) > 1 else kw.get("unbiased", True)
        return None, 1 if unbiased else 0, False
    dim = a[1] if len(a) > 1 else kw.get("dim")
    correction = a[2] if len(a) > 2 else kw.get("correction")
    keepdim = a[3] if len(a) > 3 else kw.get("keepdim", False)
    return dim, 1 if correction is None else float(correction), keepdim


def _normalize_groups(x, groups: int, weight, bias, eps: float):
    n, c = x.shape[0], x.shape[1]
    y = x.reshape(n, groups, -1)
    d = y - y.mean(-1, keepdim=True)
    y = d * torch.rsqrt((d * d).mean(-1, keepdim=True) + eps)
    y = y.reshape(x.shape)
    shape = [1, c] + [1] * (x.dim() - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def _interp_matrix(n_in: int, n_out: int, align_corners: bool, scale) -> torch.Tensor:
    """``[n_in, n_out]``: column j holds the weights of the inputs of output j (linear interpolation)."""
    eye = torch.eye(n_in, dtype=torch.float32).unsqueeze(0)  # n_in channels, each a one-hot row
    kw = {"size": n_out} if scale is None else {"scale_factor": float(scale), "recompute_scale_factor": False}
    return F.interpolate(eye, mode="linear", align_corners=align_corners, **kw)[0]


def _upsample_args(node: Node, spatial: int):
    x = node.args[0]
    size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
    align = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("align_corners", False))
    scales = node.args[3] if len(node.args) > 3 else node.kwargs.get("scale_factors")
    in_sizes = [int(s) for s in x.meta["val"].shape[-spatial:]]
    out_sizes = [int(s) for s in node.meta["val"].shape[-spatial:]]
    if size is not None:
        scales = None
    scales = list(scales) if scales is not None else [None] * spatial
    return align, [_interp_matrix(i, o, align, s) for i, o, s in zip(in_sizes, out_sizes, scales)]


class DecomposeCompositesPass(PassBase):
    """Replace the composite ops of the module docstring by the graphs of their Python decompositions."""

    def call(self, gm: GraphModule) -> PassResult:
        modified = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function":
                continue
            plan = self._plan(node)
            if plan is None:
                continue
            fn, tensor_args, constants = plan
            self._inline(gm, node, fn, tensor_args, constants)
            modified = True
        if modified:
            finish_rewrite(gm)
        return PassResult(gm, modified)

    # ------------------------------------------------------------------ what each op becomes
    def _plan(self, node: Node) -> tuple[Callable, list[Node], list[torch.Tensor]] | None:
        """(function of (*tensor inputs, *constants), the node's tensor inputs, constant tensors) or None."""
        t, a, kw = node.target, node.args, node.kwargs
        if not isinstance(node.meta.get("val"), torch.Tensor) or not node.meta["val"].dtype.is_floating_point:
            return None
        if t == aten.einsum.default:
            eq, ops = a[0], list(a[1])
            return (lambda *xs: torch.einsum(eq, *xs)), ops, []
        if t in (aten.addmm.default, aten.baddbmm.default):
            beta, alpha = kw.get("beta", 1), kw.get("alpha", 1)
            mm = torch.mm if t == aten.addmm.default else torch.bmm

            def addmm(c, x, y):
                p = mm(x, y)
                return (c if beta == 1 else beta * c) + (p if alpha == 1 else alpha * p)
            return addmm, list(a[:3]), []
        if t == aten.glu.default:
            dim = a[1] if len(a) > 1 else kw.get("dim", -1)

            def glu(x):
                h1, h2 = x.chunk(2, dim)
                return h1 * torch.sigmoid(h2)
            return glu, [a[0]], []
        if t in (aten.var.correction, aten.var.dim, aten.var.default, aten.std.correction, aten.std.dim,
                 aten.std.default):
            dim, corr, keepdim = _var_args(node)
            sqrt = t in (aten.std.correction, aten.std.dim, aten.std.default)
            return (lambda x: torch.sqrt(_var(x, dim, corr, keepdim)) if sqrt else _var(x, dim, corr, keepdim)), \
                [a[0]], []
        if t == aten.group_norm.default:
            groups = a[1]
            eps = a[4] if len(a) > 4 else kw.get("eps", 1e-5)
            return self._norm(a[0], groups, a[2] if len(a) > 2 else None, a[3] if len(a) > 3 else None, eps)
        if t == aten.instance_norm.default:
            use_input_stats, eps = a[5], a[7]
            if not use_input_stats:
                return None
            c = int(a[0].meta["val"].shape[1])
            return self._norm(a[0], c, a[1], a[2], eps)
        if t == aten.logsumexp.default:
            dim = a[1]
            keepdim = a[2] if len(a) > 2 else kw.get("keepdim", False)

            def lse(x):
                dims = _dims(dim, x.dim())
                m = x.amax(dims, keepdim=True)
                y = torch.log(torch.exp(x - m).sum(dims, keepdim=True)) + m
                return y if keepdim else y.squeeze(dims)
            return lse, [a[0]], []
        if t == aten.linalg_vector_norm.default:
            order = a[1] if len(a) > 1 else kw.get("ord", 2)
            dim = a[2] if len(a) > 2 else kw.get("dim")
            keepdim = a[3] if len(a) > 3 else kw.get("keepdim", False)
            if kw.get("dtype") is not None or order not in (1, 2, float("inf")):
                return None

            def norm(x):
                dims = _dims(dim, x.dim())
                if order == 2:
                    return torch.sqrt((x * x).sum(dims, keepdim=keepdim))
                if order == 1:
                    return x.abs().sum(dims, keepdim=keepdim)
                return x.abs().amax(dims, keepdim=keepdim)
            return norm, [a[0]], []
        if t == aten.prelu.default:
            x, w = a[0], a[1]
            rank = x.meta["val"].dim()
            nw = int(w.meta["val"].numel())

            def prelu(xv, wv):
                shape = [1] * rank
                if nw > 1:
                    shape[1 if rank > 1 else 0] = nw
                return torch.where(xv > 0, xv, xv * wv.reshape(shape))
            return prelu, [x, w], []
        if t in (aten.upsample_bilinear2d.vec, aten.upsample_linear1d.vec):
            spatial = 2 if t == aten.upsample_bilinear2d.vec else 1
            _, mats = _upsample_args(node, spatial)
            if spatial == 1:
                return (lambda x, mw: x @ mw), [a[0]], mats
            return (lambda x, mh, mw: mh.t() @ (x @ mw)), [a[0]], mats
        return None

    @staticmethod
    def _norm(x, groups, weight, bias, eps):
        args = [x] + [v for v in (weight, bias) if v is not None]
        has_w, has_b = weight is not None, bias is not None

        def norm(xv, *wb):
            wb = list(wb)
            w = wb.pop(0) if has_w else None
            b = wb.pop(0) if has_b else None
            return _normalize_groups(xv, int(groups), w, b, float(eps))
        return norm, args, []

    # ------------------------------------------------------------------ inlining
    @staticmethod
    def _inline(gm: GraphModule, node: Node, fn, tensor_args: list[Node], constants: list[torch.Tensor]) -> None:
        # traced on inputs with the real strides (a transposed q/k), and every view of the trace
        # becomes a reshape, which is valid whatever the strides of the tensors it is later run on
        examples = [torch.empty_strided(n.meta["val"].shape, n.meta["val"].stride(), dtype=n.meta["val"].dtype).zero_()
                    for n in tensor_args] + constants
        traced = make_fx(fn)(*examples)
        g = gm.graph
        env: dict[Node, object] = {}
        placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
        const_nodes = []
        for i, c in enumerate(constants):
            const_nodes.append(add_constant(gm, f"{node.name}_const{i}", c, node))
        for p, v in zip(placeholders, list(tensor_args) + const_nodes):
            env[p] = v
        result = None
        with g.inserting_before(node):
            for n in traced.graph.nodes:
                if n.op == "placeholder":
                    continue
                if n.op == "get_attr":
                    env[n] = add_constant(gm, f"{node.name}_{n.target}", getattr(traced, n.target), node)
                    continue
                if n.op == "output":
                    result = torch.fx.node.map_arg(n.args[0], lambda x: env[x])
                    continue
                target = aten.reshape.default if n.target in (aten.view.default, aten._unsafe_view.default) else n.target
                new = g.call_function(target, torch.fx.node.map_arg(n.args, lambda x: env[x]),
                                      torch.fx.node.map_arg(n.kwargs, lambda x: env[x]))
                new.meta["stack_trace"] = node.meta.get("stack_trace")
                new.meta["nn_module_stack"] = node.meta.get("nn_module_stack", {})
                env[n] = new
        node.replace_all_uses_with(result)
        g.erase_node(node)
