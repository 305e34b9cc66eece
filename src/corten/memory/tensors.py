"""Read a lowered program (see ``lowered_format.md``) the way the memory planner needs it.

:func:`analyse` turns the ``ExportedProgram`` into a :class:`ProgramTensors`: the C execution
steps in graph order, every int8 activation with the *storage class* it belongs to (reshape
aliases share their input's bytes), where each class lives (arena, caller input buffer, caller
output buffer) and its lifetime in steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram

from corten.errors import MemoryPlanError
from corten.memory.views import RESHAPE, alias_offset
from corten.ops.registry import constant_nbytes, is_lowered_node, op_name_of

QUANTIZE = "quantize_per_tensor"
DEQUANTIZE = "dequantize_per_tensor"


def constant_tensor(ep: ExportedProgram, node: torch.fx.Node) -> torch.Tensor | None:
    """The constant tensor behind a lifted-constant placeholder (parameter, buffer or lifted tensor
    constant), or None when ``node`` is not one (a user input, an op node, ...)."""
    if node.op != "placeholder":
        return None
    sig = ep.graph_signature
    for mapping in (sig.inputs_to_parameters, sig.inputs_to_buffers, sig.inputs_to_lifted_tensor_constants):
        key = mapping.get(node.name)
        if key is None:
            continue
        if key in ep.state_dict:
            return ep.state_dict[key]
        if key in ep.constants:
            return ep.constants[key]
        raise MemoryPlanError(f"placeholder {node.name!r} names constant {key!r}, which is neither in "
                              "ep.state_dict nor in ep.constants")
    return None


def tensor_nbytes(node: torch.fx.Node) -> int:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise MemoryPlanError(f"node {node.name!r} has no tensor meta['val']; the planner needs shapes "
                              "from torch.export")
    return int(val.numel()) * val.element_size()


@dataclass
class StorageClass:
    """Tensors that share one set of bytes: a producer and its views (reshape aliases, slices that
    are contiguous runs of its bytes)."""

    root: str  # the node that writes the bytes (op output, or the quantize of a program input)
    members: list[str]
    nbytes: int
    first: int  # step that writes it (-1: present before the first step, i.e. a program input)
    last: int  # last step that reads it (== len(steps) when a program output)
    region: str = "arena"  # "arena" | "input" | "output"
    index: int = 0  # which caller buffer, for "input" / "output"


@dataclass
class ProgramTensors:
    steps: list[torch.fx.Node]  # nodes the C code executes, in graph order
    op_names: list[str]  # the Corten op (or "reshape_copy") of each step
    classes: dict[str, StorageClass]  # by root name
    class_of: dict[str, str]  # int8 tensor node name -> root name
    nbytes: dict[str, int]  # int8 tensor node name -> its own size
    copies: list[tuple[str, int]] = field(default_factory=list)  # (tensor, output index) copied at the end
    constant_bytes: int = 0
    constant_names: list[str] = field(default_factory=list)
    view_offset: dict[str, int] = field(default_factory=dict)  # view tensor -> its first byte in its class
    placed_cats: dict[str, list[str]] = field(default_factory=dict)  # in-place cat -> roots of its inputs

    def live_classes(self, step: int) -> list[StorageClass]:
        return [c for c in self.classes.values() if c.first <= step <= c.last]


def _fail_unlowered(node: torch.fx.Node) -> None:
    raise MemoryPlanError(
        f"memory plan: node {node.name!r} calls {node.target}, which is neither a Corten op nor "
        "aten.reshape.default: the program is not lowered (lower it with corten.lowering first)")


CAT = "quantized_cat"


def cat_in_place_offsets(node: torch.fx.Node) -> list[int] | None:
    """Byte offsets of each input inside the output of a ``quantized_cat`` that concatenates along
    its outermost non-trivial storage dimension (H of an ``N == 1`` NHWC tensor, the batch, ...):
    each input is then one contiguous run of the output's bytes; else None."""
    from corten.ops._common import storage_dim_order

    inputs, dim = node.args[0], int(node.args[1])
    shape = tuple(node.meta["val"].shape)
    dim = dim % len(shape)
    order = storage_dim_order(len(shape))
    if any(shape[d] != 1 for d in order[:order.index(dim)]):
        return None
    offsets, at = [], 0
    for a in inputs:
        if not isinstance(a, torch.fx.Node):
            return None
        offsets.append(at)
        at += tensor_nbytes(a)
    return offsets


