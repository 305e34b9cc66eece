"""Corten's op dialect: one module per op family, all found through :mod:`corten.ops.registry`.

Importing this package imports every family module in it, which registers each family's ``corten::``
ops, lowering rules, quantizer annotations, scratch sizes and C emission.  A new op family is a
new module here (plus its portable C kernel in ``corten/codegen/kernels/<family>.c``): nothing
else needs editing.  Modules whose name starts with ``_`` (the rule API ``_rules``/``_qparams`` and
the shared helpers ``_common``/``_broadcast``), ``registry`` and ``checks`` are the infrastructure
the families build on: they never import a family.
"""
import importlib
import pkgutil

from corten.errors import CortenOpError
from corten.ops.registry import Hook, OpFamily, all_op_names, families, family_of, hook_for, op, op_name_of

_INFRASTRUCTURE = {"registry", "checks"}
for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _mod not in _INFRASTRUCTURE and not _mod.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod}")

__all__ = ["CortenOpError", "Hook", "OpFamily", "all_op_names", "families", "family_of", "hook_for", "op", "op_name_of"]
