"""The portable kernel provider: Corten's own C99 kernels (``codegen/kernels/<family>.c``), one for
every op, so it ends every build's provider chain.  The op families register their portable
kernels here (``@PORTABLE.kernel(op, scratch=...)``); the C generator copies the kernel files of the
families whose kernels a library calls into its shared ``corten_kernels/`` directory.
"""
from __future__ import annotations

from corten.providers.base import FALLBACK, KernelProvider, register_provider

PORTABLE = register_provider(KernelProvider(FALLBACK, "portable"))
