"""``emit_c``: a lowered int8 program + its memory plan -> a C library that links beside others.

The generator walks the graph in order and asks the build's kernel providers
(:mod:`corten.providers`) for each node's C statements: the first provider that supports the node
emits it (:mod:`corten.codegen.context`), the others' reasons go to the step's record.  Reshapes are
handled here: nothing when they alias their input's bytes, an NHWC <-> NCHW copy otherwise; views
(:func:`corten.memory.views.alias_offset`) emit nothing.

Written files (``<name>`` is the library name; every model symbol starts with ``<name>_``)::

    <name>.h            public API, sizes, shapes, quantization, program hash, status codes
    <name>.c            <name>_run: the fixed sequence of kernel calls
    <name>_constants.h  declarations of the constant arrays (internal)
    <name>_constants.c  weights, biases, multipliers, shifts, kernel sums (aligned const arrays)
    <name>.mk, <name>.cmake   the model's sources for the directory's Makefile / CMakeLists.txt
    Makefile, CMakeLists.txt  build lib<name>.a for every model emitted into the directory, and
                        libcorten_kernels.a once (host or a Cortex-M target)
    corten_kernels/     Corten's portable kernels (all of them, identical for every model emitted
                        by this Corten: any number of models share one copy; symbols corten_*)

Several models emitted into one directory share ``corten_kernels/`` and one Makefile/CMake build;
models emitted elsewhere link against any one copy of it: each ``<name>.c`` checks at compile time
that the kernels it includes are the ones it was generated for (``CORTEN_KERNELS_VERSION``).
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from corten.codegen import build_files
from corten.codegen.context import CodegenError, EmitContext, c_identifier, c_int, library_name_problem, nhwc
from corten.errors import UsageError
from corten.deployment import Deployment, weights_section_for
from corten.ops.registry import family_of, is_lowered_node, op_cost, op_name_of
from corten.providers import FALLBACK, KernelCall, KernelStep, Provider, chain_label, choose_provider

KERNELS_DIR = Path(__file__).resolve().parent / "kernels"
KERNEL_HEADERS = ("corten_fixed_point.h", "corten_internal.h", "corten_kernels.h")
KERNELS_SUBDIR = "corten_kernels"  # the shared kernel library's directory inside out_dir
KERNELS_VERSION_HEADER = "corten_kernels_version.h"
RESHAPE = torch.ops.aten.reshape.default
QUANTIZE, DEQUANTIZE = "quantize_per_tensor", "dequantize_per_tensor"
CONST_ALIGN = 16
HASH_CHARS = 16
# int8 arrays of at least this many bytes are written as string literals of their bytes ("\x..", 16 per
# line) rather than lists of numbers: the same bytes in the object file, compiled ~10x faster (gcc builds
# one tree node per list element: MobileNetV2's 7.6 MB of Helium-layout weights took 14 s and 390 MB
# as lists, 1.3 s as strings); smaller arrays (what a reader checks by eye) stay decimal lists.
BYTE_STRING_MIN_BYTES = 4096
_BYTE_ESCAPES = np.array([f"\\x{b:02x}" for b in range(256)])


@dataclass(frozen=True)
class IOTensor:
    """One program input or output at the C boundary: packed at ``offset`` in the caller's buffer."""

    shape: tuple[int, ...]  # logical torch shape (NCHW for 4-D); bytes are NHWC
    scale: float
    zero_point: int
    offset: int
    element_bytes: int = 1  # 1: int8, 2: int16 (TFLite's 16x8 edges), 4: int32 indices (argmax/argmin outputs)
    boolean: bool = False  # a comparison result returned as it is: uint8_t, 0 or 1 (no quantization)
    # an input the library takes as its first layer reads it (memory.views.input_layout_reshape):
    # the forward's argument shape; ``shape`` is then the reshaped 4-D tensor the bytes hold (NHWC)
    source_shape: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.element_bytes

    @property
    def ctype(self) -> str:
        return "uint8_t" if self.boolean else {1: "int8_t", 2: "int16_t", 4: "int32_t"}[self.element_bytes]

    @property
    def bits(self) -> int:
        return 8 * self.element_bytes

    @property
    def int32(self) -> bool:
        return self.element_bytes == 4

    @property
    def quantized(self) -> bool:
        """False for the outputs returned as computed: int32 indices and uint8_t comparison results."""
        return not (self.int32 or self.boolean)


# the program outputs returned as computed, not dequantized: argmax/argmin indices (int32) and
# comparison results (bool: one byte, 0 or 1)
UNQUANTIZED_OUTPUT_DTYPES = (torch.int32, torch.bool)


def is_index_output(node) -> bool:
    """True for a program output that is not dequantized: int32 indices (``quantized_argmax``) or a
    comparison's bool result (``quantized_compare``)."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return (isinstance(node, torch.fx.Node) and node.op == "call_function" and op_name_of(node.target) is not None
            and isinstance(val, torch.Tensor) and val.dtype in UNQUANTIZED_OUTPUT_DTYPES)


def _is_bool(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dtype == torch.bool


def output_tensor(out: torch.fx.Node) -> torch.fx.Node:
    """The tensor whose bytes a program output holds: the int8 input of its dequantize, or the int32
    indices / bool comparison result itself."""
    return out if is_index_output(out) else out.args[0]


def output_qparams(out: torch.fx.Node) -> tuple[float, int]:
    """(scale, zero point) of a program output; indices and comparison results have none (1.0, 0)."""
    return (1.0, 0) if is_index_output(out) else (float(out.args[1]), int(out.args[2]))


@dataclass(frozen=True)
class EmittedLibrary:
    """What :func:`emit_c` wrote, and the facts a caller needs to run it."""

    name: str
    out_dir: Path
    header: Path
    source: Path
    constants: Path
    constants_header: Path
    kernel_files: tuple[Path, ...]  # the copied portable kernel sources and headers (only those used)
    cmake: Path
    makefile: Path
    kernels: str  # the build's provider chain, as reports name it ("portable", "cmsis-nn", "generated+cmsis-nn+portable")
    input_shape: tuple[int, ...]  # logical torch shape (NCHW for 4-D); bytes are NHWC
    input_scale: float
    input_zero_point: int
    output_shape: tuple[int, ...]
    output_scale: float
    output_zero_point: int
    input_bytes: int  # all inputs, packed
    output_bytes: int  # all outputs, packed
    inputs: tuple[IOTensor, ...]
    outputs: tuple[IOTensor, ...]
    arena_bytes: int  # the caller's arena (0 when the library owns its memory regions' arenas)
    arena_align: int
    constant_bytes: int
    program_hash: str
    steps: tuple["StepInfo", ...] = ()  # one per step of <name>_run (module, op, kernel, MACs)
    providers: tuple[str, ...] = ()  # the provider chain's names, in order
    extra_sources: tuple[Path, ...] = ()  # C files of providers other than portable's shared kernels
    regions: tuple = ()  # the memory regions' arenas the library owns (corten.memory.RegionPlan), fastest first
    linker_fragment: Path | None = None  # <name>_sections.ld: sections of the regions' arenas and the weights

    @property
    def links_cmsis_nn(self) -> bool:
        """Whether the build needs CMSIS-NN's sources (CMSIS_NN_PATH)."""
        from corten.providers import get_provider

        return any(get_provider(p).links_cmsis_nn for p in self.providers)

    @property
    def model_sources(self) -> list[Path]:
        """The model's own C files (every symbol prefixed ``<name>_``)."""
        return [self.source, self.constants, *self.extra_sources]

    @property
    def kernel_sources(self) -> list[Path]:
        """The shared portable kernels this model calls (in ``corten_kernels/``)."""
        return [p for p in self.kernel_files if p.suffix == ".c"]

    @property
    def kernels_dir(self) -> Path:
        return self.out_dir / KERNELS_SUBDIR

    @property
    def sources(self) -> list[Path]:
        """The C files to compile for this model alone (the CMSIS-NN sources are not included for
        kernels="cmsis-nn"); link several models with each one's model_sources + one kernel set."""
        return self.model_sources + self.kernel_sources

    @property
    def include_dirs(self) -> list[Path]:
        return [self.out_dir]

    @property
    def run_symbol(self) -> str:
        return f"{self.name}_run"


@dataclass(frozen=True)
class StepInfo:
    """One step of ``<name>_run``: what the profile and the report show."""

    step: int  # 1-based, the number <name>_run returns when this step's kernel fails
    node: str  # graph node name
    module: str  # PyTorch module path ("" for the root module's forward)
    op: str  # Corten op (or "reshape (layout copy)", "output_copy")
    source: str  # file.py:line in fn
    kernel: str  # the (first) C function called: arm_* (CMSIS-NN), corten_* (portable), ...; "copy", "inline"
    macs: int  # multiply-accumulates (0 for data movement)
    reason: str = ""  # why the build's leading provider does not run this step ("" when it does)
    provider: str = FALLBACK  # the provider whose kernel runs the step ("" for the generator's own byte copy)
    calls: tuple = ()  # the step's KernelCalls (function, arguments, parameter structs)
    note: str = ""  # how the kernel computes the step (KernelStep.note: a generated kernel's strategy)

    @property
    def portable(self) -> bool:
        """Corten's portable kernels (or the generator's own code) run this step."""
        return self.provider in (FALLBACK, "")


