"""``quantized_lstm``: one unidirectional LSTM layer in TFLite's int8 LSTM arithmetic (int8 input and
hidden state, int8 per-tensor symmetric weights, int16 gates and cell state), the arithmetic of
CMSIS-NN's ``arm_lstm_unidirectional_s8``.

How ``nn.LSTM`` gets here
-------------------------
``torch.export`` keeps ``nn.LSTM`` whole as ``aten.lstm.input(x, [h0, c0], params, has_biases,
num_layers, dropout, train, bidirectional, batch_first)`` returning ``(output, h_n, c_n)``.  The
ATen rewrite :class:`SplitLSTMPass` (registered with ``rewrites_aten``; the quantizer runs it in
``transform_for_annotation``, before observers are placed) replaces it by one float custom op
``corten_float::lstm_layer`` per layer (the output sequence; a custom op so that it stays one node
through ``torch.export``) and, for the readers of the last hidden state (``h_n[-1]``, ``h_n[k]``,
``h_n.squeeze(0)`` of one layer, ``output[:, -1]``), ``corten_float::lstm_last_step``.  The
lowering turns a layer into ``quantized_lstm`` and a last step into the same ``quantized_lstm``
with ``last_only`` (the sequence version then usually has no reader left and is dropped; when both
are read, the C program runs that layer twice).  Not rewritten, hence refused by name as
``aten.lstm.input``: bidirectional or projected (``proj_size``) LSTMs, non-zero initial states, a
used ``c_n`` (the cell state is int16 inside the kernel), ``h_n`` of several layers used whole - the
first four are unrolled into cells before this pass (``aten_passes/decompose_composites.py``).

Quantization (choices where PyTorch is silent)
----------------------------------------------
* input x and hidden state h (the layer's output sequence, which the recurrence reads back): int8
  per-tensor, observed like any activation on the whole sequence (a last-step reader shares the
  sequence's quantization);
* weights: int8 per-tensor symmetric, one scale per gate and per matrix (W_ih and W_hh), taken
  from the float weights at lowering (CMSIS-NN's LSTM takes one multiplier per gate and matrix);
* gate pre-activations: int16 with scale 2**-12 (Q3.12); gate outputs: int16 Q0.15 from the int16
  sigmoid/tanh; bias b_ih + b_hh in int32 with the scale ``s_x * s_W``;
* cell state: int16 with a power-of-two scale ``2**cell_scale_power``, the smallest that holds the
  largest |c| seen in calibration: the float layer records max |c| over every step into a
  ``stats`` buffer while calibration runs (a custom observer of a tensor the graph never shows).

The integer step (per time step t, all batches; ``R(acc, m, s)`` is ``arm_nn_requantize``)::

    gate_k = act_k(sat16(R(x_t . Wx_k + ebx_k, mx_k, sx_k) + R(h_{t-1} . Wh_k + ebh_k, mh_k, sh_k)))
             (no hidden term at t = 0: zero initial state, as CMSIS-NN with hidden_state NULL)
    c = clamp(R(f * c, forget_to_cell), -32768, 32767)
    c = clamp(R(i * g, input_to_cell) + c, -cell_clip, cell_clip)
    h_t = clamp(R(o * tanh16(c, cell_scale_power + 12), output_multiplier) + output_offset, -128, 127)

``ebx = bias + input_offset * rowsum(Wx)``, ``ebh = -hidden_zero_point * rowsum(Wh)`` (precomputed
constants, as CMSIS-NN's ``arm_vector_sum_s8`` fills them).  ``act_k`` is ``arm_nn_activation_s16``
(sigmoid for i, f, o; tanh for g): a 256-entry uint16 table of sigmoid(k/24) with linear
interpolation.  The table is an argument of the op (:func:`sigmoid_table`, Corten's own:
``min(round(65536 * sigmoid(k / 24)), 65535)``).  CMSIS-NN ships its own table, which differs from
Corten's in 44 entries by one unit of 2**-16, and Corten does not copy it, so neither C flavour calls
``arm_lstm_unidirectional_s8`` whole: the portable flavour runs ``corten_lstm_s8``; the CMSIS-NN
flavour computes the gate pre-activations (all the multiply-accumulates) with CMSIS-NN's
``arm_nn_vec_mat_mul_result_acc_s8_s16`` (Helium/DSP code, the same integer arithmetic) and the
int16 sigmoid/tanh, cell and output with ``corten_lstm_step_s8``; both are byte-exact with this
reference.  The CMSIS-NN-gated test (tests/test_lstm_cmsis.py) feeds CMSIS-NN's table, read from the
tree at run time, to the reference and checks it against ``arm_lstm_unidirectional_s8`` byte for
byte: the arithmetic is CMSIS-NN's.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from corten.errors import LoweringError
from corten.fixed_point import quantize_multiplier, requantize, round_half_away_t, wrap_int32_t
from corten.ops import checks
from corten.ops._rules import Match
from corten.ops.registry import OpFamily, annotates, lowers, register_family, rewrites_aten
from corten.providers import CMSIS_NN, PORTABLE

FAMILY = "lstm"
GATES = ("input", "forget", "cell", "output")  # PyTorch's gate order (i, f, g, o) in weight_ih/hh
Q15_MIN, Q15_MAX = -32768, 32767
GATE_SCALE = 2.0 ** -12  # int16 gate pre-activations (Q3.12)
GATE_OUTPUT_SCALE = 2.0 ** -15  # sigmoid/tanh int16 outputs (Q0.15)
CELL_CLIP = 32767
CELL_SCALE_POWER_MIN, CELL_SCALE_POWER_MAX = -15, -3


def sigmoid_table() -> torch.Tensor:
    """Corten's table of sigmoid(k/24), k = 0..255, in 0.16 fixed point (int32 holding uint16)."""
    k = torch.arange(256, dtype=torch.float64)
    v = round_half_away_t(65536.0 * torch.sigmoid(k / 24.0))
    return v.clamp(max=65535).to(torch.int32)


