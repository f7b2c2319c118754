"""model.json: everything a runtime needs to serve an exported model without torch.

An artifact directory holds ``model.json`` and the files it names (``model.onnx``, optionally
``model.plan``). :func:`load_artifact` validates the JSON and the checksums; every error names the
file, what was found and the fix.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ARTIFACT_FORMAT_VERSION = 1
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ArtifactError(ValueError):
    """An artifact directory is missing, malformed, or disagrees with itself."""


@dataclass
class Preprocess:
    """Evaluation transform: resize shorter side, center crop, scale to [0, 1], normalise (RGB, NCHW).

    ``invert`` is "never", "always" or "auto" (invert when the border is brighter than the centre,
    i.e. a dark drawing on a light background, for models trained on light-on-dark data).
    ``grayscale`` converts to luminance before replicating to three channels.
    ``fit`` is "none" or "ink": "ink" replaces resize/crop/invert by the ink-box transform of
    :func:`irpe.artifact.preprocess.fit_ink` (for drawings: any size, margin, position and polarity);
    ``fit_size`` > 0 passes the ink box through a fit_size x fit_size image first (removes rendering detail).
    """

    resize: int = 256
    crop: int = 224
    interpolation: str = "bicubic"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    invert: str = "never"
    grayscale: bool = False
    fit: str = "none"
    fit_size: int = 0

    @classmethod
    def for_imagenet(cls, img_size: int = 224) -> Preprocess:
        """The DeiT evaluation transform: resize to int(256/224 * size), crop size."""
        return cls(resize=int(256 / 224 * img_size), crop=img_size)


@dataclass
class ModelArtifact:
    """The parsed contents of model.json."""

    name: str
    architecture: dict[str, Any]
    img_size: int
    num_classes: int
    preprocess: Preprocess
    labels: list[str]
    onnx_file: str = "model.onnx"
    onnx_sha256: str = ""
    opset: int = 17
    input_name: str = "images"
    output_name: str = "logits"
    rpe_plugin: bool = False
    checkpoint_sha256: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)  # how a shipped model was trained (command, seed, ...)
    format_version: int = ARTIFACT_FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["preprocess"]["mean"] = list(self.preprocess.mean)
        d["preprocess"]["std"] = list(self.preprocess.std)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "model.json") -> ModelArtifact:
        known = set(cls.__dataclass_fields__)
        missing = [k for k in ("name", "architecture", "img_size", "num_classes", "preprocess", "labels")
                   if k not in d]
        if missing:
            raise ArtifactError(f"{source}: missing required field(s) {missing}; re-run `irpe export`")
        if d.get("format_version", 1) > ARTIFACT_FORMAT_VERSION:
            raise ArtifactError(f"{source}: format_version {d['format_version']} is newer than this "
                                f"runtime supports ({ARTIFACT_FORMAT_VERSION}); upgrade irpe-deploy")
        kwargs = {k: v for k, v in d.items() if k in known}
        try:
            kwargs["preprocess"] = Preprocess(**d["preprocess"])
            art = cls(**kwargs)
        except TypeError as e:
            raise ArtifactError(f"{source}: malformed field ({e}); re-run `irpe export`") from None
        if len(art.labels) != art.num_classes:
            raise ArtifactError(f"{source}: {len(art.labels)} labels for num_classes={art.num_classes}; "
                                "fix the labels list or re-export with matching --num-classes")
        return art


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_artifact(art: ModelArtifact, directory: str | Path) -> Path:
    """Write model.json into ``directory`` (the ONNX file must already be there)."""
    path = Path(directory) / "model.json"
    path.write_text(json.dumps(art.to_dict(), indent=2) + "\n")
    return path


def load_artifact(directory: str | Path, verify_checksum: bool = True) -> ModelArtifact:
    """Read and validate ``directory/model.json``; checks the ONNX file exists and matches its sha256."""
    directory = Path(directory)
    path = directory / "model.json"
    if not path.is_file():
        raise ArtifactError(f"{path}: not found; point at a directory written by `irpe export CHECKPOINT -o DIR`")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e}); re-run `irpe export`") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object, found {type(data).__name__}")
    art = ModelArtifact.from_dict(data, source=str(path))
    onnx_path = directory / art.onnx_file
    if not onnx_path.is_file():
        raise ArtifactError(f"{onnx_path}: not found (named by {path}); re-run `irpe export`")
    if verify_checksum and art.onnx_sha256 and file_sha256(onnx_path) != art.onnx_sha256:
        raise ArtifactError(f"{onnx_path}: sha256 differs from {path} (file changed or corrupt); "
                            "re-run `irpe export` or restore the file")
    return art
