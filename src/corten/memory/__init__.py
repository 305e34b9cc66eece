"""Static memory planning: where every int8 activation and kernel scratch buffer lives in RAM.

Entry point: :func:`plan_memory` (``ExportedProgram`` + target -> :class:`MemoryPlan`); then
:func:`check_budget`.  :func:`reshape_is_alias` tells the C generator which reshapes are free.
"""
from corten.memory.budget import BudgetError, check_budget
from corten.memory.plan import ALIGNMENT, MemoryPlan, RegionPlan, TensorAlloc, plan_memory
from corten.memory.tensors import MemoryPlanError, constant_tensor
from corten.memory.views import reshape_is_alias

__all__ = ["ALIGNMENT", "BudgetError", "MemoryPlan", "MemoryPlanError", "RegionPlan", "TensorAlloc", "check_budget",
           "constant_tensor", "plan_memory", "reshape_is_alias"]
