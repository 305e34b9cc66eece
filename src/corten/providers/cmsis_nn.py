"""The CMSIS-NN kernel provider: which CMSIS-NN function runs a node, and its scratch per ISA.

The op families register their CMSIS-NN kernels here (``@CMSIS_NN.kernel(op, supports=...,
scratch=...)``, next to their portable ones); this module holds what is CMSIS-NN's own: its
``*_get_buffer_size`` formulas for the convolution wrappers on each ISA (plain, DSP, MVE) and the
include its calls need.  A build with ``kernels="cmsis-nn"`` is this provider then the portable one
(for every node CMSIS-NN does not support: the fallback report says why).
"""
from __future__ import annotations

from corten.providers.base import KernelProvider, register_provider

CMSIS_NN = register_provider(KernelProvider("cmsis-nn", "CMSIS-NN", links_cmsis_nn=True,
                                            includes=('#include "arm_nnfunctions.h"',)))


# ----------------------------------------------------------------------------- scratch memory
# The ``ctx.buf`` scratch CMSIS-NN needs, computed from its ``*_get_buffer_size`` formulas for the
# kernel the wrappers (``arm_convolve_wrapper_s8``, ``arm_depthwise_conv_wrapper_s8``) dispatch to
# on each ISA.  Two of those formulas depend on the compiler that builds CMSIS-NN (armclang's
# ``__ARMCC_VERSION`` switches on a DSP 1x1 buffer and moves the MVE depthwise->conv threshold);
# ``compiler="any"`` (what the memory planner uses) reserves the larger of the two, so a plan is
# valid whichever compiler builds the C code.
COMPILERS = ("gcc", "armclang", "any")
MVE_DW_CH_IN_BLOCK = 124  # CH_IN_BLOCK_MVE: channels per block of the MVE depthwise kernel