def activation_s16(x: torch.Tensor, left_shift: int, sigmoid: bool, table: torch.Tensor) -> torch.Tensor:
    """``arm_nn_activation_s16`` on int16 values held in int64 (``ARM_SIGMOID`` or ``ARM_TANH``)."""
    abs_input_shift = 9 if sigmoid else 8
    max_saturation = (0x7FFF << 10) if sigmoid else (0xFFFF << 8)
    input_multiplier = 3 if left_shift < 0 else 3 << left_shift
    abs_left_shift = -left_shift if left_shift < 0 else 0
    rounding = (1 << (abs_left_shift - 1)) if abs_left_shift > 0 else 0
    data = (x * input_multiplier + rounding) >> abs_left_shift
    absd = data.abs()
    uh = absd >> abs_input_shift
    sat = uh >= 255
    idx = uh.clamp(max=254)
    t = table.to(torch.int64)
    ua, ub = t[idx], t[idx + 1]
    ut = absd & (0x1FF if sigmoid else 0xFF)
    result = torch.where(sat, torch.full_like(absd, max_saturation), (ua << abs_input_shift) + ut * (ub - ua))
    mask = 0xFFFFFFFF  # the C code computes in uint32
    if sigmoid:
        result = torch.where(data >= 0, result + (1 << 9), (1 << 25) - result + (1 << 9) - 1) & mask
        result = result >> 10
    else:
        result = torch.where(data >= 0, result - (1 << 23) + (1 << 7), (-result + (1 << 23)) + (1 << 7) - 1) & mask
        result = result >> 8
    result = result & 0xFFFF  # (int16_t) cast
    return torch.where(result >= 0x8000, result - 0x10000, result)


def _check(input, input_weights, hidden_weights, input_effective_bias, hidden_effective_bias,
           gate_multipliers, gate_shifts, table, time_major):
    op = "quantized_lstm"
    checks.dtype(op, "input", input, torch.int8)
    checks.ndim(op, "input", input, 3)
    checks.dtype(op, "input_weights", input_weights, torch.int8)
    checks.dtype(op, "hidden_weights", hidden_weights, torch.int8)
    checks.ndim(op, "input_weights", input_weights, 3)
    hidden = int(input_weights.shape[1])
    checks.shape(op, "input_weights", input_weights, (4, hidden, int(input.shape[-1])))
    checks.shape(op, "hidden_weights", hidden_weights, (4, hidden, hidden))
    for name, t in (("input_effective_bias", input_effective_bias), ("hidden_effective_bias", hidden_effective_bias)):
        checks.dtype(op, name, t, torch.int32)
        checks.shape(op, name, t, (4, hidden))
    for name, t in (("gate_multipliers", gate_multipliers), ("gate_shifts", gate_shifts), ("sigmoid_table", table)):
        checks.dtype(op, name, t, torch.int32)
    checks.shape(op, "gate_multipliers", gate_multipliers, (4, 2))
    checks.shape(op, "gate_shifts", gate_shifts, (4, 2))
    checks.shape(op, "sigmoid_table", table, (256,))


