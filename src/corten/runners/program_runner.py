"""Run a compiled :class:`corten.program.Program` as C: emit its model library, build it for the host
or a QEMU board, feed it the quantized input bytes and read back the output bytes.

Byte layout at the C boundary: a 4-D tensor (logical NCHW in torch) is NHWC in memory; other
ranks are row-major.  The caller quantizes inputs and dequantizes outputs, as a C application
would with the header's scale/zero-point macros.
"""
from __future__ import annotations

import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corten.errors import CmsisNnNotFoundError, UsageError
from corten.deployment import Deployment
from corten.runners.common import CRunResult, harness_defines


def tensor_to_c_bytes(t: torch.Tensor) -> bytes:
    """int8 / int16 tensor -> the bytes of its C buffer (NHWC for 4-D; int16 little-endian, as Cortex-M)."""
    if t.dim() == 4:
        t = t.permute(0, 2, 3, 1)
    return t.contiguous().numpy().tobytes()


def inputs_to_c_bytes(lib, q_inputs) -> bytes:
    """The caller's packed input buffer of an emitted library (``lib.inputs[i].offset``): each
    quantized program input in the C layout of ``lib.inputs[i].shape`` - the forward's argument, or
    the 4-D tensor its first reshape makes when the library takes the input as that layer reads it
    (:func:`corten.memory.views.input_layout_reshape`)."""
    data = bytearray()
    for q, t in zip(q_inputs, lib.inputs):
        data += bytes(t.offset - len(data))  # (alignment padding before an int16 input)
        data += tensor_to_c_bytes(q.reshape(t.shape))
    return bytes(data)


def c_bytes_to_tensor(data: bytes, shape: tuple[int, ...], bits: int = 8) -> torch.Tensor:
    """The bytes of a C buffer -> int8 (``bits=16``: int16; ``bits=32``: int32 argmax/argmin indices;
    little-endian, as every supported target) tensor of logical ``shape`` (channels_last for 4-D)."""
    dtype = {8: np.int8, 16: "<i2", 32: "<i4"}[bits]
    arr = torch.from_numpy(np.frombuffer(bytearray(data), dtype=dtype).astype(
        {8: np.int8, 16: np.int16, 32: np.int32}[bits]))
    if len(shape) == 4:
        n, c, h, w = shape
        return arr.reshape(n, h, w, c).permute(0, 3, 1, 2)
    return arr.reshape(shape)


def cmsis_nn_sources(cmsis_nn_path: str | Path) -> tuple[list[Path], list[Path]]:
    """All CMSIS-NN kernel sources and its include directory, from a user's CMSIS-NN tree."""
    root = Path(cmsis_nn_path)
    # Integer kernels only: the float ones (*_f16.c, *_f32.c) need CMSIS-NN's float build options.
    sources = sorted(p for p in root.glob("Source/*/*.c") if not p.name.endswith(("_f16.c", "_f32.c")))
    if not sources or not (root / "Include" / "arm_nnfunctions.h").exists():
        raise CmsisNnNotFoundError(f"{root}: not a CMSIS-NN tree (expected Include/arm_nnfunctions.h and "
                                "Source/*/*.c); set CMSIS_NN_PATH / cmsis_nn_path to your CMSIS-NN checkout")
    return sources, [root / "Include"]


@dataclass
class CRun:
    """One C run of a program (``Program.c_run``; the last one also in ``prog.last_c_run``)."""

    on: str  # "host" or "qemu"
    target: str | None  # the Cortex-M target for QEMU runs
    kernels: str
    wall_s: float  # host: the inference call alone; QEMU: the whole emulator run
    instructions: int | None  # QEMU: instructions of the inference alone
    result: CRunResult
    outputs: list[torch.Tensor] = field(default_factory=list)  # the int8 outputs, set by Program.c_run
    output_names: list[str] = field(default_factory=list)  # their C names (Program.output_names)
    structured: Any = None  # the int8 outputs in the structure forward returns (dict, NamedTuple, ...)

    @property
    def cycles_estimate(self) -> float | None:
        """Estimated cycles of the inference (QEMU runs with ``cycles=True``; None otherwise)."""
        est = self.result.cycles
        return None if est is None else est.total


def host_kernel_objects(kernel_files, cflags: tuple[str, ...]) -> list[Path]:
    """Corten's kernel sources compiled for the host with ``cflags``, once per process
    (:func:`corten.runners.common.cached_objects`)."""
    from corten.runners.common import cached_objects
    from corten.runners.host import host_compile_command

    return cached_objects([p for p in kernel_files if Path(p).suffix == ".c"], host_compile_command(cflags),
                          where="host (Corten kernels)")