PACKED_BITS = (4,)  # sub-byte element widths the constant writer packs


def pack_nibbles(values: torch.Tensor) -> torch.Tensor:
    """int4 values (an integer tensor in [-8, 7]) packed two per byte, as CMSIS-NN's s4 kernels read
    them: element 2k in the low nibble and element 2k+1 in the high nibble of byte k (weights
    ``[0x1, 0x2, 0x3, 0x4]`` are the bytes ``[0x21, 0x43]``, arm_nnfunctions.h); an odd count leaves
    the last high nibble 0.  Returned as int8 (the C array's type)."""
    flat = values.reshape(-1).to(torch.int64)
    if flat.numel() and (int(flat.min()) < -8 or int(flat.max()) > 7):
        raise CodegenError(f"int4 constant values must be in [-8, 7], got [{int(flat.min())}, {int(flat.max())}]")
    nib = (flat & 0xF).tolist() + [0] * (flat.numel() % 2)
    packed = [lo | (hi << 4) for lo, hi in zip(nib[0::2], nib[1::2])]
    return torch.tensor(packed, dtype=torch.uint8).view(torch.int8) if packed else torch.zeros(0, dtype=torch.int8)


@dataclass
class _Array:
    cname: str
    tensor: torch.Tensor  # the values: contiguous, int8/16/32/64
    bits: int = 0  # 4: the values are int4, packed two per byte (pack_nibbles); 0: the tensor's own width
    section: str | None = None  # its linker section (Deployment.weights_sections); None: .rodata

    @property
    def data(self) -> torch.Tensor:
        """The C array's elements (the packed bytes of a sub-byte array)."""
        return pack_nibbles(self.tensor) if self.bits == 4 else self.tensor

    @property
    def ctype(self) -> str:
        return {torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int32_t",
                torch.int64: "int64_t"}[self.data.dtype]

    @property
    def length(self) -> int:
        return max(1, self.data.numel())

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


