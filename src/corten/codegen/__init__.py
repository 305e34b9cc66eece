"""C code generation: Corten's portable C99 int8 kernels (``kernels/``) and :func:`emit_c`, which
writes a lowered program + memory plan as a self-contained C library."""
from __future__ import annotations

from corten.codegen.context import CodegenError, EmitContext
from corten.codegen.emitter import KERNELS_DIR, EmittedLibrary, emit_c

__all__ = ["CodegenError", "EmitContext", "EmittedLibrary", "KERNELS_DIR", "emit_c"]
