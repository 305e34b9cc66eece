"""ATen-level graph passes run on the captured model before quantization.

The default pipeline (:class:`AtenPassManager`) puts data movement in single-input form
(split/unbind pieces become slices, stack a cat, movement of constants is folded), runs pointwise math on
computed 0-D tensors on one-element ones, removes inference no-ops (dropout, clone, ...),
folds each BatchNorm into the conv / linear producing its input when that is exact and rewrites every
other as a depthwise 1x1 conv (one pass, :class:`FoldBatchNormPass`), so the quantizer never sees a
BatchNorm.  Composite ops are spelled out by a table of rewrite functions (``COMPOSITES``, run by
:class:`RewriteTablePass`).

Each pass is a ``torch.fx.passes.infra.pass_base.PassBase``: ``pass_(gm) -> PassResult(gm, modified)``.
"""
from corten.aten_passes.batch_norm import (BatchNormMatch, BatchNormToDepthwiseConvPass, FoldBatchNormPass,
                                           FuseBatchNormIntoConvPass, FuseBatchNormIntoLinearPass, batch_norms,
                                           fold_scale_into_conv_weight, is_batch_norm, match_batch_norm)
from corten.aten_passes.decompose_composites import COMPOSITES, DecomposeCompositesPass
from corten.aten_passes.decompose_movement import DecomposeMovementPass
from corten.aten_passes.functionalize import FunctionalizeInPlacePass, functional_variant
from corten.aten_passes.graph_utils import AtenPassError
from corten.aten_passes.lift_zero_d import LiftZeroDimPass
from corten.aten_passes.pass_manager import RUNS_AFTER, AtenPassManager, default_passes
from corten.aten_passes.remove_noops import RemoveNoOpsPass, is_noop
from corten.aten_passes.rewrites import Refusal, Rewrite, RewriteTable, RewriteTablePass

__all__ = [
    "AtenPassManager", "AtenPassError", "default_passes", "RUNS_AFTER",
    "FoldBatchNormPass", "FuseBatchNormIntoConvPass", "FuseBatchNormIntoLinearPass", "BatchNormToDepthwiseConvPass",
    "DecomposeCompositesPass", "COMPOSITES", "Rewrite", "Refusal", "RewriteTable",
    "RewriteTablePass",
    "RemoveNoOpsPass", "DecomposeMovementPass", "LiftZeroDimPass", "FunctionalizeInPlacePass", "functional_variant", "BatchNormMatch", "batch_norms", "is_batch_norm", "match_batch_norm",
    "is_noop", "fold_scale_into_conv_weight",
]
