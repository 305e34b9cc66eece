"""Every error Corten raises on purpose, under one base class :class:`CortenError`.

A ``CortenError`` is a *user-facing* error: its message names what is wrong (the node or op, its
source line, the argument) and what to do, so ``corten`` on the command line prints just the
message.  Anything else that escapes is an internal bug and is shown with its traceback.

The subclasses keep the builtin base they had before this module existed (``ValueError`` for bad
input, ``RuntimeError`` for failed runs), so ``except ValueError`` in existing code still works.
This module imports nothing from Corten: every layer may raise these.
"""
from __future__ import annotations

import collections
from typing import Any, Sequence


class CortenError(Exception):
    """Base class of the errors Corten raises for its users (shown without a traceback)."""


class UsageError(CortenError, ValueError):
    """An API or CLI argument is wrong (unknown target, wrong input shape, empty calibration...)."""


class CaptureError(CortenError, ValueError):
    """The model or its example inputs cannot be captured; the message says what to change."""


class AtenPassError(CortenError, RuntimeError):
    """An ATen pass met a graph it cannot handle; the message names the node and what to do."""


class QuantizationError(CortenError, ValueError):
    """The model cannot be quantized with Corten's int8 scheme; the message names the op."""


class LoweringError(CortenError, ValueError):
    """A lowering rule cannot express this node; the message says why (shown to the user)."""


class UnsupportedOpsError(CortenError, ValueError):
    """The model has operators Corten cannot lower; the message lists them with their sources.

    ``nodes`` are :class:`corten.lowering.UnloweredNode` (name, op, location, reason)."""

    def __init__(self, model_name: str, nodes: Sequence[Any]):
        self.nodes = list(nodes)
        counts = collections.Counter(n.op for n in nodes)
        lines = [f"Corten cannot lower {len(nodes)} operator(s) of {model_name} to int8 CMSIS-NN ops:"]
        for op, count in counts.most_common():
            lines.append(f"  {op} x{count}")
            for n in [n for n in nodes if n.op == op][:5]:
                why = f" -- {n.reason}" if n.reason else ""
                lines.append(f"      {n.name} at {n.location}{why}")
        lines.append(
            "Workarounds: replace the operator with a supported one (conv1d/conv2d/depthwise/transposed conv 1-D/2-D, "
            "linear, "
            "add/sub/mul/div/maximum/minimum with broadcasting and scalars, softmax, sigmoid/tanh/SiLU/GELU/hardswish "
            "and the other lookup-table activations (mish, softplus, selu, celu, logsigmoid, prelu; in-place forms "
            "too), elementwise math as lookup tables (abs, neg, sign, x ** k, sqrt, rsqrt, exp, log, erf, sin, cos, "
            "clamp_min/max, k - x, floor/ceil/round/trunc, threshold), lerp/addcmul/addcdiv/hypot/pairwise_distance, "
            "avg/max/adaptive pools (any variant), "
            "amax/amin/sum/mean/var/std/var_mean/std_mean/logsumexp/norm/linalg.norm over any dims, comparisons (and &, |, ~ of them) + "
            "where, "
            "relu/relu6/hardtanh/clamp after those, einsum/addmm/baddbmm/bmm, matmul with 1-D operands (mv, dot, inner, outer), glu, "
            "LayerNorm/GroupNorm/InstanceNorm/RMSNorm/BatchNorm (batch statistics too)/LocalResponseNorm/F.normalize, "
            "bilinear/linear/bicubic/nearest/nearest-exact interpolation (antialias too), grouped transposed convs, "
            "data movement: reshape, "
            "slice/select, cat/stack, permute, expand/repeat, flip, pixel_shuffle, index_select/gather with "
            "constant indices, reflect/replicate/circular pad, cumsum, torch.diff, cosine_similarity, triu/tril, F.unfold/nn.Unfold, zeros_like/new_zeros/new_full (folded), x.mean()/sum()/max()/min()/std()/amax() to 0-D and math on them, x.max(dim)[1] as an output; nn.LSTM (bidirectional, c_n, "
            "given (h0, c0), proj_size: unrolled), nn.GRU, nn.RNN and their cells with a zero, given or computed "
            "initial state; "
            "attention as matmul/@ + softmax, nn.MultiheadAttention, nn.TransformerEncoder/Decoder(Layer), "
            "scaled_dot_product_attention (is_causal or a constant mask; no dropout), masked_fill/where with "
            "constant masks (-inf, additive 0/-inf attn_mask, key_padding_mask buffers); "
            "argmax/argmin (over a dim or the flattened tensor) as an output; any batch size, ranks 1-5), "
            "move it outside the compiled model (pre/post-processing), or pass allow_unlowered=True "
            "to corten.compile to get a partly lowered program for inspection (it cannot be emitted as C).")
        super().__init__("\n".join(lines))


class CortenOpError(CortenError, ValueError):
    """A Corten op was called with arguments its kernel cannot take."""


class ProgramFileError(CortenError, ValueError):
    """A saved program directory is invalid (bad manifest, changed file, other format version)."""


class ProgramNotFoundError(CortenError, FileNotFoundError):
    """No saved program at the given path."""


class MemoryPlanError(CortenError, ValueError):
    """The program handed to the memory planner is not a lowered Corten program."""


class BudgetError(CortenError, ValueError):
    """The plan needs more RAM (arena) or flash (constant data) than allowed."""


class CodegenError(CortenError, ValueError):
    """The program cannot be emitted as C; the message names the node and what to do."""


class ModelFileError(CortenError, ValueError):
    """A model file (``.tflite``, ``.onnx``) Corten cannot read or convert: not that format, an
    unsupported operator or tensor type; the message names the file, the operator (index, tensor
    names) and what to do."""


class CRunnerError(CortenError, RuntimeError):
    """Base class of runner failures; the message names where the code was built or run."""


class CBuildError(CRunnerError):
    """The C compiler or linker rejected the model library plus harness."""


class CRunError(CRunnerError):
    """The harness ran but did not complete successfully (non-zero status, fault, bad output)."""


class CRunTimeout(CRunError):
    """The harness (or QEMU) did not finish within the timeout."""


class CmsisNnNotFoundError(CortenError, FileNotFoundError):
    """``cmsis_nn_path`` / ``CMSIS_NN_PATH`` does not name a CMSIS-NN source tree."""


class UnsupportedTargetError(CRunnerError, ValueError):
    """The target is a valid Corten target but has no emulated board."""


__all__ = [
    "AtenPassError", "BudgetError", "CBuildError", "CmsisNnNotFoundError", "CRunError", "CRunTimeout", "CRunnerError", "CaptureError",
    "CodegenError", "CortenError", "CortenOpError", "LoweringError", "MemoryPlanError", "ModelFileError", "ProgramFileError",
    "ProgramNotFoundError", "QuantizationError", "UnsupportedOpsError", "UnsupportedTargetError", "UsageError",
]


class QuantizationWarning(UserWarning):
    """The program is correct, but its int8 accuracy is probably worse than it could be (random or
    unrepresentative calibration, badly scaled input features, saturated outputs, a layer with a low
    SQNR); the message says what to change."""
