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
``batch_norm`` with batch statistics         mean and variance per channel over N and the spatial dims
(``track_running_stats=False``)              (BatchNorms with running statistics are folded later)
``logsumexp``                                ``log(sum(exp(x - amax))) + amax``
``rms_norm`` (``nn.RMSNorm``)                 ``x * rsqrt(mean(x ** 2) + eps) * weight``
``linalg_vector_norm`` (``ord`` 1, 2, inf)   ``sqrt(sum(x * x))``, ``sum(abs)``, ``amax(abs)`` (``x.norm``, ``F.normalize``)
``prelu``                                    ``where(x > 0, x, weight * x)``
``upsample_bilinear2d`` / ``_linear1d`` /   ``x @ Mw`` then ``Mh @ .``: constant interpolation matrices
``upsample_bicubic2d``, ``antialias=True``  (any size / scale_factor / align_corners; bicubic: PyTorch's
                                             separable cubic with clamped borders; the anti-aliased filters)
``pow(x, p)``, ``p`` a 1-element constant    ``x ** float(p)`` (GeM's learned exponent)
``linear`` with a 1-D weight                 ``[1, in]`` weight, the output dim dropped (NanoDet's ``Integral``)
grouped ``conv_transpose1d/2d``               ``groups=1`` with the block-diagonal weight (``groups`` x the MACs)
``avg_pool3d`` ``(k, 1, 1)`` on              a 1x1 conv with a constant band weight (``LocalResponseNorm``'s
``[N, 1, C, H, W]`` (after a zero pad on C)  channel-window mean, the pad folded in)
``gru_cell`` / ``lstm_cell`` / ``rnn_*_cell``  the cell equations (linear, sigmoid, tanh, mul, add, ``1 - z``)
``nn.GRU`` / ``nn.RNN`` (any layers, both     unrolled over time: one linear over the whole sequence per layer and
directions, given ``h0``), ``nn.LSTM``       direction, the cells per step, ``cat`` of the directions; a zero
bidirectional, reading ``c_n``, with given   initial state drops the terms it multiplies
``(h0, c0)`` or ``proj_size``
``cumsum(x, dim)``                            ``x @ triu(ones)`` along ``dim`` (a constant 0/1 matrix)
``cosine_similarity(a, b, dim)``             ``sum(a * b) / (max(|a|, eps) * max(|b|, eps))``
``linear`` on a 4-D/5-D tensor               ``reshape`` to ``[N, -1, C]``, ``linear``, ``reshape`` back (the
                                             channels-last ``x.permute(0, 2, 3, 1)`` of ConvNeXt blocks)
``x.mean()`` / ``sum`` / ``max`` / ``min`` /  the reduction over every dim with ``keepdim``; users that
``std`` / ``var`` (all dims, 0-D)            broadcast it read that directly, others a ``reshape`` to ``[]``
``var_mean``                                 ``var`` and ``mean`` as above
``lerp`` / ``addcmul`` / ``addcdiv``          ``a + w * (b - a)``, ``a + v * b * c``, ``a + v * b / c``
``hypot`` / ``pairwise_distance`` (p 1, 2)   ``sqrt(a * a + b * b)``, ``sqrt(sum(d * d))`` / ``sum(abs(d))``,
                                             ``d = a - b + eps``
``adaptive_max_pool1d``                      ``adaptive_max_pool2d`` on ``[N, C, 1, L]`` (same indices)
``max_pool1d/2d_with_indices``, indices unread  the plain ``max_pool1d/2d``
``pad`` reflect / replicate / circular       ``index_select`` with constant indices per padded dim (exact bytes)
``pad(value=-inf)`` read only by max pools  the same as a replicate pad (timm's ``max_pool2d_same``)
``where(c1 & c2, a, b)``, ``|``, ``~``      nested ``where`` on the comparisons (no boolean tensors)
``softmax(x.masked_fill(mask, -inf))``       ``p = softmax(x * keep + amin(x) * (1 - keep)) * keep; p / p.sum()``
                                             (``keep = ~mask``, a constant): the masked softmax of causal
                                             attention, exact in real numbers, its row maximum a kept score;
``softmax(x + m)``, ``m`` constant 0 / -inf    the same with ``keep = m == 0`` (an additive float attention mask)
==========================================  ==================================================

``max_unpool2d``, ``grid_sample`` and ``affine_grid`` (addresses computed from the data) are refused with
the reason and what to write instead.

Before that, constant subgraphs are folded: tensors made by factories (``torch.zeros(b, h)``,
``zeros_like(x)`` - its shape only -, ``ones``, ``full``, ``arange``, ``eye``) and any op whose inputs
are all constants (``self.tril == 0``, ``w * mask``, ``const.type_as(x)``) become constants, so an RNN
cell's zero initial state or a registered causal mask feeds the ops after it as a constant operand.  Random
ops are never folded, and a factory that is itself a program output stays (and is refused by name).

The new nodes keep the original node's source line and module path, so a refusal further down
still names the line the user wrote.
"""
from __future__ import annotations

import math
import operator
from typing import Callable

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from corten.aten_passes.batch_norm import match_batch_norm
from corten.aten_passes.graph_utils import add_constant, is_mutating
from corten.aten_passes.remove_noops import CAST_OPS, copy_protects_input, is_noop
from corten.aten_passes.rewrites import Refusal, Rewrite, RewriteTable, RewriteTablePass
from corten.fx_nodes import get_attr, node_arg

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
    if node.target in (aten.var.dim, aten.std.dim, aten.var_mean.dim, aten.std_mean.dim):
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


# x.mean() / x.sum() / x.max() / x.min() (0-D): the reduction over every dim with keepdim
FULL_REDUCTIONS = {aten.mean.default: torch.mean, aten.sum.default: torch.sum,
                   aten.max.default: torch.amax, aten.min.default: torch.amin}
_BROADCAST_USERS = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor}


_SCALAR_UNARY = {aten.sqrt.default, aten.rsqrt.default, aten.abs.default, aten.neg.default, aten.exp.default,
                 aten.log.default, aten.reciprocal.default, aten.clamp.default, aten.clamp_min.default,
                 aten.clamp_max.default, aten.relu.default, aten.sigmoid.default, aten.tanh.default}


def _zero_d(node: Node, keepdim_fn: Callable) -> Callable:
    """The decomposition of a 0-D reduction ``node``: ``keepdim_fn`` (the ``[1, ..., 1]`` result) when
    every path from it ends in an elementwise op broadcasting it against a tensor with every dim
    (``[1, ..., 1]`` broadcasts as ``[]`` does), through elementwise ops with a Python number or none
    (``x / (x.abs().max() + eps)``); else that result reshaped to ``[]``."""
    rank = node.args[0].meta["val"].dim()

    def reads_keepdim(u, src, depth=0):
        if depth > 8 or not u.users and u.op != "output":
            return False
        if u.target in _SCALAR_UNARY and u.args[0] is src:
            return all(reads_keepdim(w, u, depth + 1) for w in u.users)
        others = [v for v in u.args[:2] if v is not src]
        if u.target not in _BROADCAST_USERS or len(others) != 1:
            return False
        other = others[0]
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return bool(u.users) and all(reads_keepdim(w, u, depth + 1) for w in u.users)
        return isinstance(other, Node) and isinstance(other.meta.get("val"), torch.Tensor) \
            and other.meta["val"].dim() >= rank
    if node.users and all(reads_keepdim(u, node) for u in node.users):
        return keepdim_fn
    return lambda x: keepdim_fn(x).reshape([])


def _normalized(x, dims, eps: float, weight=None, bias=None):
    """``(x - mean) / sqrt(var + eps)`` over ``dims`` (biased variance), times ``weight`` plus ``bias``
    (broadcast as given)."""
    d = x - x.mean(dims, keepdim=True)
    y = d * torch.rsqrt((d * d).mean(dims, keepdim=True) + eps)
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y


def _normalize_groups(x, groups: int, weight, bias, eps: float):
    n, c = x.shape[0], x.shape[1]
    y = _normalized(x.reshape(n, groups, -1), [-1], eps).reshape(x.shape)
    shape = [1, c] + [1] * (x.dim() - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def _interp_matrix(n_in: int, n_out: int, align_corners: bool, scale, mode: str = "linear",
                   antialias: bool = False) -> torch.Tensor:
    """``[n_in, n_out]``: column j holds the weights of the inputs of output j (linear interpolation;
    ``mode="cubic"`` or ``antialias``: PyTorch's 2-D bicubic / anti-aliased filters along one dim -
    separable, borders clamped - from a ``[1, n_in, 1, n_in]`` one-hot image whose single row the
    height pass leaves unchanged)."""
    eye = torch.eye(n_in, dtype=torch.float32).unsqueeze(0)  # n_in channels, each a one-hot row
    if mode == "cubic" or antialias:
        kw = {"size": (1, n_out)} if scale is None else {"scale_factor": (1.0, float(scale)),
                                                          "recompute_scale_factor": False}
        return F.interpolate(eye.unsqueeze(2), mode="bicubic" if mode == "cubic" else "bilinear",
                             align_corners=align_corners, antialias=antialias, **kw)[0, :, 0]
    kw = {"size": n_out} if scale is None else {"scale_factor": float(scale), "recompute_scale_factor": False}
    return F.interpolate(eye, mode="linear", align_corners=align_corners, **kw)[0]


def _upsample_args(node: Node, spatial: int, mode: str = "linear", antialias: bool = False):
    x = node.args[0]
    size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
    align = bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("align_corners", False))
    scales = node.args[3] if len(node.args) > 3 else node.kwargs.get("scale_factors")
    in_sizes = [int(s) for s in x.meta["val"].shape[-spatial:]]
    out_sizes = [int(s) for s in node.meta["val"].shape[-spatial:]]
    if size is not None:
        scales = None
    scales = list(scales) if scales is not None else [None] * spatial
    return align, [_interp_matrix(i, o, align, s, mode, antialias) for i, o, s in zip(in_sizes, out_sizes, scales)]


FACTORIES = {aten.zeros.default, aten.ones.default, aten.full.default, aten.arange.default, aten.arange.start,
             aten.arange.start_step, aten.eye.default, aten.scalar_tensor.default, aten.empty.memory_format,
             aten.linspace.default, aten.logspace.default,
             *(getattr(getattr(aten, w), o) for w in ("hann_window", "hamming_window", "blackman_window",
                                                      "bartlett_window", "kaiser_window")
               for o in getattr(aten, w).overloads() if "out" not in o)}  # (torch.hann_window(n) in forward)
SHAPE_FACTORIES = {aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
                   aten.new_zeros.default, aten.new_ones.default, aten.new_full.default}
# ``const.type_as(x)`` / ``const.to(x)`` (NanoDet's ``self.project.type_as(x)``): a constant cast to
# the dtype of an activation
DTYPE_OF_OTHER = {aten.type_as.default, aten.to.other}
RANDOM = ("rand", "randn", "randint", "randperm", "normal", "bernoulli", "dropout", "uniform", "multinomial",
          "poisson", "exponential", "cauchy", "geometric", "log_normal", "empty")


RECURRENT = {aten.lstm.input, aten.gru.input, aten.rnn_tanh.input, aten.rnn_relu.input}


def _writes(user: Node, node: Node) -> bool:
    """``user`` is an in-place op writing ``node`` (``masked_fill_(zeros, node, v)`` only reads ``node``),
    or a view of ``node`` that is written (``buf[:, :4] = y``: ``copy_(slice(buf), y)``); the
    functionalization turns the write into a new value first, and the folding after it takes the rest."""
    from corten.aten_passes.functionalize import _is_view

    if user.op == "call_function" and _is_view(user) and user.args and user.args[0] is node:
        return any(_writes(u, user) for u in user.users)
    schema = getattr(user.target, "_schema", None)
    if schema is None or not is_mutating(user):
        return False
    written = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    return any((user.args[i] if i < len(user.args) else user.kwargs.get(schema.arguments[i].name)) is node
               for i in written)


def _foldable(node: Node) -> bool:
    if node.op != "call_function" or not isinstance(node.meta.get("val"), torch.Tensor) or not node.users:
        return False
    if any(u.op == "output" or _writes(u, node) or u.target in RECURRENT for u in node.users) or is_mutating(node):
        return False  # (the LSTM rewrite reads a zero initial state from its aten.zeros node)
    name = getattr(node.target, "__name__", str(node.target))
    if any(r in name for r in RANDOM) and node.target != aten.empty.memory_format:
        return False
    if node.target in FACTORIES or node.target in SHAPE_FACTORIES:
        return True
    if node.target in DTYPE_OF_OTHER:  # only the dtype of the second operand is read
        return isinstance(node.args[0], Node) and node.args[0].op == "get_attr"
    if node.target is operator.getitem:  # a piece of split/unbind/chunk of a constant (MHA's in_proj_weight)
        node = node.args[0]
        if not isinstance(node, Node) or node.op != "call_function" or is_mutating(node):
            return False
    if not isinstance(node.target, torch._ops.OpOverload) or node.target.namespace != "aten":
        return False
    inputs = node.all_input_nodes
    return bool(inputs) and all(a.op == "get_attr" for a in inputs)


def _evaluate(gm: GraphModule, node: Node):
    """The value of an aten op on constants (``node``: the op, or a ``getitem`` of its result)."""
    if node.target is operator.getitem:
        return _evaluate(gm, node.args[0])[node.args[1]]
    args = torch.fx.node.map_arg(node.args, lambda a: get_attr(gm, a).detach())
    kwargs = {k: v for k, v in torch.fx.node.map_arg(node.kwargs, lambda a: get_attr(gm, a).detach()).items()
              if k not in ("device", "pin_memory")}
    with torch.no_grad():
        return node.target(*args, **kwargs)


def drop_noop_casts(gm: GraphModule) -> bool:
    """Casts to the dtype a tensor already has (``att.float()`` before a softmax, ``x.type_as(y)``) and
    the ``_assert_tensor_metadata`` checks beside them, removed before the rewrites look for their
    patterns (``softmax(x.masked_fill(mask, -inf).float())`` is the masked softmax); the rest of the
    no-ops go later, in :class:`~corten.aten_passes.remove_noops.RemoveNoOpsPass`."""
    modified = False
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in CAST_OPS and is_noop(node) \
                and not copy_protects_input(node):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            modified = True
    return modified


def _ancestors(roots) -> set[Node]:
    seen: set[Node] = set()
    todo = [r for r in roots if isinstance(r, Node)]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(n.all_input_nodes)
    return seen


def _factory_value(gm: GraphModule, node: Node) -> torch.Tensor:
    """The value of a foldable node (:func:`_foldable`) or of a factory an in-place op writes."""
    val = node.meta["val"]
    if node.target in DTYPE_OF_OTHER:
        return get_attr(gm, node.args[0]).detach().to(val.dtype)
    if node.target in SHAPE_FACTORIES:
        fill = {aten.zeros_like.default: 0.0, aten.ones_like.default: 1.0, aten.new_zeros.default: 0.0,
                aten.new_ones.default: 1.0}.get(node.target)
        if fill is None:  # full_like(x, fill_value), new_full(x, size, fill_value)
            at = 2 if node.target == aten.new_full.default else 1
            fill = node.args[at] if len(node.args) > at else node.kwargs.get("fill_value")
        return torch.full(tuple(val.shape), fill, dtype=node.kwargs.get("dtype") or val.dtype)
    return _evaluate(gm, node)


def _written_factory(node: Node) -> Node | None:
    """The fresh factory tensor an in-place op on constants writes (``_canonical_mask``'s
    ``zeros_like(mask, dtype=float).masked_fill_(mask, -inf)``), when nothing reads it before the write."""
    if node.op != "call_function" or not is_mutating(node) or not node.args or not isinstance(node.args[0], Node):
        return None
    base = node.args[0]
    if base.target not in FACTORIES | SHAPE_FACTORIES or base.target == aten.empty.memory_format:
        return None
    if any(a is not base and a.op != "get_attr" for a in node.all_input_nodes):
        return None
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    others = [u for u in base.users if u is not node]
    if any(order[u] < order[node] or is_mutating(u) or u.op == "output" for u in others):
        return None
    return base


def fold_constants(gm: GraphModule, only_for=None) -> bool:
    """Replace factory tensors and ops on constants by constants (see the module docstring), and an
    in-place op on a fresh factory tensor by its result; ``only_for`` (nodes): just the subgraphs
    those nodes are computed from."""
    modified = False
    scope = None if only_for is None else _ancestors(only_for)
    for node in list(gm.graph.nodes):
        if scope is not None and node not in scope:
            continue
        base = _written_factory(node)
        if base is not None:
            try:
                written = _factory_value(gm, base)
                args = torch.fx.node.map_arg(node.args[1:], lambda a: get_attr(gm, a).detach())
                with torch.no_grad():
                    node.target(written, *args, **node.kwargs)
            except Exception:  # leave it: the op is refused later, by name
                continue
            const = add_constant(gm, f"_folded_{node.name}", written.contiguous(), node)
            node.replace_all_uses_with(const)
            base.replace_all_uses_with(const)  # (its readers all come after the write)
            gm.graph.erase_node(node)
            gm.graph.erase_node(base)
            modified = True
            continue
        if not _foldable(node) or node.target == aten.empty.memory_format:
            continue
        try:
            value = _factory_value(gm, node)
        except Exception:  # leave it: the op is refused later, by name
            continue
        if not isinstance(value, torch.Tensor):
            continue
        const = add_constant(gm, f"_folded_{node.name}", value.contiguous(), node)
        node.replace_all_uses_with(const)
        source = node.args[0] if node.target is operator.getitem else None
        gm.graph.erase_node(node)
        if source is not None and not source.users:  # (the split whose pieces are all constants now)
            gm.graph.erase_node(source)
        modified = True
    return modified


def _gru_step(gi, h, w_hh, b_hh):
    """One GRU step from the precomputed input gates ``gi``; ``h`` None is the zero state."""
    hidden = gi.shape[-1] // 3
    i_r, i_z, i_n = gi.split(hidden, -1)
    if h is None:
        gh = [None] * 3 if b_hh is None else list(b_hh.split(hidden, -1))
    else:
        gh = list(F.linear(h, w_hh, b_hh).split(hidden, -1))
    add = lambda a, b: a if b is None else a + b  # noqa: E731
    r = torch.sigmoid(add(i_r, gh[0]))
    z = torch.sigmoid(add(i_z, gh[1]))
    n = torch.tanh(i_n if gh[2] is None else i_n + r * gh[2])
    return (1 - z) * n if h is None else n + z * (h - n)


def _lstm_step(gi, state, w_hh, b_hh, w_hr=None):
    """One LSTM step; ``w_hr``: the projection of ``proj_size`` (``h = (o * tanh(c)) @ w_hr.T``)."""
    hidden = gi.shape[-1] // 4
    if state is None:
        gates = gi if b_hh is None else gi + b_hh
    else:
        gates = gi + F.linear(state[0], w_hh, b_hh)
    i, f, g, o = gates.split(hidden, -1)
    c = torch.sigmoid(i) * torch.tanh(g)
    if state is not None:
        c = torch.sigmoid(f) * state[1] + c
    h = torch.sigmoid(o) * torch.tanh(c)
    return (h if w_hr is None else F.linear(h, w_hr)), c


def _rnn_step(gi, h, w_hh, b_hh, relu):
    pre = gi if h is None else gi + F.linear(h, w_hh, b_hh)
    if h is None and b_hh is not None:
        pre = pre + b_hh
    return torch.relu(pre) if relu else torch.tanh(pre)


def unrolled_rnn(kind: str, x, h0, c0, params, has_biases: bool, layers: int, bidirectional: bool,
                 batch_first: bool, relu: bool = False):
    """``torch.nn.GRU`` / ``RNN`` / ``LSTM`` forward (eval) unrolled: (output, h_n[, c_n]); ``h0``/``c0`` None: zeros.
    An LSTM with ``proj_size`` has one more weight per layer and direction (``w_hr``, last)."""
    seq = x if not batch_first else x.transpose(0, 1)  # [T, N, C]
    steps = seq.shape[0]
    dirs = 2 if bidirectional else 1
    base = 4 if has_biases else 2
    proj = kind == "lstm" and len(params) == layers * dirs * (base + 1)
    per = base + (1 if proj else 0)
    h_n, c_n = [], []
    for layer in range(layers):
        outs = []
        for d in range(dirs):
            k = (layer * dirs + d) * per
            w_ih, w_hh = params[k], params[k + 1]
            b_ih, b_hh = (params[k + 2], params[k + 3]) if has_biases else (None, None)
            gi_all = F.linear(seq, w_ih, b_ih)
            j = layer * dirs + d
            h = None if h0 is None else h0[j]
            state = None if h0 is None or kind != "lstm" else (h0[j], c0[j])  # (GRU/RNN: h alone)
            ys = [None] * steps
            for t in (range(steps) if d == 0 else range(steps - 1, -1, -1)):
                if kind == "gru":
                    h = _gru_step(gi_all[t], h, w_hh, b_hh)
                elif kind == "lstm":
                    state = _lstm_step(gi_all[t], state, w_hh, b_hh, params[k + per - 1] if proj else None)
                    h = state[0]
                else:
                    h = _rnn_step(gi_all[t], h, w_hh, b_hh, relu)
                ys[t] = h
            outs.append(torch.stack(ys, 0))
            h_n.append(h)
            if kind == "lstm":
                c_n.append(state[1])
        seq = outs[0] if dirs == 1 else torch.cat(outs, -1)
    out = seq.transpose(0, 1) if batch_first else seq
    res = (out, torch.stack(h_n, 0))
    return res + (torch.stack(c_n, 0),) if kind == "lstm" else res


def _is_zero_state(node) -> bool:
    if not isinstance(node, Node):
        return False
    if node.target in (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default):
        return True
    if node.target == aten.full.default and float(node.args[1]) == 0.0:
        return True
    if node.op == "get_attr":
        v = get_attr(node.graph.owning_module, node)
        return isinstance(v, torch.Tensor) and not bool(v.any())
    return False


def masked_softmax(x: torch.Tensor, keep: torch.Tensor, drop: torch.Tensor, dim: int) -> torch.Tensor:
    """``softmax(x)`` over ``dim`` restricted to where the constant 0/1 ``keep`` is 1 (``drop = 1 - keep``),
    renormalised.  The masked scores are first lowered to the row's minimum, so the row's maximum is a
    kept score: a plain softmax of ``x`` lets larger masked scores (later keys of causal attention)
    take the whole int8 probability mass, the kept ones round to 0 and the row came out all zeros."""
    low = x.amin(dim, keepdim=True)
    p = torch.softmax(x * keep + low * drop, dim) * keep
    return p / p.sum(dim, keepdim=True)


def masked_softmax_constants(keep: torch.Tensor) -> list[torch.Tensor]:
    """The constants :func:`masked_softmax` takes after ``x``: ``keep`` and ``drop`` as float 0/1."""
    keep = keep.to(torch.float32)
    return [keep, 1.0 - keep]


def _constant(node: Node, arg: Node) -> torch.Tensor | None:
    gm = node.graph.owning_module
    try:
        return get_attr(gm, arg).detach().to(torch.bool)
    except AttributeError:
        return None


def _uniform_value(gm: GraphModule, arg) -> float | None:
    """The one value of a constant float tensor whose elements are all equal (a folded ``zeros_like``)."""
    if not (isinstance(arg, Node) and arg.op == "get_attr"):
        return None
    v = get_attr(gm, arg)
    if not isinstance(v, torch.Tensor) or not v.dtype.is_floating_point or v.numel() == 0:
        return None
    first = v.flatten()[0]
    return float(first) if bool((v == first).all()) else None


def scalar_wheres(gm: GraphModule) -> bool:
    """``masked_fill(x, mask, v)`` -> ``where(mask, v, x)``; ``where(c, a, zeros_like(a))`` (a uniform constant
    operand that does not widen the result) -> ``where`` with a Python number (``where.ScalarOther``)."""
    modified = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target == aten.masked_fill.Scalar and len(node.args) == 3:
            x, mask, value = node.args
            masks_softmax = float(value) <= -1e4 and all(u.target in (aten.softmax.int, aten._softmax.default)
                                                         for u in node.users)
            if isinstance(mask, Node) and not masks_softmax:  # (the masked softmax is rewritten below)
                node.target = aten.where.ScalarSelf
                node.args = (mask, float(value), x)
                modified = True
            continue
        if node.target != aten.where.self:
            continue
        cond, a, b = node.args
        out_shape = tuple(node.meta["val"].shape) if isinstance(node.meta.get("val"), torch.Tensor) else None
        for i, (const, other, target) in enumerate(((b, a, aten.where.ScalarOther), (a, b, aten.where.ScalarSelf))):
            value = _uniform_value(gm, const)
            if value is None or out_shape is None or not isinstance(other, Node) or "val" not in other.meta:
                continue
            shapes = [tuple(other.meta["val"].shape)]
            if isinstance(cond, Node) and "val" in cond.meta:
                shapes.append(tuple(cond.meta["val"].shape))
            if tuple(torch.broadcast_shapes(*shapes)) != out_shape:
                continue
            node.target = target
            node.args = (cond, other, value) if i == 0 else (cond, value, other)
            modified = True
            break
    return modified


_AND = {aten.__and__.Tensor, aten.bitwise_and.Tensor, aten.logical_and.default}
_OR = {aten.__or__.Tensor, aten.bitwise_or.Tensor, aten.logical_or.default}
_NOT = {aten.bitwise_not.default, aten.logical_not.default}
_WHERES = {(True, True): aten.where.self, (True, False): aten.where.ScalarOther, (False, True): aten.where.ScalarSelf}


def logical_wheres(gm: GraphModule) -> bool:
    """``where(c1 & c2, a, b)`` -> ``where(c1, where(c2, a, b), b)``, ``where(c1 | c2, a, b)`` ->
    ``where(c1, a, where(c2, a, b))``, ``where(~c, a, b)`` -> ``where(c, b, a)`` (any nesting): the
    conditions stay comparisons, which ``quantized_where`` reads, and no boolean arithmetic is left."""
    modified, changed = False, True
    while changed:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in _WHERES.values() or node.kwargs:
                continue
            cond, x, y = node.args
            if not isinstance(cond, Node) or cond.op != "call_function" or \
                    cond.target not in (_AND | _OR | _NOT):
                continue
            with gm.graph.inserting_before(node):
                if cond.target in _NOT:
                    node.args = (cond.args[0], y, x)
                    node.target = _WHERES[(isinstance(y, Node), isinstance(x, Node))]
                else:
                    c1, c2 = cond.args[:2]
                    if not (isinstance(c1, Node) and isinstance(c2, Node)):
                        continue
                    inner = gm.graph.call_function(node.target, (c2, x, y))
                    inner.meta.update({k: v for k, v in node.meta.items() if k != "val"})
                    if cond.target in _AND:
                        node.args, node.target = (c1, inner, y), _WHERES[(True, isinstance(y, Node))]
                    else:
                        node.args, node.target = (c1, x, inner), _WHERES[(isinstance(x, Node), True)]
            if not cond.users:
                gm.graph.erase_node(cond)
            changed = modified = True
    return modified


# ---------------------------------------------------------------------------- the rewrite table
COMPOSITES = RewriteTable("composites")
rewrites = COMPOSITES.rewrites


@rewrites(aten.einsum.default)
def _einsum(node: Node) -> Rewrite | Refusal:
    eq, ops = node.args[0], list(node.args[1])
    return Rewrite(lambda *xs: torch.einsum(eq, *xs), ops)


@rewrites(aten.addmm.default, aten.baddbmm.default)
def _addmm(node: Node) -> Rewrite | Refusal:
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    mm = torch.mm if node.target == aten.addmm.default else torch.bmm

    def addmm(c, x, y):
        p = mm(x, y)
        return (c if beta == 1 else beta * c) + (p if alpha == 1 else alpha * p)
    return Rewrite(addmm, list(node.args[:3]))


@rewrites(aten.matmul.default, aten.mv.default, aten.dot.default, aten.vdot.default)
def _vector_matmul(node: Node) -> Rewrite | Refusal:
    """``torch.matmul`` with a 1-D operand, ``mv`` and ``dot``: as PyTorch defines them, a 1-D left
    operand is a ``[1, K]`` row and a 1-D right one a ``[K, 1]`` column, whose added dim is removed
    from the product (a vector . vector product is 0-D)."""
    a, b = node.args[0], node.args[1]
    if not (isinstance(a, Node) and isinstance(b, Node)):
        return Refusal("an operand is not a tensor")
    row, col = a.meta["val"].dim() == 1, b.meta["val"].dim() == 1
    if not (row or col):
        return Refusal("no 1-D operand (the matmul family lowers it)")

    def vector_matmul(x, y):
        p = torch.matmul(x.unsqueeze(0) if row else x, y.unsqueeze(-1) if col else y)
        if col:
            p = p.squeeze(-1)
        return p.squeeze(-2) if row and not col else (p.reshape([]) if row else p)
    return Rewrite(vector_matmul, [a, b])


@rewrites(aten.outer.default, aten.ger.default, aten.inner.default)
def _outer_inner(node: Node) -> Rewrite | Refusal:
    """``torch.outer(a, b)`` (1-D a, b): ``a[:, None] * b[None, :]``; ``torch.inner(a, b)``: the sum
    over both last dims, ``a`` as rows times ``b`` as rows transposed (``dot`` for 1-D)."""
    a, b = node.args[0], node.args[1]
    if not (isinstance(a, Node) and isinstance(b, Node)):
        return Refusal("an operand is not a tensor")
    if node.target != aten.inner.default:
        return Rewrite(lambda x, y: x.unsqueeze(1) * y.unsqueeze(0), [a, b])
    sa, sb = list(a.meta["val"].shape), list(b.meta["val"].shape)
    if not sa or not sb:
        return Refusal("a 0-D operand (a product)")

    def inner(x, y):
        if x.dim() == 1 and y.dim() == 1:
            return (x * y).sum(0)  # (0-D: the LiftZeroDimPass runs it keepdim)
        p = x.reshape(-1, sa[-1]) @ y.reshape(-1, sb[-1]).t()
        return p.reshape(sa[:-1] + sb[:-1])
    return Rewrite(inner, [a, b])


@rewrites(aten.im2col.default)
def _unfold(node: Node) -> Rewrite | Refusal:
    """``F.unfold(x, kernel, dilation, padding, stride)`` (sliding patches, ``[N, C * kH * kW, L]``): a
    convolution with one-hot weights (output channel ``(c, i, j)`` reads tap ``(i, j)`` of channel
    ``c``), flattened."""
    x = node.args[0]
    kernel, dilation, padding, stride = ([int(v) for v in node.args[i]] for i in range(1, 5))
    c = int(x.meta["val"].shape[1])
    taps = kernel[0] * kernel[1]
    weight = torch.zeros(c * taps, c, kernel[0], kernel[1])
    for ch in range(c):
        for t in range(taps):
            weight[ch * taps + t, ch, t // kernel[1], t % kernel[1]] = 1.0

    def unfold(xv, w):
        y = F.conv2d(xv, w, None, stride, padding, dilation)
        return y.reshape(y.shape[0], y.shape[1], -1)
    return Rewrite(unfold, [x], [weight], pre_dispatch=True)


@rewrites(aten.glu.default)
def _glu(node: Node) -> Rewrite | Refusal:
    dim = node_arg(node, "dim", -1)

    def glu(x):
        h1, h2 = x.chunk(2, dim)
        return h1 * torch.sigmoid(h2)
    return Rewrite(glu, [node.args[0]])


_STD = {aten.std.correction, aten.std.dim, aten.std.default}


@rewrites(aten.var.correction, aten.var.dim, aten.var.default, *_STD)
def _var_std(node: Node) -> Rewrite | Refusal:
    dim, corr, keepdim = _var_args(node)
    sqrt = node.target in _STD
    rank = node.args[0].meta["val"].dim()
    full = not keepdim and len(_dims(dim, rank)) == rank  # a 0-D result

    def var(x):
        v = _var(x, dim, corr, keepdim or full)
        return torch.sqrt(v) if sqrt else v
    return Rewrite(_zero_d(node, var) if full else var, [node.args[0]])


@rewrites(aten.var_mean.correction, aten.var_mean.dim, aten.std_mean.correction, aten.std_mean.dim)
def _var_mean(node: Node) -> Rewrite | Refusal:
    dim, correction, keepdim = _var_args(node)
    std = node.target in (aten.std_mean.correction, aten.std_mean.dim)

    def var_mean(x):
        dims = _dims(dim, x.dim())
        v = _var(x, dims, correction, keepdim)
        return torch.sqrt(v) if std else v, x.mean(dims, keepdim=keepdim)
    return Rewrite(var_mean, [node.args[0]])


@rewrites(aten.triu.default, aten.tril.default)
def _triangle(node: Node) -> Rewrite | Refusal:
    """``x.triu(k)`` / ``x.tril(k)`` of a computed tensor: ``x`` times the constant 0/1 triangle."""
    x = node.args[0]
    shape = [int(d) for d in x.meta["val"].shape]
    if len(shape) < 2:
        return Refusal("a rank-0/1 input")
    ones = torch.ones(shape[-2:])
    k = int(node_arg(node, "diagonal", 0))
    mask = ones.triu(k) if node.target == aten.triu.default else ones.tril(k)
    return Rewrite(lambda xv, m: xv * m, [x], [mask])


@rewrites(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(node: Node) -> Rewrite | Refusal:
    a = node.args
    if node.target == aten.lerp.Scalar:
        w = float(a[2])
        return Rewrite(lambda x, y: x + w * (y - x), [a[0], a[1]])
    return Rewrite(lambda x, y, wt: x + wt * (y - x), [a[0], a[1], a[2]])


@rewrites(aten.addcmul.default, aten.addcdiv.default)
def _addc(node: Node) -> Rewrite | Refusal:
    value = float(node_arg(node, "value", 1))
    mul = node.target == aten.addcmul.default

    def addc(x, y, z):
        p = y * z if mul else y / z
        return x + (p if value == 1 else value * p)
    return Rewrite(addc, list(node.args[:3]))


@rewrites(aten.hypot.default)
def _hypot(node: Node) -> Rewrite | Refusal:
    return Rewrite(lambda x, y: torch.sqrt(x * x + y * y), [node.args[0], node.args[1]])


@rewrites(aten.pairwise_distance.default)
def _pairwise_distance(node: Node) -> Rewrite | Refusal:
    order = float(node_arg(node, "p", 2.0))
    eps = float(node_arg(node, "eps", 1e-6))
    keepdim = bool(node_arg(node, "keepdim", False))
    if order not in (1.0, 2.0):
        return Refusal(f"p={order:g} (only p 1 and 2 are spelled out)")

    def pairwise(x, y):
        d = x - y + eps
        if order == 2.0:
            return torch.sqrt((d * d).sum(-1, keepdim=keepdim))
        return d.abs().sum(-1, keepdim=keepdim)
    return Rewrite(pairwise, [node.args[0], node.args[1]])


@rewrites(aten.adaptive_max_pool1d.default, float_outputs=1)  # (values, int64 indices)
def _adaptive_max_pool1d(node: Node) -> Rewrite | Refusal:
    a1 = node.args[1]
    size = int(a1[0] if isinstance(a1, (list, tuple)) else a1)

    def adaptive_max1d(x):  # indices along L: with H = 1, the 2-D flat index h * W + w is w
        v, i = F.adaptive_max_pool2d(x.unsqueeze(-2), (1, size), return_indices=True)
        return v.squeeze(-2), i.squeeze(-2)
    return Rewrite(adaptive_max1d, [node.args[0]])


@rewrites(aten.max_pool1d_with_indices.default, aten.max_pool2d_with_indices.default, float_outputs=1)
def _max_pool_values(node: Node) -> Rewrite | Refusal:
    """``F.max_pool1d/2d(..., return_indices=True)[0]`` (``nn.MaxPool1d(return_indices=True)``) with the
    indices unread: the plain max pool (indices returned by the program are ``corten.max_pool2d_indices``,
    set up at capture)."""
    if any(u.target is operator.getitem and u.args[1] == 1 and u.users for u in node.users):
        return Refusal("its indices are read inside the model (MaxUnpool, gather): only values, or 2-D indices "
                       "returned as a program output, are supported")
    one_d = node.target == aten.max_pool1d_with_indices.default
    kernel = node.args[1]
    stride = node_arg(node, "stride", None) or kernel
    padding, dilation, ceil = (node_arg(node, k, d) for k, d in (("padding", 0), ("dilation", 1),
                                                                  ("ceil_mode", False)))
    pool = F.max_pool1d if one_d else F.max_pool2d

    def values(xv):
        v = pool(xv, kernel, stride, padding, dilation, ceil_mode=bool(ceil))
        return v, torch.zeros(v.shape, dtype=torch.int64)  # (unread: removed with the node's other dead code)
    return Rewrite(values, [node.args[0]], pre_dispatch=True)  # (max_pool stays whole)


def _norm(x, groups, weight, bias, eps) -> Rewrite:
    args = [x] + [v for v in (weight, bias) if v is not None]
    has_w, has_b = weight is not None, bias is not None

    def norm(xv, *wb):
        wb = list(wb)
        w = wb.pop(0) if has_w else None
        b = wb.pop(0) if has_b else None
        return _normalize_groups(xv, int(groups), w, b, float(eps))
    return Rewrite(norm, args)


@rewrites(aten.group_norm.default)
def _group_norm(node: Node) -> Rewrite | Refusal:
    a = node.args
    return _norm(a[0], a[1], a[2] if len(a) > 2 else None, a[3] if len(a) > 3 else None,
                 node_arg(node, "eps", 1e-5))


@rewrites(aten.layer_norm.default)
def _layer_norm_of_maps(node: Node) -> Rewrite | Refusal:
    """``nn.LayerNorm((C, H, W))`` or ``((H, W))`` on a feature map: the layer-norm kernel normalizes
    the last dim of a channels-last map only, so several trailing dims of a 4-D or 5-D tensor are
    spelled out as GroupNorm is (mean, sub, mean of squares, rsqrt, the elementwise weight and bias)."""
    x, normalized = node.args[0], [int(d) for d in node.args[1]]
    weight, bias = (node_arg(node, k, None) for k in ("weight", "bias"))
    eps = float(node_arg(node, "eps", 1e-5))
    rank = x.meta["val"].dim()
    if rank < 4 or len(normalized) < 2:
        return Refusal("one normalized dim, or a rank-2/3 input (the layer-norm family lowers it)")
    dims = list(range(rank - len(normalized), rank))
    has_w, has_b = isinstance(weight, Node), isinstance(bias, Node)

    def layer_norm(xv, *wb):
        wb = list(wb)
        return _normalized(xv, dims, eps, wb.pop(0) if has_w else None, wb.pop(0) if has_b else None)
    return Rewrite(layer_norm, [x] + [v for v in (weight, bias) if isinstance(v, Node)])


@rewrites(aten.instance_norm.default)
def _instance_norm(node: Node) -> Rewrite | Refusal:
    a = node.args
    use_input_stats, eps = a[5], a[7]
    if not use_input_stats:
        return Refusal("use_input_stats=False (running statistics: not spelled out)")
    return _norm(a[0], int(a[0].meta["val"].shape[1]), a[1], a[2], eps)


# run on its own before torchao's conv-BatchNorm folding (corten.compiler.fuse_conv_bn), which would
# fold a BatchNorm normalising with batch statistics as if it had running ones
BATCH_STATISTICS = RewriteTable("batch statistics")


@BATCH_STATISTICS.rewrites(aten.batch_norm.default)
@rewrites(aten.batch_norm.default)
def _batch_statistics_norm(node: Node) -> Rewrite | Refusal:
    """``nn.BatchNorm2d(C, track_running_stats=False)`` in eval mode (``F.batch_norm(x, None, None,
    training=True)``) normalises with the statistics of the batch it is given: per channel over ``N``
    and the spatial dims, then the affine - spelled out like GroupNorm.  (A BatchNorm with running
    statistics is folded into its producer later; one in training mode is refused.)"""
    a = node.args
    if not bool(node_arg(node, "training", False)):
        return Refusal("running statistics (folded by FoldBatchNormPass)")
    if node_arg(node, "running_mean", None) is not None or node_arg(node, "running_var", None) is not None:
        match_batch_norm(node)  # a model captured in training mode: refused ("call model.eval()")
    x, weight, bias = a[0], node_arg(node, "weight", None), node_arg(node, "bias", None)
    eps = float(node_arg(node, "eps", 1e-5))
    rank = x.meta["val"].dim()
    c = int(x.meta["val"].shape[1])
    dims = [0] + list(range(2, rank))
    shape = [1, c] + [1] * (rank - 2)
    args = [x] + [v for v in (weight, bias) if isinstance(v, Node)]
    has_w, has_b = isinstance(weight, Node), isinstance(bias, Node)

    def batch_stats(xv, *wb):
        wb = list(wb)
        return _normalized(xv, dims, eps, wb.pop(0).reshape(shape) if has_w else None,
                           wb.pop(0).reshape(shape) if has_b else None)
    return Rewrite(batch_stats, args)


@rewrites(aten.logsumexp.default)
def _logsumexp(node: Node) -> Rewrite | Refusal:
    dim = node.args[1]
    keepdim = node_arg(node, "keepdim", False)

    def lse(x):
        dims = _dims(dim, x.dim())
        m = x.amax(dims, keepdim=True)
        y = torch.log(torch.exp(x - m).sum(dims, keepdim=True)) + m
        return y if keepdim else y.squeeze(dims)
    return Rewrite(lse, [node.args[0]])


@rewrites(aten.linalg_norm.default)
def _matrix_or_vector_norm(node: Node) -> Rewrite | Refusal:
    """``torch.linalg.norm(x)`` / ``(x, dim=...)`` without ``ord``: the 2-norm of the elements over
    ``dim`` (all of them by default; for a matrix that is the Frobenius norm)."""
    if node_arg(node, "ord", None) is not None or node.kwargs.get("dtype") is not None:
        return Refusal("ord= or dtype= given (only the default 2-norm of the elements is spelled out)")
    dim, keepdim = node_arg(node, "dim", None), node_arg(node, "keepdim", False)
    return Rewrite(lambda x: torch.sqrt((x * x).sum(_dims(dim, x.dim()), keepdim=keepdim)), [node.args[0]])


@rewrites(aten.linalg_vector_norm.default)
def _vector_norm(node: Node) -> Rewrite | Refusal:
    order = node_arg(node, "ord", 2)
    dim = node_arg(node, "dim", None)
    keepdim = node_arg(node, "keepdim", False)
    if node.kwargs.get("dtype") is not None:
        return Refusal("dtype= given")
    if order not in (1, 2, float("inf")):
        return Refusal(f"ord={order} (only 1, 2 and inf are spelled out)")

    def norm(x):
        dims = _dims(dim, x.dim())
        if order == 2:
            return torch.sqrt((x * x).sum(dims, keepdim=keepdim))
        if order == 1:
            return x.abs().sum(dims, keepdim=keepdim)
        return x.abs().amax(dims, keepdim=keepdim)
    return Rewrite(norm, [node.args[0]])


@rewrites(aten.prelu.default)
def _prelu(node: Node) -> Rewrite | Refusal:
    x, w = node.args[0], node.args[1]
    rank = x.meta["val"].dim()
    nw = int(w.meta["val"].numel())

    def prelu(xv, wv):
        shape = [1] * rank
        if nw > 1:
            shape[1 if rank > 1 else 0] = nw
        return torch.where(xv > 0, xv, xv * wv.reshape(shape))
    return Rewrite(prelu, [x, w])


@rewrites(aten.clamp.Tensor)
def _clamp_constant_bounds(node: Node) -> Rewrite | Refusal:
    """``clamp(x, min=t1, max=t2)`` with a constant bound (a parameter or buffer) -> ``maximum`` then
    ``minimum``: a constant tensor is an operand those take on the shared grid (bounds that are
    activations keep the clamp, lowered as the same two ops)."""
    x = node.args[0]
    lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    bounds = [b for b in (lo, hi) if b is not None]
    if not any(isinstance(b, Node) and b.op == "get_attr" for b in bounds):
        return Refusal("no constant bound: the clamp of activations is lowered as it is")
    has_lo, has_hi = lo is not None, hi is not None

    def clamp(xv, *bs):
        bs = list(bs)
        if has_lo:
            xv = torch.maximum(xv, bs.pop(0))
        if has_hi:
            xv = torch.minimum(xv, bs.pop(0))
        return xv
    return Rewrite(clamp, [x, *bounds])


@rewrites(aten.softmax.int, aten._softmax.default)
def _masked_softmax(node: Node) -> Rewrite | Refusal:
    fill = node.args[0]
    if isinstance(fill, Node) and fill.target == aten.add.Tensor and len(fill.users) == 1 and not fill.kwargs:
        return _additive_mask_softmax(node, fill)
    if isinstance(fill, Node) and fill.target in (aten.where.ScalarOther, aten.where.ScalarSelf) \
            and len(fill.users) == 1:
        return _where_mask_softmax(node, fill)
    if not (isinstance(fill, Node) and fill.target == aten.masked_fill.Scalar and len(fill.users) == 1):
        return Refusal("not a softmax of a masked_fill read only by it")  # (the softmax family lowers it)
    mask, value = fill.args[1], fill.args[2]
    if not (isinstance(mask, Node) and mask.op == "get_attr") or float(value) > -1e4:
        return Refusal("the mask is not a constant, or the fill value is not a large negative number")
    keep = _constant(node, mask)
    if keep is None:
        return Refusal(f"mask {mask.target} is not an attribute of the module")
    dim = node.args[1]
    return Rewrite(lambda x, k, d: masked_softmax(x, k, d, dim), [fill.args[0]], masked_softmax_constants(~keep))


def _where_mask_softmax(node: Node, where: Node) -> Rewrite | Refusal:
    """``softmax(torch.where(mask, x, -inf))`` (or ``where(mask, -inf, x)``) with a constant ``mask``."""
    cond, a, b = where.args[:3]
    x, fill, keep_when = (a, b, True) if where.target == aten.where.ScalarOther else (b, a, False)
    if not (isinstance(cond, Node) and cond.op == "get_attr" and isinstance(x, Node) and "val" in x.meta) \
            or float(fill) > -1e4:
        return Refusal("not a softmax of where(constant mask, x, -inf)")
    c = get_attr(node.graph.owning_module, cond).detach().to(torch.bool)
    keep = c if keep_when else ~c
    shape = tuple(x.meta["val"].shape)
    if tuple(torch.broadcast_shapes(shape, tuple(keep.shape))) != shape:
        return Refusal("the mask broadcasts x to a larger shape")
    dim = node.args[1]
    return Rewrite(lambda xv, k, d: masked_softmax(xv, k, d, dim), [x], masked_softmax_constants(keep))


def _additive_mask_softmax(node: Node, add: Node) -> Rewrite | Refusal:
    """``softmax(x + m)`` with a constant ``m`` of 0 and -inf (or large negative) values: the additive
    attention mask (``nn.MultiheadAttention`` with ``need_weights=True`` adds its float ``attn_mask``
    with ``baddbmm``) is the masked softmax of ``keep = m == 0`` - the -inf never reaches an int8 grid."""
    gm = node.graph.owning_module
    for x, m in (add.args[:2], add.args[1::-1]):
        if not (isinstance(x, Node) and isinstance(m, Node) and m.op == "get_attr" and "val" in x.meta):
            continue
        mv = get_attr(gm, m).detach()
        if not mv.is_floating_point() or not bool(((mv == 0) | (mv <= -1e4)).all()) or bool((mv == 0).all()):
            continue
        shape = tuple(x.meta["val"].shape)
        if tuple(torch.broadcast_shapes(shape, tuple(mv.shape))) != shape:
            continue
        dim = node.args[1]
        return Rewrite(lambda xv, k, d: masked_softmax(xv, k, d, dim), [x], masked_softmax_constants(mv == 0))
    return Refusal("not a softmax of x + a constant 0/-inf mask")  # (the softmax family lowers it)


@rewrites(aten.diff.default)
def _diff(node: Node) -> Rewrite | Refusal:
    """``torch.diff(x, n, dim, prepend, append)``: ``cat`` the constants or activations around ``x``, then
    ``n`` times ``x[1:] - x[:-1]`` along ``dim``."""
    x = node.args[0]
    n = int(node_arg(node, "n", 1))
    dim = int(node_arg(node, "dim", -1))
    prepend, append = node_arg(node, "prepend", None), node_arg(node, "append", None)
    extra = [a for a in (prepend, append) if a is not None]
    if any(not isinstance(a, Node) for a in extra):
        return Refusal("prepend/append that are not tensors")
    has_pre, has_app = prepend is not None, append is not None

    def diff(xv, *pa):
        pa = list(pa)
        parts = ([pa.pop(0)] if has_pre else []) + [xv] + ([pa.pop(0)] if has_app else [])
        y = torch.cat(parts, dim) if len(parts) > 1 else xv
        for _ in range(n):
            y = y.narrow(dim, 1, y.shape[dim] - 1) - y.narrow(dim, 0, y.shape[dim] - 1)
        return y
    return Rewrite(diff, [x] + extra)


_WHERE_OPS = (aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)


@rewrites(*_WHERE_OPS)
def _where_constant_condition(node: Node) -> Rewrite | Refusal:
    """``torch.where(c, a, b)`` / ``x.masked_fill(c, v)`` whose condition is a constant (a length mask
    built from a buffer): ``a * c + b * (1 - c)`` with 0/1 constants - a number ``a`` or ``b`` becomes a
    constant tensor term, a zero one vanishes (``masked_fill(c, 0)`` is ``x * (1 - c)``)."""
    cond, a, b = node.args[:3]
    if not (isinstance(cond, Node) and cond.op == "get_attr"):
        return Refusal("the condition is not a constant (where of comparisons lowers as quantized_where)")
    c = get_attr(node.graph.owning_module, cond).detach().to(torch.bool)
    if any(not isinstance(v, Node) and (not math.isfinite(float(v)) or float(v) <= -1e4) for v in (a, b)):
        return Refusal("a fill of -inf or a large negative number (a softmax mask: the masked softmax takes it)")
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor) or not out.dtype.is_floating_point:
        return Refusal("not a float result")
    on, off = c.to(torch.float32), (~c).to(torch.float32)
    nodes = [v for v in (a, b) if isinstance(v, Node)]
    consts = [m for v, m in ((a, on), (b, off)) if isinstance(v, Node)]
    fixed = sum((float(v) * m for v, m in ((a, on), (b, off)) if not isinstance(v, Node) and float(v) != 0.0),
                torch.zeros(()))
    has_fixed = bool(fixed.ne(0).any())
    shape = tuple(out.shape)

    def where(*vs):
        vs = list(vs)
        xs, ms = vs[:len(nodes)], vs[len(nodes):len(nodes) + len(consts)]
        terms = [xv * mv for xv, mv in zip(xs, ms)]
        y = terms[0] if terms else None
        for t in terms[1:]:
            y = y + t
        if has_fixed:
            y = vs[-1] if y is None else y + vs[-1]
        return y.expand(shape) if tuple(y.shape) != shape else y
    if not nodes:
        return Refusal("no tensor operand (a constant: folded)")
    return Rewrite(where, nodes, consts + ([fixed] if has_fixed else []))


@rewrites(aten.div.Tensor)
def _div_by_constant(node: Node) -> Rewrite | Refusal:
    """``x / k`` with a constant integer tensor ``k`` (lengths from a buffer): ``x * (1 / k)`` (a float
    constant divisor is an int8 operand of ``quantized_div`` as it is; an integer one no quantizer spec takes)."""
    x, k = node.args[:2]
    if node.kwargs.get("rounding_mode") is not None or not (isinstance(k, Node) and k.op == "get_attr") \
            or not isinstance(x, Node):
        return Refusal("not an activation divided by a constant tensor")
    kv = get_attr(node.graph.owning_module, k).detach()
    if kv.is_floating_point() or kv.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        return Refusal("a float (or non-numeric) divisor: quantized_div takes it")
    if bool((kv == 0).any()):
        return Refusal("the constant divisor holds zeros")
    return Rewrite(lambda xv, r: xv * r, [x], [1.0 / kv.to(torch.float32)])


@rewrites(aten.rms_norm.default)
def _rms_norm(node: Node) -> Rewrite | Refusal:
    """``nn.RMSNorm`` / ``F.rms_norm``: ``x * rsqrt(mean(x ** 2) + eps) * weight`` over the trailing dims
    (``eps`` None: the dtype's epsilon, as torch)."""
    x = node.args[0]
    dims = list(range(-len(list(node.args[1])), 0))
    weight = node_arg(node, "weight", None)
    eps = node_arg(node, "eps", None)
    eps = float(torch.finfo(torch.float32).eps if eps is None else eps)

    def rms(xv, *w):
        y = xv * torch.rsqrt(xv.pow(2).mean(dims, keepdim=True) + eps)
        return y * w[0] if w else y
    return Rewrite(rms, [x] + ([weight] if weight is not None else []))


@rewrites(aten.gru_cell.default, aten.lstm_cell.default, aten.rnn_tanh_cell.default, aten.rnn_relu_cell.default)
def _recurrent_cell(node: Node) -> Rewrite | Refusal:
    t = node.target
    x, hx, w_ih, w_hh = node.args[:4]
    b_ih = node_arg(node, "b_ih", None)
    b_hh = node_arg(node, "b_hh", None)
    states = list(hx) if t == aten.lstm_cell.default else [hx]
    zero = all(_is_zero_state(h) for h in states)
    nodes = [x, w_ih, w_hh] + [b for b in (b_ih, b_hh) if b is not None] + ([] if zero else states)
    nb = b_ih is not None

    def cell(*vs):
        vs = list(vs)
        xv, wi, wh = vs[:3]
        bi, bh = (vs[3], vs[4]) if nb else (None, None)
        st = None if zero else vs[5 if nb else 3:]
        gi = F.linear(xv, wi, bi)
        if t == aten.gru_cell.default:
            return _gru_step(gi, None if st is None else st[0], wh, bh)
        if t == aten.lstm_cell.default:
            return _lstm_step(gi, None if st is None else (st[0], st[1]), wh, bh)
        return _rnn_step(gi, None if st is None else st[0], wh, bh, t == aten.rnn_relu_cell.default)
    return Rewrite(cell, nodes, pre_dispatch=True)


@rewrites(aten.gru.input, aten.rnn_tanh.input, aten.rnn_relu.input, aten.lstm.input)
def _recurrent_layer(node: Node) -> Rewrite | Refusal:
    t = node.target
    x, hx, params, has_biases, layers, _, _, bidirectional, batch_first = node.args[:9]
    c_n_used = any(u.target is operator.getitem and u.args[1] == 2 and u.users for u in node.users)
    states = list(hx) if t == aten.lstm.input else [hx]
    zero = all(_is_zero_state(h) for h in states)
    projected = t == aten.lstm.input and len(params) != int(layers) * (2 if bidirectional else 1) * (
        4 if has_biases else 2)
    if t == aten.lstm.input and not bidirectional and not c_n_used and zero and not projected:
        return Refusal("a unidirectional LSTM with a zero initial state, not reading c_n (the LSTM family lowers "
                       "it whole)")
    kind = {aten.gru.input: "gru", aten.lstm.input: "lstm"}.get(t, "rnn")
    params = list(params)
    nodes = [x] + params + ([] if zero else states)

    def rnn(*vs):
        vs = list(vs)
        p = vs[1:1 + len(params)]
        st = vs[1 + len(params):]
        h0 = None if zero else st[0]
        c0 = None if zero or kind != "lstm" else st[1]
        return unrolled_rnn(kind, vs[0], h0, c0, p, bool(has_biases), int(layers), bool(bidirectional),
                            bool(batch_first), relu=t == aten.rnn_relu.input)
    return Rewrite(rnn, nodes, pre_dispatch=True)


@rewrites(aten.cumsum.default)
def _cumsum(node: Node) -> Rewrite | Refusal:
    if node.kwargs.get("dtype") is not None:
        return Refusal("dtype= given")
    x = node.args[0]
    rank = x.meta["val"].dim()
    dim = int(node.args[1]) % rank
    n = int(x.meta["val"].shape[dim])

    def cumsum(xv, u):
        if dim == rank - 1:
            return xv @ u
        return (xv.transpose(dim, -1) @ u).transpose(dim, -1)
    return Rewrite(cumsum, [x], [torch.ones(n, n).triu()])


@rewrites(aten.cosine_similarity.default)
def _cosine_similarity(node: Node) -> Rewrite | Refusal:
    dim = node_arg(node, "dim", 1)
    eps = float(node_arg(node, "eps", 1e-8))

    def cosine(x, y):
        nx = torch.sqrt((x * x).sum(dim, keepdim=True)).clamp_min(eps)
        ny = torch.sqrt((y * y).sum(dim, keepdim=True)).clamp_min(eps)
        return ((x / nx) * (y / ny)).sum(dim)
    return Rewrite(cosine, [node.args[0], node.args[1]])


@rewrites(aten.linear.default)
def _linear_nd(node: Node) -> Rewrite | Refusal:
    x = node.args[0]
    w = node.args[1]
    wb = [v for v in node.args[1:3] if isinstance(v, Node)]
    if isinstance(x, Node) and isinstance(w, Node) and w.meta["val"].dim() == 1:
        # F.linear(x, w) with a 1-D weight (NanoDet's Integral: a projection vector): the dot product
        # over the last dim, i.e. one output feature of a [1, in] weight, that feature dim dropped
        lead = list(x.meta["val"].shape[:-1])
        n_in = int(w.meta["val"].shape[0])
        gm = node.graph.owning_module
        if all(v.op == "get_attr" for v in wb):  # constants stay constants (no reshape node on them)
            consts = [get_attr(gm, v).detach().reshape(1, -1 if i == 0 else 1) for i, v in enumerate(wb)]

            def linear_vector(xv, wv, *b):
                return F.linear(xv.reshape(-1, n_in), wv, b[0] if b else None).reshape(lead)
            return Rewrite(linear_vector, [x], consts, pre_dispatch=True)

        def linear_computed_vector(xv, wv, *b):
            y = F.linear(xv.reshape(-1, n_in), wv.reshape(1, n_in), b[0].reshape(1) if b else None)
            return y.reshape(lead)
        return Rewrite(linear_computed_vector, [x] + wb, pre_dispatch=True)
    if not (isinstance(x, Node) and x.meta["val"].dim() in (4, 5)):
        return Refusal("not a 4-D or 5-D input (the linear family lowers it)")
    shape = list(x.meta["val"].shape)

    def linear_nd(xv, w, *b):
        y = F.linear(xv.reshape(shape[0], -1, shape[-1]), w, b[0] if b else None)
        return y.reshape(shape[:-1] + [y.shape[-1]])
    return Rewrite(linear_nd, [x] + wb, pre_dispatch=True)


@rewrites(*FULL_REDUCTIONS)
def _full_reduction(node: Node) -> Rewrite | Refusal:
    if node.kwargs.get("dtype") is not None or len(node.args) != 1 or node.args[0].meta["val"].dim() < 1:
        return Refusal("dtype= given, or a 0-D input")
    rank = node.args[0].meta["val"].dim()
    reduce = FULL_REDUCTIONS[node.target]
    return Rewrite(_zero_d(node, lambda x: reduce(x, list(range(rank)), keepdim=True)), [node.args[0]])


_MAX_POOLS = (aten.max_pool2d.default, aten.max_pool1d.default)


def _pad_feeds_only_max_pools(node: Node, pads: list[int]) -> bool:
    """Every user of the pad is a max pool whose every window still holds an input element (each pad
    narrower than the pool's kernel along its dim)."""
    rank = node.meta["val"].dim()
    for u in node.users:
        if u.target not in _MAX_POOLS or u.args[0] is not node:
            return False
        kernel = list(node_arg(u, "kernel_size"))
        kernel = kernel * (rank - 2) if len(kernel) == 1 else kernel
        for k in range(len(pads) // 2):
            dim_k = len(kernel) - 1 - k
            if dim_k < 0 or max(pads[2 * k], pads[2 * k + 1]) >= int(kernel[dim_k]):
                return False
    return bool(node.users)


@rewrites(aten.pad.default)
def _index_pad(node: Node) -> Rewrite | Refusal:
    """reflect / replicate / circular pads as constant ``index_select``s; a ``-inf`` constant pad read
    only by max pools (timm's ``max_pool2d_same``, TF 'SAME' max pools) as a replicate pad: a padded
    position then repeats the nearest edge element, which lies in every window that reads it, so each
    window's maximum is the one of its input elements - as with ``-inf`` - and nothing is infinite."""
    mode = node_arg(node, "mode", "constant")
    pads = [int(p) for p in node.args[1]]
    value = node_arg(node, "value", None)
    if (mode == "constant" and value is not None and float(value) == float("-inf") and all(p >= 0 for p in pads)
            and _pad_feeds_only_max_pools(node, pads)):
        mode = "replicate"
    if mode not in ("reflect", "replicate", "circular") or any(p < 0 for p in pads):
        return Refusal(f"mode {mode!r} or a negative pad (the pad family lowers constant pads)")
    shape = [int(d) for d in node.args[0].meta["val"].shape]
    plan, index = [], []
    for k in range(len(pads) // 2):
        dim = len(shape) - 1 - k
        before, after = pads[2 * k], pads[2 * k + 1]
        if before == after == 0:
            continue
        n = shape[dim]
        pos = torch.arange(-before, n + after)
        if mode == "reflect":
            period = 2 * (n - 1)
            pos = pos.remainder(period) if period else torch.zeros_like(pos)
            pos = torch.where(pos >= n, period - pos, pos)
        elif mode == "replicate":
            pos = pos.clamp(0, n - 1)
        else:
            pos = pos.remainder(n)
        plan.append(dim)
        index.append(pos.to(torch.int64))

    def pad(x, *idx):
        for d, i in zip(plan, idx):
            x = x.index_select(d, i)
        return x
    return Rewrite(pad, [node.args[0]], index)


@rewrites(aten.upsample_bilinear2d.vec, aten.upsample_linear1d.vec, aten.upsample_bicubic2d.vec,
          aten._upsample_bilinear2d_aa.vec, aten._upsample_bicubic2d_aa.vec)
def _linear_upsample(node: Node) -> Rewrite | Refusal:
    spatial = 1 if node.target == aten.upsample_linear1d.vec else 2
    mode = "cubic" if node.target in (aten.upsample_bicubic2d.vec, aten._upsample_bicubic2d_aa.vec) else "linear"
    antialias = node.target in (aten._upsample_bilinear2d_aa.vec, aten._upsample_bicubic2d_aa.vec)
    _, mats = _upsample_args(node, spatial, mode, antialias)
    if spatial == 1:
        return Rewrite(lambda x, mw: x @ mw, [node.args[0]], mats)
    return Rewrite(lambda x, mh, mw: mh.t() @ (x @ mw), [node.args[0]], mats)


@rewrites(aten.pow.Tensor_Tensor)
def _pow_constant_exponent(node: Node) -> Rewrite | Refusal:
    """``x.pow(self.p)`` with a one-element constant exponent (GeM pooling's learned ``p``; ``1 / p``
    is folded to a constant first): ``x ** float(p)``, the elementwise table of a Python exponent."""
    x, e = node.args[0], node.args[1]
    if not (isinstance(x, Node) and isinstance(e, Node) and e.op == "get_attr"):
        return Refusal("the exponent is not a constant (only x ** constant is a table)")
    value = get_attr(node.graph.owning_module, e)
    if value.numel() != 1 or tuple(node.meta["val"].shape) != tuple(x.meta["val"].shape):
        return Refusal("the exponent has more than one element, or it broadcasts the base")
    k = float(value.reshape(()))
    return Rewrite(lambda xv: torch.pow(xv, k), [x])


def spell_out_batch_statistics(gm: GraphModule) -> bool:
    """Spell out every BatchNorm that normalises with batch statistics (see ``_batch_statistics_norm``)."""
    return RewriteTablePass(BATCH_STATISTICS)(gm).modified


class DecomposeCompositesPass(RewriteTablePass):
    """Drop same-dtype casts, fold constant subgraphs, turn masked_fill / logical conditions into ``where``s, then
    replace the composite ops of the module docstring by the graphs of their rewrites (:data:`COMPOSITES`)."""

    def __init__(self) -> None:
        super().__init__(COMPOSITES, prepare=(drop_noop_casts, fold_constants, scalar_wheres, logical_wheres))


@rewrites(aten.conv3d.default)
def _conv3d_frames(node: Node) -> Rewrite | Refusal:
    """``nn.Conv3d`` with a temporal kernel of 1 (ExecuTorch's suite, (2+1)-D video models): a 2-D
    convolution of every frame - ``[N, C, T, H, W]`` as ``N * T`` images, the temporal stride
    picking frames - then back to ``[N, O, T', H', W']``."""
    x, w = node.args[0], node.args[1]
    b = node_arg(node, "bias", None)
    stride, padding, dilation = (list(node_arg(node, k, d)) for k, d in
                                 (("stride", [1, 1, 1]), ("padding", [0, 0, 0]), ("dilation", [1, 1, 1])))
    stride, padding, dilation = ([v[0]] * 3 if len(v) == 1 else v for v in (stride, padding, dilation))
    groups = int(node_arg(node, "groups", 1))
    if w.meta["val"].shape[2] != 1 or padding[0] != 0:
        why = ("a conv3d with a temporal kernel or temporal padding: only a temporal kernel of 1 without temporal "
               "padding runs (as a 2-D convolution of each frame); split it into a spatial conv3d (1, kH, kW) and "
               "a temporal one written as a sum of shifted frames, or use Conv2d on [N * T, C, H, W]")
        node.meta["corten_refusal"] = why  # (no lowering rule takes conv3d: reported with this reason)
        return Refusal(why)
    st = int(stride[0])

    def frames(xv, wv, *bv):
        n, c, t, h, wd = xv.shape
        xs = xv[:, :, ::st] if st > 1 else xv
        t2 = xs.shape[2]
        y = F.conv2d(xs.permute(0, 2, 1, 3, 4).reshape(n * t2, c, h, wd), wv[:, :, 0], bv[0] if bv else None,
                     stride[1:], padding[1:], dilation[1:], groups)
        return y.reshape(n, t2, *y.shape[1:]).permute(0, 2, 1, 3, 4)
    return Rewrite(frames, [x, w] + ([b] if b is not None else []), pre_dispatch=True)  # (conv2d stays whole)


@rewrites(aten.conv_transpose2d.input, aten.conv_transpose1d.default)
def _grouped_conv_transpose(node: Node) -> Rewrite | Refusal:
    """A transposed convolution with ``groups > 1`` (FCN's depthwise bilinear upsampling,
    ``ConvTranspose2d(C, C, 4, 2, 1, groups=C)``) -> ``groups=1`` with the block-diagonal weight
    (zeros between the groups): the same sums, each output channel's per-channel weight scale
    unchanged.  It costs ``groups`` times the MACs of the grouped layer."""
    x, w = node.args[0], node.args[1]
    groups = int(node_arg(node, "groups", 1))
    if groups == 1:
        return Refusal("groups=1 (the conv_transpose family lowers it)")
    gm = node.graph.owning_module
    b = node_arg(node, "bias", None)
    if not (isinstance(w, Node) and w.op == "get_attr") or not (b is None or (isinstance(b, Node) and
                                                                         b.op == "get_attr")):
        return Refusal("the weight or bias is not a constant")
    weight = get_attr(gm, w).detach()
    c_in, c_out_g = int(weight.shape[0]), int(weight.shape[1])
    c_in_g = c_in // groups
    dense = weight.new_zeros((c_in, c_out_g * groups) + tuple(weight.shape[2:]))
    for g in range(groups):
        dense[g * c_in_g:(g + 1) * c_in_g, g * c_out_g:(g + 1) * c_out_g] = weight[g * c_in_g:(g + 1) * c_in_g]
    consts = [dense] + ([get_attr(gm, b).detach()] if b is not None else [])
    stride, padding, output_padding, dilation = (node_arg(node, k, d) for k, d in (
        ("stride", 1), ("padding", 0), ("output_padding", 0), ("dilation", 1)))
    fn = F.conv_transpose2d if node.target == aten.conv_transpose2d.input else F.conv_transpose1d

    def ungrouped(xv, wv, *bv):
        return fn(xv, wv, bv[0] if bv else None, stride, padding, output_padding, 1, dilation)
    return Rewrite(ungrouped, [x], consts, pre_dispatch=True)


@rewrites(aten.avg_pool3d.default)
def _channel_window_mean(node: Node) -> Rewrite | Refusal:
    """``nn.LocalResponseNorm`` / ``F.local_response_norm`` (AlexNet, GoogLeNet v1): PyTorch averages
    ``x * x`` over a window of channels as ``avg_pool3d`` with kernel ``(size, 1, 1)`` on the
    ``[N, 1, C, H, W]`` view, zero-padded over C.  That mean is linear in the channels: a 1x1
    convolution ``C -> C`` with a constant band weight (``1 / size`` inside each window; the zero pad
    folded in), on ``[N, C, H, W]``."""
    x = node.args[0]
    kernel = [int(k) for k in node_arg(node, "kernel_size")]
    stride = [int(k) for k in (node_arg(node, "stride", None) or kernel)]
    padding = [int(k) for k in node_arg(node, "padding", [0, 0, 0])]
    if len(kernel) == 1:
        kernel = kernel * 3
    if len(stride) == 1:
        stride = stride * 3
    if len(padding) == 1:
        padding = padding * 3
    shape = [int(d) for d in x.meta["val"].shape]
    if (len(shape) != 5 or shape[1] != 1 or kernel[1:] != [1, 1] or stride != [1, 1, 1] or any(padding)
            or node_arg(node, "ceil_mode", False) or not node_arg(node, "count_include_pad", True)
            or node_arg(node, "divisor_override", None) is not None):
        why = ("avg_pool3d: only the channel-window mean of nn.LocalResponseNorm (kernel (k, 1, 1), stride 1, "
               "on [N, 1, C, H, W]) is supported; pool 4-D tensors with avg_pool2d (e.g. each frame as an image)")
        node.meta["corten_refusal"] = why
        return Refusal(why)
    before = after = 0
    if (x.target in (aten.pad.default, aten.constant_pad_nd.default) and len(x.users) == 1
            and str(node_arg(x, "mode", "constant")) == "constant" and not float(node_arg(x, "value", 0.0) or 0.0)):
        pads = [int(p) for p in x.args[1]]
        pads += [0] * (10 - len(pads))
        if not any(pads[:4]) and not any(pads[6:]) and min(pads[4:6]) >= 0:
            before, after = pads[4], pads[5]
            x = x.args[0]
    n, _, d, h, w = (int(v) for v in x.meta["val"].shape)
    k = kernel[0]
    d_out = d + before + after - k + 1
    band = torch.zeros(d_out, d, 1, 1)
    for o in range(d_out):
        for i in range(max(0, o - before), min(d, o - before + k)):
            band[o, i] = 1.0 / k

    def channel_mean(xv, wv):
        y = F.conv2d(xv.reshape(n, d, h, w), wv)
        return y.reshape(n, 1, d_out, h, w)
    return Rewrite(channel_mean, [x], [band], pre_dispatch=True)


# Ops that read or write at addresses computed from the data: no int8 kernel, refused with why and
# what to write instead (the reason travels on the node to the UnsupportedOpsError)
DATA_ADDRESSED = {
    aten.max_unpool2d.default: (
        "max_unpool2d writes each value at the position max_pool2d(return_indices=True) recorded (addresses "
        "computed from the data): not supported; upsample with nn.Upsample(scale_factor=2) or a "
        "ConvTranspose2d instead (a U-Net-style decoder in place of SegNet's unpooling)"),
    aten.grid_sampler.default: (
        "grid_sample reads the input at positions computed from the data (a spatial transformer): not "
        "supported; apply the warp outside the compiled model (on the input image), or use a fixed "
        "crop / F.interpolate"),
    aten.grid_sampler_2d.default: (
        "grid_sample reads the input at positions computed from the data (a spatial transformer): not "
        "supported; apply the warp outside the compiled model (on the input image), or use a fixed "
        "crop / F.interpolate"),
    aten.affine_grid_generator.default: (
        "affine_grid only feeds grid_sample (sampling at computed positions), which is not supported; "
        "apply the affine warp outside the compiled model"),
}


@rewrites(*DATA_ADDRESSED)
def _data_addressed(node: Node) -> Rewrite | Refusal:
    why = DATA_ADDRESSED[node.target]
    node.meta["corten_refusal"] = why  # (no lowering rule takes these ops: reported with this reason)
    indices = node.args[1] if node.target == aten.max_unpool2d.default else None
    if isinstance(indices, Node) and indices.target is operator.getitem and isinstance(indices.args[0], Node):
        indices.args[0].meta["corten_refusal"] = f"its indices feed {node.name} (max_unpool2d), which is not supported"
    return Refusal(why)


@rewrites(aten.index_copy.default, aten.index_put.default)
def _index_copy(node: Node) -> Rewrite | Refusal:
    """``x.index_copy(dim, idx, src)`` and ``index_put(x, (idx,), src)`` with constant indices (the
    edge dialect's functional forms): one ``index_select`` of ``cat([x, src], dim)`` whose constant
    index picks, at each position, the row of ``src`` written there or else ``x``'s own row."""
    def refuse(why: str) -> Refusal:
        node.meta["corten_refusal"] = why + "; write it as torch.cat of slices, or with a constant index tensor"
        return Refusal(why)  # (no lowering rule takes index_copy / index_put: reported with this reason)

    x = node.args[0]
    if node.target == aten.index_copy.default:
        dim, idx, src = node.args[1], node.args[2], node.args[3]
    else:
        indices, src = node.args[1], node.args[2]
        if node_arg(node, "accumulate", False):
            return refuse("index_put with accumulate=True (a scatter-add) is not rewritten")
        if len(indices) != 1 or indices[0] is None:
            return refuse("index_put with more than one index tensor (only one index on dim 0 is rewritten)")
        dim, idx = 0, indices[0]
    if not (isinstance(idx, Node) and idx.op == "get_attr" and isinstance(src, Node)):
        return refuse("the indices are computed (only constant indices are rewritten)")
    index = get_attr(node.graph.owning_module, idx).detach().flatten().long()
    shape = list(x.meta["val"].shape)
    d = int(dim) % len(shape)
    n = shape[d]
    index = torch.where(index < 0, index + n, index)
    if index.numel() == 0 or index.dtype == torch.bool or bool(((index < 0) | (index >= n)).any()):
        return refuse("the indices are empty, boolean or out of range")
    want = shape[:d] + [index.numel()] + shape[d + 1:]
    if list(src.meta["val"].shape) != want:
        return refuse(f"the values have shape {list(src.meta['val'].shape)}, not {want} (no broadcast is rewritten)")
    pick = list(range(n))
    for j, i in enumerate(index.tolist()):  # the last write to a position wins, as in torch
        pick[i] = n + j
    pick_t = torch.tensor(pick, dtype=torch.long)

    def index_copy(xv, sv, p):
        return torch.index_select(torch.cat([xv, sv], d), d, p)
    return Rewrite(index_copy, [x, src], [pick_t])
