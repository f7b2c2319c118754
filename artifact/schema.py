"""model.json: everything a runtime needs to serve an exported model without torch.

An artifact directory holds ``model.json`` and the files it names (``model.onnx``, optionally
``model.plan``). :func:`load_artifact` validates the JSON and the checksums, and refuses an ONNX file that keeps
tensors in other files (ONNX external data, which no checksum covers); every error names the file, what was
found and the fix.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from .onnx_scan import TooDeep, external_tensors

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
    quantization: dict[str, Any] = field(default_factory=dict)  # int8 QDQ: method, scope, calibration
    fidelity: dict[str, Any] = field(default_factory=dict)  # "int8" / "bf16" vs fp32 on held-out images
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
        problems = art.problems()
        if problems:
            raise ArtifactError(f"{source}: invalid field(s): {'; '.join(problems[:8])}; fix model.json or "
                                "re-run `irpe export`")
        if len(art.labels) != art.num_classes:
            raise ArtifactError(f"{source}: {len(art.labels)} labels for num_classes={art.num_classes}; "
                                "fix the labels list or re-export with matching --num-classes")
        return art

    def problems(self) -> list[str]:
        """Type and value errors of every field ([] when valid); see :func:`field_problems`."""
        return field_problems(self)

    def files(self) -> dict[str, tuple[str, str]]:
        """Every file model.json names: role -> (relative path, sha256)."""
        out = {"onnx": (self.onnx_file, self.onnx_sha256)}
        for kind, entry in (self.engines if isinstance(self.engines, dict) else {}).items():
            if isinstance(entry, dict) and (entry.get("file") or entry.get("path")):
                out[kind] = (str(entry.get("file") or entry.get("path")), str(entry.get("sha256") or ""))
        return out


INTERPOLATIONS = ("bicubic", "bilinear", "nearest")
INVERT = ("never", "always", "auto")
_CONTROL = {chr(c) for c in range(32)} | {"\x7f"}


def _is_int(v: Any, low: int = 1, high: int = 1 << 20) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _is_real_list(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) in (1, 3) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)


def relative_name_problem(name: Any) -> str:
    """Why ``name`` is not a plain relative path inside the artifact directory ("" when it is)."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or PureWindowsPath(name).drive or ".." in p.parts:
        return f"{name!r} must be a path inside the artifact directory (no '..', not absolute)"
    return ""


def label_problem(label: Any) -> str:
    """Why ``label`` cannot be a class label ("" when it can): it ends up in KServe/Triton classification
    strings ``score:index:label`` and one-per-line labels.txt, so no ':' and no control characters."""
    if not isinstance(label, str):
        return f"label {label!r} is not a string"
    if ":" in label or _CONTROL & set(label) or len(label) > 1000:
        return f"label {label[:60]!r} contains ':' or a control character (newline, tab, ...) or is over 1000 chars"
    return ""


