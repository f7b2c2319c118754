"""What an export records: labels, preprocessing, versions, model.json and ONNX metadata_props."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, fields
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import onnx

from irpe.artifact import ModelArtifact, Preprocess
from irpe.models.deit import ViTConfig

IMAGENET_CLASSES = Path(__file__).with_name("imagenet_classes.txt")
METADATA_PREFIX = "irpe."
_VERSIONED = ("irpe-deploy", "torch", "onnx", "onnxruntime", "numpy")


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names in class-index order (WordNet lemmas)."""
    labels = IMAGENET_CLASSES.read_text().splitlines()
    if len(labels) != 1000:
        raise RuntimeError(f"{IMAGENET_CLASSES}: expected 1000 lines, found {len(labels)}; reinstall irpe-deploy")
    return labels


def labels_for(num_classes: int, class_names: list[str] | None) -> list[str]:
    """Checkpoint class names when they fit, else ImageNet names for 1000 classes, else class_i."""
    if class_names is not None and len(class_names) == num_classes:
        return [str(c) for c in class_names]
    if num_classes == 1000:
        return imagenet_labels()
    return [f"class_{i}" for i in range(num_classes)]


def preprocess_for(img_size: int, stored: Any) -> Preprocess:
    """The checkpoint's ``preprocess`` dict when present (crop must match), else the DeiT transform."""
    if not isinstance(stored, dict):
        return Preprocess.for_imagenet(img_size)
    known = {f.name for f in fields(Preprocess)}
    unknown = sorted(set(stored) - known)
    if unknown:
        raise ValueError(f"checkpoint 'preprocess' has unknown field(s) {unknown}; allowed: {sorted(known)}")
    preprocess = Preprocess(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()})
    if preprocess.crop != img_size:
        raise ValueError(f"checkpoint 'preprocess' crops to {preprocess.crop} but the model input is {img_size}; "
                         "pass --img-size matching the crop or fix the checkpoint")
    return preprocess


def tool_versions() -> dict[str, str]:
    """Versions of the packages that produced the artifact."""
    out = {"python": platform.python_version()}
    for pkg in _VERSIONED:
        try:
            out[pkg] = importlib_metadata.version(pkg)
        except importlib_metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def architecture(name: str, cfg: ViTConfig) -> dict[str, Any]:
    """The variant name and every architecture hyper-parameter incl. the RPE config."""
    arch = asdict(cfg)
    arch["variant"] = name
    arch["num_prefix_tokens"] = cfg.num_prefix_tokens
    return arch


def metadata_summary(artifact: ModelArtifact) -> dict[str, str]:
    """model.json's fields as ONNX metadata_props (JSON-encoded values, ``irpe.`` keys).

    The ONNX file's own sha256 is left out (it cannot contain itself); engines are TensorRT-only.
    """
    d = artifact.to_dict()
    d.pop("onnx_sha256", None)
    d.pop("engines", None)
    return {METADATA_PREFIX + k: json.dumps(v, sort_keys=True) for k, v in d.items()}


def set_metadata(proto: onnx.ModelProto, props: dict[str, str]) -> None:
    """Replace the model's ``irpe.*`` metadata_props with ``props`` and set doc/version fields."""
    keep = [(p.key, p.value) for p in proto.metadata_props if not p.key.startswith(METADATA_PREFIX)]
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, dict(keep) | props)
    name = json.loads(props.get(METADATA_PREFIX + "name", '"model"'))
    proto.doc_string = f"irpe-deploy export of {name}"


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The decoded ``irpe.*`` metadata_props of an exported ONNX file."""
    proto = onnx.load(str(path), load_external_data=False)
    out: dict[str, Any] = {}
    for p in proto.metadata_props:
        if p.key.startswith(METADATA_PREFIX):
            out[p.key[len(METADATA_PREFIX):]] = json.loads(p.value)
    return out
