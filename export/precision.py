"""Reduced precision for an exported artifact: bf16 and int8 fidelity on held-out images, the int8 QDQ model.onnx.

``model.json`` ``fidelity``:

* ``bf16``: the fp32 graph run by OpenVINO with the bf16 inference-precision hint vs fp32 (when OpenVINO is
  installed and the CPU has bf16); recorded, never fatal (top-1 / accuracy floors as for int8, cosine
  0.999). ``--precision auto`` serves bf16 only when it passed.
* ``int8``: the QDQ graph on the default CPU runtime (OpenVINO, bf16 elsewhere where the CPU has it; else
  ONNX Runtime) vs fp32 (ONNX Runtime); ``int8_onnxruntime`` the same graph on ONNX Runtime when OpenVINO
  was the main one. Both are enforced: below a floor the export stops (exit 2, naming each gap) and the
  directory keeps the fp32 model.onnx.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from irpe.artifact import ModelArtifact, file_sha256, save_artifact

from . import fidelity, metadata, quantize


def reduced_precision(artifact: ModelArtifact, out_dir: Path, calibration: str, *, int8: bool,
                      calibration_size: int = 64, heldout: int = 400, method: str = "percentile",
                      scope: str = "linear", floors: dict[str, float | None] | None = None,
                      say: Callable[[str], None] = print, standard: Path | None = None) -> ModelArtifact:
    """Write the fidelity reports (and, with ``int8``, the QDQ model.onnx) into ``out_dir``; returns ``artifact``.

    ``standard``: the plugin-free fp32 graph of a --rpe-plugin artifact; it is calibrated and measured, and its
    Q/DQ pairs are copied into the plugin graph (irpe:: nodes stay float; see :func:`_plugin_qdq`)."""
    onnx_path = standard or out_dir / artifact.onnx_file
    sets = fidelity.image_sets(calibration, artifact, calibration_size=calibration_size, heldout=heldout)
    say(f"calibration / held-out images: {sets.source}")
    ref = fidelity.run_logits(onnx_path, sets.heldout)
    bf16 = fidelity.openvino_bf16()
    if bf16:
        report = fidelity.compare(ref, fidelity.run_logits(onnx_path, sets.heldout, runtime="openvino",
                                                           precision="bf16"), sets.labels)
        report["runtime"] = "openvino-cpu bf16"
        bf16_floors = {k: v for k, v in (floors or {}).items() if k != "cosine_mean"}  # bf16 keeps 0.999
        artifact.fidelity["bf16"] = fidelity.enforce("bf16", report, bf16_floors)
        say(fidelity.format_report("bf16", report))
    save_artifact(artifact, out_dir)
    if not int8:
        return artifact
    with tempfile.TemporaryDirectory(prefix="irpe-int8-") as tmp:
        qdq = Path(tmp) / "model.int8.onnx"
        say(f"int8: calibrating ({method}, scope {scope}) on {len(sets.calibration)} images ...")
        quantize.qdq_from_onnx(onnx_path, qdq, sets.calibration, method=method, scope=scope,
                               input_name=artifact.input_name)
        _int8_reports(artifact, qdq, ref, sets, bf16, floors or {}, out_dir, say)
        proto = onnx.load(str(qdq))
        if standard is not None:
            proto = _plugin_qdq(out_dir / artifact.onnx_file, proto, qdq, sets.heldout[:16], say)
        artifact.quantization = quantize.summary(proto, method=method, scope=scope, images=len(sets.calibration),
                                            source=sets.source)
        metadata.set_metadata(proto, metadata.metadata_summary(artifact))
        onnx.save(proto, str(out_dir / artifact.onnx_file))
    artifact.onnx_sha256 = file_sha256(out_dir / artifact.onnx_file)
    save_artifact(artifact, out_dir)
    say(f"int8: {artifact.quantization['matmuls']} MatMuls quantized; model.onnx is the QDQ graph")
    return artifact


def _int8_reports(artifact: ModelArtifact, qdq: Path, ref: Any, sets: fidelity.ImageSets, bf16: bool,
                  floors: dict[str, float | None], out_dir: Path, say: Callable[[str], None]) -> None:
    """Measure the QDQ graph on each CPU runtime; save the reports, then enforce them (FidelityError)."""
    runs = [("int8_onnxruntime", "onnxruntime", "fp32", "onnxruntime-cpu")]
    if fidelity.openvino_available():
        precision = "bf16" if bf16 else "fp32"
        runs.insert(0, ("int8", "openvino", precision, f"openvino-cpu ({precision} elsewhere)"))
    else:
        runs[0] = ("int8", "onnxruntime", "fp32", "onnxruntime-cpu")
    errors = []
    for key, runtime, precision, label in runs:
        report = fidelity.compare(ref, fidelity.run_logits(qdq, sets.heldout, runtime=runtime,
                                                           precision=precision), sets.labels)
        report["runtime"] = label
        try:
            fidelity.enforce("int8", report, floors)
        except fidelity.FidelityError as e:
            errors.append(f"{label}: {e}")
        artifact.fidelity[key] = report
        say(fidelity.format_report("int8", report))
    if errors:
        save_artifact(artifact, out_dir)  # the reports stay in model.json; model.onnx is still the fp32 graph
        raise fidelity.FidelityError(f"int8 export refused (model.onnx in {out_dir} stays fp32): "
                                     + " | ".join(errors))


PLUGIN_INT8_ATOL = 1e-3


def _plugin_qdq(plugin_path: Path, qdq: onnx.ModelProto, qdq_path: Path, x: Any,
                say: Callable[[str], None]) -> onnx.ModelProto:
    """The plugin graph with the standard graph's Q/DQ pairs, checked in TensorRT's form and against the
    standard QDQ graph on ONNX Runtime (plugin ops through the irpe custom-op lowering)."""
    from .parity import ort_session

    proto = quantize.qdq_into(onnx.load(str(plugin_path)), qdq)
    bad = quantize.qdq_form_violations(proto)
    if bad:
        raise quantize.QuantizationError(f"plugin QDQ graph is not in TensorRT's form: {bad[:3]}")
    with tempfile.TemporaryDirectory(prefix="irpe-int8-plugin-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(proto, str(path))
        got = ort_session(path, rpe_plugin=True).run(["logits"], {"images": x})[0]
    want = ort_session(qdq_path).run(["logits"], {"images": x})[0]
    diff = float(abs(got - want).max())
    if diff > PLUGIN_INT8_ATOL * max(1.0, float(abs(want).max())):
        raise quantize.QuantizationError(f"plugin QDQ graph differs from the standard QDQ graph by {diff:.3g}")
    say(f"int8: Q/DQ copied into the plugin graph (irpe:: nodes float); max |d logit| vs standard {diff:.2g}")
    return proto