@dataclass
class _Generator:
    ep: torch.export.ExportedProgram
    plan: Any
    name: str
    target: Any
    providers: tuple  # the build's Provider chain (corten.providers.resolve_providers)
    arrays: dict[str, _Array] = field(default_factory=dict)  # key -> array, in first-use order
    uses_layout: bool = False
    portable_families: set[str] = field(default_factory=set)  # families whose portable kernel file is called
    node_sources: dict = field(default_factory=dict)  # node name -> {"module": path, "source": file:line}
    step_info: list = field(default_factory=list)  # per step: StepInfo
    emitted: dict = field(default_factory=dict)  # provider name -> [KernelStep] it emitted
    output_names: tuple = ()  # C names of the outputs (context.output_field_names); () = output0, output1, ...
    weights_sections: tuple = ()  # (module path prefix, linker section) rules of the constants

    def __post_init__(self):
        self.macro = self.name.upper()
        self.kernels = chain_label(self.providers)
        self.lead = self.providers[0]
        self._prefixes: dict[str, str] = {}
        self._arena_names: dict[str, str] = {}
        self._scratch_names: dict[str, str] = {}
        self.arena_pointers: dict[str, tuple[int, int, str, str]] = {}  # C name -> (offset, bytes, node, base)
        self._emitting: torch.fx.Node | None = None  # the node whose kernel is being emitted
        self._used_names: set[str] = set()
        sig = self.ep.graph_signature
        self._const_keys = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
                            **sig.inputs_to_lifted_tensor_constants}

    # ------------------------------------------------------------------ constants
    def constant_value(self, node: torch.fx.Node) -> torch.Tensor:
        if not isinstance(node, torch.fx.Node) or node.op != "placeholder" or node.name not in self._const_keys:
            raise CodegenError(f"{node!r} is not a lifted constant of the program (a constant tensor argument "
                               "must be a parameter, buffer or lifted constant placeholder)")
        key = self._const_keys[node.name]
        if key in self.ep.constants:
            return self.ep.constants[key]
        return self.ep.state_dict[key]

    def _unique(self, base: str) -> str:
        name, k = base, 2
        while name in self._used_names:
            name, k = f"{base}_{k}", k + 1
        self._used_names.add(name)
        return name

    def _add_array(self, key: str, tensor: torch.Tensor, pretty: str | None = None, bits: int = 0) -> str:
        if key in self.arrays:
            return self.arrays[key].cname
        if tensor.dtype not in (torch.int8, torch.int16, torch.int32, torch.int64):
            raise CodegenError(f"constant {key!r} has dtype {tensor.dtype}; only int8/16/32/64 constants "
                               "can be emitted (was the program lowered by Corten?)")
        if bits and bits not in PACKED_BITS:
            raise CodegenError(f"constant {key!r}: {bits}-bit elements cannot be packed (only {PACKED_BITS})")
        if bits:
            pack_nibbles(tensor)  # CodegenError naming the range when a value does not fit
        cname = self._unique(f"{self.name}_{c_identifier(pretty or key).strip('_') or 'const'}")
        section = (weights_section_for(self.weights_sections, self.module_path(self._emitting))
                   if self.weights_sections and self._emitting is not None else None)
        self.arrays[key] = _Array(cname, tensor.detach().contiguous().cpu(), bits, section)
        return cname

    def constant_array(self, node: torch.fx.Node, dtype: torch.dtype | None = None, pretty: str | None = None,
                       bits: int = 0) -> str:
        tensor = self.constant_value(node)
        if dtype is not None and tensor.dtype != dtype:
            raise CodegenError(f"constant {node.name!r} has dtype {tensor.dtype}, expected {dtype}")
        return self._add_array(node.name, tensor, pretty, bits)

    def derived_array(self, key: str, tensor: torch.Tensor, pretty: str | None = None, bits: int = 0) -> str:
        return self._add_array(key, tensor, pretty, bits)

    # ------------------------------------------------------------------ naming
    def module_path(self, node: torch.fx.Node) -> str:
        """The PyTorch module path that produced ``node`` ("" for the root's forward)."""
        info = self.node_sources.get(node.name) or {}
        return str(info.get("module", ""))

    def source_line(self, node: torch.fx.Node) -> str:
        """``file.py:12 in forward`` of the user's code (basename only: the C stays machine independent)."""
        info = self.node_sources.get(node.name) or {}
        src = info.get("source")
        if not src:
            from corten.ops._rules import source_location

            src = source_location(node)
        if src.startswith("<"):
            return ""
        return src.rsplit("/", 1)[-1]

    def uses(self, provider: Provider) -> bool:
        """Whether the library's ``.c`` calls ``provider`` (the leading provider always counts)."""
        if provider is self.lead:
            return True
        if provider.name == FALLBACK:
            return bool(self.portable_families) or self.uses_layout
        return bool(self.emitted.get(provider.name))

    def _named(self, names: dict[str, str], node: torch.fx.Node, prefix: str = "") -> str:
        """``prefix`` + the node's module path (``features_3_conv_1``), or, for code in the root
        module's forward, its op and node number (``add_3``); unique among ``names``."""
        if node.name not in names:
            path = self.module_path(node)
            base = c_identifier(path.replace(".", "_")).strip("_") if path else ""
            if not base:
                base = c_identifier(node.name.replace("quantized_", "")).strip("_") or "step"
            base = prefix + base
            name, k = base, 2
            while name in names.values():
                name, k = f"{base}_{k}", k + 1
            names[node.name] = name
        return names[node.name]

    def node_prefix(self, node: torch.fx.Node) -> str:
        """C name stem of a node's constants, unique within the model (see :meth:`_named`)."""
        return self._named(self._prefixes, node)

    def arena_pointer(self, node: torch.fx.Node, offset: int, nbytes: int, scratch: bool = False,
                      memory: str = "") -> str:
        """The named pointer of the arena bytes of ``node``'s tensor (or scratch): ``act_<module path>``
        (``scratch_<module path>``), declared at the top of ``<name>_steps`` as ``act + offset`` (with
        memory regions: ``<name>_arena_<region> + offset``)."""
        names = self._scratch_names if scratch else self._arena_names
        name = self._named(names, node, "scratch_" if scratch else "act_")
        base = region_arena_symbol(self.name, memory) if memory else "act"
        self.arena_pointers[name] = (int(offset), int(nbytes), node.name, base)
        return name

    # ------------------------------------------------------------------ memory
    def _owner(self, node: torch.fx.Node) -> torch.fx.Node:
        """The node whose planned buffer holds ``node``'s bytes (itself, or the source of an alias reshape)."""
        cur = node
        while cur.name not in self.plan.tensors:
            if cur.op == "call_function" and cur.target == RESHAPE and _reshape_is_alias(cur):
                cur = cur.args[0]
                continue
            raise CodegenError(f"the memory plan has no buffer for tensor {node.name!r}; plan the same "
                               "program that is emitted")
        return cur

    def alloc(self, node: torch.fx.Node):
        return self.plan.tensors[self._owner(node).name]

    def buffer_expr(self, node: torch.fx.Node) -> str:
        a = self.alloc(node)
        if a.region not in ("arena", "input", "output"):
            raise CodegenError(f"tensor {node.name!r} has unknown region {a.region!r} in the memory plan")
        # each program input / output has its own pointer (in<i> / out<i>) inside <name>_steps, each
        # arena tensor a named one (act_<module path>)
        if a.region == "arena":
            return self.arena_pointer(self._owner(node), a.offset, a.nbytes, memory=getattr(a, "memory", ""))
        base = f"{'in' if a.region == 'input' else 'out'}{int(getattr(a, 'index', 0))}"
        offset = int(a.offset)
        return f"({base} + {offset})" if offset else f"({base})"

    def scratch_expr(self, node: torch.fx.Node) -> tuple[str, int]:
        a = getattr(self.plan, "scratch", {}).get(node.name)
        if a is None or int(a.nbytes) == 0:
            return "NULL", 0
        if a.region != "arena":
            raise CodegenError(f"scratch of {node.name!r} is in region {a.region!r}; scratch must be in the arena")
        return (f"(void *){self.arena_pointer(node, a.offset, a.nbytes, scratch=True, memory=getattr(a, 'memory', ''))}",
                int(a.nbytes))

    # ------------------------------------------------------------------ program walk
    def io_nodes(self) -> tuple[list[torch.fx.Node | None], list[torch.fx.Node]]:
        """(the quantize of each program input, in input order - None for an input the program
        never reads; the dequantize of each output, in output order).  Several inputs (outputs)
        are packed one after another in the caller's input (output) buffer, at the offsets
        :meth:`io_offsets` gives."""
        placeholders = {n.name: n for n in self.ep.graph.nodes if n.op == "placeholder"}
        user_inputs = [placeholders[name] for name in self.ep.graph_signature.user_inputs]
        quants = []
        for ph in user_inputs:
            qs = [u for u in ph.users if u.op == "call_function" and op_name_of(u.target) == QUANTIZE]
            if len(qs) > 1 or len(qs) != len(ph.users):
                raise CodegenError(f"program input {ph.name!r} must be read through one quantize_per_tensor")
            quants.append(qs[0] if qs else None)
        self.user_inputs = user_inputs
        outs = [a for a in self.ep.graph.output_node().args[0]]
        deqs = [a for a in outs if isinstance(a, torch.fx.Node)
                and (op_name_of(a.target) == DEQUANTIZE or is_index_output(a))]
        if not any(q is not None for q in quants) or len(deqs) != len(outs):
            raise CodegenError(f"every program input must be quantized and every output dequantized; the program "
                               f"has {sum(q is not None for q in quants)} quantize nodes and {len(deqs)} of "
                               f"{len(outs)} outputs dequantized")
        return quants, deqs

    def io_offsets(self) -> tuple[list[int], list[int]]:
        quants, deqs = self.io_nodes()
        def packed(nodes):
            offs, total = [], 0
            for n in nodes:
                val = n.meta.get("val")
                elem = val.element_size() if isinstance(val, torch.Tensor) and val.dtype == torch.int16 else 1
                size = _output_bytes(n) if is_index_output(n) else elem
                total = -(-total // size) * size  # int32 indices (int16 values) start on a multiple of 4 (2)
                offs.append(total)
                total += self._nbytes(n)
            return offs
        # an input's bytes are its quantize's output (int8 or int16); an unread input keeps int8 bytes
        return (packed([q if q is not None else ph for ph, q in zip(self.user_inputs, quants)]),
                packed([output_tensor(d) for d in deqs]))

    def statements(self) -> tuple[list[str], list[str]]:
        """(C statements of <name>_run, canonical op descriptions for the program hash)."""
        stmts, ops = [], []
        index = 0
        for node in self.ep.graph.nodes:
            if node.op != "call_function":
                continue
            name = op_name_of(node.target)
            if not is_lowered_node(node):
                raise CodegenError(f"node {node.name!r} ({node.target}) is not lowered; only lowered programs "
                                   "(Corten ops and registered views such as aten.reshape) can be emitted as C")
            if name in (QUANTIZE, DEQUANTIZE):
                continue
            if node.target == RESHAPE:
                if _reshape_is_alias(node):
                    ops.append(f"reshape_alias {self._shape(node.args[0])} -> {self._shape(node)}")
                    continue
                index += 1
                call, body = self._reshape_copy(node, index)
                step = KernelStep(FALLBACK, (call,), body)
                reason = "" if self.lead.name == FALLBACK else \
                    f"NHWC <-> NCHW layout copy ({self.lead.title} has no such kernel)"
                stmts.append(self._comment(index, "reshape (layout copy)", node, [node.args[0]], step, reason)
                             + "\n" + body)
                ops.append(f"reshape_copy {self._shape(node.args[0])} -> {self._shape(node)}")
                continue
            if node.name in getattr(self.plan, "placed_cats", ()):  # bands wrote straight into its rows
                ops.append(f"cat_in_place {self._describe(node, name)}")
                continue
            if name is not None and _alias_offset(node) is not None:  # a view: the plan placed it in its input
                ops.append(f"view {self._describe(node, name)}")
                continue
            if name is None:
                raise CodegenError(f"node {node.name!r} ({node.target}) is not a Corten op; only lowered programs "
                                   "(Corten ops and aten.reshape) can be emitted as C")
            try:
                provider, reason = choose_provider(self.providers, node, self.target)
            except UsageError as e:
                raise CodegenError(str(e)) from None
            index += 1
            ctx = EmitContext(node, name, provider.name, self.target, self, step=index)
            inputs = [a for a in node.args if isinstance(a, torch.fx.Node) and a.op != "placeholder"]
            self._emitting = node  # (the module path picks its constants' section)
            if node.name in getattr(self.plan, "in_place_kernels", ()):  # its output over its input
                step = provider.emit_in_place(ctx)
            else:
                step = provider.emit(ctx)
            self._emitting = None
            if not isinstance(step, KernelStep):
                raise CodegenError(f"provider {provider.name!r} returned {type(step).__name__} for node {node.name!r}; "
                                   "emit must return a corten.providers.KernelStep")
            self.emitted.setdefault(provider.name, []).append(step)
            if provider.name == FALLBACK or step.uses_portable:
                self.portable_families.add(family_of(name).name)
            stmts.append(self._comment(index, name, node, inputs, step, reason) + "\n" + step.code)
            ops.append(self._describe(node, name))
        for tensor_name, out_index in getattr(self.plan, "copies", []):
            index += 1
            stmts.append(self._output_copy(index, tensor_name, out_index))
            ops.append(f"output_copy {tensor_name} -> {out_index}")
        return stmts, ops

    def _output_copy(self, index: int, tensor_name: str, out_index: int) -> str:
        """The plan keeps these bytes elsewhere (e.g. the output *is* the input): copy them at the end."""
        node = next((n for n in self.ep.graph.nodes if n.name == tensor_name), None)
        if node is None:
            raise CodegenError(f"the memory plan copies unknown tensor {tensor_name!r}; plan the emitted program")
        nbytes = self._nbytes(node)
        self.step_info.append(StepInfo(index, tensor_name, "", "output_copy", "", "copy", 0,
                                       "the memory plan keeps the output's bytes elsewhere (a byte copy)"
                                       if self.lead.name != FALLBACK else "", provider=""))
        return (f"/* Step {index}: output copy of tensor '{tensor_name}' ({nbytes} bytes) -> output {out_index} */\n"
                "{\n"
                f"    const int8_t *src = {self.buffer_expr(node)};\n"
                f"    int8_t *dst = out{out_index};\n"
                "    size_t i;\n"
                f"    for (i = 0; i < {nbytes}u; i++) {{\n"
                "        dst[i] = src[i];\n"
                "    }\n"
                "}")

    def _nbytes(self, node) -> int:
        """Bytes of an activation tensor (int8 or int16 elements)."""
        val = node.meta["val"]
        return int(np.prod(self._shape(node))) * (val.element_size() if val.dtype != torch.float32 else 1)

    def _shape(self, node) -> list[int]:
        return [int(d) for d in node.meta["val"].shape]

    def _comment(self, index: int, what: str, node, inputs, step: KernelStep, reason: str) -> str:
        """``/* Step 5: features.3.conv.1 - quantized_conv2d (model.py:12 in forward) ... */`` and the
        step's record (module, op, provider, kernel calls, MACs) for the report and the profile."""
        module = self.module_path(node)
        source = self.source_line(node)
        kernel = step.kernel
        self.step_info.append(StepInfo(index, node.name, module, what, source, kernel, op_cost(node).macs,
                                       reason, step.provider, step.calls, step.note))
        ins = ", ".join(self._layout(i) for i in inputs)
        where = f" ({source})" if source else ""
        return (f"/* Step {index}: {module or '(forward)'} - {what}{where}\n"
                f" *   {ins} -> {self._layout(node)}; node '{node.name}', kernel {kernel} */")

    def _layout(self, node) -> str:
        shape = self._shape(node)
        if len(shape) == 4:
            n, h, w, c = nhwc(shape)
            return f"[{n}, {h}, {w}, {c}] NHWC"
        return str(shape)

    def _describe(self, node, name) -> str:
        parts = [name]
        for a in node.args:
            if isinstance(a, torch.fx.Node):
                if a.op == "placeholder":
                    t = self.constant_value(a)
                    parts.append(f"const{tuple(t.shape)}:{hashlib.sha256(_bytes(t)).hexdigest()}")
                else:
                    parts.append(f"tensor{self._shape(a)}")
            else:
                parts.append(repr(a))
        parts.append(f"-> {self._shape(node)}")
        return " ".join(parts)

    def _reshape_copy(self, node, index: int) -> str:
        src = node.args[0]
        in_shape, out_shape = self._shape(src), self._shape(node)
        self.uses_layout = True
        plan = reshape_copy_plan(in_shape, out_shape)
        if plan is None:
            raise CodegenError(f"reshape node {node.name!r} {in_shape} -> {out_shape} permutes channels-last bytes "
                               "on both sides; flatten to 2-D first")
        fn, dims = plan
        out, inp = self.buffer_expr(node), self.buffer_expr(src)
        if src.meta["val"].dtype == torch.int16:  # 16x8: 2-byte elements
            fn = fn.replace("_s8", "_s16")
            out, inp = f"(int16_t *)(void *){out}", f"(const int16_t *)(const void *){inp}"
        return KernelCall(fn, ("&dims", inp, out)), ("{\n"
                f"    const corten_dims dims = {{.n = {dims[0]}, .h = {dims[1]}, .w = {dims[2]}, .c = {dims[3]}}};\n"
                f"    if ({fn}(&dims, {inp}, {out}) != 0) {{\n"
                f"        return {index}; /* step {index} failed */\n"
                "    }\n}")


def reshape_copy_plan(in_shape, out_shape) -> tuple[str, tuple[int, int, int, int]] | None:
    """The layout copy of a reshape that moves bytes: ``(kernel, NHWC dims)`` when one side is a 4-D
    channels-last tensor and the other is stored in logical order; None when both sides are
    channels-last (no layout copy does that: the lowering makes it a strided copy)."""
    in_nhwc = len(in_shape) == 4 and not _storage_is_logical(in_shape)
    out_nhwc = len(out_shape) == 4 and not _storage_is_logical(out_shape)
    if in_nhwc and not out_nhwc:
        return "corten_nhwc_to_nchw_s8", tuple(nhwc(in_shape))
    if out_nhwc and not in_nhwc:
        return "corten_nchw_to_nhwc_s8", tuple(nhwc(out_shape))
    return None


def emittable_reshape(node: torch.fx.Node) -> bool:
    """Whether a lowered ``aten.reshape`` node can be emitted: a view of its input's bytes, or one
    layout copy (:func:`reshape_copy_plan`)."""
    shape = lambda n: [int(d) for d in n.meta["val"].shape]  # noqa: E731
    return _reshape_is_alias(node) or reshape_copy_plan(shape(node.args[0]), shape(node)) is not None


def _reshape_is_alias(node: torch.fx.Node) -> bool:
    from corten.memory.views import reshape_is_alias

    return reshape_is_alias(node)


def _alias_offset(node: torch.fx.Node) -> int | None:
    from corten.memory.views import alias_offset

    return alias_offset(node)


def _edge_bytes(q_or_dq) -> int:
    """Element bytes of the int tensor at a program edge (its quantize/dequantize's ``bits``)."""
    if q_or_dq is None:
        return 1
    bits = q_or_dq.args[3] if len(q_or_dq.args) > 3 else q_or_dq.kwargs.get("bits", 8)
    return int(bits) // 8


def _output_bytes(out) -> int:
    """Element bytes of a program output: int32 indices 4, truth values 1, else its dequantize's width."""
    if is_index_output(out):
        return 1 if _is_bool(out) else 4
    return _edge_bytes(out)


def _storage_is_logical(shape) -> bool:
    from corten.memory.views import storage_is_logical

    return storage_is_logical(shape)


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().cpu().numpy().tobytes()


# ----------------------------------------------------------------------------- file writers
def _is_byte_string(arr: _Array) -> bool:
    return arr.ctype == "int8_t" and arr.nbytes >= BYTE_STRING_MIN_BYTES


def _byte_string_lines(data: torch.Tensor) -> list[str]:
    """The bytes of an int8 array as adjacent string literals, 16 bytes per line (C gives the array
    exactly its declared length of them: no terminating NUL is stored)."""
    escapes = _BYTE_ESCAPES[data.reshape(-1).numpy().view(np.uint8)]
    return ['    "' + "".join(escapes[i:i + 16].tolist()) + '"' for i in range(0, len(escapes), 16)]


def _format_array(arr: _Array) -> str:
    shape = "x".join(str(d) for d in arr.tensor.shape) or "scalar"
    kind = (f"int{arr.bits}, packed {8 // arr.bits} per {arr.ctype}: element 2k in the low nibble of byte k, "
            "2k+1 in the high one (CMSIS-NN's s4 layout)") if arr.bits else arr.ctype
    section = f" CORTEN_SECTION(\"{arr.section}\")" if arr.section else ""
    head = f"const {arr.ctype} {arr.cname}[{arr.length}] CORTEN_CONST_ALIGNED{section}"
    if _is_byte_string(arr):
        return (f"/* {shape} {kind}; its bytes as a string */\n{head} CORTEN_BYTES =\n"
                + "\n".join(_byte_string_lines(arr.data)) + ";\n")
    values = arr.data.reshape(-1).numpy().astype(np.int64)
    per_line = 16 if arr.ctype == "int8_t" else 8
    lines = ["    " + ", ".join(c_int(v) for v in values[i:i + per_line].tolist()) + ","
             for i in range(0, len(values), per_line)]
    return f"/* {shape} {kind} */\n{head} = {{\n" + ("\n".join(lines) if lines else "    0,") + "\n};\n"


def _float_literal(v: float) -> str:
    """A float literal denoting exactly the float32 value of ``v`` (the value Python computes with:
    ``torch.tensor(scale, dtype=torch.float32)``), not a double rounded twice."""
    text = str(np.float32(v))
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    return text + "f"


def _dim_macros(p: str, shape: tuple[int, ...]) -> list[str]:
    """One macro per dimension: ``_DIM_N/_H/_W/_C`` (memory order NHWC) for 4-D tensors, else
    ``_DIM0``... (row-major)."""
    if len(shape) == 4:
        n, h, w, c = nhwc(shape)
        return [f"#define {p}_RANK 4 /* memory order NHWC */", f"#define {p}_DIM_N {n}", f"#define {p}_DIM_H {h}",
                f"#define {p}_DIM_W {w}", f"#define {p}_DIM_C {c}"]
    return [f"#define {p}_RANK {len(shape)} /* row-major */"] + [f"#define {p}_DIM{i} {d}" for i, d in enumerate(shape)]


def _input_tensor(g: _Generator, ph, q, offset: int) -> IOTensor:
    """A program input at the C boundary (an input the program never reads keeps its bytes in the
    buffer, with scale 1 and zero point 0)."""
    from corten.memory.views import input_layout_reshape

    scale, zero_point = (float(q.args[1]), int(q.args[2])) if q is not None else (1.0, 0)
    first = input_layout_reshape(q) if q is not None else None
    if first is None:
        return IOTensor(tuple(g._shape(ph)), scale, zero_point, offset, _edge_bytes(q))
    return IOTensor(tuple(g._shape(first)), scale, zero_point, offset, _edge_bytes(q),
                    source_shape=tuple(g._shape(ph)))


def _io_block(p: str, t: IOTensor, what: str, offset: bool) -> str:
    if t.source_shape is not None:
        shape = ", ".join(map(str, t.shape))
        what += (f": the forward's {list(t.source_shape)} argument as its first layer reads it, i.e. "
                 f"x.reshape({shape}) in NHWC order (no layout copy runs)")
    lines = [f"/* {what} */", *([f"#define {p}_BYTES {t.nbytes}"] if offset else []), *_dim_macros(p, t.shape),
             f"#define {p}_SCALE {_float_literal(t.scale)}", f"#define {p}_ZERO_POINT {t.zero_point}"]
    if t.int32:  # argmax/argmin: int32 indices, no quantization (scale 1, zero point 0)
        lines.insert(1, f"#define {p}_INT32 1 /* int32_t indices, {int(np.prod(t.shape))} values */")
    if t.boolean:  # a comparison result: one byte per element, 0 (false) or 1 (true), no quantization
        lines.insert(1, f"#define {p}_BOOL 1 /* uint8_t truth values (0 or 1), {int(np.prod(t.shape))} values */")
    if offset:
        lines.insert(1, f"#define {p}_OFFSET {t.offset} /* in the packed buffer of {{name}}_run */")
    return "\n".join(lines)


def _io_names(g: _Generator) -> tuple[list[str], list[str]]:
    """C field names of the inputs (the forward's argument names) and outputs (output0, ..., or the
    names the program gives them: dict keys and NamedTuple fields, see ``context.output_field_names``)."""
    quants, deqs = g.io_nodes()
    names, used = [], set()
    for ph in g.user_inputs:  # (an input the program never reads has no quantize node)
        base = c_identifier(str(ph.name))
        name, k = base, 2
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        names.append(name)
    outs = list(g.output_names) or [f"output{i}" for i in range(len(deqs))]
    if len(outs) != len(deqs) or len(set(outs)) != len(outs) or any(c_identifier(o) != o for o in outs):
        raise CodegenError(f"output_names {outs} must be {len(deqs)} distinct C identifiers (one per program output)")
    return names, outs


QUANT_HELPERS = r"""
/**
 * float -> int8 exactly as the Python program computes it (corten.quantize_per_tensor, TFLite's
 * AffineQuantize): q = clamp(round_half_away_from_zero(x / scale) + zero_point, -128, 127), the
 * division in float32.  NaN gives 127.  No libm needed.
 */
static inline int8_t {n}_quantize(float x, float scale, int32_t zero_point)
{{
    const float v = x / scale;
    const float a = v < 0.0f ? -v : v;
    int32_t r = 1024; /* saturates whatever the zero point */
    if (a < 1024.0f) {{
        r = (int32_t)a; /* floor, a >= 0 */
        if (a - (float)r >= 0.5f) {{ /* exact: a and r are within 2**10 */
            r += 1;
        }}
    }}
    r = (v < 0.0f ? -r : r) + zero_point;
    return (int8_t)(r < -128 ? -128 : (r > 127 ? 127 : r));
}}

/** int8 -> float exactly as corten.dequantize_per_tensor: (q - zero_point) * scale in float32. */
static inline float {n}_dequantize(int8_t q, float scale, int32_t zero_point)
{{
    return (float)((int32_t)q - zero_point) * scale;
}}
"""

QUANT16_HELPERS = r"""
/**
 * float -> int16 (TFLite's 16x8 edges: symmetric, zero point 0) exactly as corten.quantize_per_tensor
 * with bits=16: q = clamp(round_half_away_from_zero(x / scale), -32768, 32767).
 */
static inline int16_t {n}_quantize16(float x, float scale)
{{
    const float v = x / scale;
    const float a = v < 0.0f ? -v : v;
    int32_t r = 65536; /* saturates */
    if (a < 65536.0f) {{
        r = (int32_t)a; /* floor, a >= 0 */
        if (a - (float)r >= 0.5f) {{ /* exact: a and r are within 2**16 */
            r += 1;
        }}
    }}
    r = v < 0.0f ? -r : r;
    return (int16_t)(r < -32768 ? -32768 : (r > 32767 ? 32767 : r));
}}

/** int16 -> float exactly as corten.dequantize_per_tensor: q * scale in float32. */
static inline float {n}_dequantize16(int16_t q, float scale)
{{
    return (float)q * scale;
}}
"""


def _quant_helper(n: str, m: str, what: str, suffix: str, t: "IOTensor") -> str:
    """``<n>_quantize_input<suffix>`` / ``<n>_dequantize_output<suffix>`` of one edge (int8 or int16)."""
    p = f"{m}_{what.upper()}{suffix}"
    if what == "input":
        if t.bits == 16:
            return (f"static inline int16_t {n}_quantize_input{suffix}(float x)\n{{\n"
                    f"    return {n}_quantize16(x, {p}_SCALE);\n}}")
        return (f"static inline int8_t {n}_quantize_input{suffix}(float x)\n{{\n"
                f"    return {n}_quantize(x, {p}_SCALE, {p}_ZERO_POINT);\n}}")
    if t.bits == 16:
        return (f"static inline float {n}_dequantize_output{suffix}(int16_t q)\n{{\n"
                f"    return {n}_dequantize16(q, {p}_SCALE);\n}}")
    return (f"static inline float {n}_dequantize_output{suffix}(int8_t q)\n{{\n"
            f"    return {n}_dequantize(q, {p}_SCALE, {p}_ZERO_POINT);\n}}")



def _scale_helper(n: str, m: str, suffix: str, scales, offsets) -> str:
    """``<n>_scale_input<suffix>(x, feature)``: the per-feature map ``x / s + o`` (float32, in this
    order, as Program.run computes it) whose result ``<n>_quantize_input<suffix>`` quantizes."""
    lits = lambda v: ", ".join(_float_literal(float(x)) for x in v)  # noqa: E731
    return (f"/* Input{suffix and ' ' + suffix} is scaled per feature (the last dim, {len(scales)} features): quantize\n"
            f" * {n}_scale_input{suffix}(x, feature) of each value, not x itself. */\n"
            f"#define {m}_INPUT{suffix}_FEATURES {len(scales)}\n"
            f"static inline float {n}_scale_input{suffix}(float x, int32_t feature)\n{{\n"
            f"    static const float scale[{len(scales)}] = {{{lits(scales)}}};\n"
            f"    static const float offset[{len(offsets)}] = {{{lits(offsets)}}};\n"
            f"    return x / scale[feature] + offset[feature];\n}}")


def _header(g: _Generator, lib: dict, n_steps: int) -> str:
    m, n = g.macro, g.name
    ins, outs = lib["inputs"], lib["outputs"]
    multi = len(ins) > 1 or len(outs) > 1
    in_names, out_names = _io_names(g)
    named = out_names[0] != "output0" and not multi  # (one output returned in a dict / NamedTuple)
    blocks = [_io_block(f"{m}_INPUT", ins[0], f"Input{' 0 (' + in_names[0] + ')' if multi else ''}", False),
              _io_block(f"{m}_OUTPUT", outs[0], f"Output{' 0' if multi else ''}{f' ({out_names[0]})' if named else ''}",
                        False)]
    helpers = [_quant_helper(n, m, "input", "", ins[0])] + ([] if not outs[0].quantized else
                                                            [_quant_helper(n, m, "output", "", outs[0])])
    if multi:
        blocks.append(f"/* Several inputs/outputs: {n}_run_io takes one pointer each ({n}_inputs / {n}_outputs);\n"
                      f" * {n}_run takes them packed one after another at their _OFFSET. */\n"
                      f"#define {m}_NUM_INPUTS {len(ins)}\n#define {m}_NUM_OUTPUTS {len(outs)}")
        for kind, tensors, names in (("INPUT", ins, in_names), ("OUTPUT", outs, out_names)):
            for i, t in enumerate(tensors):
                blocks.append(_io_block(f"{m}_{kind}{i}", t, f"{kind.title()} {i} ({names[i]})", True).replace("{name}", n))
                if t.quantized:  # (indices and truth values need no dequantize helper)
                    helpers.append(_quant_helper(n, m, kind.lower(), str(i), t))
    # typed I/O structs for every model (a single-tensor one too): one named pointer per input / output
    in_fields = "\n".join(f"    const {t.ctype} *{nm}; /* {m}_INPUT{i if multi else ''}_BYTES bytes */"
                          for i, (nm, t) in enumerate(zip(in_names, ins)))
    out_fields = "\n".join(f"    {t.ctype} *{nm}; /* {m}_OUTPUT{i if multi else ''}_BYTES bytes */"
                           for i, (nm, t) in enumerate(zip(out_names, outs)))
    io_api = f"""
/** One pointer per program input / output (no packing needed). */
typedef struct {{
{in_fields}
}} {n}_inputs;

typedef struct {{
{out_fields}
}} {n}_outputs;

/**
 * Run the model on named inputs/outputs with an arena of arena_bytes bytes (refused with
 * {m}_ERROR_ARENA_TOO_SMALL below {m}_ARENA_BYTES).  Returns as {n}_run.
 */
int {n}_run_io(const {n}_inputs *inputs, const {n}_outputs *outputs, uint8_t *arena, size_t arena_bytes);
"""
    for i, (scales, offsets) in sorted(lib["input_scaling"].items()):
        helpers.append(_scale_helper(n, m, str(i) if multi else "", scales, offsets))
    body = "\n\n".join(blocks)
    wide = any(t.bits == 16 for t in (*ins, *outs))
    helper_text = (QUANT_HELPERS.format(n=n) + (QUANT16_HELPERS.format(n=n) if wide else "") + "\n"
                   + "\n\n".join(helpers))
    return f"""/*
 * {n}.h - int8 model library generated by Corten (kernels: {g.kernels}, target: {g.target.name}).
 *
 * Usage: quantize the float input with {n}_quantize_input() (or {m}_INPUT_SCALE /
 * {m}_INPUT_ZERO_POINT), lay it out as the _DIM macros say (NHWC for 4-D tensors), call
 * {n}_run_checked() with an arena of {m}_ARENA_BYTES bytes aligned to {m}_ARENA_ALIGN, then
 * dequantize the output with {n}_dequantize_output().
 * The library uses no heap, no floating point and no mutable global state: it is reentrant as
 * long as each concurrent call has its own arena.  Every symbol starts with {n}_ (or {m}_);
 * the portable kernels it calls are the shared corten_kernels/ library.
 *
 * Generated file: do not edit.
 */
#ifndef {m}_H
#define {m}_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif

#define {m}_PROGRAM_HASH "{lib['program_hash']}"

#define {m}_INPUT_BYTES {lib['input_bytes']}   /* all inputs, packed */
#define {m}_OUTPUT_BYTES {lib['output_bytes']}  /* all outputs, packed */
#define {m}_ARENA_BYTES {lib['arena_bytes']}
#define {m}_ARENA_ALIGN {lib['arena_align']}
#define {m}_CONSTANT_BYTES {lib['constant_bytes']}
#define {m}_NUM_STEPS {n_steps}
{_region_header(g)}
{body}

/*
 * Status of {n}_run*: 0 on success; negative for a bad call; a positive value k is the number of
 * the step whose kernel rejected its arguments (1..{m}_NUM_STEPS, "Step k" in {n}.c: module path,
 * op and source line), which means a generator bug: report it.
 */
#define {m}_OK 0
#define {m}_ERROR_NULL_POINTER (-1)     /* input, output or arena is NULL */
#define {m}_ERROR_ARENA_ALIGNMENT (-2)  /* arena is not aligned to {m}_ARENA_ALIGN bytes */
#define {m}_ERROR_ARENA_TOO_SMALL (-4)  /* arena_bytes < {m}_ARENA_BYTES */

/**
 * Run the model: input holds {m}_INPUT_BYTES bytes (int8 values; int16 ones for 16x8 edges), output receives {m}_OUTPUT_BYTES,
 * arena is {m}_ARENA_BYTES bytes of working memory aligned to {m}_ARENA_ALIGN (not checked:
 * prefer {n}_run_checked).  Returns {m}_OK, an {m}_ERROR_* code or a failed step's number.
 */
int {n}_run(const int8_t *input, int8_t *output, uint8_t *arena);

/** {n}_run, refusing an arena shorter than {m}_ARENA_BYTES ({m}_ERROR_ARENA_TOO_SMALL). */
int {n}_run_checked(const int8_t *input, int8_t *output, uint8_t *arena, size_t arena_bytes);
{io_api}
#ifdef CORTEN_PROFILE
/**
 * Profile build (compile {n}.c with -DCORTEN_PROFILE): {n}_run calls this function, which the
 * application defines, with step = 0 before the first step and step = k (1..{m}_NUM_STEPS) after
 * step k; reading a cycle counter there gives the cost of every step (corten profile does so).
 */
void {n}_profile_step(int step);
#endif
{helper_text}

#ifdef __cplusplus
}}
#endif

#endif /* {m}_H */
"""


def _source(g: _Generator, statements: list[str], lib: dict) -> str:
    m, n = g.macro, g.name
    arena_bytes = lib["arena_bytes"]
    ins, outs = lib["inputs"], lib["outputs"]
    includes = [f'#include "{n}.h"', f'#include "{n}_constants.h"']
    for p in g.providers:
        if p.name != FALLBACK and g.uses(p):
            includes.extend(p.includes(n))
    if g.uses(next(p for p in g.providers if p.name == FALLBACK)):
        includes.append(f'#include "{KERNELS_SUBDIR}/corten_kernels.h"')
        includes.append(f'#include "{KERNELS_SUBDIR}/{KERNELS_VERSION_HEADER}"\n'
                        f"#if CORTEN_KERNELS_VERSION != 0x{kernels_version()}UL\n"
                        f'#error "{KERNELS_SUBDIR}/ comes from another Corten version than {n}.c: emit the '
                        'models with one Corten version and link one copy of its kernels"\n#endif')
    # profile builds (-DCORTEN_PROFILE) call <name>_profile_step(k) when step k is done (0: start)
    body = "\n\n".join([f"{m}_PROFILE_STEP(0);"] + [f"{s}\n{m}_PROFILE_STEP({k});"
                                                     for k, s in enumerate(statements, start=1)])
    body = "\n".join(("    " + line) if line else line for line in body.split("\n"))
    params = ", ".join([f"const int8_t *in{i}" for i in range(len(ins))] + [f"int8_t *out{i}" for i in range(len(outs))]
                       + ["int8_t *act"])
    used = [(name, ptr) for name, ptr in g.arena_pointers.items() if re.search(rf"\b{name}\b", body)]
    pointers = "".join(f"    int8_t *const {name} = {_base_plus(base, off)}; /* {nbytes} B, node '{node}' */\n"
                       for name, (off, nbytes, node, base) in used)
    steps_fn = (f"/* The model's steps; in<i>/out<i> point at each program input/output, act at the arena:\n"
                f" * one named pointer per arena tensor (act_<module path>) and scratch buffer (scratch_<...>). */\n"
                f"static int {n}_steps({params})\n{{\n"
                + pointers + ("\n" if pointers else "")
                # e.g. a model without arena tensors, or with its arenas in memory regions
                + ("" if any(base == "act" for _, (_, _, _, base) in used) else "    (void)act;\n")
                + "".join(f"    (void)in{i}; /* an input the model never reads */\n" for i, t in enumerate(ins)
                          if not re.search(rf"\bin{i}\b", body))
                + body + ("\n\n" if body else "") + f"    return {m}_OK;\n}}\n")
    checks = [f"input == NULL || output == NULL" + (" || arena == NULL" if arena_bytes > 0 else "")]
    align = (f"    if (arena != NULL && ((uintptr_t)arena % (uintptr_t){m}_ARENA_ALIGN) != 0u) {{\n"
             f"        return {m}_ERROR_ARENA_ALIGNMENT;\n    }}\n")
    call_args = ", ".join([f"input + {t.offset}" if t.offset else "input" for t in ins]
                          + [f"output + {t.offset}" if t.offset else "output" for t in outs] + ["(int8_t *)arena"])
    run = (f"int {n}_run(const int8_t *input, int8_t *output, uint8_t *arena)\n{{\n"
           f"    if ({checks[0]}) {{\n        return {m}_ERROR_NULL_POINTER;\n    }}\n" + align +
           f"    return {n}_steps({call_args});\n}}\n")
    size_check = (f"    if (arena_bytes < (size_t){m}_ARENA_BYTES) {{\n        return {m}_ERROR_ARENA_TOO_SMALL;\n    }}\n"
                  if arena_bytes > 0 else "    (void)arena_bytes; /* this model needs no caller arena */\n")
    checked = (f"int {n}_run_checked(const int8_t *input, int8_t *output, uint8_t *arena, size_t arena_bytes)\n{{\n"
               + size_check + f"    return {n}_run(input, output, arena);\n}}\n")
    # every model has <name>_run_io (typed <name>_inputs / <name>_outputs)
    in_names, out_names = _io_names(g)
    nulls = " || ".join(["inputs == NULL", "outputs == NULL"] + [f"inputs->{x} == NULL" for x in in_names]
                        + [f"outputs->{x} == NULL" for x in out_names]
                        + (["arena == NULL"] if arena_bytes > 0 else []))
    args = ", ".join([f"inputs->{x}" if t.bits == 8 else f"(const int8_t *)(const void *)inputs->{x}"
                      for x, t in zip(in_names, ins)]
                     + [f"outputs->{x}" if t.bits == 8 and not t.boolean else f"(int8_t *)(void *)outputs->{x}"
                        for x, t in zip(out_names, outs)] + ["(int8_t *)arena"])
    io = (f"\nint {n}_run_io(const {n}_inputs *inputs, const {n}_outputs *outputs, uint8_t *arena, size_t arena_bytes)\n{{\n"
          f"    if ({nulls}) {{\n        return {m}_ERROR_NULL_POINTER;\n    }}\n"
          + size_check + align + f"    return {n}_steps({args});\n}}\n")
    return (f"/*\n * {n}.c - generated by Corten (kernels: {g.kernels}, target: {g.target.name}).\n"
            f" * The fixed sequence of kernel calls of the model: one numbered step per kernel call (the\n"
            f" * number {n}_run returns if that call fails), with the PyTorch module path, op and source\n"
            f" * line it comes from.  Generated file: do not edit.\n */\n"
            "#include <stddef.h>\n#include <stdint.h>\n\n" + "\n".join(includes) + "\n\n"
            + _PROFILE_MACRO.format(m=m, n=n) + _region_arenas(g) + steps_fn + "\n" + run + "\n" + checked + io)


def region_arena_symbol(name: str, region: str) -> str:
    """The C array of a memory region's arena: ``<name>_arena_<region>``."""
    return f"{name}_arena_{region}"


def _base_plus(base: str, offset: int) -> str:
    if base == "act":
        return f"act + {offset}" if offset else "act"
    return f"(int8_t *){base} + {offset}" if offset else f"(int8_t *){base}"


def _planned_regions(plan: Any) -> list:
    return [r for r in getattr(plan, "regions", ()) or () if r.nbytes > 0]


def _region_arenas(g: _Generator) -> str:
    """The arrays of the memory regions' arenas (the library owns them), each in its section."""
    regions = _planned_regions(g.plan)
    if not regions:
        return ""
    m, align = g.macro, int(getattr(g.plan, "alignment", 16) or 16)
    lines = ["/* The arenas of the memory regions (fastest first), each in its linker section; the",
             f" * fragment {g.name}_sections.ld places the sections in the board's memories. */",
             "#if defined(__GNUC__) || defined(__clang__)",
             f"#define {m}_IN_SECTION(s) __attribute__((section(s), aligned({align})))", "#else",
             f"#define {m}_IN_SECTION(s)", "#endif"]
    for r in regions:
        lines.append(f"uint8_t {region_arena_symbol(g.name, r.name)}[{m}_ARENA_{r.name.upper()}_BYTES] "
                     f"{m}_IN_SECTION({m}_ARENA_{r.name.upper()}_SECTION);")
    return "\n".join(lines) + "\n\n"


def _region_header(g: _Generator) -> str:
    regions = _planned_regions(g.plan)
    if not regions:
        return ""
    m = g.macro
    lines = [f"/* Memory regions: the library owns one arena per region (below), so {m}_ARENA_BYTES is 0",
             " * and the arena argument of the run functions is unused (pass NULL); one inference at a time.",
             f" * Override a region's section with -D{m}_ARENA_<REGION>_SECTION=... */",
             f"#define {m}_NUM_REGIONS {len(regions)}"]
    for r in regions:
        u = r.name.upper()
        cap = f"{r.capacity:,} B" if r.capacity is not None else "no limit"
        lines += [f"#define {m}_ARENA_{u}_BYTES {r.nbytes} /* region {r.name} ({cap}), speed rank {r.rank} */",
                  f"#ifndef {m}_ARENA_{u}_SECTION", f'#define {m}_ARENA_{u}_SECTION "{r.section}"', "#endif",
                  f"extern uint8_t {region_arena_symbol(g.name, r.name)}[{m}_ARENA_{u}_BYTES];"]
    return "\n".join(lines) + "\n"


def linker_fragment(g: _Generator) -> str | None:
    """``<name>_sections.ld``: a GCC linker-script fragment placing the regions' arena sections and
    the weights' sections in MEMORY regions (INCLUDE it inside SECTIONS, before .data and .bss)."""
    regions = _planned_regions(g.plan)
    weights = sorted({a.section for a in g.arrays.values() if a.section})
    if not regions and not weights:
        return None
    align = int(getattr(g.plan, "alignment", 16) or 16)
    memories = sorted({r.memory for r in regions} | {memory_region_of_section(s) for s in weights})
    lines = [f"/* {g.name}_sections.ld - generated by Corten: where the memory regions' arenas and the weights of",
             f" * {g.name} go.  INCLUDE it inside the SECTIONS {{ }} of your GCC linker script, before the",
             " * .data and .bss output sections (so these rules match first), and name your MEMORY regions",
             f" * (or REGION_ALIAS them): {', '.join(memories)}. */"]
    for r in regions:
        lines.append(f"{r.section} (NOLOAD) : ALIGN({align}) {{ *({r.section}) }} > {r.memory}"
                     f"  /* arena of region {r.name}: {r.nbytes} B */")
    for sec in weights:
        nbytes = sum(a.nbytes for a in g.arrays.values() if a.section == sec)
        lines.append(f"{sec} : ALIGN({CONST_ALIGN}) {{ KEEP(*({sec})) }} > {memory_region_of_section(sec)}"
                     f"  /* weights: {nbytes} B */")
    return "\n".join(lines) + "\n"


def memory_region_of_section(section: str) -> str:
    """The MEMORY region a weights section goes to in the fragment: its name without the leading
    dot, upper case (``.ext_flash`` -> ``EXT_FLASH``)."""
    return re.sub(r"[^0-9A-Za-z_]", "_", section.lstrip(".")).upper()


_PROFILE_MACRO = """\
#ifdef CORTEN_PROFILE
/* Profile build: {n}_profile_step(k) (defined by the application, see {n}.h) runs after step k. */
#define {m}_PROFILE_STEP(k) {n}_profile_step(k)
#else
#define {m}_PROFILE_STEP(k) ((void)0)
#endif

"""


def _constants_header(g: _Generator) -> str:
    guard = f"{g.macro}_CONSTANTS_H"
    decls = "\n".join(f"extern const {a.ctype} {a.cname}[{a.length}];" for a in g.arrays.values())
    return (f"/* {g.name}_constants.h - constant arrays of {g.name} (internal; generated by Corten). */\n"
            f"#ifndef {guard}\n#define {guard}\n\n#include <stdint.h>\n\n{decls}\n\n#endif /* {guard} */\n")


def _constants_source(g: _Generator) -> str:
    arrays = "\n".join(_format_array(a) for a in g.arrays.values())
    sections = any(a.section for a in g.arrays.values())
    strings = any(_is_byte_string(a) for a in g.arrays.values())
    return (f"/* {g.name}_constants.c - weights, biases, multipliers, shifts and kernel sums of {g.name}.\n"
            " * Generated by Corten: do not edit. */\n"
            f'#include "{g.name}_constants.h"\n\n'
            "#if defined(__GNUC__) || defined(__clang__)\n"
            f"#define CORTEN_CONST_ALIGNED __attribute__((aligned({CONST_ALIGN})))\n"
            + ("#define CORTEN_SECTION(s) __attribute__((section(s)))\n" if sections else "")
            + "#else\n#define CORTEN_CONST_ALIGNED\n"
            + ("#define CORTEN_SECTION(s)\n" if sections else "") + "#endif\n"
            + (_BYTE_STRING_PRELUDE if strings else "") + "\n" + arrays)


# what the byte-string arrays need: their strings are longer than the 4095 characters C99 guarantees
# (gcc, clang and armclang take any length; -Wpedantic warns about it), and `nonstring` tells gcc 15's
# -Wunterminated-string-initialization that the arrays hold bytes, not NUL-terminated text
_BYTE_STRING_PRELUDE = (
    f"\n/* the arrays of {BYTE_STRING_MIN_BYTES} bytes or more are written as strings of their bytes (faster to compile) */\n"
    "#if defined(__GNUC__) || defined(__clang__)\n"
    "#pragma GCC diagnostic ignored \"-Woverlength-strings\"\n"
    "#endif\n"
    "#if defined(__has_attribute)\n#if __has_attribute(nonstring)\n"
    "#define CORTEN_BYTES __attribute__((nonstring))\n#endif\n#endif\n"
    "#ifndef CORTEN_BYTES\n#define CORTEN_BYTES\n#endif\n")


# ----------------------------------------------------------------------------- public entry point
def emit_c(ep: torch.export.ExportedProgram, plan: Any, out_dir: str | Path, name: str, deployment: Any,
           kernels: Any = None, node_sources: dict | None = None,
           output_names: Sequence[str] = (), input_scaling: dict | None = None) -> EmittedLibrary:
    """Write the C library of the lowered program ``ep`` planned by ``plan`` into ``out_dir``.

    ``name`` becomes the file names and the ``<name>_run`` symbol (a C identifier); ``deployment``
    (:class:`corten.deployment.Deployment`) gives the core and the kernel providers tried in order
    for each node - or, as a convenience, a :class:`corten.targets.Target` (or its name) with
    ``kernels`` (:func:`corten.providers.resolve_providers`): ``"portable"`` (the default: Corten's
    C99 kernels, copied next to the model), ``"cmsis-nn"`` (calls into a CMSIS-NN tree found at
    build time through ``CMSIS_NN_PATH``; portable kernels for what it does not run), another
    registered provider's name, or a sequence of providers.  ``node_sources`` (``Program.info["node_sources"]``)
    gives each node's PyTorch module path and source line: constant names and step comments use
    them.  ``output_names`` (``Program.output_names``): the C names of the outputs (fields of
    ``<name>_outputs``), by default ``output0``, ``output1``, ...  ``input_scaling``
    (``Program.input_scaling``: input index -> per-feature ``(s, o)``): the header's
    ``<name>_scale_input<i>(x, feature)`` helpers.  Output is deterministic byte for byte.
    """
    deployment = _deployment(deployment, kernels)
    target, providers = deployment.target, deployment.providers
    problem = library_name_problem(name)
    if problem is not None:
        raise CodegenError(problem)
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir):
        raise CodegenError(f"out_dir must be a directory path, got {out_dir!r}")
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CodegenError(f"{out_dir}: cannot write the C library there ({e.strerror or e}); "
                           "choose a writable directory") from None

    g = _Generator(ep, plan, name, target, providers, node_sources=dict(node_sources or {}),
                   output_names=tuple(output_names or ()), weights_sections=deployment.weights_sections)
    quants, dequants = g.io_nodes()
    quant, dequant = next(q for q in quants if q is not None), dequants[0]
    statements, op_lines = g.statements()
    if not statements:
        raise CodegenError("the program has no operator between its quantize and dequantize; nothing to emit")

    hasher = hashlib.sha256()
    for line in op_lines:
        hasher.update(line.encode() + b"\n")
    for key, arr in g.arrays.items():
        hasher.update(f"{key} {arr.ctype} {tuple(arr.tensor.shape)}{f' int{arr.bits}' if arr.bits else ''}\n".encode())
        hasher.update(_bytes(arr.data))
    out_node = output_tensor(dequant)
    out_shape = tuple(g._shape(out_node))
    in_offs, out_offs = g.io_offsets()
    # an input the program never reads keeps its bytes in the buffer, with scale 1 and zero point 0
    inputs = tuple(_input_tensor(g, ph, q, off) for ph, q, off in zip(g.user_inputs, quants, in_offs))
    outputs = tuple(IOTensor(tuple(g._shape(output_tensor(d))), *output_qparams(d), off,
                             _output_bytes(d), boolean=_is_bool(d))
                    for d, off in zip(dequants, out_offs))
    lib = dict(
        input_shape=inputs[0].shape, input_scale=inputs[0].scale, input_zero_point=inputs[0].zero_point,
        output_shape=out_shape, output_scale=output_qparams(dequant)[0], output_zero_point=output_qparams(dequant)[1],
        input_bytes=max(t.offset + t.nbytes for t in inputs), output_bytes=max(t.offset + t.nbytes for t in outputs),
        inputs=inputs, outputs=outputs,
        arena_bytes=0 if getattr(plan, "regions", None) else int(plan.arena_bytes),
        arena_align=int(getattr(plan, "alignment", 16) or 16),
        constant_bytes=sum(a.nbytes for a in g.arrays.values()),
        program_hash=hasher.hexdigest()[:HASH_CHARS],
        input_scaling=dict(input_scaling or {}),
    )

    files: dict[str, str] = {
        f"{name}.h": _header(g, lib, len(statements)),
        f"{name}.c": _source(g, statements, lib),
        f"{name}_constants.h": _constants_header(g),
        f"{name}_constants.c": _constants_source(g),
    }
    fragment = linker_fragment(g)
    if fragment is not None:
        files[f"{name}_sections.ld"] = fragment
    kernel_names: list[str] = []
    if g.uses(next(p for p in providers if p.name == FALLBACK)):
        kernel_names += list(KERNEL_HEADERS)
    kernel_names += [f"{fam}.c" for fam in sorted(g.portable_families)]
    if g.uses_layout:
        kernel_names.append("layout.c")
    for kname in kernel_names:
        if not (KERNELS_DIR / kname).exists():
            raise CodegenError(f"no portable kernel file {kname} in {KERNELS_DIR} (op family without C kernels)")
    model_sources = [f"{name}.c", f"{name}_constants.c"]
    extra: list[str] = []
    for p in providers:  # a provider's own C files (e.g. generated kernels), compiled with the model
        for fname, text in p.sources(name, tuple(g.emitted.get(p.name, ()))).items():
            if fname in files or not fname.startswith(f"{name}_"):
                raise CodegenError(f"provider {p.name!r}: source file {fname!r} must be new and start with {name}_")
            files[fname] = text
            if fname.endswith(".c"):
                extra.append(fname)
    model_sources += extra
    cmsis = any(p.links_cmsis_nn for p in providers)
    files[f"{name}.mk"] = build_files.model_makefile(name, model_sources, g.kernels, target, cmsis)
    files[f"{name}.cmake"] = build_files.model_cmake(name, model_sources, g.kernels, target, cmsis)
    files["Makefile"] = build_files.makefile()
    files["CMakeLists.txt"] = build_files.cmakelists()
    for rel, text in kernel_library_files().items():
        files[f"{KERNELS_SUBDIR}/{rel}"] = text
    for fname, text in files.items():  # never overwrite a file of the user's (their own Makefile, ...)
        path = out_dir / fname
        try:
            old = path.read_text(errors="replace")[:400] if path.is_file() else None
        except OSError:
            old = None
        if old is not None and "Corten" not in old and not text.startswith(old):
            raise CodegenError(f"{path}: exists and was not written by Corten; emit the C library into a "
                               f"directory of its own (e.g. {out_dir / 'corten_model'}) or move that file away")
    for fname, text in files.items():
        path = out_dir / fname
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
        except (OSError, UnicodeDecodeError) as e:
            raise CodegenError(f"{path}: cannot write it ({getattr(e, 'strerror', None) or e}); "
                               "choose a writable directory of your own for the C library") from None

    kdir = out_dir / KERNELS_SUBDIR
    return EmittedLibrary(
        name=name, out_dir=out_dir, header=out_dir / f"{name}.h", source=out_dir / f"{name}.c",
        constants=out_dir / f"{name}_constants.c", constants_header=out_dir / f"{name}_constants.h",
        kernel_files=tuple(kdir / k for k in kernel_names),
        cmake=out_dir / f"{name}.cmake", makefile=out_dir / "Makefile", kernels=g.kernels,
        steps=tuple(g.step_info), providers=tuple(p.name for p in providers),
        extra_sources=tuple(out_dir / f for f in extra), regions=tuple(_planned_regions(plan)),
        linker_fragment=out_dir / f"{name}_sections.ld" if fragment is not None else None,
        **{k: v for k, v in lib.items() if k != "input_scaling"})


