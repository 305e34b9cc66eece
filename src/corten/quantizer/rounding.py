"""Output-aware weight rounding (``corten.compile(..., rounding="adaptive")``), int8 and int4 weights.

Round-to-nearest minimises each weight's own error; what matters is the error of the layer's
*output*.  For a conv/linear layer with per-channel weights ``w`` (scale ``s_c`` per output channel
``c``), integer weights ``q`` and layer inputs ``x`` (rows of the input as the layer reads them: the
im2col patches of a conv, the feature vectors of a linear), the output error of channel ``c`` is

    sum_rows (x . (s_c q_c - w_c))^2 = s_c^2 r_c^T H r_c,    r_c = q_c - w_c / s_c,  H = X^T X

(AdaRound's layer-wise objective, Nagel et al. 2020, with its constraint: each weight is rounded
*up or down*, ``q = floor(w / s)`` or ``floor(w / s) + 1``, clamped to the weight range).  ``H`` is
the Gram matrix of the layer's quantized inputs over the calibration samples (per group for grouped
and depthwise convolutions), so the cost of the search does not grow with the sample count.  The
layers are rounded one after the other in graph order, each on its inputs as the program computes
them with the layers before it already re-rounded (weights and moved biases): a layer's rounding
and bias fit the activations it will really see, so a later layer's bias absorbs the mean error the
earlier layers leave.

Solver: exact coordinate descent from round-to-nearest (:func:`round_adaptive`): in every channel,
the single up/down flip that lowers ``r^T H r`` most is applied, until no flip lowers it.  Each step
lowers the objective, so the result is never worse than nearest on the samples it was fitted on;
deterministic, no learning rate, temperature or iteration schedule (AdaRound's sigmoid relaxation
needs all three) and fast: a step updates ``H r`` by one row of ``H``.

Bias correction: in a layer with a bias, the bias absorbs the mean output error (the int32 bias
moves by ``-s_c m . r_c``, ``m`` the mean input row), so the rounding minimises what is left, the
error about that mean: the descent runs on the centred Gram matrix ``H - n m m^T``.  In a ReLU
network a systematic shift of every output adds up coherently from layer to layer; random errors
only in power.

Against overfitting small sample counts:

* a weight moves at most one step from its float value (floor or ceil);
* ``H`` is damped, ``H + d * mean(diag H) * I``: directions the samples do not excite keep the
  nearest rounding (the damping term is the weights' own squared error, minimised by nearest).  The
  damping grows as the fitted rows get fewer than the weights they fit, ``d = max(DAMPING, SHRINKAGE *
  (K - rows) / rows)`` (:func:`damping`): with 6 fitted rows for 128 weights ``H`` has rank 6, and the
  descent would otherwise fit the samples' noise in the directions they leave unexcited (measured on
  the zoo's deep-ae, int16: on its 8 default samples adaptive rounding was worse than nearest, 0.071
  against 0.066 relative error);
* a held-out guard: the layer is fitted on the first samples and each output channel keeps the new
  rounding only where it has a smaller output error than nearest on the held-out quarter of the
  samples (at least one), its bias correction included; otherwise the channel keeps nearest and its
  bias.  With fewer than two samples nothing changes.

Only the integer weight and bias constants change: scales, zero points and every activation range
stay those of calibration, so the lowering, the C and the bit-exactness are untouched.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from corten.fixed_point import INT32_MAX
from corten.fx_nodes import get_attr, node_arg

ROUNDINGS = ("nearest", "adaptive")
DAMPING = 0.01  # the weight-error term added to H, relative to H's mean diagonal (at least)
SHRINKAGE = 0.3  # ... and at least SHRINKAGE * (weights per channel - fitted rows) / (fitted rows)
HELD_OUT = 4  # 1 / HELD_OUT of the calibration samples (at least one) judge each layer's rounding
_CONVS = {torch.ops.aten.conv1d.default, torch.ops.aten.conv2d.default}
_LAYERS = _CONVS | {torch.ops.aten.linear.default}
_DQ_PER_CHANNEL = torch.ops.quantized_decomposed.dequantize_per_channel.default


@dataclass
class LayerRounding:
    """What adaptive rounding did to one layer: output mean squared errors on the held-out samples
    with nearest and with the chosen rounding, the output channels that took the new rounding and
    the weights that differ from nearest."""

    node: str
    nearest_error: float
    adaptive_error: float
    channels: int
    channels_changed: int
    changed: int


def check_rounding(rounding) -> str:
    from corten.errors import UsageError

    if rounding not in ROUNDINGS:
        raise UsageError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    return rounding


# ----------------------------------------------------------------------------- the math (pure functions)
def layer_rows(x: torch.Tensor, kind: str, weight_shape: tuple, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
               groups: int = 1) -> torch.Tensor:
    """The rows a layer multiplies its weights with, ``[groups, rows, K]`` (``K`` = the weights of one
    output channel, in ``weight.reshape(C_out, -1)`` order): for ``kind="linear"`` the input's feature
    vectors, for ``"conv1d"`` / ``"conv2d"`` the zero-padded im2col patches of each group."""
    x = x.detach().to(torch.float32)
    if kind == "linear":
        return x.reshape(1, -1, weight_shape[1])
    if kind == "conv1d":  # [N, C, L] as [N, C, 1, L]
        x, kernel = x.unsqueeze(2), (1, weight_shape[2])
        stride, padding, dilation = (1, stride[0]), (0, padding[0]), (1, dilation[0])
    else:
        kernel = tuple(weight_shape[2:4])
    cols = torch.nn.functional.unfold(x, kernel, dilation=tuple(dilation), padding=tuple(padding),
                                      stride=tuple(stride))  # [N, C_in * kH * kW, L], channel-major
    n, k, length = cols.shape
    return cols.reshape(n, groups, k // groups, length).permute(1, 0, 3, 2).reshape(groups, n * length, k // groups)


def gram(rows: torch.Tensor) -> torch.Tensor:
    """``X^T X`` of each group's rows, ``[groups, K, K]`` in float64."""
    return torch.matmul(rows.transpose(1, 2), rows).to(torch.float64)


