"""``export_artifact``: checkpoint -> model.onnx + model.json (+ TensorRT plan, Triton repository)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from torch import nn

from irpe.artifact import ModelArtifact, file_sha256, save_artifact
from irpe.models import CheckpointInfo, load_checkpoint_with_info, read_checkpoint

from . import metadata
from .onnx import INPUT_NAME, OUTPUT_NAME, build_onnx, check_onnx
from .options import ExportError, ExportOptions, Format
from .parity import check_ort_ops, check_parity, format_report

__all__ = ["ExportError", "ExportOptions", "Progress", "export_artifact"]


class Progress:
    """Timed step lines on stderr (silent when disabled)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def say(self, text: str) -> None:
        if self.enabled:
            print(f"irpe export: {text}", file=sys.stderr, flush=True)

    @contextmanager
    def step(self, text: str) -> Iterator[None]:
        start = time.perf_counter()
        self.say(f"{text} ...")
        yield
        self.say(f"{text}: done in {time.perf_counter() - start:.1f} s")


@dataclass
class LoadedCheckpoint:
    """A checkpoint read for export: the model in eval mode, what the checkpoint says, and its raw dict
    (class names and preprocessing are read from it)."""

    model: nn.Module
    info: CheckpointInfo
    raw: dict[str, Any]


def _load(checkpoint: Path, options: ExportOptions) -> LoadedCheckpoint:
    """Read and build the checkpoint's model (a training run's recorded overrides apply; explicit ones win)."""
    raw = read_checkpoint(checkpoint)
    model, info = load_checkpoint_with_info(checkpoint, options.name, **dict(options.overrides))
    return LoadedCheckpoint(model=model, info=info, raw=raw)


def export_artifact(checkpoint: str | Path, out_dir: str | Path, options: ExportOptions | None = None) -> Path:
    """Export a checkpoint into an artifact directory: model.onnx and model.json, parity-checked.

    Args:
        checkpoint: a ``.pth`` file (read with ``weights_only=True``: untrusted files cannot run code).
        out_dir: the artifact directory to write (created if missing).
        options: what to produce (formats, precision, calibration); the defaults give fp32 ONNX.

    Returns:
        ``out_dir``, holding model.onnx, model.json and, as asked, the fidelity reports, model.plan and a
        Triton repository.

    Raises:
        ExportError: options that cannot go together, or an output that cannot be written; the message
            names the fix.
        CheckpointError: the checkpoint cannot be read or does not describe a known model.
        ParityError: the exported graph does not match the PyTorch model within the bounds.
    """
    options = options or ExportOptions()
    formats = options.check()
    out_dir, checkpoint = Path(out_dir), Path(checkpoint)
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir}: exists and is not a directory; pass -o a directory to write")
    log = Progress(options.progress)
    with log.step(f"loading {checkpoint}"):
        loaded = _load(checkpoint, options)
    artifact = _new_artifact(loaded, checkpoint, options)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_onnx(loaded, artifact, out_dir / artifact.onnx_file, options, log)
    if options.calibration:
        _reduced_precision(loaded.model, artifact, out_dir, options, log)
    log.say(f"wrote {out_dir / artifact.onnx_file} and {out_dir / 'model.json'}")
    _extra_formats(artifact, out_dir, formats, options, log)
    return out_dir


def _write_onnx(loaded: LoadedCheckpoint, artifact: ModelArtifact, onnx_path: Path, options: ExportOptions,
                log: Progress) -> None:
    """Build, check and save model.onnx, check its parity with PyTorch, and save model.json."""
    suffix = (", fp16" if options.fp16 else "") + (", iRPE plugin ops" if options.rpe_plugin else "")
    with log.step(f"building the ONNX graph ({loaded.info.name}, opset {options.opset}{suffix})"):
        proto = build_onnx(loaded.model, opset=options.opset, rpe_plugin=options.rpe_plugin, fp16=options.fp16)
        check_onnx(proto, onnx_path)
        metadata.set_metadata(proto, metadata.metadata_summary(artifact))
        onnx.save(proto, str(onnx_path))
    with log.step("parity with PyTorch (random inputs, batches 1 and 3; sample photographs)"):
        preprocess = artifact.preprocess
        artifact.parity = check_parity(loaded.model, onnx_path, preprocess, fp16=options.fp16,
                                       rpe_plugin=options.rpe_plugin)
        ort_ops = None if options.fp16 or options.rpe_plugin else check_ort_ops(loaded.model, onnx_path, preprocess)
        if ort_ops:
            artifact.parity["irpe_ort_ops"] = ort_ops
    log.say(format_report(artifact.parity))
    metadata.set_metadata(proto, metadata.metadata_summary(artifact))  # now with the parity summary
    onnx.save(proto, str(onnx_path))
    artifact.onnx_sha256 = file_sha256(onnx_path)
    save_artifact(artifact, onnx_path.parent)