@torch.library.custom_op("corten::quantized_lstm", mutates_args=())
def quantized_lstm(
    input: torch.Tensor,
    input_weights: torch.Tensor,
    hidden_weights: torch.Tensor,
    input_effective_bias: torch.Tensor,
    hidden_effective_bias: torch.Tensor,
    gate_multipliers: torch.Tensor,
    gate_shifts: torch.Tensor,
    sigmoid_table: torch.Tensor,
    output_offset: int,
    output_multiplier: int,
    output_shift: int,
    forget_to_cell_multiplier: int,
    forget_to_cell_shift: int,
    input_to_cell_multiplier: int,
    input_to_cell_shift: int,
    cell_clip: int,
    cell_scale_power: int,
    time_major: bool,
    last_only: bool,
) -> torch.Tensor:
    _check(input, input_weights, hidden_weights, input_effective_bias, hidden_effective_bias,
           gate_multipliers, gate_shifts, sigmoid_table, time_major)
    x = input.to(torch.int64)
    if not time_major:
        x = x.transpose(0, 1)  # -> [T, B, I]; batches are independent, so the order of work is free
    steps, batches = int(x.shape[0]), int(x.shape[1])
    hidden = int(input_weights.shape[1])
    wx = input_weights.to(torch.float64)
    wh = hidden_weights.to(torch.float64)
    ebx = input_effective_bias.to(torch.int64)
    ebh = hidden_effective_bias.to(torch.int64)
    mult = gate_multipliers.to(torch.int64)
    shift = gate_shifts.to(torch.int64)
    cell = torch.zeros(batches, hidden, dtype=torch.int64)
    h = None
    outs = []

    def gate(k: int, x_t: torch.Tensor, h_prev: torch.Tensor | None) -> torch.Tensor:
        # Exact in float64: |x * w| <= 2**14, sizes far below 2**39.
        acc = wrap_int32_t((x_t.to(torch.float64) @ wx[k].T).to(torch.int64) + ebx[k])
        r = requantize(acc, int(mult[k, 0]), int(shift[k, 0])).clamp(Q15_MIN, Q15_MAX)
        if h_prev is not None:
            acc = wrap_int32_t((h_prev.to(torch.float64) @ wh[k].T).to(torch.int64) + ebh[k])
            r = (requantize(acc, int(mult[k, 1]), int(shift[k, 1])) + r).clamp(Q15_MIN, Q15_MAX)
        return activation_s16(r, 0, k != 2, sigmoid_table)

    for t in range(steps):
        f = gate(1, x[t], h)
        cell = requantize(f * cell, forget_to_cell_multiplier, forget_to_cell_shift).clamp(Q15_MIN, Q15_MAX)
        i = gate(0, x[t], h)
        g = gate(2, x[t], h)
        cell = (requantize(i * g, input_to_cell_multiplier, input_to_cell_shift) + cell).clamp(-cell_clip, cell_clip)
        o = gate(3, x[t], h)
        th = activation_s16(cell, cell_scale_power + 12, False, sigmoid_table)
        h = (requantize(o * th, output_multiplier, output_shift) + output_offset).clamp(-128, 127)
        outs.append(h)
    if last_only:
        return h.to(torch.int8)
    seq = torch.stack(outs)  # [T, B, H]
    if not time_major:
        seq = seq.transpose(0, 1)
    return seq.to(torch.int8).contiguous()


@quantized_lstm.register_fake
def _(input, input_weights, hidden_weights, input_effective_bias, hidden_effective_bias, gate_multipliers,
      gate_shifts, sigmoid_table, output_offset, output_multiplier, output_shift, forget_to_cell_multiplier,
      forget_to_cell_shift, input_to_cell_multiplier, input_to_cell_shift, cell_clip, cell_scale_power,
      time_major, last_only):
    _check(input, input_weights, hidden_weights, input_effective_bias, hidden_effective_bias,
           gate_multipliers, gate_shifts, sigmoid_table, time_major)
    hidden = input_weights.shape[1]
    if last_only:
        return input.new_empty((input.shape[1] if time_major else input.shape[0], hidden))
    return input.new_empty((*input.shape[:-1], hidden))


