"""Triton Inference Server model repository from an exported artifact directory (torch-free).

Layout written under ``out_dir`` (default ``<artifact_dir>/triton``)::

    <name>/config.pbtxt        platform onnxruntime_onnx, dynamic batching
    <name>/labels.txt
    <name>/1/model.onnx
    <name>_trt/config.pbtxt    platform tensorrt_plan (only when a .plan exists)
    <name>_trt/labels.txt
    <name>_trt/1/model.plan
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from irpe.artifact import ArtifactError, ModelArtifact, load_artifact

# No added delay: Triton holds a request up to this long for a batch to fill even when an instance is idle (a
# lone request at concurrency 1 ran 2.5x slower with 2000 us); with 0, batches still form from whatever queued
# while the instances were busy.
MAX_QUEUE_DELAY_US = 0


def preferred_batch_sizes(max_batch: int) -> list[int]:
    """Powers of two from 4 up to ``max_batch`` (plus ``max_batch`` itself), e.g. 32 -> [4, 8, 16, 32]."""
    sizes = [b for b in (4, 8, 16, 32, 64, 128, 256) if b < max_batch]
    return [*sizes, max_batch]


def config_pbtxt(name: str, platform: str, artifact: ModelArtifact, max_batch: int, *,
                 instance_kind: str = "KIND_CPU", instance_count: int = 1) -> str:
    """Text-format ``ModelConfig`` for one model (images FP32 [3,H,W] -> logits FP32 [C])."""
    sizes = ", ".join(str(b) for b in preferred_batch_sizes(max_batch))
    s = artifact.img_size
    return (f'name: "{name}"\nplatform: "{platform}"\nmax_batch_size: {max_batch}\n'
            f'input [\n  {{\n    name: "{artifact.input_name}"\n    data_type: TYPE_FP32\n    dims: [ 3, {s}, {s} ]\n'
            f'  }}\n]\n'
            f'output [\n  {{\n    name: "{artifact.output_name}"\n    data_type: TYPE_FP32\n'
            f'    dims: [ {artifact.num_classes} ]\n    label_filename: "labels.txt"\n  }}\n]\n'
            f'dynamic_batching {{\n  preferred_batch_size: [ {sizes} ]\n'
            f'  max_queue_delay_microseconds: {MAX_QUEUE_DELAY_US}\n}}\n'
            f'instance_group [\n  {{\n    count: {instance_count}\n    kind: {instance_kind}\n  }}\n]\n')


def _safe_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")
    if not cleaned:
        raise ArtifactError(f"model name {name!r} has no characters usable as a Triton model name")
    return cleaned


def _write_model(root: Path, name: str, config: str, labels: list[str], src: Path, dest_name: str) -> Path:
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config)
    (model_dir / "labels.txt").write_text("\n".join(labels) + "\n")
    shutil.copyfile(src, model_dir / "1" / dest_name)
    return model_dir


def _find_plan(artifact_dir: Path, artifact: ModelArtifact, plan_path: str | Path | None) -> Path | None:
    if plan_path is not None:
        plan = Path(plan_path)
        if not plan.is_file():
            raise ArtifactError(f"{plan}: TensorRT plan not found; build one on a GPU host with TensorRT: "
                                "irpe export CHECKPOINT -o DIR --format tensorrt,triton")
        return plan
    for entry in artifact.engines.values():
        candidate = artifact_dir / str(entry.get("file", ""))
        if entry.get("file") and candidate.is_file():
            return candidate
    default = artifact_dir / "model.plan"
    return default if default.is_file() else None


def triton_repo_from_artifact(artifact_dir: str | Path, out_dir: str | Path | None = None, *,
                              model_name: str | None = None, max_batch: int = 32,
                              plan_path: str | Path | None = None) -> Path:
    """Write a Triton model repository for ``artifact_dir``; returns the repository root."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    artifact_dir = Path(artifact_dir)
    artifact = load_artifact(artifact_dir)
    root = Path(out_dir) if out_dir is not None else artifact_dir / "triton"
    name = _safe_name(model_name or artifact.name)
    plan = _find_plan(artifact_dir, artifact, plan_path)
    if artifact.rpe_plugin and plan is None:
        raise ArtifactError(f"{artifact_dir}: the ONNX graph uses irpe plugin ops, which Triton's onnxruntime "
                            "backend cannot run, and there is no TensorRT plan; export without --rpe-plugin "
                            "or pass plan_path")
    if not artifact.rpe_plugin:
        _write_model(root, name, config_pbtxt(name, "onnxruntime_onnx", artifact, max_batch), artifact.labels,
                     artifact_dir / artifact.onnx_file, "model.onnx")
    if plan is not None:
        trt_name = f"{name}_trt"
        _write_model(root, trt_name, config_pbtxt(trt_name, "tensorrt_plan", artifact, max_batch,
                                                  instance_kind="KIND_GPU"), artifact.labels, plan, "model.plan")
    return root
