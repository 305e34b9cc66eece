"""Which nodes of a lowered program are free *views* of their input's bytes and which need a copy in C.

Two kinds of views (:func:`alias_offset`):

* an ``aten.reshape`` that leaves every value at the same byte (below);
* a Corten op whose family declares, through its ``"alias_offset"`` hook, that this node's
  output is one contiguous run of its input's bytes starting at some byte offset (a
  ``quantized_strided_copy`` slicing H of an NHWC tensor, the batch, a row-major tensor's outer
  dims, ...) - unless a program output reads it (:func:`feeds_program_output`): the caller's
  output buffer holds only the output, so there the bytes are copied.

Reshapes:

A graph tensor's C bytes are its values in *storage order*: NHWC for 4-D activations (Corten's
convention: the reference kernels return ``channels_last`` tensors), row-major for every other
rank.  ``torch.reshape`` keeps the *logical* (row-major NCHW) order of the values.  A reshape is
therefore byte-for-byte free exactly when every value sits at the same byte in its input and in
its output; otherwise the C code must copy (permute) the bytes.

A 4-D ``[N, C, H, W]`` tensor's NHWC storage equals its logical order when ``C == 1`` or
``H * W == 1``, so the common cases are decided without building any index tensor:

* ``[1, 1280, 1, 1] -> [1, 1280]`` (MobileNetV2's flatten): alias;
* ``[1, 16, 5, 5] -> [1, 400]`` (flatten of a feature map): copy (NHWC -> NCHW order);
* ``[1, 400] -> [1, 16, 5, 5]`` (un-flatten before a conv): copy (NCHW -> NHWC order);
* ``[1, 8, 4, 4] -> [1, 8, 16, 1]``: both sides permuted the same way, alias.
"""
from __future__ import annotations

import torch

from corten.ops._movement import shapes_share_bytes, storage_is_logical, storage_order  # noqa: F401  (re-exported)
from corten.ops.registry import Hook, all_op_names, hook_for, op_name_of

RESHAPE = torch.ops.aten.reshape.default
DEQUANTIZE = "dequantize_per_tensor"


def reshape_is_alias(node: torch.fx.Node) -> bool:
    """True when the ``aten.reshape`` ``node`` can share its input's bytes; False when C must copy.

    Shared by the memory planner (an alias gets its input's offset and extends its lifetime) and
    the C generator (which emits the NHWC <-> NCHW copy for the others).
    """
    if node.op != "call_function" or node.target != RESHAPE:
        raise ValueError(f"reshape_is_alias: node {node.name!r} is {node.target}, not aten.reshape.default")
    src = node.args[0]
    if not isinstance(src, torch.fx.Node) or "val" not in src.meta or "val" not in node.meta:
        raise ValueError(f"reshape_is_alias: node {node.name!r} lacks meta['val'] shapes on its input or "
                         "output; run it through torch.export (or FakeTensorProp) first")
    if input_layout_reshape(src) is node:  # the C input is laid out as this reshape stores it
        return True
    return shapes_share_bytes(tuple(src.meta["val"].shape), tuple(node.meta["val"].shape))


QUANTIZE = "quantize_per_tensor"


def input_layout_reshape(quant: torch.fx.Node) -> torch.fx.Node | None:
    """The reshape whose layout a program input takes at the C boundary, or None.

    When the ``quantize_per_tensor`` of a program input is read only by one ``aten.reshape`` to a
    4-D tensor whose NHWC storage differs from the input's row-major order (a Conv1d model's
    ``[N, C, L] -> [N, C, 1, L]``, an un-flatten ``[N, C*H*W] -> [N, C, H, W]`` before a conv), the
    C input is laid out the way that first layer reads it: the reshaped tensor's NHWC bytes
    (``[N, L, C]`` for the Conv1d input).  The reshape is then a view of the caller's input
    buffer and no layout copy runs; the library's input (``IOTensor.shape``, the ``_DIM`` macros)
    is the reshaped 4-D tensor, and ``IOTensor.source_shape`` the forward's argument shape."""
    if quant.op != "call_function" or op_name_of(quant.target) != QUANTIZE or len(quant.users) != 1:
        return None
    src = quant.args[0]
    if not isinstance(src, torch.fx.Node) or src.op != "placeholder":
        return None
    (user,) = quant.users
    if user.op != "call_function" or user.target != RESHAPE or "val" not in user.meta or "val" not in quant.meta:
        return None
    in_shape, out_shape = tuple(quant.meta["val"].shape), tuple(user.meta["val"].shape)
    if len(out_shape) != 4 or len(in_shape) == 4 or shapes_share_bytes(in_shape, out_shape):
        return None
    if any(u.op == "call_function" and op_name_of(u.target) == DEQUANTIZE for u in user.users):
        return None  # a program output: nothing runs between the two buffers anyway
    return user


def feeds_program_output(node: torch.fx.Node) -> bool:
    """True when a program output (a ``dequantize_per_tensor``) reads ``node``'s bytes, directly or
    through reshape aliases."""
    for user in node.users:
        if user.op == "output":  # (int32 indices are program outputs themselves)
            return True
        if user.op == "call_function" and op_name_of(user.target) == DEQUANTIZE:
            return True
        if user.op == "call_function" and user.target == RESHAPE and reshape_is_alias(user) and \
                feeds_program_output(user):
            return True
    return False


def alias_offset(node: torch.fx.Node) -> int | None:
    """Where ``node``'s bytes start inside its first input's bytes when ``node`` is a view (an alias,
    no C code), else None: 0 for an aliasing reshape; for a Corten op, what its family's
    ``"alias_offset"`` hook says, unless a program output reads the node."""
    if node.op != "call_function":
        return None
    if node.target == RESHAPE:
        return 0 if reshape_is_alias(node) else None
    name = op_name_of(node.target)
    if name is None or name not in all_op_names():
        return None
    hook = hook_for(name, Hook.ALIAS_OFFSET)
    if hook is None:
        return None
    offset = hook(node)
    if offset is None or feeds_program_output(node):
        return None
    return int(offset)