family = register_family(OpFamily(FAMILY, ("quantized_lstm",), doc=__doc__))


# ----------------------------------------------------------------------------- the float layer
@torch.library.custom_op("corten_float::lstm_layer", mutates_args=())
def lstm_layer(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor | None,
               b_hh: torch.Tensor | None, stats: torch.Tensor, batch_first: bool) -> torch.Tensor:
    """One float LSTM layer (zero initial state) as :class:`SplitLSTMPass` leaves it in the graph:
    the output sequence.  A custom op (namespace ``corten_float``, not a Corten op) so that it stays
    one node through ``torch.export``.  When it runs on real tensors (calibration) it records the
    largest |cell state| of any step in ``stats[0]`` - an observer of a tensor the graph never
    shows (deliberately not declared as a mutation: export and fake runs must not see it)."""
    seq = x.transpose(0, 1) if batch_first else x  # [T, B, I]
    hidden = w_hh.shape[1]
    h = seq.new_zeros((seq.shape[1], hidden))
    c = seq.new_zeros((seq.shape[1], hidden))
    bias = (b_ih if b_ih is not None else 0) + (b_hh if b_hh is not None else 0)
    outs = []
    cmax = 0.0
    with torch.no_grad():
        for t in range(seq.shape[0]):
            z = seq[t] @ w_ih.T + h @ w_hh.T + bias
            i, f, g, o = z.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
            cmax = max(cmax, float(c.abs().max()))
        stats[0] = max(float(stats[0]), cmax)
    out = torch.stack(outs)
    return out.transpose(0, 1).contiguous() if batch_first else out


@lstm_layer.register_fake
def _(x, w_ih, w_hh, b_ih, b_hh, stats, batch_first):
    return x.new_empty((*x.shape[:-1], w_hh.shape[1]))


@torch.library.custom_op("corten_float::lstm_last_step", mutates_args=())
def lstm_last_step(seq: torch.Tensor, time_dim: int) -> torch.Tensor:
    """The last hidden state of an LSTM layer's output sequence (``output[:, -1]``, ``h_n[k]``)."""
    return seq.select(time_dim, -1).clone()


@lstm_last_step.register_fake
def _(seq, time_dim):
    return seq.select(time_dim, -1).clone()


LSTM_LAYER = torch.ops.corten_float.lstm_layer.default
LSTM_LAST_STEP = torch.ops.corten_float.lstm_last_step.default


def cell_scale_power(max_abs_cell: float) -> int:
    """The smallest power p with 32768 * 2**p >= max |c| (TFLite's power-of-two cell scale), in
    [-15, -3]; an unobserved (zero) range gets 2**-11 (|c| up to 16)."""
    if not (max_abs_cell > 0.0) or not math.isfinite(max_abs_cell):
        return -11
    p = math.ceil(math.log2(max_abs_cell)) - 15
    return max(CELL_SCALE_POWER_MIN, min(CELL_SCALE_POWER_MAX, p))


# ----------------------------------------------------------------------------- the ATen pass
def _is_zeros(node: Any) -> bool:
    aten = torch.ops.aten
    if not isinstance(node, torch.fx.Node):
        return False
    if node.target in (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default):
        return True
    if node.target in (aten.full.default,) and float(node.args[1]) == 0.0:
        return True
    return False


def _int_arg(v) -> int | None:
    return v if isinstance(v, int) else None