def field_problems(art: ModelArtifact) -> list[str]:
    """Every field checked for type and range (model.json is read from disk: trust nothing in it)."""
    pp, bad = art.preprocess, []
    checks = [
        (isinstance(art.name, str) and 0 < len(art.name) <= 200 and not _CONTROL & set(art.name),
         "name: a string of 1-200 printable characters"),
        (isinstance(art.architecture, dict), "architecture: an object"),
        (_is_int(art.img_size, 1, 8192), "img_size: an integer 1..8192"),
        (_is_int(art.num_classes, 1, 1_000_000), "num_classes: an integer 1..1e6"),
        (isinstance(art.labels, list), "labels: a list of strings"),
        (isinstance(art.onnx_sha256, str) and (not art.onnx_sha256 or _is_hex64(art.onnx_sha256)),
         "onnx_sha256: 64 hex digits"),
        (_is_int(art.opset, 1, 100), "opset: an integer"),
        (isinstance(art.input_name, str) and isinstance(art.output_name, str), "input_name/output_name: strings"),
        (isinstance(art.rpe_plugin, bool), "rpe_plugin: true/false"),
        (all(isinstance(x, dict) for x in (art.versions, art.parity, art.engines)),
         "versions/parity/engines: objects"),
        (_is_int(pp.resize, 1, 8192) and _is_int(pp.crop, 1, 8192), "preprocess.resize/crop: integers 1..8192"),
        (pp.interpolation in INTERPOLATIONS, f"preprocess.interpolation: one of {', '.join(INTERPOLATIONS)}"),
        (_is_real_list(pp.mean) and _is_real_list(pp.std) and all(x != 0 for x in pp.std),
         "preprocess.mean/std: 1 or 3 finite numbers, std non-zero"),
        (pp.invert in INVERT, f"preprocess.invert: one of {', '.join(INVERT)}"),
        (isinstance(pp.grayscale, bool), "preprocess.grayscale: true/false"),
    ]
    bad += [msg for ok, msg in checks if not ok]
    if isinstance(art.labels, list):
        bad += [p for p in (label_problem(x) for x in art.labels) if p][:3]
    if (p := relative_name_problem(art.onnx_file)):
        bad.append(f"onnx_file: {p}")
    if isinstance(art.engines, dict) and all(isinstance(e, dict) for e in art.engines.values()):
        bad += [f"engines.{role} file: {p}" for role, (name, _) in art.files().items()
                if role != "onnx" and (p := relative_name_problem(name))]
    else:
        bad.append("engines: an object of objects")
    return bad


def _is_hex64(v: str) -> bool:
    return len(v) == 64 and all(c in "0123456789abcdef" for c in v.lower())


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_artifact(art: ModelArtifact, directory: str | Path) -> Path:
    """Write model.json into ``directory`` (the ONNX file must already be there)."""
    problems = art.problems()
    if problems:
        raise ArtifactError(f"cannot write model.json: {'; '.join(problems[:8])}; fix these values (e.g. rename "
                            "the class names in the checkpoint) and export again")
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
    if verify_checksum:
        if not art.onnx_sha256:
            raise ArtifactError(f"{path}: onnx_sha256 is empty, so {onnx_path.name} cannot be verified; "
                                "re-run `irpe export` (or set it to the file's sha256)")
        for role, (name, digest) in art.files().items():
            verify_file(directory / name, digest, path, required=role == "onnx")
        refuse_external_data(onnx_path)
    return art


def refuse_external_data(onnx_path: Path) -> None:
    """ArtifactError when the ONNX file keeps tensors in other files (see :mod:`.onnx_scan`): only the
    checksummed .onnx is verified, and runtimes keep external data mapped, so it could change unchecked."""
    try:
        external = external_tensors(onnx_path)
    except TooDeep as e:
        raise ArtifactError(f"{onnx_path}: {e}; re-run `irpe export`") from None
    if external:
        where = ", ".join(f"{t.name!r} in {t.location or '(no location)'!r}" for t in external[:3])
        raise ArtifactError(f"{onnx_path}: {len(external)} tensor(s) kept outside the file as ONNX external data "
                            f"({where}{', ...' if len(external) > 3 else ''}), which is refused: an artifact is one "
                            "checksummed .onnx and runtimes map external data files, so a later write would change "
                            "a loaded model unchecked; save the data inside the file (onnx.save(onnx.load(path), "
                            "path), models under 2 GB) or re-run `irpe export`")


def verify_file(file: Path, digest: str, source: Path, required: bool = True) -> None:
    """ArtifactError unless ``file`` (when it exists, or always if ``required``) has sha256 ``digest``;
    a file without a recorded digest is refused, so nothing unverified is ever loaded."""
    if not file.is_file():
        if required:
            raise ArtifactError(f"{file}: not found (named by {source}); re-run `irpe export`")
        return
    if not digest:
        raise ArtifactError(f"{source}: no sha256 recorded for {file.name}, so it cannot be verified; "
                            "re-run `irpe export`")
    if file_sha256(file) != digest:
        raise ArtifactError(f"{file}: sha256 differs from {source} (file changed or corrupt); "
                            "re-run `irpe export` or restore the file")
