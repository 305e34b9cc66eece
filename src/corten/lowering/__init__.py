"""Lowering: quantized ATen graph -> Corten ops (rules live with their op families)."""
from corten.lowering.pass_manager import CortenPassManager, UnloweredNode, unlowered_nodes

__all__ = ["CortenPassManager", "UnloweredNode", "unlowered_nodes"]