class SplitLSTMPass:
    """``aten.lstm.input`` -> one :func:`lstm_layer` node per layer and per needed output (see the
    module docstring).  Returns ``PassResult``."""

    def __call__(self, gm: torch.fx.GraphModule):
        from torch.fx.passes.infra.pass_base import PassResult

        modified = False
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and node.target == torch.ops.aten.lstm.input:
                modified |= self._rewrite(gm, node)
        if modified:
            gm.graph.eliminate_dead_code()
            gm.graph.lint()
            gm.recompile()
        return PassResult(gm, modified)

    def _rewrite(self, gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
        import operator

        aten = torch.ops.aten
        x, hx, params, has_biases, num_layers, _dropout, train, bidirectional, batch_first = node.args[:9]

        def refuse(why: str) -> bool:
            node.meta["corten_refusal"] = why
            return False

        if bidirectional:
            return refuse("bidirectional LSTMs are not supported: run two unidirectional nn.LSTMs (one on "
                          "the time-reversed input, flipped outside the model) or use bidirectional=False")
        if train:
            return refuse("LSTM in training mode; call model.eval()")
        if not all(_is_zeros(h) for h in hx):
            return refuse("only a zero initial state (h0, c0) is supported: call the LSTM without (h0, c0)")
        per_layer = 4 if has_biases else 2
        if len(params) != per_layer * num_layers:
            return refuse("LSTMs with proj_size are not supported")
        val = x.meta.get("val")
        if val is None or val.dim() != 3:
            return refuse("only batched 3-D input ([B, T, I] or [T, B, I]) is supported")
        time_dim = 1 if batch_first else 0
        steps = int(val.shape[time_dim])
        outputs = {0: [], 1: [], 2: []}
        for u in node.users:
            if u.target != operator.getitem:
                return refuse("the LSTM's result tuple is used as a whole")
            outputs[int(u.args[1])].append(u)
        if any(g.users for g in outputs[2]):
            return refuse("the final cell state c_n is used: Corten's LSTM keeps the cell state in int16 "
                          "inside the kernel and returns the output sequence and h_n only")
        # what each layer must produce: {layer: {"seq", "last"}}
        need: dict[int, set] = {k: set() for k in range(num_layers)}
        for k in range(num_layers - 1):
            need[k].add("seq")
        replace: list[tuple[torch.fx.Node, int, str, list | None]] = []  # (node to replace, layer, kind, reshape)
        for g in outputs[0]:
            for u in list(g.users):
                if (u.target == aten.select.int and u.args[0] is g and u.args[1] == time_dim
                        and _int_arg(u.args[2]) in (-1, steps - 1)):
                    replace.append((u, num_layers - 1, "last", None))
                    need[num_layers - 1].add("last")
                else:
                    replace.append((g, num_layers - 1, "seq", None))
                    need[num_layers - 1].add("seq")
                    break
        for g in outputs[1]:
            for u in list(g.users):
                if u.target == aten.select.int and u.args[0] is g and u.args[1] == 0 and _int_arg(u.args[2]) is not None:
                    layer = u.args[2] % num_layers
                    replace.append((u, layer, "last", None))
                    need[layer].add("last")
                elif num_layers == 1:
                    replace.append((g, 0, "last", list(g.meta["val"].shape)))
                    need[0].add("last")
                    break
                else:
                    return refuse("h_n of a multi-layer LSTM is used whole: read h_n[-1] (or h_n[k]) or the "
                                  "output sequence instead")
        seqs: list[torch.fx.Node] = []
        lasts: dict[int, torch.fx.Node] = {}
        prev = x
        fake = torch._subclasses.fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)

        def meta(n: torch.fx.Node, trace_of: torch.fx.Node) -> torch.fx.Node:
            n.meta["stack_trace"] = trace_of.meta.get("stack_trace")
            n.meta["nn_module_stack"] = trace_of.meta.get("nn_module_stack")
            with fake:
                n.meta["val"] = n.target(*(a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in n.args))
            return n

        with gm.graph.inserting_before(node):
            for layer in range(num_layers):
                w = params[layer * per_layer: (layer + 1) * per_layer]
                b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
                name = f"_corten_lstm_stats_{node.name}_l{layer}"
                gm.register_buffer(name, torch.zeros(1))
                stats = gm.graph.get_attr(name)
                stats.meta["val"] = torch.zeros(1)
                prev = meta(gm.graph.call_function(LSTM_LAYER, (prev, w[0], w[1], b_ih, b_hh, stats,
                                                                bool(batch_first))), node)
                seqs.append(prev)
                if "last" in need[layer]:
                    lasts[layer] = meta(gm.graph.call_function(LSTM_LAST_STEP, (prev, time_dim)), node)
        for old, layer, kind, shape in replace:
            new = lasts[layer] if kind == "last" else seqs[layer]
            if shape is not None:
                with gm.graph.inserting_after(new):
                    r = gm.graph.call_function(aten.reshape.default, (new, shape))
                r.meta["val"] = old.meta["val"]
                r.meta["stack_trace"] = old.meta.get("stack_trace")
                new = r
            old.replace_all_uses_with(new)
        for g in [*outputs[0], *outputs[1], *outputs[2]]:
            if not g.users:
                gm.graph.erase_node(g)
        if not node.users:
            gm.graph.erase_node(node)
        return True


