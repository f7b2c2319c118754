"""``export_artifact``: checkpoint -> model.onnx + model.json (+ TensorRT plan, Triton repository)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnx

from irpe.artifact import ModelArtifact, file_sha256, save_artifact
from irpe.models import load_checkpoint_with_info, read_checkpoint

from . import metadata
from .onnx import INPUT_NAME, OUTPUT_NAME, build_onnx, check_onnx
from .parity import check_ort_ops, check_parity, format_report

FORMATS = ("onnx", "tensorrt", "triton")


class ExportError(ValueError):
    """An export that cannot be completed; the message names the cause and the fix."""


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


def parse_formats(formats: str | Sequence[str]) -> tuple[str, ...]:
    """Validate a comma string or sequence of formats; "onnx" is always produced."""
    items = [f.strip().lower() for f in (formats.split(",") if isinstance(formats, str) else formats)]
    bad = [f for f in items if f not in FORMATS]
    if bad or not items:
        raise ExportError(f"unknown --format {bad or items}; use a comma list of {', '.join(FORMATS)}")
    return tuple(dict.fromkeys(["onnx", *items]))


def _load(checkpoint: Path, name: str | None, overrides: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """(model in eval mode, CheckpointInfo, raw checkpoint dict for class names / preprocess).

    load_checkpoint_with_info applies a training run's recorded ``args.overrides`` (explicit ones win).
    """
    raw = read_checkpoint(checkpoint)
    model, info = load_checkpoint_with_info(checkpoint, name, **overrides)
    return model, info, raw


def export_artifact(checkpoint: str | Path, out_dir: str | Path, *, name: str | None = None,
                    overrides: dict | None = None, formats: str | Sequence[str] = ("onnx",),
                    rpe_plugin: bool = False, opset: int = 17, max_batch: int = 32, fp16: bool = False,
                    progress: bool = True, int8: bool = False, calibration: str | None = None,
                    calibration_options: dict[str, Any] | None = None) -> Path:
    """Export ``checkpoint`` into ``out_dir`` (model.onnx, model.json; parity checked); returns out_dir.

    ``calibration`` (``digits`` or an image directory) adds fidelity reports on held-out images (bf16 where
    OpenVINO runs it); ``int8`` replaces model.onnx by its calibrated QDQ form (see :mod:`.precision`);
    ``calibration_options``: :func:`irpe.export.precision.reduced_precision` keywords."""
    formats = parse_formats(formats)
    out_dir, checkpoint = Path(out_dir), Path(checkpoint)
    _check_options(out_dir, int8=int8, fp16=fp16, calibration=calibration, max_batch=max_batch)
    log = Progress(progress)
    with log.step(f"loading {checkpoint}"):
        model, info, raw = _load(checkpoint, name, dict(overrides or {}))
    art = _new_artifact(info, raw, checkpoint, opset=opset, rpe_plugin=rpe_plugin)
    pp = art.preprocess
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / art.onnx_file
    with log.step(f"building the ONNX graph ({info.name}, opset {opset}{', fp16' if fp16 else ''}"
                  f"{', iRPE plugin ops' if rpe_plugin else ''})"):
        proto = build_onnx(model, opset=opset, rpe_plugin=rpe_plugin, fp16=fp16)
        check_onnx(proto, onnx_path)
        metadata.set_metadata(proto, metadata.metadata_summary(art))
        onnx.save(proto, str(onnx_path))
    with log.step("parity with PyTorch (random inputs, batches 1 and 3; sample photographs)"):
        art.parity = check_parity(model, onnx_path, pp, fp16=fp16, rpe_plugin=rpe_plugin)
        ort_ops = None if fp16 or rpe_plugin else check_ort_ops(model, onnx_path, pp)
        if ort_ops:
            art.parity["irpe_ort_ops"] = ort_ops
    log.say(format_report(art.parity))
    metadata.set_metadata(proto, metadata.metadata_summary(art))
    onnx.save(proto, str(onnx_path))
    art.onnx_sha256 = file_sha256(onnx_path)
    save_artifact(art, out_dir)
    if calibration:
        _reduced_precision(model, art, out_dir, calibration, int8=int8, opset=opset, log=log,
                           options=calibration_options or {})
    log.say(f"wrote {onnx_path} and {out_dir / 'model.json'}")
    _extra_formats(art, out_dir, formats, max_batch=max_batch, fp16=fp16, log=log,
                   tensorrt_onnx=lambda: _tensorrt_onnx(model, proto, out_dir, opset=opset, fp16=fp16, pp=pp))
    return out_dir


def _check_options(out_dir: Path, *, int8: bool, fp16: bool, calibration: str | None, max_batch: int) -> None:
    """ExportError naming the fix for options that cannot go together, before anything is loaded."""
    if int8 and not calibration:
        raise ExportError("--int8 needs calibration images: --calibration digits or --calibration DIR")
    if int8 and fp16:
        raise ExportError("--int8 quantizes the fp32 graph (float parts stay fp32); drop --fp16")
    if max_batch < 1:
        raise ExportError(f"--max-batch must be >= 1, got {max_batch}")
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir}: exists and is not a directory; pass -o a directory to write")


def _new_artifact(info: Any, raw: dict[str, Any], checkpoint: Path, *, opset: int, rpe_plugin: bool) -> ModelArtifact:
    """model.json's contract for the loaded checkpoint (parity and hashes of the ONNX file come later)."""
    cfg = info.config
    return ModelArtifact(
        name=info.name, architecture=metadata.architecture(info.name, cfg), img_size=cfg.img_size,
        num_classes=cfg.num_classes, preprocess=metadata.preprocess_for(cfg.img_size, raw.get("preprocess")),
        labels=metadata.labels_for(cfg.num_classes, info.class_names), opset=opset, input_name=INPUT_NAME,
        output_name=OUTPUT_NAME, rpe_plugin=rpe_plugin, checkpoint_sha256=file_sha256(checkpoint),
        versions=metadata.tool_versions())


