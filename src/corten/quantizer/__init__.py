"""PT2E quantization with Corten's own torchao ``Quantizer``."""
from corten.quantizer.quantizer import CortenQuantizer

__all__ = ["CortenQuantizer"]