def _deployment(deployment: Any, kernels: Any) -> Deployment:
    try:
        return Deployment.coerce(deployment, kernels, default_kernels="portable")
    except UsageError as e:
        raise CodegenError(str(e)) from None


def kernel_steps(ep: torch.export.ExportedProgram, plan: Any, name: str, deployment: Any, kernels: Any = None,
                 node_sources: dict | None = None) -> tuple[StepInfo, ...]:
    """The steps :func:`emit_c` would write for ``deployment`` (module, op, provider, kernel calls,
    MACs, and for a step the leading provider does not run the reason), without writing anything:
    the same providers choose and emit the kernels.  A target (name) with ``kernels`` (default
    "cmsis-nn") may stand for the deployment."""
    if not isinstance(deployment, Deployment) and kernels is None:
        kernels = "cmsis-nn"
    d = _deployment(deployment, kernels)
    g = _Generator(ep, plan, name, d.target, d.providers, node_sources=dict(node_sources or {}))
    g.io_nodes()
    g.statements()
    return tuple(g.step_info)


def library_constant_bytes(ep: torch.export.ExportedProgram, plan: Any, deployment: Any) -> int:
    """The flash bytes of the constant arrays :func:`emit_c` would write for ``deployment``, without
    writing anything: a provider that lays weights out for its kernels (the generated kernels'
    pre-widened DSP or Helium-chunk layouts, their border segments' copies) counts what it stores."""
    d = _deployment(deployment, None)
    g = _Generator(ep, plan, "model", d.target, d.providers, weights_sections=d.weights_sections)
    g.io_nodes()
    g.statements()
    return sum(a.nbytes for a in g.arrays.values())


