"""Does a memory plan fit the device?  :func:`check_budget` says what does not, and by how much."""
from __future__ import annotations

from corten.errors import BudgetError
from corten.memory.plan import MemoryPlan


def check_budget(plan: MemoryPlan, max_arena: int | None, max_flash: int | None) -> None:
    """Raise :class:`BudgetError` when the arena exceeds ``max_arena`` bytes of RAM or the constant
    data exceeds ``max_flash`` bytes of flash (None: no limit).  ``max_flash`` covers the model's
    constant tensors only, not code.  The message names the peak step and the tensors live there."""
    problems = []
    if max_arena is not None and plan.arena_bytes > max_arena:
        problems.append(f"arena needs {plan.arena_bytes:,} B of RAM but max_arena is {max_arena:,} B "
                        f"(over by {plan.arena_bytes - max_arena:,} B; the lower bound without in-place "
                        f"reuse is {plan.lower_bound_bytes:,} B)")
    for r in getattr(plan, "regions", ()):
        if r.over:
            problems.append(f"memory region {r.name!r} needs {r.nbytes:,} B but has {r.capacity:,} B (over by "
                            f"{r.over:,} B: the buffers no faster region holds do not fit it; give it more "
                            "bytes or add a region after it)")
    if max_flash is not None and plan.constant_bytes > max_flash:
        problems.append(f"constant data (weights, biases, multipliers, shifts, kernel sums) needs "
                        f"{plan.constant_bytes:,} B of flash but max_flash is {max_flash:,} B "
                        f"(over by {plan.constant_bytes - max_flash:,} B"
                        + ("; Corten's generated kernels store the weights in layouts of their own, about twice "
                           "the int8 bytes: the portable or CMSIS-NN kernels need the int8 weights only"
                           if "generated" in str(plan.kernels or "") else "")
                        + "; weights='int4' or 'auto' stores weights in 4 bits)")
    if problems:
        raise BudgetError(
            f"model does not fit {plan.target or 'the target'}: " + "; ".join(problems) + ". "
            + plan.peak_description() + ". Shrink the model (input resolution, width) or choose a "
            "target with more memory.")