def _c_div(a: int, b: int) -> int:
    """C integer division (truncates towards zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _c_mod(a: int, b: int) -> int:
    """C ``%`` (the remainder takes the dividend's sign)."""
    return a - _c_div(a, b) * b


def _check_compiler(compiler: str) -> None:
    if compiler not in COMPILERS:
        raise ValueError(f"compiler must be one of {COMPILERS}, got {compiler!r}")


def _check_isa(isa: str) -> None:
    if isa not in ("plain", "dsp", "mve"):
        raise ValueError(f"isa must be 'plain', 'dsp' or 'mve', got {isa!r}")


def conv2d_kernel_variant(input_nhwc, kernel_hw, stride, padding, dilation) -> str:
    """Which kernel ``arm_convolve_wrapper_s8`` runs: ``"1x1_fast"`` (``arm_convolve_1x1_s8_fast``),
    ``"1x1"`` (strided, ``arm_convolve_1x1_s8``), ``"1xn"`` (``arm_convolve_1_x_n_s8``) or
    ``"im2col"`` (``arm_convolve_s8``).  Corten convolutions have ``C_in == filter C`` always."""
    _, h, _, c = input_nhwc
    kh, kw = kernel_hw
    if tuple(padding) == (0, 0) and (kh, kw) == (1, 1) and tuple(dilation) == (1, 1):
        return "1x1_fast" if tuple(stride) == (1, 1) else "1x1"
    if h == 1 and dilation[1] == 1 and kh == 1 and (stride[1] * c) % 4 == 0:
        return "1xn"
    return "im2col"


def im2col_bytes(isa: str, c_in: int, kh: int, kw: int) -> int:
    """``arm_convolve_s8_get_buffer_size``: two int16 im2col columns (plain/DSP, columns rounded up
    to 4) or four int8 columns rounded up to 16-byte lanes (MVE)."""
    cols = kh * kw * c_in
    if isa == "mve":
        return 4 * 16 * -(-cols // 16)
    return 2 * 2 * (-(-cols // 4) * 4)


def _conv_1xn_mve_bytes(c_in: int, w_in: int, kw: int, w_out: int, stride_w: int, pad_w: int, kh: int) -> int:
    """``arm_convolve_1_x_n_s8_get_buffer_size_mve`` (C integer arithmetic)."""
    total_pad = (w_out - 1) * stride_w + kw - w_in
    asym_pad = _c_mod(total_pad, 2)
    right = max(1, _c_div(pad_w + asym_pad + stride_w - 1, stride_w)) if pad_w + asym_pad != 0 else 0
    left = max(1, _c_div(pad_w + stride_w - 1, stride_w)) if pad_w != 0 else 0
    middle = max(w_out - (right + left), 0)
    if right + middle + left != w_out:
        return im2col_bytes("mve", c_in, kh, kw)
    pad_left = pad_w * c_in
    pad_right = right * c_in if asym_pad else pad_left
    elems_left = kw * c_in
    return max(elems_left + pad_left, elems_left - c_in + pad_right)


def conv2d_scratch_bytes(isa: str, input_nhwc, kernel_hw, output_hw, stride, padding, dilation,
                         compiler: str = "any") -> int:
    """``arm_convolve_wrapper_s8_get_buffer_size`` for ``isa`` ("plain", "dsp" or "mve")."""
    _check_isa(isa)
    _check_compiler(compiler)
    _, _, w_in, c_in = input_nhwc
    kh, kw = kernel_hw
    variant = conv2d_kernel_variant(input_nhwc, kernel_hw, stride, padding, dilation)
    if variant == "1x1_fast":
        # arm_convolve_1x1_s8_fast_get_buffer_size: an int16 copy of two input pixels, DSP builds
        # by armclang only; gcc builds and MVE need none.
        return 2 * c_in * 2 if isa == "dsp" and compiler in ("armclang", "any") else 0
    if variant == "1x1":
        return 0
    if variant == "1xn" and isa == "mve":
        return _conv_1xn_mve_bytes(c_in, w_in, kw, output_hw[1], stride[1], padding[1], kh)
    return im2col_bytes(isa, c_in, kh, kw)


def depthwise_kernel_variant(isa: str, input_nhwc, kernel_hw, c_out, padding, dilation,
                             compiler: str = "gcc") -> str:
    """Which kernel ``arm_depthwise_conv_wrapper_s8`` runs: ``"to_conv"`` (MVE, one input channel:
    transposed weights + ``arm_convolve_wrapper_s8``), ``"3x3"`` (``arm_depthwise_conv_3x3_s8``,
    not MVE), ``"opt"`` (``arm_depthwise_conv_s8_opt``) or ``"generic"`` (``arm_depthwise_conv_s8``)."""
    _check_isa(isa)
    if compiler not in ("gcc", "armclang"):
        raise ValueError(f"the kernel choice needs one compiler ('gcc' or 'armclang'), got {compiler!r}")
    n, _, _, c_in = input_nhwc
    kh, kw = kernel_hw
    threshold = 8 if compiler == "armclang" else 1  # CONVERT_DW_CONV_WITH_ONE_INPUT_CH_AND_OUTPUT_CH_ABOVE_THRESHOLD
    if isa == "mve" and c_in == 1 and c_out > threshold:
        return "to_conv"
    if c_in == c_out and n == 1 and tuple(dilation) == (1, 1):
        if isa != "mve" and (kh, kw) == (3, 3) and padding[0] <= 1 and padding[1] <= 1:
            return "3x3"
        return "opt"
    return "generic"


def _depthwise_bytes_for(isa, input_nhwc, kernel_hw, output_hw, c_out, stride, padding, dilation, compiler):
    variant = depthwise_kernel_variant(isa, input_nhwc, kernel_hw, c_out, padding, dilation, compiler)
    kh, kw = kernel_hw
    if variant == "to_conv":
        # conv scratch of the equivalent [C_out, kH, kW, 1] convolution, then the transposed weights
        conv = conv2d_scratch_bytes("mve", input_nhwc, kernel_hw, output_hw, stride, padding, dilation, compiler)
        return conv + c_out * kh * kw
    if variant == "opt":
        if isa == "mve":
            return 4 * MVE_DW_CH_IN_BLOCK * kh * kw
        if isa == "dsp":
            return input_nhwc[3] * kh * kw * 2
    return 0


def depthwise_scratch_bytes(isa: str, input_nhwc, kernel_hw, output_hw, c_out, stride, padding, dilation,
                            compiler: str = "any") -> int:
    """``arm_depthwise_conv_wrapper_s8_get_buffer_size`` for ``isa`` ("plain", "dsp" or "mve")."""
    _check_isa(isa)
    _check_compiler(compiler)
    chosen = ("gcc", "armclang") if compiler == "any" else (compiler,)
    return max(_depthwise_bytes_for(isa, input_nhwc, kernel_hw, output_hw, c_out, stride, padding, dilation, cc)
               for cc in chosen)


def conv2d_s16_scratch_bytes(isa: str, c_in: int, kh: int, kw: int) -> int:
    """``arm_convolve_wrapper_s16_get_buffer_size``: two int16 im2col columns (plain/DSP) or four
    columns rounded up to 8-lane int16 vectors (MVE).  ``arm_convolve_s16`` needs it on every ISA."""
    _check_isa(isa)
    cols = c_in * kh * kw
    return 4 * (-(-cols // 8) * 8) * 2 if isa == "mve" else 2 * cols * 2


def depthwise_s16_scratch_bytes(isa: str, c_in: int, kh: int, kw: int, ch_mult: int, dilation) -> int:
    """``arm_depthwise_conv_wrapper_s16_get_buffer_size``: the fast kernel's buffer (depth multiplier
    1, no dilation, fewer than 512 taps) on DSP (one int16 column) and MVE (four, + 8 bytes of
    over-read), nothing otherwise."""
    _check_isa(isa)
    if not (ch_mult == 1 and tuple(dilation) == (1, 1) and kh * kw < 512) or isa == "plain":
        return 0
    return 4 * c_in * kh * kw * 2 + 8 if isa == "mve" else c_in * kh * kw * 2


def conv2d_s4_scratch_bytes(isa: str, input_nhwc, kernel_hw, stride, padding, dilation) -> int:
    """``arm_convolve_wrapper_s4_get_buffer_size`` for ``isa``: the 1x1 kernels need none; otherwise
    two int16 im2col columns (plain/DSP: ``arm_convolve_s4_get_buffer_size``) or four int8 columns
    rounded up to 16-byte lanes (MVE; reserved for the 1xN kernel too, which may need none)."""
    _check_isa(isa)
    if conv2d_kernel_variant(input_nhwc, kernel_hw, stride, padding, dilation) in ("1x1_fast", "1x1"):
        return 0
    cols = kernel_hw[0] * kernel_hw[1] * input_nhwc[3]
    return 4 * 16 * -(-cols // 16) if isa == "mve" else 2 * cols * 2


def depthwise_s4_scratch_bytes(isa: str, input_nhwc, kernel_hw, c_out: int, dilation) -> int:
    """``arm_depthwise_conv_wrapper_s4_get_buffer_size``: the optimised kernel's buffer (one image,
    depth multiplier 1, no dilation) - MVE's channel blocks, else one int16 column (plain cores too:
    ``arm_depthwise_conv_s4_opt`` refuses a NULL buffer) - nothing for the general kernel."""
    _check_isa(isa)
    n, _, _, c_in = input_nhwc
    kh, kw = kernel_hw
    if not (c_in == c_out and n == 1 and tuple(dilation) == (1, 1)):
        return 0
    return 4 * MVE_DW_CH_IN_BLOCK * kh * kw if isa == "mve" else c_in * kh * kw * 2