def _new_artifact(loaded: LoadedCheckpoint, checkpoint: Path, options: ExportOptions) -> ModelArtifact:
    """model.json's contract for the loaded checkpoint (parity and hashes of the ONNX file come later)."""
    config = loaded.info.config
    return ModelArtifact(
        name=loaded.info.name, architecture=metadata.architecture(loaded.info.name, config),
        img_size=config.img_size, num_classes=config.num_classes,
        preprocess=metadata.preprocess_for(config.img_size, loaded.raw.get("preprocess")),
        labels=metadata.labels_for(config.num_classes, loaded.info.class_names), opset=options.opset,
        input_name=INPUT_NAME, output_name=OUTPUT_NAME, rpe_plugin=options.rpe_plugin,
        checkpoint_sha256=file_sha256(checkpoint), versions=metadata.tool_versions())


def _reduced_precision(model: nn.Module, artifact: ModelArtifact, out_dir: Path, options: ExportOptions,
                       log: Progress) -> None:
    """Fidelity reports / int8; a plugin artifact is calibrated and measured on its plugin-free graph."""
    import tempfile

    from .precision import reduced_precision

    assert options.calibration is not None
    with tempfile.TemporaryDirectory(prefix="irpe-standard-") as tmp:
        standard = None
        if artifact.rpe_plugin:
            standard = Path(tmp) / "model.onnx"
            onnx.save(build_onnx(model, opset=options.opset), str(standard))
        reduced_precision(artifact, out_dir, options.calibration, int8=options.int8, say=log.say,
                          standard=standard, **dict(options.calibration_options))


def _extra_formats(artifact: ModelArtifact, out_dir: Path, formats: tuple[Format, ...], options: ExportOptions,
                   log: Progress) -> None:
    """TensorRT engine (recorded in model.json ``engines``) and Triton repository, after the ONNX artifact."""
    if "tensorrt" not in formats and (out_dir / "model.plan").exists():
        log.say(f"warning: {out_dir / 'model.plan'} is from an earlier export and does not match the new "
                "ONNX graph; delete it or re-run with --format tensorrt")
    if "tensorrt" in formats:
        source = out_dir / artifact.onnx_file
        with log.step(f"building the TensorRT engine from {source.name}"):
            artifact.engines["tensorrt"] = _tensorrt(artifact, out_dir, source, max_batch=options.max_batch,
                                                     fp16=options.fp16)
        save_artifact(artifact, out_dir)
    if "triton" in formats:
        with log.step("writing the Triton model repository"):
            from .triton import triton_repo_from_artifact

            root = triton_repo_from_artifact(out_dir, max_batch=options.max_batch)
        log.say(f"wrote the Triton model repository {root}")


def _tensorrt(artifact: ModelArtifact, out_dir: Path, source: Path, *, max_batch: int,
              fp16: bool) -> dict[str, Any]:
    """Build model.plan with the TensorRT builder; a missing TensorRT becomes an ExportError."""
    from irpe.plugins.tensorrt_plugin import TensorRTUnavailable

    from .tensorrt import build_environment, engine_from_onnx

    try:
        plan = engine_from_onnx(source, out_dir / "model.plan", max_batch=max_batch,
                                img_size=artifact.img_size, fp16=fp16, use_plugin=artifact.rpe_plugin)
    except TensorRTUnavailable as e:
        raise ExportError(f"{e} (the ONNX artifact in {out_dir} was written; only the TensorRT engine is "
                          "missing)") from None
    import tensorrt as trt

    return {"file": plan.name, "sha256": file_sha256(plan), "max_batch": max_batch,
            "precision": "fp16" if fp16 else "fp32", "rpe_plugin": artifact.rpe_plugin, "onnx": source.name,
            **build_environment(trt)}
