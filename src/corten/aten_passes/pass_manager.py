"""Run Corten's ATen-level passes on a captured GraphModule, before quantization."""
from __future__ import annotations

from typing import Callable, Sequence

from torch.fx import GraphModule
from torch.fx.passes.infra.pass_base import PassResult

from corten.aten_passes.batch_norm import FoldBatchNormPass
from corten.aten_passes.decompose_attention import DecomposeScaledDotProductAttentionPass
from corten.aten_passes.decompose_composites import DecomposeCompositesPass
from corten.aten_passes.decompose_movement import DecomposeMovementPass
from corten.aten_passes.functionalize import FunctionalizeInPlacePass
from corten.aten_passes.fold_pad_into_conv import FoldPadIntoConvPass
from corten.aten_passes.graph_utils import AtenPassError
from corten.aten_passes.lift_zero_d import LiftZeroDimPass
from corten.aten_passes.remove_noops import RemoveNoOpsPass

AtenPass = Callable[[GraphModule], PassResult]


def default_passes() -> list[AtenPass]:
    """Composite ops (einsum, addmm, glu, var/std, group/instance norm, logsumexp, vector norms, prelu,
    bilinear upsampling) are spelled out first; in-place ops become functional next (``out += x`` -> ``add``), then
    pointwise math on computed 0-D tensors runs on one-element ones, then data movement in single-input form (split/unbind pieces as slices, stack as cat, movement of
    constants folded), then no-op removal (so ``conv -> dropout/clone -> BN`` still folds), symmetric zero pads into
    the convs reading them, then each BatchNorm folded into its conv / linear or rewritten as a depthwise
    conv, then ``scaled_dot_product_attention`` spelled out as matmul, mul, softmax, matmul.  The order
    is declared in :data:`RUNS_AFTER` and checked by :class:`AtenPassManager`."""
    return [
        DecomposeCompositesPass(),
        FunctionalizeInPlacePass(),
        LiftZeroDimPass(),
        DecomposeMovementPass(),
        RemoveNoOpsPass(),
        FoldPadIntoConvPass(),
        FoldBatchNormPass(),
        DecomposeScaledDotProductAttentionPass(),
    ]


# pass -> the passes that must run before it when both are in a pass list (and why)
RUNS_AFTER: dict[str, tuple[str, ...]] = {
    # constant folding keeps tensors that are later written in place (it sees the writes only before
    # functionalization turns them into new values)
    "FunctionalizeInPlacePass": ("DecomposeCompositesPass",),
    # the composites give full reductions (and dot products) as 0-D tensors; ``s += 1`` on one must be
    # functional first
    "LiftZeroDimPass": ("DecomposeCompositesPass", "FunctionalizeInPlacePass"),
    # the composites' rewrites emit split/stack (unrolled RNNs stack their steps); an in-place op made
    # functional may be a movement op
    "DecomposeMovementPass": ("DecomposeCompositesPass", "FunctionalizeInPlacePass"),
    # conv -> dropout/clone -> BN folds only once the no-op is gone; ``bn_(x)`` must be functional first
    "FoldBatchNormPass": ("RemoveNoOpsPass", "FunctionalizeInPlacePass"),
    "FuseBatchNormIntoConvPass": ("RemoveNoOpsPass", "FunctionalizeInPlacePass"),
    "FuseBatchNormIntoLinearPass": ("RemoveNoOpsPass", "FunctionalizeInPlacePass"),
    # a BatchNorm left for the depthwise rewrite is one no fold could take
    "BatchNormToDepthwiseConvPass": ("RemoveNoOpsPass", "FunctionalizeInPlacePass", "FuseBatchNormIntoConvPass",
                                     "FuseBatchNormIntoLinearPass"),
    # pad -> clone -> conv
    "FoldPadIntoConvPass": ("RemoveNoOpsPass",),
}


def check_order(passes: Sequence[object]) -> None:
    """Raise :class:`AtenPassError` when a pass comes before one :data:`RUNS_AFTER` says it follows."""
    names = [type(p).__name__ for p in passes]
    for i, name in enumerate(names):
        late = [b for b in RUNS_AFTER.get(name, ()) if b in names[i + 1:]]
        if late:
            raise AtenPassError(f"ATen pass {name} must run after {', '.join(late)}; reorder the pass list")


class AtenPassManager:
    """``AtenPassManager(passes=None)(gm) -> gm``: run ``passes`` (default :func:`default_passes`)
    in order on ``gm`` (usually from :func:`corten.capture.capture_module`).

    Each pass is a callable returning a ``PassResult(graph_module, modified)``.  After a run,
    ``modified_by`` lists the class names of the passes that changed the graph.  The passes rewrite
    ``gm`` in place (new parameters are added, the user's parameters are never modified) and the
    returned GraphModule is recompiled, with ``meta["val"]`` set on every node.
    """

    def __init__(self, passes: Sequence[AtenPass] | None = None) -> None:
        self.passes: list[AtenPass] = list(passes) if passes is not None else default_passes()
        check_order(self.passes)
        self.modified_by: list[str] = []

    def __call__(self, graph_module: GraphModule) -> GraphModule:
        self.modified_by = []
        for aten_pass in self.passes:
            result = aten_pass(graph_module)
            if result is not None:
                graph_module = result.graph_module
                if result.modified:
                    self.modified_by.append(type(aten_pass).__name__)
        graph_module.graph.lint()
        graph_module.recompile()
        return graph_module