def analyse(ep: ExportedProgram, in_place_cats: bool = False) -> ProgramTensors:
    """The program's steps and storage classes.  ``in_place_cats``: a ``quantized_cat`` along its
    outermost storage dimension whose inputs are op outputs read by nothing else (the band outputs
    of a banded schedule, :mod:`corten.memory.banding`) runs no code: each input is written
    straight into its bytes of the output (:func:`cat_in_place_offsets`)."""
    graph = ep.graph
    user_inputs = list(ep.graph_signature.user_inputs)
    output_node = next(n for n in graph.nodes if n.op == "output")
    outputs = list(output_node.args[0]) if isinstance(output_node.args[0], (list, tuple)) else [output_node.args[0]]

    steps: list[torch.fx.Node] = []
    op_names: list[str] = []
    class_of: dict[str, str] = {}
    nbytes: dict[str, int] = {}
    input_index: dict[str, int] = {}
    constants: dict[str, int] = {}
    view_offset: dict[str, int] = {}
    placed: dict[str, list[str]] = {}
    step_names: set[str] = set()

    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op != "call_function":
            raise MemoryPlanError(f"memory plan: node {node.name!r} is a {node.op!r} node; a lowered program "
                                  "has only placeholders, call_function nodes and the output")
        name = op_name_of(node.target)
        if not is_lowered_node(node):
            _fail_unlowered(node)
        for arg in node.all_input_nodes:
            t = constant_tensor(ep, arg)
            if t is not None:
                constants[arg.name] = constant_nbytes(node, arg, t)  # (int4 weights: packed)
            elif arg.op == "placeholder" and name != QUANTIZE:
                raise MemoryPlanError(f"memory plan: node {node.name!r} reads program input {arg.name!r} "
                                      "directly; each program input must go through one "
                                      "corten.quantize_per_tensor (see lowered_format)")
        if name == DEQUANTIZE:
            continue
        if name == QUANTIZE:
            src = node.args[0]
            if not (isinstance(src, torch.fx.Node) and src.op == "placeholder" and src.name in user_inputs):
                raise MemoryPlanError(f"memory plan: {node.name!r} quantizes {src}, not a program input")
            input_index[node.name] = user_inputs.index(src.name)
            class_of[node.name] = node.name
        elif (offset := alias_offset(node)) is not None:  # a view: the bytes of its input (from offset)
            src = node.args[0].name
            class_of[node.name] = class_of[src]
            view_offset[node.name] = view_offset.get(src, 0) + offset
        elif in_place_cats and name == CAT and (roots := _placeable_cat(node, class_of, step_names, placed)):
            offsets = cat_in_place_offsets(node)
            class_of[node.name] = node.name
            for root, off in zip(roots, offsets):
                for t, r in list(class_of.items()):
                    if r == root:
                        class_of[t] = node.name
                        view_offset[t] = off + view_offset.get(t, 0)
            placed[node.name] = roots
        elif node.target == RESHAPE:
            class_of[node.name] = node.name
            steps.append(node)
            step_names.add(node.name)
            op_names.append("reshape_copy")
        else:
            class_of[node.name] = node.name
            steps.append(node)
            step_names.add(node.name)
            op_names.append(name)
        nbytes[node.name] = tensor_nbytes(node)

    step_of = {n.name: i for i, n in enumerate(steps)}
    end = len(steps)
    classes: dict[str, StorageClass] = {}
    for tname, root in class_of.items():
        cls = classes.get(root)
        if cls is None:
            if root in placed:
                first = min(step_of[r] for r in placed[root])
            else:
                first = -1 if root in input_index else step_of[root]
            cls = classes[root] = StorageClass(root, [], nbytes[root], first, first)
        cls.members.append(tname)

    dequantized: dict[str, list[int]] = {}  # root -> output numbers it feeds
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        for arg in node.all_input_nodes:
            root = class_of.get(arg.name)
            if root is None:
                continue
            cls = classes[root]
            if op_name_of(node.target) == DEQUANTIZE:
                cls.last = end
                if node in outputs:
                    dequantized.setdefault(root, []).extend(i for i, o in enumerate(outputs) if o is node)
            elif node.name in step_of:
                cls.last = max(cls.last, step_of[node.name])

    for i, o in enumerate(outputs):  # int32 indices (argmax) are program outputs without a dequantize
        if isinstance(o, torch.fx.Node) and o.op == "call_function" and op_name_of(o.target) not in (None, DEQUANTIZE) \
                and o.name in class_of:
            root = class_of[o.name]
            classes[root].last = end
            dequantized.setdefault(root, []).append(i)

    copies: list[tuple[str, int]] = []
    for root, cls in classes.items():
        outs = sorted(dequantized.get(root, []))
        if root in input_index:
            cls.region, cls.index = "input", input_index[root]
            copies += [(root, k) for k in outs]  # the bytes already live in the caller's input buffer
        elif outs:
            cls.region, cls.index = "output", outs[0]
            copies += [(root, k) for k in outs[1:]]  # one tensor returned twice: copy to the others
    return ProgramTensors(steps, op_names, classes, class_of, nbytes, sorted(copies),
                          sum(constants.values()), sorted(constants), view_offset, placed)


def _placeable_cat(node, class_of, step_names, placed) -> list[str] | None:
    """The input roots of an in-place cat, or None when ``node`` cannot be one: two or more
    inputs along the outermost storage dimension, each the whole output of an earlier step, read
    by this cat only and not already placed in another cat."""
    inputs = node.args[0]
    if not isinstance(inputs, (list, tuple)) or len(inputs) < 2 or cat_in_place_offsets(node) is None:
        return None
    roots = []
    for a in inputs:
        if a.name not in step_names or class_of.get(a.name) != a.name or a.name in placed or len(a.users) != 1:
            return None
        roots.append(a.name)
    if len(set(roots)) != len(roots):
        return None
    return roots
