"""irpe.export: checkpoint -> ONNX graph (built from the weights) + model.json, parity-checked."""

from .artifact import export_artifact
from .onnx import build_onnx, onnx_from_model
from .options import FORMATS, ExportError, ExportOptions, parse_formats
from .parity import ParityError, check_parity

__all__ = ["FORMATS", "ExportError", "ExportOptions", "ParityError", "build_onnx", "check_parity",
           "export_artifact", "onnx_from_model", "parse_formats"]
