"""Corten's op dialect: one module per op family, all found through :mod:`corten.ops.registry`.

Importing this package registers every op in the ``corten`` ``torch.library`` namespace.
"""
from corten.ops import add, conv, linear, pool, quantize, shape  # noqa: F401  (registers the families)
from corten.ops.checks import CortenOpError
from corten.ops.registry import OpFamily, all_op_names, families, family_of, hook_for, op, op_name_of

__all__ = ["CortenOpError", "OpFamily", "all_op_names", "families", "family_of", "hook_for", "op", "op_name_of"]