# ----------------------------------------------------------------------------- lowering

annotates("unary", LSTM_LAYER)
annotates("shared", LSTM_LAST_STEP)


def _per_tensor_symmetric(w: torch.Tensor) -> tuple[torch.Tensor, float]:
    w = w.to(torch.float64)
    scale = float(w.abs().max()) / 127.0
    if scale == 0.0:
        scale = 1.0
    q = round_half_away_t(w / scale).clamp(-127, 127).to(torch.int8)
    return q, scale


@lowers(LSTM_LAYER)
def lower_lstm(m: Match):
    """One float LSTM layer -> ``quantized_lstm`` with every multiplier, shift, effective bias and
    the cell scale computed here (see the module docstring for the scheme)."""
    if len(m.inputs) != 1:
        raise LoweringError("an LSTM layer needs exactly one quantized tensor input")
    x = m.inputs[0]
    _, w_ih, w_hh, b_ih, b_hh, stats, batch_first = m.node.args
    if m.activation is not None:
        raise LoweringError(f"{m.node.name}: no activation can be fused into an LSTM")
    w_ih = m.constant(w_ih).to(torch.float64)
    w_hh = m.constant(w_hh).to(torch.float64)
    hidden = int(w_hh.shape[1])
    bias = torch.zeros(4 * hidden, dtype=torch.float64)
    for b in (b_ih, b_hh):
        if b is not None:
            bias = bias + m.constant(b).to(torch.float64)
    s_h, zp_h = m.output.scale, m.output.zero_point
    wx, wh = [], []
    ebx, ebh = [], []
    mults, shifts = [], []
    for k in range(4):
        rows = slice(k * hidden, (k + 1) * hidden)
        qx, sx = _per_tensor_symmetric(w_ih[rows])
        qh, sh = _per_tensor_symmetric(w_hh[rows])
        bq = round_half_away_t(bias[rows] / (x.qparams.scale * sx)).clamp(-(2**31) + 1, 2**31 - 1).to(torch.int64)
        ebx.append(bq + x.qparams.offset * qx.to(torch.int64).sum(dim=1))
        ebh.append(-zp_h * qh.to(torch.int64).sum(dim=1))
        try:
            mx, shx = quantize_multiplier(x.qparams.scale * sx / GATE_SCALE)
            mh, shh = quantize_multiplier(s_h * sh / GATE_SCALE)
        except ValueError as e:
            raise LoweringError(f"{m.node.name}: {e}") from e
        mults.append([mx, mh])
        shifts.append([shx, shh])
        wx.append(qx)
        wh.append(qh)
    for t in ebx:
        if bool(((t < -(2**31)) | (t >= 2**31)).any()):
            raise LoweringError(f"{m.node.name}: an effective bias leaves the int32 range")
    p = cell_scale_power(float(m.constant(stats)[0]))
    f2c = quantize_multiplier(GATE_OUTPUT_SCALE)  # (f * c): 2**-15 * 2**p -> 2**p
    i2c = quantize_multiplier(GATE_OUTPUT_SCALE * GATE_OUTPUT_SCALE / 2.0 ** p)
    out_m, out_s = quantize_multiplier(GATE_OUTPUT_SCALE * GATE_OUTPUT_SCALE / m.output.scale)
    return m.call(
        "quantized_lstm", x.node,
        m.add_constant(torch.stack(wx), "input_weights"), m.add_constant(torch.stack(wh), "hidden_weights"),
        m.add_constant(torch.stack(ebx).to(torch.int32), "input_effective_bias"),
        m.add_constant(torch.stack(ebh).to(torch.int32), "hidden_effective_bias"),
        m.add_constant(torch.tensor(mults, dtype=torch.int32), "gate_multipliers"),
        m.add_constant(torch.tensor(shifts, dtype=torch.int32), "gate_shifts"),
        m.add_constant(sigmoid_table(), "sigmoid_table"),
        m.output.zero_point, out_m, out_s, f2c[0], f2c[1], i2c[0], i2c[1], CELL_CLIP, p,
        not batch_first, False)


