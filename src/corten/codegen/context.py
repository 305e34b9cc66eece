"""What an op family's ``emit_c`` hook gets: :class:`EmitContext`, one per graph node.

A kernel's ``emit(ctx: EmitContext) -> str`` (registered with a provider, see
:mod:`corten.providers`) returns the C statement(s) running one node inside the generated
``<name>_run`` function.  The context hides the memory plan and the constant tables:

* :meth:`EmitContext.arg` - the node's arguments by schema name (tensors are ``fx.Node``);
* :meth:`EmitContext.buffer` / :meth:`EmitContext.out` - C expressions of the int8 buffers
  (``(act + 1024)``, ``(in0)``, ``(out0)``) the planner assigned;
* :meth:`EmitContext.const` - the name of the ``const`` C array holding a constant argument
  (:meth:`EmitContext.derived_const` for arrays the hook computes, e.g. expanded multipliers);
* :meth:`EmitContext.scratch` - the planned scratch buffer (expression, bytes) for CMSIS-NN;
* :meth:`EmitContext.params` / :meth:`EmitContext.dims` - a ``const`` parameter struct with a
  designated initialiser (``{.stride_h = 1, .activation = {.min = -128, .max = 127}}``): the
  only way hooks write parameter structs, so the generated C names every field;
* :meth:`EmitContext.call` - a kernel call wrapped in the generated error check (a failing call
  makes ``<name>_run`` return this step's number); :meth:`EmitContext.invoke` - a call expression
  without the check (a ``void`` kernel, a call inside a loop the hook writes).

The structs and calls made through these helpers are recorded (``ctx.calls``): a provider's
:class:`corten.providers.KernelStep` carries them, and the memory plan, the reports and the profiler
read them instead of the C text.

Constant arrays are named after the PyTorch module that produced the node and the argument
(``<model>_features_3_conv_1_weight``), see :meth:`EmitContext.const`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from corten.errors import CodegenError  # noqa: F401  (re-exported)
from corten.providers import KernelCall, NodeView, ParamStruct, element_pointer, nhwc  # noqa: F401  (nhwc re-exported)
from corten.providers.base import tensor_dtype

class ProgramEmitter(Protocol):
    """What an :class:`EmitContext` asks of the program-level emitter (``codegen.emitter``): the one
    interface between a node's emission and the library being written."""

    def constant_value(self, node: torch.fx.Node) -> torch.Tensor:
        """The value of a constant argument node."""

    def constant_array(self, node: torch.fx.Node, dtype: torch.dtype | None = None,
                       pretty: str | None = None, bits: int = 0) -> str:
        """The C array name of a constant argument (registered once; ``bits=4``: int4 values packed
        two per byte, see :func:`corten.codegen.emitter.pack_nibbles`)."""

    def derived_array(self, key: str, tensor: torch.Tensor, pretty: str | None = None, bits: int = 0) -> str:
        """Register an extra constant array under ``key``; its C name."""

    def node_prefix(self, node: torch.fx.Node) -> str:
        """``<model>_<module path>``: the prefix of a node's constant names."""

    def buffer_expr(self, node: torch.fx.Node) -> str:
        """The C expression of an activation's bytes (arena, input or output buffer)."""

    def scratch_expr(self, node: torch.fx.Node) -> tuple[str, int]:
        """``(void * expression, bytes)`` of a node's planned scratch buffer."""




C_KEYWORDS = frozenset(
    "auto break case char const continue default do double else enum extern float for goto if inline int long "
    "register restrict return short signed sizeof static struct switch typedef union unsigned void volatile "
    "while _Bool _Complex _Imaginary".split())


def c_identifier(text: str) -> str:
    """A valid C identifier derived from ``text`` (graph node names are already close to one)."""
    ident = re.sub(r"[^0-9A-Za-z_]", "_", text)
    if not ident or ident[0].isdigit() or ident in C_KEYWORDS:
        ident = "_" + ident
    return ident


