"""irpe.export: checkpoint -> ONNX graph (built from the weights) + model.json, parity-checked."""

from .artifact import ExportError, export_artifact, parse_formats
from .onnx import build_onnx, onnx_from_model
from .parity import ParityError, check_parity

__all__ = ["ExportError", "ParityError", "build_onnx", "check_parity", "export_artifact", "onnx_from_model",
           "parse_formats"]
