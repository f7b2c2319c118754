"""What ``irpe export`` is asked to produce: :class:`ExportOptions`, one typed object instead of keywords."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Format = Literal["onnx", "tensorrt", "triton"]
FORMATS: tuple[str, ...] = get_args(Format)


class ExportError(ValueError):
    """An export that cannot be completed; the message names the cause and the fix."""


def parse_formats(formats: str | Sequence[str]) -> tuple[Format, ...]:
    """The formats to write, from a comma string (``"onnx,triton"``) or a sequence; "onnx" is always included.

    Args:
        formats: names from :data:`FORMATS`, as a comma string or a sequence.

    Returns:
        The formats in order, without repeats, starting with "onnx".

    Raises:
        ExportError: a name is not one of :data:`FORMATS`, or none is given.
    """
    items = [f.strip().lower() for f in (formats.split(",") if isinstance(formats, str) else formats)]
    unknown = [f for f in items if f not in FORMATS]
    if unknown or not items:
        raise ExportError(f"unknown --format {unknown or items}; use a comma list of {', '.join(FORMATS)}")
    return tuple(dict.fromkeys(["onnx", *items]))  # type: ignore[arg-type]


@dataclass(frozen=True)
class ExportOptions:
    """How to export one checkpoint; the defaults give model.onnx + model.json in fp32.

    Attributes:
        name: the registered variant (default: read from the checkpoint).
        overrides: :func:`irpe.models.create_model` keywords that win over the checkpoint's (e.g. img_size).
        formats: what to write besides model.onnx: "tensorrt" (model.plan), "triton" (a model repository).
        rpe_plugin: emit the iRPE lookups as ``irpe::RPEIndex`` TensorRT plugin ops.
        opset: the ONNX opset (17 or newer).
        max_batch: the largest batch of the TensorRT engine and the Triton config.
        fp16: a float16 graph (parity bounds for fp16 apply).
        progress: timed step lines on stderr.
        int8: replace model.onnx by its calibrated int8 QDQ form (needs ``calibration``).
        calibration: "digits" or an image directory: calibrates int8 and holds out images for fidelity reports.
        calibration_options: :func:`irpe.export.precision.reduced_precision` keywords (calibration_size,
            heldout, method, scope, floors).
    """

    name: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    formats: str | Sequence[str] = ("onnx",)
    rpe_plugin: bool = False
    opset: int = 17
    max_batch: int = 32
    fp16: bool = False
    progress: bool = True
    int8: bool = False
    calibration: str | None = None
    calibration_options: Mapping[str, Any] = field(default_factory=dict)

    def check(self) -> tuple[Format, ...]:
        """The parsed formats, after refusing options that cannot go together (before anything is loaded).

        Raises:
            ExportError: the message names the conflicting options and the fix.
        """
        if self.int8 and not self.calibration:
            raise ExportError("--int8 needs calibration images: --calibration digits or --calibration DIR")
        if self.int8 and self.fp16:
            raise ExportError("--int8 quantizes the fp32 graph (float parts stay fp32); drop --fp16")
        if self.max_batch < 1:
            raise ExportError(f"--max-batch must be >= 1, got {self.max_batch}")
        return parse_formats(self.formats)
