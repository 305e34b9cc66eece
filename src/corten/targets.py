"""Cortex-M targets and the instruction-set features that pick kernels and scratch sizes."""
from __future__ import annotations

from dataclasses import dataclass

from corten.errors import UsageError


@dataclass(frozen=True)
class Target:
    name: str  # "cortex-m55"
    cpu: str  # gcc -mcpu value
    isa: str  # "plain" (no DSP extension), "dsp" (Armv7E-M / Armv8-M Main DSP) or "mve" (Helium)
    fpu: str | None  # gcc -mfpu value, None when the core has no FPU
    arch: str

    @property
    def has_dsp(self) -> bool:
        return self.isa in ("dsp", "mve")

    @property
    def has_mve(self) -> bool:
        return self.isa == "mve"


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("cortex-m0", "cortex-m0", "plain", None, "armv6-m"),
        Target("cortex-m0plus", "cortex-m0plus", "plain", None, "armv6-m"),
        Target("cortex-m3", "cortex-m3", "plain", None, "armv7-m"),
        Target("cortex-m4", "cortex-m4", "dsp", "fpv4-sp-d16", "armv7e-m"),
        Target("cortex-m7", "cortex-m7", "dsp", "fpv5-d16", "armv7e-m"),
        Target("cortex-m33", "cortex-m33", "dsp", "fpv5-sp-d16", "armv8-m.main"),
        Target("cortex-m55", "cortex-m55", "mve", "auto", "armv8.1-m.main"),
        Target("cortex-m85", "cortex-m85", "mve", "auto", "armv8.1-m.main"),
    )
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise UsageError(f"unknown target {name!r}; choose one of: {', '.join(TARGETS)}") from None
