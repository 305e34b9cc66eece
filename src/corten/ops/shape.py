"""Shape-only ops: they move no arithmetic, so they lower to ``aten.reshape`` on the int8 tensor
(or vanish, for identity-like ops).  They need the same quantization on both sides, which
CortenQuantizer's shared specs give them.  In-place forms (``squeeze_``, ``unsqueeze_``) lower
like the functional ones.

In C a reshape is free (an alias of its input's bytes) except when an NHWC tensor with H*W > 1
and C > 1 is flattened: NCHW order then differs from the bytes, and the generator emits a copy.
A reshape between two 4-D shapes whose bytes are both channels-last permuted (``[1, 8, 4, 4] ->
[1, 4, 8, 4]``), or one of bytes another movement just copied, is one ``quantized_strided_copy``
(:mod:`corten.ops._movement`).
"""
from __future__ import annotations

import torch

from corten.errors import LoweringError
from corten.ops._common import RESHAPES
from corten.ops._movement import composes_with_copy, lower_byte_map, shapes_share_bytes, storage_is_logical
from corten.ops._rules import Match
from corten.ops.registry import A8W8, A16W8, OpFamily, annotates, lowers, register_family

aten = torch.ops.aten

family = register_family(OpFamily("shape", (), doc=__doc__))

IDENTITIES = (aten.dropout.default, aten.clone.default, aten.alias.default, aten.contiguous.default,
              aten.detach.default, aten.lift_fresh_copy.default, aten.detach_.default)
annotates("shared", *RESHAPES, *IDENTITIES)


def _check_shared(m: Match) -> None:
    if m.inputs[0].qparams != m.output:
        raise LoweringError("a shape-only op must keep its input's quantization parameters")


@lowers(*RESHAPES, formats=(A8W8, A16W8))
def lower_reshape(m: Match):
    _check_shared(m)
    shape = list(m.node.meta["val"].shape)
    in_shape = list(m.inputs[0].node.meta["val"].shape)
    if in_shape == shape:
        return m.inputs[0].node
    if not shapes_share_bytes(in_shape, shape) and (
            (not storage_is_logical(in_shape) and not storage_is_logical(shape)) or composes_with_copy(m)):
        if m.output.dtype != torch.int8:
            raise LoweringError(f"a reshape {in_shape} -> {shape} of int16 activations that is a strided copy; "
                                "keep it in an int8 region (precision={'<module path>': 'int8'})")
        # both sides channels-last permuted (no layout copy does it), or a copy of bytes another
        # movement just copied: one strided copy
        return lower_byte_map(m, lambda t: t.reshape(shape), "reshape")
    return m.call_aten(aten.reshape.default, m.inputs[0].node, shape)


@lowers(*IDENTITIES, formats=(A8W8, A16W8))
def lower_identity(m: Match):
    """Eval-mode dropout, clone and friends are no-ops on the int8 tensor: they vanish."""
    _check_shared(m)
    if m.node.target == aten.dropout.default and len(m.node.args) > 2 and m.node.args[2]:
        raise LoweringError("dropout in training mode; call model.eval() before compiling")
    return m.inputs[0].node
