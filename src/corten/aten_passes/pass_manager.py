"""Run Corten's ATen-level passes on a captured GraphModule, before quantization."""
from __future__ import annotations

from typing import Callable, Sequence

from torch.fx import GraphModule
from torch.fx.passes.infra.pass_base import PassResult

from corten.aten_passes.batch_norm_to_depthwise import BatchNormToDepthwiseConvPass
from corten.aten_passes.decompose_attention import DecomposeScaledDotProductAttentionPass
from corten.aten_passes.decompose_composites import DecomposeCompositesPass
from corten.aten_passes.decompose_movement import DecomposeMovementPass
from corten.aten_passes.functionalize import FunctionalizeInPlacePass
from corten.aten_passes.fold_pad_into_conv import FoldPadIntoConvPass
from corten.aten_passes.fuse_batch_norm import FuseBatchNormIntoConvPass, FuseBatchNormIntoLinearPass
from corten.aten_passes.remove_noops import RemoveNoOpsPass

AtenPass = Callable[[GraphModule], PassResult]


def default_passes() -> list[AtenPass]:
    """Composite ops (einsum, addmm, glu, var/std, group/instance norm, logsumexp, vector norms, prelu,
    bilinear upsampling) are spelled out first; in-place ops become functional next (``out += x`` -> ``add``), then data movement in single-input form (split/unbind pieces as slices, stack as cat, movement of
    constants folded), then no-op removal (so ``conv -> dropout/clone -> BN`` still folds), symmetric zero pads into
    the convs reading them, then BatchNorm folding
    into conv and linear, then the depthwise rewrite of every BatchNorm that could not be folded, then
    ``scaled_dot_product_attention`` spelled out as matmul, mul, softmax, matmul."""
    return [
        DecomposeCompositesPass(),
        FunctionalizeInPlacePass(),
        DecomposeMovementPass(),
        RemoveNoOpsPass(),
        FoldPadIntoConvPass(),
        FuseBatchNormIntoConvPass(),
        FuseBatchNormIntoLinearPass(),
        BatchNormToDepthwiseConvPass(),
        DecomposeScaledDotProductAttentionPass(),
    ]


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