class ProgramRunner:
    """Emits (once per kernels/target) and runs a program's C library."""

    def __init__(self, program) -> None:
        self.program = program
        # Removed when the runner (the program) goes away or the process exits - silently: a
        # TemporaryDirectory would warn (ResourceWarning) whenever the garbage collector frees a
        # program that ran C, inside whatever code happens to be running then.
        self.workdir = Path(tempfile.mkdtemp(prefix=f"corten-{program.name}-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.workdir), ignore_errors=True)
        self._emitted: dict[tuple[str, str], object] = {}

    def close(self) -> None:
        """Remove the work directory now (it is removed anyway when the runner goes away)."""
        self._cleanup()
        self._emitted.clear()

    def library(self, deployment: Deployment, target=None) -> object:
        """The program's C library for ``deployment`` (emitted once per core and providers); a
        ``kernels`` spec with a ``target`` (name or Target) stands for ``Deployment.of(target, kernels)``."""
        if not isinstance(deployment, Deployment):
            deployment = Deployment.of(target or self.program.target, deployment)
        if deployment.key not in self._emitted:
            out = self.workdir / f"{_dir_name(deployment.kernels)}-{deployment.core}" / "lib"
            self._emitted[deployment.key] = self.program.emit_c(out, deployment=deployment)
        return self._emitted[deployment.key]

    def run(self, inputs: tuple[torch.Tensor, ...], on: str, deployment: Deployment, cmsis_nn_path=None,
            progress=True, cflags: tuple[str, ...] = (), profile: bool = False,
            cycles: bool = False) -> tuple[list[torch.Tensor], CRun]:
        """One C run; ``profile``: the instrumented build (``-DCORTEN_PROFILE``, the harness reads the
        timer after every step: :mod:`corten.runners.profile` turns its log into rows)."""
        from corten.runners.common import cached_objects
        from corten.runners.host import host_compile_command, run_on_host
        from corten.runners.qemu import arm_compile_command, run_on_qemu

        if on not in ("host", "qemu"):
            raise UsageError(f"on must be 'host' or 'qemu', got {on!r}")
        lib = self.library(deployment)
        includes = list(lib.include_dirs)
        cflags = ("-O2", *cflags)  # the caller's flags last: they override (-O0, -g, -fsanitize=...)
        # the kernel libraries as objects compiled once per process (they do not depend on the program)
        compile_command = (host_compile_command(cflags) if on == "host"
                           else arm_compile_command(deployment.require_board(), cflags))
        kernel_sources = [p for p in lib.kernel_files if p.suffix == ".c"]
        sources = [p for p in lib.sources if p not in kernel_sources]
        sources += cached_objects(kernel_sources, compile_command, where=f"{on} (Corten kernels)")
        if lib.links_cmsis_nn:
            if cmsis_nn_path is None:
                raise UsageError(f"kernels={lib.kernels!r} needs cmsis_nn_path (or the CMSIS_NN_PATH variable) "
                                 "pointing at a CMSIS-NN source tree")
            nn_sources, nn_includes = cmsis_nn_sources(cmsis_nn_path)
            sources += cached_objects(nn_sources, compile_command, nn_includes, where=f"{on} (CMSIS-NN)")
            includes += nn_includes
        q_inputs = self.program.quantize_inputs(*inputs)
        data = inputs_to_c_bytes(lib, q_inputs)  # packed at lib.inputs[i].offset
        defines = harness_defines(f"{lib.name}.h", lib.run_symbol, lib.input_bytes, lib.output_bytes,
                                  lib.arena_bytes, lib.arena_align)
        if profile:
            defines.update(CORTEN_PROFILE="1", CORTEN_PROFILE_HOOK=f"{lib.name}_profile_step",
                           CORTEN_PROFILE_STEPS=str(len(lib.steps)))
        kwargs = {} if progress else {"progress": lambda *a, **k: None}
        run_dir = self.workdir / f"{_dir_name(lib.kernels)}-{deployment.core}" / f"run-{on}{'-profile' if profile else ''}"
        run_dir.mkdir(parents=True, exist_ok=True)
        if on == "host":
            res = run_on_host(sources, includes, defines, data, lib.output_bytes, run_dir, cflags=cflags, **kwargs)
        else:
            res = run_on_qemu(sources, includes, defines, data, lib.output_bytes, deployment, run_dir,
                              cflags=cflags, cycles=cycles, linker_fragment=getattr(lib, "linker_fragment", None),
                              **kwargs)
        outs = [c_bytes_to_tensor(res.output[t.offset:t.offset + t.nbytes], t.shape, t.bits) for t in lib.outputs]
        outs = [o.to(torch.bool) if t.boolean else o for o, t in zip(outs, lib.outputs)]
        return outs, CRun(on, deployment.core if on == "qemu" else None, lib.kernels, res.wall_s, res.instructions, res)


def _dir_name(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_+." else "_" for ch in label)
