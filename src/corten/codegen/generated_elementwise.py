"""Generated kernels of the elementwise add / sub and the average pool (``kernels="generated"``).

The generator's other layers (:mod:`corten.codegen.generated`) are convolutions; these two ops sit
between them in residual networks (ResNet's adds) and at their end (the global average pool), and
their library kernels pay for generality the compiler can resolve ahead of time.

**Add / sub** (``quantized_add``, ``quantized_sub``; int8, same-shape dense operands).  The
arithmetic (:func:`corten.ops._broadcast.rescaled_sum`) is::

    a = requantize((x1 + input1_offset) << left_shift, input1_multiplier, input1_shift)
    b = requantize((x2 + input2_offset) << left_shift, +-input2_multiplier, input2_shift)
    y = clamp(requantize(a + b, output_multiplier, output_shift) + output_offset, act_min, act_max)

``a`` depends on the int8 ``x1`` alone and ``b`` on ``x2`` alone, so the generator evaluates both
with the reference function for all 256 values (:func:`add_tables`, two int32 tables of 1 KiB in
flash): per element two byte loads, two table loads, one add and the output epilogue - the
generator's short epilogue (``cg_requant_short``) when :func:`~corten.codegen.generated.short_epilogue_ok`
proves it equal on ``|a + b| <= max|a| + max|b|``, else ``arm_nn_requantize`` with the int32
wrap-around of the sum.  Unrolled by four; each element is read before it is written, so the output
may share its bytes with either input (the planner's in-place add).

**Average pool** (``quantized_avg_pool2d``, int8, every window inside the input: no padding, no
ceil-mode overhang).  The divisor ``D`` and the zero-point correction are constants: ``sum`` over
the window's ``K = kH * kW`` taps, ``s = sum - K * zp`` (``zp`` only with ``count_include_pad`` or
``divisor_override``, see :mod:`corten.ops.pool`), ``(s > 0 ? s + D/2 : s - D/2) / D + zp`` (a
division by a constant), clamped.  On DSP cores four channels per word: ``SXTAB16`` adds bytes 0, 2
and (``ROR #8``) 1, 3 of each tap's word into two pairs of int16 lanes, exact while ``K <= 256``
(``|sum| <= 256 * 128 = 2**15``); more taps, the leftover ``C % 4`` channels and the plain path sum
scalars in int32.
"""
from __future__ import annotations

import torch

from corten.fixed_point import requantize, wrap_int32_t

ADD_OPS = ("quantized_add", "quantized_sub")
POOL_OPS = ("quantized_avg_pool2d",)
SIMD_POOL_TAPS = 256  # most taps summed in int16 lanes without overflow (module docstring)