def fallback_report(steps: Sequence[StepInfo], title: str = "CMSIS-NN") -> str:
    """The steps of a build its leading provider (``title``: CMSIS-NN) does not run, one line each
    with the reason (report.txt, CLI)."""
    portable = [s for s in steps if s.reason]
    head = f"Kernels of a {title} build: {len(steps) - len(portable)} of {len(steps)} steps call {title}"
    if not portable:
        return head + "; none falls back to a portable kernel."
    lines = [head + f"; {len(portable)} run Corten's portable kernels:"]
    for s in portable:
        lines.append(f"  step {s.step:>3}  {(s.module or '(forward)')[:32]:<32} {s.op[:26]:<26} {s.kernel:<30} "
                     f"{s.reason}")
    return "\n".join(lines)


def choices_report(steps: Sequence[StepInfo], kernels: str) -> str:
    """Which provider and kernel run each compute step of a build with the provider chain
    ``kernels`` (``"generated+cmsis-nn+portable"``), and why: the kernel's own note (a generated
    kernel's strategy) or why the providers before it do not run the step (report.txt, profile)."""
    compute = [s for s in steps if s.macs or s.provider not in (FALLBACK, "")]
    counts: dict[str, int] = {}
    for s in compute:
        counts[s.provider or FALLBACK] = counts.get(s.provider or FALLBACK, 0) + 1
    lines = [f"Kernel choices ({kernels} chain), {len(compute)} compute step(s): "
             + ", ".join(f"{n} {p}" for p, n in counts.items())]
    for s in compute:
        why = "; ".join(x for x in (s.note, s.reason) if x) or "-"
        lines.append(f"  step {s.step:>3}  {(s.module or '(forward)')[:28]:<28} {s.op[:24]:<24} "
                     f"{(s.provider or FALLBACK):<10} {s.kernel[:34]:<34} {why}")
    return "\n".join(lines)


