"""C code generation: Corten's portable C99 int8 kernels (``kernels/``) and :func:`emit_c`, which
writes a lowered program + memory plan as a self-contained C library."""
from __future__ import annotations

from corten.codegen.context import CodegenError, EmitContext
from corten.codegen.emitter import (KERNELS_DIR, EmittedLibrary, StepInfo, choices_report, emit_c, fallback_report,
                                   kernel_steps)
from corten.codegen.generated import GENERATED  # registers kernels="generated"

__all__ = ["CodegenError", "EmitContext", "EmittedLibrary", "GENERATED", "KERNELS_DIR", "StepInfo", "choices_report",
           "emit_c", "fallback_report", "kernel_steps"]