def damping(k: int, rows: int) -> float:
    """The damping of a layer with ``k`` weights per output channel fitted on ``rows`` rows: the floor
    ``DAMPING`` while the rows can excite every direction (``rows >= k``), then in proportion to the
    directions they leave unexcited (``H`` has rank ``rows``), ``k - rows``, per row."""
    return max(DAMPING, SHRINKAGE * (k - rows) / max(rows, 1))


def damped(h: torch.Tensor, amount: float = DAMPING) -> torch.Tensor:
    """``H + amount * mean(diag H) * I`` per group (``amount``: :func:`damping`)."""
    diag = torch.diagonal(h, dim1=1, dim2=2)
    eye = torch.eye(h.shape[-1], dtype=h.dtype)
    return h + amount * diag.mean(1).clamp_min(1e-30)[:, None, None] * eye


def channel_losses(q: torch.Tensor, w_scaled: torch.Tensor, h: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """``r_c^T H_g(c) r_c`` per output channel, ``r = q - w / s`` (``[C, K]``), ``h`` ``[G, K, K]``."""
    r = (q - w_scaled).to(torch.float64)
    if h.shape[0] == 1:
        return ((r @ h[0]) * r).sum(1)
    return (torch.bmm(r.unsqueeze(1), h[group]).squeeze(1) * r).sum(1)


def centred(h: torch.Tensor, sums: torch.Tensor, n: int) -> torch.Tensor:
    """``H - S S^T / n`` per group (``sums`` ``[G, K]``: the rows' sum, ``n`` rows): the Gram matrix
    of the rows minus their mean, the objective left once a bias absorbs the mean error."""
    return h - sums.unsqueeze(2) * sums.unsqueeze(1) / max(n, 1)


def corrected_losses(q: torch.Tensor, w_scaled: torch.Tensor, h: torch.Tensor, group: torch.Tensor,
                     sums: torch.Tensor, n: int, mean_fit: torch.Tensor) -> torch.Tensor:
    """Per channel ``||X r - u||^2`` over ``n`` rows of Gram matrix ``h`` and row sum ``sums``, where the
    bias moved by ``-u``, ``u = mean_fit . r`` (the mean error of the rows it was fitted on):
    ``r^T H r - 2 u (S . r) + n u^2``."""
    r = (q - w_scaled).to(torch.float64)
    u = (mean_fit[group] * r).sum(1)
    return channel_losses(q, w_scaled, h, group) - 2 * u * (sums[group] * r).sum(1) + n * u * u


def round_adaptive(w_scaled: torch.Tensor, h: torch.Tensor, group: torch.Tensor, qmin: int, qmax: int,
                   start: torch.Tensor | None = None) -> torch.Tensor:
    """Integer weights ``[C, K]`` (float tensor of integers) minimising ``r_c^T H_g(c) r_c`` per
    channel over ``q`` in ``{floor(w/s), floor(w/s) + 1}`` clamped to ``[qmin, qmax]``, by coordinate
    descent from ``start`` (default: round-to-nearest, half to even): each step applies, in every
    channel, the one flip that lowers its loss most; it stops when no flip lowers any.
    ``w_scaled = w / s`` (``[C, K]``), ``h`` ``[G, K, K]`` symmetric, ``group[c]`` the group of channel ``c``."""
    w = w_scaled.to(torch.float64)
    lo = torch.clamp(torch.floor(w), qmin, qmax)
    hi = torch.clamp(torch.floor(w) + 1, qmin, qmax)
    q = torch.clamp(torch.round(w), qmin, qmax) if start is None else start.to(torch.float64).clone()
    shared = h.shape[0] == 1
    hc = h[0] if shared else h[group]  # [K, K] or [C, K, K]
    grad = 2 * ((q - w) @ hc if shared else torch.bmm((q - w).unsqueeze(1), hc).squeeze(1))  # d loss / d q
    diag = torch.diagonal(hc).expand_as(w).contiguous() if shared else torch.diagonal(hc, dim1=1, dim2=2)
    tol = 1e-12 * diag.abs().amax(1).clamp_min(1e-30)
    # the working set: the channels that may still improve (converged ones are dropped in batches,
    # when a third of them are done; a channel without an improving flip no longer changes)
    rows_of = torch.arange(w.shape[0])
    wq, wlo, whi, wgrad, wdiag, wtol = q.clone(), lo, hi, grad, diag, tol
    for _ in range(4 * w.shape[1] + 4):  # (a safety bound: each flip lowers the loss, so the descent ends)
        d = torch.where(wq == wlo, whi, wlo) - wq  # the other candidate of each weight: +1, -1 or 0
        delta = d * (wgrad + d * wdiag)  # the loss change of flipping that weight alone
        delta.masked_fill_(d == 0, float("inf"))
        best, idx = delta.min(1)
        move = best < -wtol
        n_move = int(move.sum())
        if n_move == 0:
            break
        ch = move.nonzero().squeeze(1)
        i = idx[ch]
        step = d[ch, i]
        wq[ch, i] += step
        rows = hc[i] if shared else hc[rows_of[ch], i]  # row i of each moving channel's H
        wgrad[ch] += 2 * step[:, None] * rows
        if n_move < 2 * len(rows_of) // 3:  # compact: keep the moving channels only
            q[rows_of] = wq
            rows_of = rows_of[ch]
            wq, wlo, whi, wgrad, wdiag, wtol = (t[ch] for t in (wq, wlo, whi, wgrad, wdiag, wtol))
    q[rows_of] = wq
    return q


def guarded(q_near: torch.Tensor, q_adapt: torch.Tensor, w_scaled: torch.Tensor, h_test: torch.Tensor,
            group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, keep, loss nearest, loss chosen)``: per channel the adaptive rounding where its held-out
    loss ``r^T H_test r`` is below nearest's, else nearest."""
    near, adapt = channel_losses(q_near, w_scaled, h_test, group), channel_losses(q_adapt, w_scaled, h_test, group)
    keep = adapt < near
    return torch.where(keep[:, None], q_adapt, q_near), keep, near, torch.where(keep, adapt, near)


# ----------------------------------------------------------------------------- the converted graph
def _layer_kind(node: torch.fx.Node) -> str:
    if node.target == torch.ops.aten.linear.default:
        return "linear"
    return "conv1d" if node.target == torch.ops.aten.conv1d.default else "conv2d"


def _int_weight(node: torch.fx.Node, gm: torch.fx.GraphModule):
    """``(int constant target, scale [C], qmin, qmax)`` of a converted layer whose weights are
    quantized per output channel (axis 0), else None."""
    dq = node.args[1] if len(node.args) > 1 else None
    if not (isinstance(dq, torch.fx.Node) and dq.target == _DQ_PER_CHANNEL):
        return None
    q, scale, _zp, axis, qmin, qmax = dq.args[:6]
    if axis != 0 or not (isinstance(q, torch.fx.Node) and q.op == "get_attr"):
        return None
    s = get_attr(gm, scale) if isinstance(scale, torch.fx.Node) else torch.as_tensor(scale)
    return q.target, s.detach().to(torch.float64), int(qmin), int(qmax)


def _int_bias(node: torch.fx.Node, gm: torch.fx.GraphModule):
    """``(int32 constant target, scale [C])`` of a converted layer's per-channel quantized bias, else None."""
    dq = node.args[2] if len(node.args) > 2 else None
    if not (isinstance(dq, torch.fx.Node) and dq.target == _DQ_PER_CHANNEL):
        return None
    b, scale = dq.args[:2]
    if not (isinstance(b, torch.fx.Node) and b.op == "get_attr" and isinstance(scale, torch.fx.Node)):
        return None
    return b.target, get_attr(gm, scale).detach().to(torch.float64)


def _weight_source(node: torch.fx.Node):
    """The get_attr node of an observed weight in a prepared graph (through its observer)."""
    w = node.args[1] if len(node.args) > 1 else None
    while isinstance(w, torch.fx.Node) and w.op == "call_module":
        w = w.args[0]
    return w if isinstance(w, torch.fx.Node) and w.op == "get_attr" else None


def float_weights(prepared: torch.fx.GraphModule) -> dict[str, torch.Tensor]:
    """``{layer node name: float weight}`` of the conv/linear layers of a prepared graph (BatchNorm
    folded), taken before ``convert_pt2e`` replaces them by integer constants."""
    return {node.name: get_attr(prepared, _weight_source(node)).detach().clone()
            for node in prepared.graph.nodes
            if node.op == "call_function" and node.target in _LAYERS and _weight_source(node) is not None}


def _geometry(node: torch.fx.Node) -> dict:
    if node.target == torch.ops.aten.linear.default:
        return {}
    return {k: tuple(node_arg(node, k)) for k in ("stride", "padding", "dilation")} | \
        {"groups": int(node_arg(node, "groups"))}


def _constant_nodes(graph: torch.fx.Graph) -> set:
    """The nodes whose value does not depend on the inputs (constants and what is computed from them)."""
    const: set = set()
    for n in graph.nodes:
        if n.op == "get_attr" or (n.op == "call_function" and all(a in const for a in n.all_input_nodes)):
            const.add(n)
    return const


def _ancestors(nodes, within: set) -> set:
    seen, todo = set(), [n for n in nodes if isinstance(n, torch.fx.Node) and n in within]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += [a for a in n.all_input_nodes if a in within]
    return seen


def _call(node: torch.fx.Node, gm: torch.nn.Module, value):
    """``node`` evaluated with ``value(input node)`` for its inputs."""
    if node.op == "get_attr":
        return get_attr(gm, node.target)
    args = torch.fx.node.map_arg(node.args, value)
    kwargs = torch.fx.node.map_arg(node.kwargs, value)
    if node.op == "call_function":
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        return getattr(args[0], node.target)(*args[1:], **kwargs)
    return get_attr(gm, node.target)(*args, **kwargs)  # call_module


def adaptive_rounding(converted: torch.fx.GraphModule, weights: dict[str, torch.Tensor], samples: list,
                      say=lambda s: None) -> list[LayerRounding]:
    """Re-round the integer weights of ``converted``'s conv/linear layers in place (see the module
    docstring); ``weights`` from :func:`float_weights` of the prepared graph, ``samples`` the
    calibration input tuples.  Returns one :class:`LayerRounding` per layer.

    Layer by layer, in graph order: the graph runs node by node over all samples at once, so each
    layer is rounded on its inputs as the quantized program gives them with every layer before it
    already re-rounded (its Gram matrices see the upstream layers' final weights and biases)."""
    layers: dict[str, dict] = {}
    for node in converted.graph.nodes:
        if node.op != "call_function" or node.target not in _LAYERS or node.name not in weights:
            continue
        found = _int_weight(node, converted)
        if found is None:
            continue
        target, scale, qmin, qmax = found
        w = weights[node.name].to(torch.float64)
        layers[node.name] = {"kind": _layer_kind(node), "shape": tuple(w.shape), "geometry": _geometry(node),
                             "target": target, "scale": scale, "qmin": qmin, "qmax": qmax, "w": w,
                             "bias": _int_bias(node, converted)}
    if not layers or len(samples) < 2:
        return []
    n_test = max(1, len(samples) // HELD_OUT)
    nodes = list(converted.graph.nodes)
    const = _constant_nodes(converted.graph)
    last_use = {a: i for i, n in enumerate(nodes) for a in n.all_input_nodes}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    consts: dict = {}  # the constants' values (a layer's new weight and bias once it is re-rounded)
    envs: list[dict] = [{} for _ in samples]  # per sample, the values of the other nodes
    report = []
    with torch.no_grad():
        for i, n in enumerate(nodes):
            if n.op == "output":
                break
            if n in const:
                consts[n] = _call(n, converted, consts.__getitem__)
                continue
            if n.op == "placeholder":
                k = placeholders.index(n)
                for env, sample in zip(envs, samples):
                    env[n] = sample[k]
                continue
            spec = layers.get(n.name)
            if spec is not None:
                say(f"\r  adaptive rounding [{len(report) + 1}/{len(layers)}] {n.name}"
                    + ("\n" if len(report) + 1 == len(layers) else ""))
                for k, env in enumerate(envs):
                    _add_rows(spec, env[n.args[0]], held_out=k >= len(samples) - n_test)
                report.append(_round_layer(converted, spec, n.name))
                changed = _ancestors(n.args[1:3], const)  # the new weight and bias constants, for what follows
                for a in nodes:
                    if a in changed:
                        consts[a] = _call(a, converted, consts.__getitem__)
            for env in envs:
                env[n] = _call(n, converted, lambda a: consts[a] if a in consts else env[a])  # noqa: B023
            for a in n.all_input_nodes:
                if last_use.get(a) == i and a not in const:
                    for env in envs:
                        env.pop(a, None)
    return report


def _add_rows(spec: dict, x: torch.Tensor, held_out: bool) -> None:
    """Add one sample's input rows of a layer to its Gram matrix, row sum and row count (the fit or
    the held-out ones)."""
    rows = layer_rows(x, spec["kind"], spec["shape"], **spec["geometry"])
    part = "test" if held_out else "fit"
    spec["h_" + part] = gram(rows) + spec.get("h_" + part, 0)
    spec["sum_" + part] = rows.sum(1).to(torch.float64) + spec.get("sum_" + part, 0)
    spec["rows_" + part] = rows.shape[1] + spec.get("rows_" + part, 0)


def _round_layer(converted: torch.fx.GraphModule, spec: dict, name: str) -> LayerRounding:
    """Re-round one layer's weight (and move its bias) constants in ``converted`` from the Gram
    matrices :func:`_add_rows` gathered."""
    w = spec["w"].reshape(spec["shape"][0], -1)
    s = spec["scale"].reshape(-1, 1)
    w_scaled = w / s
    groups = spec["h_fit"].shape[0]
    group = torch.arange(w.shape[0]) // (w.shape[0] // groups)
    current = get_attr(converted, spec["target"])
    q_near = current.reshape(w.shape[0], -1).to(torch.float64)
    if spec["bias"] is None:
        h_fit = damped(spec["h_fit"], damping(w.shape[1], spec["rows_fit"]))
        q_adapt = round_adaptive(w_scaled, h_fit, group, spec["qmin"], spec["qmax"], start=q_near)
        q, keep, near, chosen = guarded(q_near, q_adapt, w_scaled, spec["h_test"], group)
    else:  # the bias absorbs the mean error: round on the centred Gram matrix, then move the bias
        n_fit = spec["rows_fit"]
        h_fit = centred(spec["h_fit"], spec["sum_fit"], n_fit)
        h_fit = damped(h_fit, damping(w.shape[1], n_fit))
        q_adapt = round_adaptive(w_scaled, h_fit, group, spec["qmin"], spec["qmax"], start=q_near)
        mean_fit = spec["sum_fit"] / max(n_fit, 1)
        near = channel_losses(q_near, w_scaled, spec["h_test"], group)
        adapt = corrected_losses(q_adapt, w_scaled, spec["h_test"], group, spec["sum_test"], spec["rows_test"],
                                 mean_fit)
        keep = adapt < near
        q, chosen = torch.where(keep[:, None], q_adapt, q_near), torch.where(keep, adapt, near)
        # output shift of each kept channel: s * mean . r; the bias (scale s_in * s) moves by -shift
        shift = spec["scale"] * (mean_fit[group] * (q_adapt - w_scaled)).sum(1)
        b_target, b_scale = spec["bias"]
        bias = get_attr(converted, b_target)
        moved = torch.where(keep, torch.round(-shift / b_scale), torch.zeros_like(shift))
        if bool((moved != 0).any()):
            new_bias = torch.clamp(bias.to(torch.float64) + moved, -INT32_MAX, INT32_MAX)  # (the bias range)
            _set_attr(converted, b_target, new_bias.to(bias.dtype))
    changed = int((q != q_near).sum())
    if changed:
        _set_attr(converted, spec["target"], q.reshape(current.shape).to(current.dtype))
    per_output = float(spec["rows_test"] * w.shape[0])
    s2 = spec["scale"] ** 2
    return LayerRounding(name, float((s2 * near).sum()) / per_output, float((s2 * chosen).sum()) / per_output,
                         w.shape[0], int(keep.sum()), changed)


def _set_attr(gm: torch.nn.Module, target: str, value: torch.Tensor) -> None:
    *path, last = target.split(".")
    obj = gm
    for part in path:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def rounding_summary(report: list[LayerRounding]) -> dict:
    """What ``Program.info["rounding"]`` keeps of a report."""
    return {"layers": len(report), "layers_changed": sum(1 for r in report if r.changed),
            "weights_changed": sum(r.changed for r in report),
            "per_layer": [{"node": r.node, "nearest_mse": r.nearest_error, "adaptive_mse": r.adaptive_error,
                           "channels_changed": r.channels_changed, "weights_changed": r.changed} for r in report]}