@lowers(LSTM_LAST_STEP)
def lower_lstm_last_step(m: Match):
    """``output[:, -1]`` / ``h_n[k]`` of a lowered layer: the same ``quantized_lstm`` with
    ``last_only`` (writes only the last hidden state).  When the sequence has other readers too,
    the layer runs twice in C (the sequence and the last state)."""
    src = m.inputs[0].node
    if getattr(src, "target", None) != quantized_lstm_op():
        raise LoweringError(f"{m.node.name}: its input is not a lowered LSTM layer")
    if m.inputs[0].qparams != m.output:
        raise LoweringError(f"{m.node.name}: the last step must keep the sequence's quantization")
    return m.call("quantized_lstm", *src.args[:-1], True)


def quantized_lstm_op():
    return torch.ops.corten.quantized_lstm.default


# ----------------------------------------------------------------------------- scratch memory
def lstm_scratch_bytes(batches: int, hidden: int) -> int:
    """``corten_lstm_s8``: four int16 gate vectors and the int16 cell state (``[B, H]`` each) and
    the int8 previous hidden state."""
    return 2 * 5 * batches * hidden + batches * hidden


def _batches(node) -> int:
    val = node.args[0].meta["val"]
    time_major = node.args[17]
    return int(val.shape[1] if time_major else val.shape[0])


def _lstm_scratch(node, target) -> int:
    hidden = int(node.args[1].meta["val"].shape[1]) if "val" in node.args[1].meta else None
    if hidden is None:
        raise ValueError(f"{node.name}: unknown hidden size")
    return lstm_scratch_bytes(_batches(node), hidden)


# ----------------------------------------------------------------------------- C emission
def _lstm_params(ctx) -> dict:
    """The ``corten_lstm_params`` initialiser lines and the sizes and buffers of an LSTM node."""
    shape = ctx.shape(ctx.arg("input"))
    time_major = bool(ctx.arg("time_major"))
    steps, batches = (shape[0], shape[1]) if time_major else (shape[1], shape[0])
    wx = ctx.tensor("input_weights")
    hidden, inputs = int(wx.shape[1]), int(wx.shape[2])
    scratch, nbytes = ctx.scratch()
    need = lstm_scratch_bytes(batches, hidden)
    if nbytes < need:
        ctx.fail(f"the memory plan gives {nbytes} scratch bytes; corten_lstm_s8 needs {need}")
    a = ctx.arg
    x, out = ctx.input("input"), ctx.out()
    params = [
        "const corten_lstm_params params = {",
        f"    .time_major = {int(time_major)}, .last_only = {int(bool(a('last_only')))},",
        f"    .batches = {batches}, .time_steps = {steps}, .input_size = {inputs}, .hidden_size = {hidden},",
        f"    .output_offset = {int(a('output_offset'))}, .output_multiplier = {ctx.int_(a('output_multiplier'))},"
        f" .output_shift = {int(a('output_shift'))},",
        f"    .forget_to_cell_multiplier = {ctx.int_(a('forget_to_cell_multiplier'))},"
        f" .forget_to_cell_shift = {int(a('forget_to_cell_shift'))},",
        f"    .input_to_cell_multiplier = {ctx.int_(a('input_to_cell_multiplier'))},"
        f" .input_to_cell_shift = {int(a('input_to_cell_shift'))},",
        f"    .cell_clip = {int(a('cell_clip'))}, .cell_scale_power = {int(a('cell_scale_power'))},",
        f"    .input_weights = {ctx.const('input_weights', torch.int8)},"
        f" .hidden_weights = {ctx.const('hidden_weights', torch.int8)},",
        f"    .input_effective_bias = {ctx.const('input_effective_bias', torch.int32)},",
        f"    .hidden_effective_bias = {ctx.const('hidden_effective_bias', torch.int32)},",
        f"    .gate_multipliers = {ctx.const('gate_multipliers', torch.int32)},"
        f" .gate_shifts = {ctx.const('gate_shifts', torch.int32)},",
        f"    .sigmoid_table = {ctx.const('sigmoid_table', torch.int32)}",
        "};",
    ]
    return dict(params=params, steps=steps, batches=batches, hidden=hidden, inputs=inputs, x=x, out=out,
                scratch=scratch)