def output_field_names(keys: Sequence[tuple], keyed: bool) -> list[str]:
    """The C names of a program's outputs (``<name>_outputs`` fields, header comments): ``output0``,
    ``output1``, ... or, for outputs returned in a dict / NamedTuple (``keyed``), the path of each
    one's keys, indices and fields joined by ``_`` (``{"logits": y, "aux": (a, b)}``: ``logits``,
    ``aux_0``, ``aux_1``), made C identifiers (``output`` before a leading digit, ``output_`` before
    a C keyword) and unique (``_2``, ``_3`` appended)."""
    names, used = [], set()
    for i, path in enumerate(keys):
        base = "_".join(re.sub(r"[^0-9A-Za-z_]", "_", str(k)) for k in path) if keyed else ""
        if not base:
            base = f"output{i}"
        elif base[0].isdigit():
            base = "output" + base
        elif base in C_KEYWORDS:
            base = "output_" + base
        name, k = base, 2
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        names.append(name)
    return names


def library_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a C model library (its files and ``<name>_*`` symbols), or None."""
    if not isinstance(name, str):
        return f"library name must be a str, got {type(name).__name__}"
    if c_identifier(name) != name:
        return f"library name {name!r} is not a C identifier; use e.g. {c_identifier(name)!r}"
    if name.lower().startswith("corten"):
        return (f"library name {name!r} starts with 'corten', the prefix of the shared kernel library's "
                "symbols and files (corten_kernels/); choose another name")
    return None


def c_int(v: int) -> str:
    """A C integer literal that is valid for every int32 value (INT32_MIN has no literal)."""
    v = int(v)
    if v == -(2**31):
        return "(-2147483647 - 1)"
    if not -(2**31) <= v < 2**31:  # an int64 constant (the 16x8 kernels' biases)
        return f"INT64_C({v})" if v != -(2**63) else "(-INT64_C(9223372036854775807) - 1)"
    return str(v)


def designated(fields: dict[str, Any]) -> str:
    """A C designated initialiser ``{.a = 1, .b = {.x = 2}}`` (ints as C literals, strings verbatim)."""
    parts = []
    for key, value in fields.items():
        if isinstance(value, dict):
            text = designated(value)
        elif isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, int):
            text = c_int(value)
        else:
            text = str(value)
        parts.append(f".{key} = {text}")
    return "{" + ", ".join(parts) + "}"


@dataclass
class EmitContext(NodeView):
    """Emission context of one node (see the module docstring)."""

    node: torch.fx.Node
    op_name: str
    provider: str  # the name of the provider emitting this node
    target: Any  # corten.targets.Target
    emitter: ProgramEmitter
    step: int = 0  # this node's step number in <name>_run (1-based), returned when a kernel call fails
    calls: list = field(default_factory=list)  # KernelCall, in the order the hook made them
    uses_portable: bool = False  # a non-portable kernel calls helpers of the family's portable kernel file
    _structs: list = field(default_factory=list)  # ParamStructs declared since the last call

    # ------------------------------------------------------------------ arguments (NodeView: arg, shape, nhwc, fail)
    def tensor(self, name: str) -> torch.Tensor:
        """Value of the constant tensor argument ``name``."""
        return self.emitter.constant_value(self.arg(name))

    # ------------------------------------------------------------------ buffers
    def buffer(self, node: torch.fx.Node) -> str:
        """C expression (``int8_t *`` or ``const int8_t *``) of an activation tensor's bytes."""
        return self.emitter.buffer_expr(node)

    def input(self, name: str) -> str:
        return self.buffer(self.arg(name))

    def out(self) -> str:
        """C expression of this node's output buffer (``int8_t *``)."""
        expr = self.emitter.buffer_expr(self.node)
        if expr.startswith("(in"):
            self.fail("the memory plan puts this op's output in the caller's input buffer")
        return expr

    def typed_input(self, name: str) -> str:
        """The input ``name``'s buffer as a pointer to its element type (``const int16_t *`` for an
        int16 tensor; the ``int8_t *`` expression itself for int8)."""
        return element_pointer(self.input(name), self.dtype(name), const=True)

    def typed_out(self) -> str:
        """This node's output buffer as a pointer to its element type (see :meth:`typed_input`)."""
        return element_pointer(self.out(), tensor_dtype(self.node))

    def use_portable_helpers(self) -> None:
        """Declare that this (non-portable) kernel also calls functions of the op family's portable
        kernel file (``corten_kernels/<family>.c`` is then part of the library)."""
        self.uses_portable = True

    def scratch(self) -> tuple[str, int]:
        """``(void * expression, bytes)`` of the planned scratch buffer; ``("NULL", 0)`` if none."""
        return self.emitter.scratch_expr(self.node)

    # ------------------------------------------------------------------ constants
    def const(self, name: str, dtype: torch.dtype | None = None, bits: int = 0) -> str:
        """C array name of the constant argument ``name`` (None arguments give ``NULL``):
        ``<model>_<module path>_<name>``, e.g. ``net_features_3_conv_1_weight``.  ``bits=4``: the
        values (int4, in an int8 tensor) are written packed two per byte (CMSIS-NN's s4 layout)."""
        value = self.arg(name)
        if value is None:
            return "NULL"
        return self.emitter.constant_array(value, dtype, self.emitter.node_prefix(self.node) + "_" + name, bits)

    def constant(self, node: torch.fx.Node, suffix: str, dtype: torch.dtype | None = None) -> str:
        """C array name of a constant node read by this op (an element of a list argument, e.g. a cat's
        ``inputs``): ``<model>_<module path>_<suffix>``."""
        return self.emitter.constant_array(node, dtype, self.emitter.node_prefix(self.node) + "_" + suffix)

    def derived_const(self, suffix: str, tensor: torch.Tensor, bits: int = 0) -> str:
        """Register an extra constant array (named after this node's module and ``suffix``; ``bits=4``:
        int4 values packed two per byte); returns its name."""
        return self.emitter.derived_array(f"{self.node.name}_{suffix}", tensor,
                                          self.emitter.node_prefix(self.node) + "_" + suffix, bits)

    # ------------------------------------------------------------------ statements
    def _record(self, function: str, args: Sequence[Any], checked: bool) -> KernelCall:
        call = KernelCall(function, tuple(a if isinstance(a, str) else c_int(a) for a in args),
                          tuple(self._structs), checked)
        self._structs.clear()
        self.calls.append(call)
        return call

    def call(self, function: str, *args: Any) -> str:
        """``function(args...)`` (C expressions; ints as literals), a kernel returning 0 on success,
        wrapped in the generated error check: on failure ``<name>_run`` returns this step's number
        (documented in the header).  Recorded as one of the step's :class:`KernelCall` s."""
        expr = self._record(function, args, True).expr
        return f"if ({expr} != 0) {{\n    return {self.step}; /* step {self.step} failed */\n}}"

    def invoke(self, function: str, *args: Any) -> str:
        """The expression ``function(args...)`` without the error check (recorded as a call)."""
        return self._record(function, args, False).expr

    def params(self, ctype: str, name: str, fields: dict[str, Any]) -> str:
        """``const <ctype> <name> = {.field = value, ...};`` with nested dicts for nested structs
        (values: ints, C expressions as strings, dicts); recorded for the next call."""
        self._structs.append(ParamStruct(ctype, name, dict(fields)))
        return f"const {ctype} {name} = {designated(fields)};"

    def block(self, *statements: str) -> str:
        """Statements inside a ``{ }`` block (so local parameter structs do not clash)."""
        body = "\n".join(statements)
        return "{\n" + "\n".join(("    " + line) if line else line for line in body.split("\n")) + "\n}"

    def dims(self, name: str, ctype: str, n: int, h: int, w: int, c: int) -> str:
        """A ``corten_dims`` / ``cmsis_nn_dims`` (fields n, h, w, c) with a designated initialiser."""
        return self.params(ctype, name, dict(n=n, h=h, w=w, c=c))

    @staticmethod
    def int_(v: int) -> str:
        return c_int(v)