# ----------------------------------------------------------------------------- add / sub
def add_tables(v: dict, sign: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``[256]`` tables ``a(x1)``, ``b(x2)`` for ``x = -128 .. 127`` (index ``x + 128``) of the
    add arithmetic's parameters ``v`` (names of :data:`corten.ops._broadcast.PARAM_NAMES`); ``sign``
    -1: input2's multiplier negated (sub)."""
    x = torch.arange(-128, 128, dtype=torch.int64)
    a = requantize((x + v["input1_offset"]) << v["left_shift"], v["input1_multiplier"], v["input1_shift"])
    b = requantize((x + v["input2_offset"]) << v["left_shift"], sign * v["input2_multiplier"], v["input2_shift"])
    return a, b


def add_reference(x1: torch.Tensor, x2: torch.Tensor, v: dict, sign: int) -> torch.Tensor:
    """What the generated add computes, from its tables (the tests compare it with the op)."""
    a, b = add_tables(v, sign)
    s = wrap_int32_t(a[x1.to(torch.int64) + 128] + b[x2.to(torch.int64) + 128])
    y = wrap_int32_t(requantize(s, v["output_multiplier"], v["output_shift"]) + v["output_offset"])
    return y.clamp(v["activation_min"], v["activation_max"]).to(torch.int8)


def add_function(fname: str, size: int, v: dict, ta: str, tb: str, bound: int, short: bool) -> tuple[str, str]:
    """``(C of fname(in1, in2, out), what)`` for ``size`` elements; ``ta``/``tb`` name the tables of
    :func:`add_tables`, ``bound`` is ``max|a| + max|b|`` and ``short`` whether the short epilogue is
    proven equal on it."""
    from corten.codegen.generated import _c, scalar_epilogue

    m, s = torch.tensor([v["output_multiplier"]]), torch.tensor([v["output_shift"]])
    table, ep = scalar_epilogue(m, s, short, v["output_offset"], v["activation_min"], v["activation_max"])
    q = ", ".join(_c(int(t)) for t in table[0])
    total = "ta[in1[k]] + tb[in2[k]]" if bound < 2**31 else "corten_add_wrap(ta[in1[k]], tb[in2[k]])"
    elem = f"out[k] = cg_output({total}, q, {ep})"
    body = "\n".join(f"            {{ const int32_t k = i + {j}; {elem}; }}" for j in range(4))
    code = f"""void {fname}(const int8_t *in1, const int8_t *in2, int8_t *out)
{{
    static const int32_t q[4] = {{{q}}};
    const int32_t *ta = {ta} + 128;
    const int32_t *tb = {tb} + 128;
    int32_t i = 0;
    for (; i + 4 <= {size}; i += 4) {{
{body}
    }}
    for (; i < {size}; i++) {{
        const int32_t k = i;
        {elem};
    }}
}}
"""
    what = (f"elementwise {size} elements: two 256-entry tables of the input rescales, "
            f"{'short' if short else 'general'} epilogue, 4 per step")
    return code, what


# ----------------------------------------------------------------------------- average pool
def avg_pool_reason(g: dict) -> str | None:
    """Why the generator does not take an average pool of window arguments ``g``
    (:func:`corten.ops.pool.pool_window`), or None."""
    if any(int(p) for p in g["padding"]):
        return "padded average pools keep the library kernel"
    (kh, kw), (sh, sw) = g["kernel"], g["stride"]
    if (g["ho"] - 1) * sh + kh > g["h"] or (g["wo"] - 1) * sw + kw > g["w"]:
        return "a ceil-mode window overhangs the input"
    return None


def avg_pool_function(fname: str, g: dict, zero_point: int, simd: bool) -> tuple[str, str]:
    """``(C of fname(in, out), what)`` of an average pool (``g``: :func:`corten.ops.pool.pool_window`);
    ``simd``: four channels per word with ``SXTAB16`` (DSP and Helium cores; their C equivalents on a
    host)."""
    (kh, kw), (sh, sw) = (int(k) for k in g["kernel"]), (int(s) for s in g["stride"])
    n, h, w, c, ho, wo = (int(g[k]) for k in ("n", "h", "w", "c", "ho", "wo"))
    taps = kh * kw
    zp = int(zero_point) if (g["include_pad"] or g["divisor"]) else 0
    div = int(g["divisor"]) or taps
    c4 = c - c % 4 if simd and taps <= SIMD_POOL_TAPS else 0
    lo, hi = g["act_min"], g["act_max"]
    bias = f" - {taps * zp}" if zp else ""
    avg = f"cg_avg_out(%s{bias}, {div}, {zp}, {lo}, {hi})"
    simd_loop = ""
    if c4:
        lanes = "; ".join(f"y[c + {j}] = {avg % f'cg_lane16({acc}, {half})'}"
                          for j, (acc, half) in enumerate((("e", 0), ("o", 0), ("e", 1), ("o", 1))))
        simd_loop = f"""            for (c = 0; c < {c4}; c += 4) {{
                int32_t e = 0, o = 0;
                for (ky = 0; ky < {kh}; ky++) {{
                    const int8_t *r = x + ky * {w * c} + c;
                    for (kx = 0; kx < {kw}; kx++) {{
                        const int32_t v = cg_read32(r + kx * {c});
                        e = cg_sxtab16(e, v);
                        o = cg_sxtab16_ror8(o, v);
                    }}
                }}
                {lanes};
            }}
"""
    code = f"""void {fname}(const int8_t *in, int8_t *out)
{{
    int32_t b, oy, ox, c, ky, kx;
    for (b = 0; b < {n}; b++) {{
        for (oy = 0; oy < {ho}; oy++) {{
            for (ox = 0; ox < {wo}; ox++) {{
            const int8_t *x = in + ((b * {h} + oy * {sh}) * {w} + ox * {sw}) * {c};
            int8_t *y = out + ((b * {ho} + oy) * {wo} + ox) * {c};
{simd_loop}            for (c = {c4}; c < {c}; c++) {{
                int32_t s = 0;
                for (ky = 0; ky < {kh}; ky++) {{
                    for (kx = 0; kx < {kw}; kx++) {{
                        s += x[(ky * {w} + kx) * {c} + c];
                    }}
                }}
                y[c] = {avg % 's'};
            }}
            }}
        }}
    }}
}}
"""
    what = (f"average pool {kh}x{kw} / {div}: " + (f"4 channels per word (SXTAB16), {c - c4} scalar" if c4
                                                      else "scalar int32 sums"))
    return code, what