def kernels_version() -> str:
    """8 hex digits identifying the portable kernels' sources (the guard each model checks)."""
    h = hashlib.sha256()
    for path in sorted(KERNELS_DIR.iterdir()):
        if path.suffix in (".c", ".h"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:8]


def kernel_library_files() -> dict[str, str]:
    """The files of the shared ``corten_kernels/`` directory (same for every model of this Corten)."""
    files = {p.name: p.read_text() for p in sorted(KERNELS_DIR.iterdir()) if p.suffix in (".c", ".h")}
    version = kernels_version()
    files[KERNELS_VERSION_HEADER] = (
        "/* corten_kernels_version.h - identifies this copy of Corten's portable kernels (generated).\n"
        " * Each generated model checks it at compile time, so that models emitted by different Corten\n"
        " * versions are never linked against kernels they were not generated for. */\n"
        "#ifndef CORTEN_KERNELS_VERSION_H\n#define CORTEN_KERNELS_VERSION_H\n\n"
        f"#define CORTEN_KERNELS_VERSION 0x{version}UL\n\n#endif /* CORTEN_KERNELS_VERSION_H */\n")
    sources = [n for n in files if n.endswith(".c")]
    files["Makefile"] = build_files.kernels_makefile(sources)
    files["CMakeLists.txt"] = build_files.kernels_cmakelists(sources)
    return files
