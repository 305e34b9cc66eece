"""Cycle estimates of a QEMU run: the executed instruction mix costed with the core's timing table.

QEMU ``-icount`` counts instructions, not cycles, and an instruction count can be gamed (LDM/LDRD
move several words, a Helium instruction works on 128 bits over several beats).  With ``cycles``
the runner adds ``-d in_asm,exec,nochain``: QEMU then logs each translated block's guest
instructions once (``in_asm``) and every execution of a block (``exec``; ``nochain`` so that no
execution is hidden by block chaining).  :func:`estimate` walks that log: each executed block's
instructions are costed with :data:`TIMINGS` for the core, a branch that ends a block is *taken*
when the next executed block does not start right after it, and a load right after another load
or store of the same block is *pipelined*.  Only the blocks between the first entry into the
model's ``<name>_run`` and the return to the harness count; in a profile build the entries into
``<name>_profile_step`` split them into steps.

Timing tables (cycles; conservative: every taken branch pays the worst pipeline refill, a load its
extra cycle unless it follows another load/store, multi-beat Helium instructions all their beats,
no dual issue, no overlap of beats, zero-wait-state memory)::

    class        Cortex-M4 (TRM r0p1 table 3-1)    Cortex-M7 (TRM, no dual issue)   Cortex-M55 (TRM, SOG)
    alu, mul     1 (MUL/MLA/SMLAD/SMULL/SMLAL 1)   1                                 1
    div          12 (2..12)                        12                                12
    load         2, 1 pipelined                    1                                 2, 1 pipelined
    store        1                                 1                                 1
    ldrd/strd    3                                 2                                 2
    ldm/stm      1 + N                             1 + N/2                           1 + N/2
    branch       1, taken 1 + P, P = 3             1, taken 1 + 2 (mispredict)       1, taken 1 + 3; LE 1
    pop {.., pc} 1 + N + P                         1 + N/2 + 2                       1 + N/2 + 3
    mve          -                                 -                                 2 (128 bits on a dual-beat core)

This is an estimate for comparisons between kernel flavours on one core, not a simulation: caches,
flash wait states, bus contention and the M7's dual issue are not modelled.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_IN_RE = re.compile(r"^IN: ?(.*)$")
_INSN_RE = re.compile(r"^0x([0-9a-f]+):\s+((?:[0-9a-f]{4} ?)+)\s+(\S+)\s*(.*)$")
_TRACE_RE = re.compile(r"^Trace \d+: \S+ \[[0-9a-f]+/([0-9a-f]+)/[0-9a-f]+/([0-9a-f]+)\] ?(.*)$")

CORES = ("cortex-m4", "cortex-m7", "cortex-m55")
REFILL = {"cortex-m4": 3, "cortex-m7": 2, "cortex-m55": 3}


@dataclass(frozen=True)
class Insn:
    addr: int
    size: int
    mnemonic: str
    operands: str


@dataclass
class CycleEstimate:
    """Estimated cycles of a run (``total``), per profile step when the run was a profile build
    (``steps[k - 1]``: step k), and the instruction mix (class -> executed instructions)."""

    core: str
    total: float
    instructions: int
    steps: list[float] = field(default_factory=list)
    mix: Counter = field(default_factory=Counter)

    @property
    def cpi(self) -> float:
        return self.total / self.instructions if self.instructions else 0.0


def timing_core(target: str) -> str:
    """The timing table used for ``target``: M4 for the Armv7E-M/M33 DSP cores without their own
    table, M55 for Helium cores, M7 for the M7; plain cores (M0/M3) use the M4 table."""
    if target in ("cortex-m55", "cortex-m85"):
        return "cortex-m55"
    if target == "cortex-m7":
        return "cortex-m7"
    return "cortex-m4"


_BRANCHES = ("b", "bl", "bx", "blx", "cbz", "cbnz", "tbb", "tbh", "le", "wls", "dls", "letp", "wlstp")


def classify(insn: Insn) -> str:
    m = insn.mnemonic.lower().split(".")[0]
    ops = insn.operands.lower()
    if m.startswith("v") and ("q" in re.findall(r"\b(q)\d", ops) or m.startswith(("vldrb", "vldrh", "vldrw", "vstrb",
                                                                                        "vstrh", "vstrw", "vctp",
                                                                                        "vpst", "vpt", "vmladav",
                                                                                        "vmlav", "vaddv"))):
        return "mve"
    if m in ("pop", "ldm", "ldmia", "ldmdb") and "pc" in ops:
        return "pop_pc"
    if m in ("push", "pop", "ldm", "ldmia", "ldmdb", "stm", "stmia", "stmdb", "vpush", "vpop", "vldm", "vstm"):
        return "multiple"
    if m in ("ldrd", "strd"):
        return "double"
    if m.startswith("ldr") or m.startswith("vldr") or m in ("ldrex", "lda"):
        return "pc_load" if ("pc" in ops.split(",")[0]) else "load"
    if m.startswith("str") or m.startswith("vstr") or m in ("strex", "stl"):
        return "store"
    if m in ("sdiv", "udiv"):
        return "div"
    if m in ("le", "letp"):
        return "loop_end"
    base = m[:-2] if len(m) > 2 and m[-2:] in ("eq", "ne", "cs", "cc", "mi", "pl", "vs", "vc", "hi", "ls", "ge",
                                                  "lt", "gt", "le", "hs", "lo") and m[:-2] in ("b", "bx", "bl") else m
    if base in _BRANCHES:
        return "branch"
    if m in ("mov", "add") and ops.startswith("pc"):
        return "branch"
    return "alu"


def _regs(ops: str) -> int:
    m = re.search(r"\{([^}]*)\}", ops)
    if not m:
        return 1
    n = 0
    for part in m.group(1).split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-")
            try:
                n += int(b.strip()[1:]) - int(a.strip()[1:]) + 1
            except ValueError:
                n += 1
        elif part:
            n += 1
    return n


def cost(core: str, cls: str, insn: Insn, taken: bool, pipelined: bool) -> float:
    p = REFILL[core]
    if cls == "alu":
        return 1
    if cls == "div":
        return 12
    if cls == "load":
        if core == "cortex-m7":
            return 1
        return 1 if pipelined else 2
    if cls == "pc_load":
        return 2 + p
    if cls == "store":
        return 1
    if cls == "double":
        return 3 if core == "cortex-m4" else 2
    if cls in ("multiple", "pop_pc"):
        n = _regs(insn.operands)
        base = 1 + (n if core == "cortex-m4" else -(-n // 2))
        return base + (p if cls == "pop_pc" else 0)
    if cls == "branch":
        return 1 + p if taken else 1
    if cls == "loop_end":
        return 1
    if cls == "mve":
        return 2
    return 1


def estimate(log_path: Path, target: str, run_symbol: str, step_symbol: str | None = None) -> CycleEstimate:
    """Cycles of the blocks QEMU executed from the first entry into ``run_symbol`` until the return
    to the harness's ``main`` (see the module docstring).  ``step_symbol`` (a profile build's hook):
    its blocks (and the timer read they call) are not counted, and each entry into it closes a step."""
    core = timing_core(target)
    hook_symbols = {step_symbol, "corten_timer_now"} if step_symbol else set()
    blocks: dict[int, list[Insn]] = {}
    costed: dict[int, list[tuple[str, float, float]]] = {}  # pc -> per insn (class, cost, cost if taken)
    est = CycleEstimate(core, 0.0, 0)

    def block_cost(pc: int, block: list[Insn]) -> list[tuple[str, float, float]]:
        got = costed.get(pc)
        if got is None:
            got, last_mem = [], False
            for insn in block:
                cls = classify(insn)
                pipelined = last_mem and cls == "load"
                got.append((cls, cost(core, cls, insn, False, pipelined), cost(core, cls, insn, True, pipelined)))
                last_mem = cls in ("load", "store")
            costed[pc] = got
        return got

    def account(block: list[Insn], pc: int, next_pc: int | None) -> float:
        items = block_cost(pc, block)
        total = sum(c for _, c, _ in items)
        last = block[-1]
        if next_pc is not None and items[-1][0] in ("branch", "pop_pc", "pc_load") and \
                next_pc != last.addr + last.size:
            total += items[-1][2] - items[-1][1]  # the block's last branch was taken
        for cls, _, _ in items:
            est.mix[cls] += 1
        est.instructions += len(block)
        return total

    pending: list[Insn] = []
    reading_in = counting = prev_in_hook = False
    prev_block, prev_pc = None, 0
    step, steps = 0.0, []
    with open(log_path, errors="replace") as f:
        for line in f:
            if line.startswith("IN:"):
                reading_in, pending = True, []
                continue
            if reading_in:
                m = _INSN_RE.match(line)
                if m:
                    size = len(m.group(2).replace(" ", "")) // 2
                    pending.append(Insn(int(m.group(1), 16), size, m.group(3), m.group(4)))
                    continue
                reading_in = False
            if not line.startswith("Trace"):
                continue
            m = _TRACE_RE.match(line)
            if not m:
                continue
            pc, sym = int(m.group(1), 16), m.group(3).strip()
            if pending and pending[0].addr == pc:
                blocks[pc] = pending  # the block just translated (icount may retranslate shorter ones)
                pending = []
            if not counting:
                if sym != run_symbol:
                    continue
                counting = True
            elif prev_block is not None:
                c = account(prev_block, prev_pc, pc)
                if not prev_in_hook:
                    est.total += c
                    step += c
            if counting and sym == "main":
                break
            in_hook = sym in hook_symbols
            if in_hook and not prev_in_hook:
                steps.append(step)
                step = 0.0
            prev_block, prev_pc, prev_in_hook = blocks.get(pc), pc, in_hook
    if step_symbol is not None:
        est.steps = steps[1:]  # (before the first hook: the call of <name>_run)
    return est
