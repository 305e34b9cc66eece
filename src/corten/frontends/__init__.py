"""Model files as inputs: ``.tflite`` (int8 TFLite models, converted without re-quantization into a
Corten program: :mod:`corten.frontends.tflite`) and ``.onnx`` (float ONNX models, converted to a
``torch.fx`` module that the PyTorch pipeline compiles: :mod:`corten.frontends.onnx`)."""
from __future__ import annotations

from pathlib import Path

MODEL_SUFFIXES = (".tflite", ".onnx")


def model_format(model) -> str | None:
    """``"tflite"`` / ``"onnx"`` when ``model`` is a path (str or Path) to such a file, else None."""
    if isinstance(model, (str, Path)):
        suffix = Path(model).suffix.lower()
        if suffix in MODEL_SUFFIXES:
            return suffix[1:]
    return None
