"""The C library of a :class:`corten.program.Program` (a mixin of it): writing it (:meth:`emit_c`),
running it on the host or QEMU (:meth:`c_run`, :meth:`run_c`) and profiling it step by step
(:meth:`profile`).  The builds and runs themselves are :mod:`corten.runners.program_runner`'s.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Sequence

import torch

from corten.errors import UsageError


class ProgramC:
    """What :class:`corten.program.Program` does with its C library (mixed into it)."""

    def emit_c(self, out_dir: str | Path, kernels=None, target: str | None = None, *, deployment=None):
        """Write the C model library (see :func:`corten.codegen.emit_c`) for a deployment
        (:meth:`deployment`; by default the program's target with ``kernels="portable"``); the
        memory plan is made for that deployment's core and kernels."""
        from corten.codegen import emit_c

        self._require_lowered("emit C")
        d = self.deployment(kernels, target, deployment=deployment, default_kernels="portable")
        return emit_c(self.ep, self.memory_for(deployment=d), out_dir, self.name, d,
                      node_sources=self.info.get("node_sources"), output_names=self.output_names,
                      input_scaling=self.input_scaling)

    def _c_setup(self, inputs: tuple, on: str, kernels, target, deployment, cmsis_nn_path, cycles: bool):
        """(checked inputs, deployment, CMSIS-NN path) of a C run; the program's runner made once."""
        from corten.runners.program_runner import ProgramRunner

        inputs = self._check_inputs(inputs)
        if getattr(self, "_runner", None) is None:
            self._runner = ProgramRunner(self)
        if cycles and on != "qemu":
            raise UsageError("cycles=True estimates the cycles of a QEMU run (on='qemu')")
        d = self.deployment(kernels, target, deployment=deployment, default_kernels="portable")
        return inputs, d, cmsis_nn_path or os.environ.get("CMSIS_NN_PATH")

    def c_run(self, *inputs: torch.Tensor, on: str = "host", kernels=None,
              cmsis_nn_path: str | None = None, target: str | None = None, progress: bool = False,
              cflags: str | Sequence[str] = (), cycles: bool = False, deployment=None):
        """Run the program's C library on the host or on QEMU (for a deployment, :meth:`deployment`:
        the program's target, or ``target``, with ``kernels="portable"`` by default; on QEMU its
        board) and return the run as a value: a :class:`corten.runners.program_runner.CRun` with the
        int8 ``outputs`` (as :meth:`run_int8`), ``wall_s``, ``instructions`` (QEMU) and the log.
        ``cycles`` (QEMU): also ``run.cycles_estimate``, the inference's estimated cycles (the executed
        instruction mix costed with the core's timing table, :mod:`corten.runners.cycles`).

        ``cflags``: extra compiler flags (a list, or one string split like a shell would), added
        after Corten's ``-O2``, e.g. ``"-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all"``
        on the host: a sanitizer report then fails the run with :class:`corten.runners.CRunError`."""
        inputs, d, cmsis = self._c_setup(inputs, on, kernels, target, deployment, cmsis_nn_path, cycles)
        flags = _cflags_tuple(cflags)
        outs, run = self._runner.run(inputs, on, d, cmsis, progress=progress, cflags=flags, cycles=cycles)
        run.outputs = list(outs)
        run.output_names = self.output_names
        run.structured = self.structure(run.outputs)
        return run

    def profile(self, *inputs: torch.Tensor, on: str = "qemu", target: str | None = None,
                kernels=None, cmsis_nn_path: str | None = None, baseline: bool = True,
                progress: bool = False, cycles: bool = False, deployment=None):
        """Per-step cost of the C library: a :class:`corten.runners.profile.Profile` with one row per
        step of ``<name>_run`` (step, module path, op, kernel called - ``arm_*`` CMSIS-NN or
        ``corten_*`` portable -, MACs, instructions on QEMU or nanoseconds on the host).

        The library is built with ``-DCORTEN_PROFILE`` (a timer read after every step, its cost
        measured and subtracted; see :mod:`corten.runners.profile`).  ``baseline``: also run the
        normal build, so that ``profile.baseline`` / ``profile.ratio`` compare the rows' sum with
        it; ``profile.outputs_match`` says whether the run(s) reproduced :meth:`run_int8` byte for
        byte.  ``cycles`` (QEMU): each row also gets its estimated cycles (``row.cycles``, see
        :meth:`c_run`).  No inputs: seeded random ones."""
        from corten.runners.profile import Profile, parse_profile, profile_rows

        if not inputs:
            g = torch.Generator().manual_seed(0)
            inputs = tuple(torch.randn(s.shape, generator=g) for s in self.inputs)
        inputs, d, cmsis = self._c_setup(inputs, on, kernels, target, deployment, cmsis_nn_path, cycles)
        expected = self.run_int8(*inputs)
        outs, run = self._runner.run(inputs, on, d, cmsis, progress=progress, profile=True, cycles=cycles)
        steps = self._runner.library(d).steps
        if on == "qemu":
            per_tick, unit = d.require_board().instructions_per_tick, "instructions"
        else:
            per_tick, unit = 1.0, "ns"
        costs, hook = parse_profile(run.result.log, steps, per_tick, run.result.where)
        match = all(torch.equal(e, o) for e, o in zip(expected, outs))
        estimate = run.result.cycles
        prof = Profile(self.name, on, d.core if on == "qemu" else None, run.kernels, unit,
                       profile_rows(steps, costs, estimate.steps if estimate is not None else None), hook_cost=hook,
                       cycles_core=estimate.core if estimate is not None else None)
        if baseline:
            base_outs, base = self._runner.run(inputs, on, d, cmsis, progress=progress)
            prof.baseline = float(base.instructions if on == "qemu" else base.wall_s * 1e9)
            match = match and all(torch.equal(e, o) for e, o in zip(expected, base_outs))
        prof.outputs_match = match
        return prof

    def run_c(self, *inputs: torch.Tensor, on: str = "host", kernels=None,
              cmsis_nn_path: str | None = None, target: str | None = None, int8: bool = False,
              progress: bool = False, cflags: str | Sequence[str] = (), deployment=None):
        """:meth:`c_run`, returning the outputs as :meth:`run` does, in forward's structure
        (``int8=True``: the raw int8 outputs, a flat list as :meth:`run_int8`).  The run itself is also kept in ``last_c_run`` (a
        convenience; :meth:`c_run` returns it)."""
        run = self.c_run(*inputs, on=on, kernels=kernels, cmsis_nn_path=cmsis_nn_path, target=target,
                         progress=progress, cflags=cflags, deployment=deployment)
        self.last_c_run = run
        outs = run.outputs
        if int8:
            return outs
        deq = [o if o.dtype not in (torch.int8, torch.int16) else  # argmax/argmin indices: as they are
               torch.ops.corten.dequantize_per_tensor(o.contiguous(), s.scale, s.zero_point,
                                                      16 if o.dtype == torch.int16 else 8)
               for o, s in zip(outs, self.outputs)]
        return self._returned(deq)


def _cflags_tuple(cflags) -> tuple[str, ...]:
    if cflags is None:
        return ()
    if isinstance(cflags, str):
        return tuple(shlex.split(cflags))
    if not all(isinstance(f, str) for f in cflags):
        raise UsageError(f"cflags must be a string or a list of strings, got {cflags!r}")
    return tuple(cflags)