def _reduced_precision(model: Any, art: ModelArtifact, out_dir: Path, calibration: str, *, int8: bool, opset: int,
                       log: Progress, options: dict[str, Any]) -> None:
    """Fidelity reports / int8; a plugin artifact is calibrated and measured on its plugin-free graph."""
    import tempfile

    from .precision import reduced_precision

    with tempfile.TemporaryDirectory(prefix="irpe-standard-") as tmp:
        standard = None
        if art.rpe_plugin:
            standard = Path(tmp) / "model.onnx"
            onnx.save(build_onnx(model, opset=opset), str(standard))
        reduced_precision(art, out_dir, calibration, int8=int8, say=log.say, standard=standard, **options)


TENSORRT_ONNX = "model.tensorrt.onnx"


def _tensorrt_onnx(model: Any, proto: onnx.ModelProto, out_dir: Path, *, opset: int, fp16: bool,
                   pp: Any) -> Path | None:
    """model.tensorrt.onnx where model.onnx has nodes TensorRT's ONNX parser rejects (value-side ScatterND
    reductions), parity-checked like model.onnx; None when model.onnx itself suits TensorRT."""
    from .tensorrt import tensorrt_incompatibilities

    if not tensorrt_incompatibilities(proto):
        return None
    path = out_dir / TENSORRT_ONNX
    variant = build_onnx(model, opset=opset, fp16=fp16, tensorrt=True)
    check_onnx(variant, path)
    onnx.save(variant, str(path))
    check_parity(model, path, pp, fp16=fp16)
    return path


def _extra_formats(art: ModelArtifact, out_dir: Path, formats: tuple[str, ...], *, max_batch: int,
                   fp16: bool, log: Progress, tensorrt_onnx: Any = None) -> None:
    """TensorRT engine (recorded in model.json ``engines``) and Triton repository, after the ONNX artifact."""
    if "tensorrt" not in formats and (out_dir / "model.plan").exists():
        log.say(f"warning: {out_dir / 'model.plan'} is from an earlier export and does not match the new "
                "ONNX graph; delete it or re-run with --format tensorrt")
    if "tensorrt" in formats:
        source = out_dir / art.onnx_file
        if tensorrt_onnx is not None and not art.rpe_plugin:
            with log.step("writing the TensorRT variant of the ONNX graph (where needed)"):
                source = tensorrt_onnx() or source
        with log.step(f"building the TensorRT engine from {source.name}"):
            art.engines["tensorrt"] = _tensorrt(art, out_dir, source, max_batch=max_batch, fp16=fp16)
        save_artifact(art, out_dir)
    if "triton" in formats:
        with log.step("writing the Triton model repository"):
            from .triton import triton_repo_from_artifact

            root = triton_repo_from_artifact(out_dir, max_batch=max_batch)
        log.say(f"wrote the Triton model repository {root}")


def _tensorrt(art: ModelArtifact, out_dir: Path, source: Path, *, max_batch: int, fp16: bool) -> dict[str, Any]:
    """Build model.plan with the other helper's builder; a missing TensorRT becomes an ExportError."""
    from irpe.plugins.tensorrt_plugin import TensorRTUnavailable

    from .tensorrt import build_environment, engine_from_onnx

    try:
        plan = engine_from_onnx(source, out_dir / "model.plan", max_batch=max_batch,
                                img_size=art.img_size, fp16=fp16, use_plugin=art.rpe_plugin)
    except TensorRTUnavailable as e:
        raise ExportError(f"{e} (the ONNX artifact in {out_dir} was written; only the TensorRT engine is "
                          "missing)") from None
    import tensorrt as trt

    return {"file": plan.name, "sha256": file_sha256(plan), "max_batch": max_batch,
            "precision": "fp16" if fp16 else "fp32", "rpe_plugin": art.rpe_plugin, "onnx": source.name,
            **build_environment(trt)}