@PORTABLE.kernel("quantized_lstm", scratch=_lstm_scratch)
def _lstm_portable(ctx) -> str:
    """One ``corten_lstm_s8`` call."""
    p = _lstm_params(ctx)
    return ctx.block(*p["params"], ctx.call("corten_lstm_s8", "&params", p["x"], p["out"], p["scratch"]))


@CMSIS_NN.kernel("quantized_lstm", scratch=_lstm_scratch)
def _lstm_cmsis(ctx) -> str:
    """Per step and batch, the gate pre-activations with CMSIS-NN's
    ``arm_nn_vec_mat_mul_result_acc_s8_s16`` (the MACs: Helium/DSP code; the same integer arithmetic
    as the portable kernel) and ``corten_lstm_step_s8`` for the int16 sigmoid/tanh, cell and output
    (Corten's table; see the module docstring for why this does not call ``arm_lstm_unidirectional_s8``
    whole): the library then also has the portable ``lstm.c``."""
    ctx.use_portable_helpers()
    p = _lstm_params(ctx)
    steps, batches, hidden, inputs = p["steps"], p["batches"], p["hidden"], p["inputs"]
    x, out, scratch = p["x"], p["out"], p["scratch"]
    # the step's calls (recorded in order; the C below writes the MAC calls wrapped over lines)
    mac = "arm_nn_vec_mat_mul_result_acc_s8_s16"
    ctx.invoke(mac, "x_row", f"params.input_weights + k * {hidden * inputs}",
               f"params.input_effective_bias + k * {hidden}", "gate", "params.gate_multipliers[2 * k]",
               "params.gate_shifts[2 * k]", inputs, hidden, 1, 1)
    ctx.invoke(mac, "h_row", f"params.hidden_weights + k * {hidden * hidden}",
               f"params.hidden_effective_bias + k * {hidden}", "gate", "params.gate_multipliers[2 * k + 1]",
               "params.gate_shifts[2 * k + 1]", hidden, hidden, 1, 1)
    return ctx.block(
        *p["params"],
        "/* declared in arm_nnsupportfunctions.h, which the generated code does not include */",
        "extern arm_cmsis_nn_status arm_nn_vec_mat_mul_result_acc_s8_s16(const int8_t *lhs, const int8_t *rhs,",
        "    const int32_t *effective_bias, int16_t *dst, const int32_t dst_multiplier, const int32_t dst_shift,",
        "    const int32_t rhs_cols, const int32_t rhs_rows, const int32_t batches, const int32_t batch_offset);",
        "int32_t t, b, k;",
        f"for (t = 0; t < {steps}; t++) {{",
        f"    for (b = 0; b < {batches}; b++) {{",
        f"        const int8_t *x_row = {ctx.invoke('corten_lstm_input_row', '&params', x, 't', 'b')};",
        f"        const int8_t *h_row = {ctx.invoke('corten_lstm_hidden_in', '&params', out, scratch, 't', 'b')};",
        "        for (k = 0; k < 4; k++) {",
        f"            int16_t *gate = {ctx.invoke('corten_lstm_gate_row', '&params', scratch, 'k', 'b')};",
        f"            (void)arm_nn_vec_mat_mul_result_acc_s8_s16(x_row, params.input_weights + k * {hidden * inputs},",
        f"                params.input_effective_bias + k * {hidden}, gate, params.gate_multipliers[2 * k],",
        f"                params.gate_shifts[2 * k], {inputs}, {hidden}, 1, 1);",
        "            if (h_row != NULL) {",
        f"                (void)arm_nn_vec_mat_mul_result_acc_s8_s16(h_row, params.hidden_weights + k * {hidden * hidden},",
        f"                    params.hidden_effective_bias + k * {hidden}, gate, params.gate_multipliers[2 * k + 1],",
        f"                    params.gate_shifts[2 * k + 1], {hidden}, {hidden}, 1, 1);",
        "            }",
        "        }",
        "    }",
        "    " + ctx.call("corten_lstm_step_s8", "&params", "t", out, scratch).replace("\n", "\n    "),
        "}")


rewrites_aten(SplitLSTMPass())
