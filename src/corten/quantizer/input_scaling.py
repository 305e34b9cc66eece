"""Per-feature input scaling: an input whose features span very different ranges (raw sensor or
tabular data: 1e-3 next to 1e3) loses its small features on one int8 grid.  With
``input_scaling="per_feature"`` each feature ``f`` of such an input gets its own affine map onto the
int8 range, ``x'[f] = x[f] / s[f] + o[f]`` (``[lo_f, hi_f]`` from calibration onto ``[-128, 127]``),
and the program takes ``x'`` on the grid of scale 1, zero point 0.  The map is folded into the
``nn.Linear`` that reads the input: ``W x + b = (W diag(s)) x' + (b - W diag(s) o)``, exact in real
arithmetic, so the int8 program needs no extra op.

The map runs before the quantize, in float32, as ``x / s + o`` in this order (Program.run and the C
header's ``<name>_scale_input<i>(x, feature)`` alike, so both quantize the same numbers).
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from corten.aten_passes.graph_utils import add_constant
from corten.errors import UsageError
from corten.fx_nodes import get_attr
from corten.ops._qparams import scale_input  # noqa: F401  (the map itself lives with the quantize)

MODES = ("per_tensor", "per_feature")
# x' spans the int8 grid of scale 1, zero point 0: the range the quantizer declares for it
SCALED_RANGE = (-128.0, 127.0)


def check_mode(mode) -> str:
    if mode not in MODES:
        raise UsageError(f"input_scaling must be one of {', '.join(repr(m) for m in MODES)}, got {mode!r}")
    return mode


def feature_affine(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, o)`` float32 per feature (the last dim) of the calibration ``values`` [..., F]: the range
    ``[lo, hi]`` seen for a feature maps onto ``[-128, 127]`` (a constant feature onto 0)."""
    flat = values.detach().reshape(-1, values.shape[-1]).to(torch.float64)
    lo, hi = flat.amin(0), flat.amax(0)
    span = hi - lo
    const = span <= 0
    s = torch.where(const, hi.abs().clamp(min=1e-12), span / 255.0)
    o = torch.where(const, -lo / s, -128.0 - lo / s)
    return s.to(torch.float32), o.to(torch.float32)


def linear_reading(gm: GraphModule, placeholder: Node) -> Node | None:
    """The ``aten.linear`` that is the input's only reader (features last), else None."""
    users = list(placeholder.users)
    if len(users) != 1:
        return None
    lin = users[0]
    if lin.op != "call_function" or lin.target != torch.ops.aten.linear.default or lin.args[0] is not placeholder:
        return None
    w = lin.args[1]
    if not (isinstance(w, Node) and w.op == "get_attr" and len(w.users) == 1):
        return None
    b = lin.args[2] if len(lin.args) > 2 else lin.kwargs.get("bias")
    if b is not None and not (isinstance(b, Node) and b.op == "get_attr" and len(b.users) == 1):
        return None
    return lin


def fold_into_linear(gm: GraphModule, lin: Node, s: torch.Tensor, o: torch.Tensor) -> None:
    """Make ``lin`` read ``x'`` (the scaled input) instead of ``x``: new weight and bias constants
    (the user's parameters stay as they are)."""
    w = get_attr(gm, lin.args[1]).detach().to(torch.float64)
    b_node = lin.args[2] if len(lin.args) > 2 else lin.kwargs.get("bias")
    b = torch.zeros(w.shape[0], dtype=torch.float64) if b_node is None else get_attr(gm, b_node).detach().double()
    w_scaled = w * s.double()
    b_scaled = b - w_scaled @ o.double()
    new_w = add_constant(gm, "input_scaled_weight", w_scaled.to(torch.float32), lin)
    new_b = add_constant(gm, "input_scaled_bias", b_scaled.to(torch.float32), lin)
    lin.args = (lin.args[0], new_w, new_b) + tuple(lin.args[3:])
    lin.kwargs = {k: v for k, v in lin.kwargs.items() if k != "bias"}
    gm.graph.eliminate_dead_code()
    gm.recompile()
