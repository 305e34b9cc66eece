"""PT2E quantization with Corten's own torchao ``Quantizer``."""
from corten._quiet import quiet_torchao_import

with quiet_torchao_import():  # torchao's import-time log lines are not the user's business
    from corten.quantizer.quantizer import CortenQuantizer

__all__ = ["CortenQuantizer"]
