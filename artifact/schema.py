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
from typing import Any, Literal, get_args

from .onnx_scan import LISTED, TooDeep, external_tensors

ARTIFACT_FORMAT_VERSION = 1
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: The resampling filter of the resize (and of the ink fit).
Interpolation = Literal["bicubic", "bilinear", "nearest"]
#: "never", "always", or "auto": invert when the border is brighter than the centre.
InvertMode = Literal["never", "always", "auto"]
#: "none": resize and center crop; "ink": the ink-box transform for drawings.
FitMode = Literal["none", "ink"]

INTERPOLATIONS: tuple[Interpolation, ...] = get_args(Interpolation)
INVERT: tuple[InvertMode, ...] = get_args(InvertMode)
FIT_MODES: tuple[FitMode, ...] = get_args(FitMode)


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
    interpolation: Interpolation = "bicubic"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    invert: InvertMode = "never"
    grayscale: bool = False
    fit: FitMode = "none"
    fit_size: int = 0

    @classmethod
    def for_imagenet(cls, img_size: int = 224) -> Preprocess:
        """The DeiT evaluation transform: resize to int(256/224 * size), crop size."""
        return cls(resize=int(256 / 224 * img_size), crop=img_size)


@dataclass
class ModelArtifact:
    """The parsed contents of model.json.

    Attributes:
        name: the model's name as served (1-200 printable characters).
        architecture: the model's hyper-parameters as exported (``ViTConfig`` fields, informative).
        img_size: the side of the square input, in pixels.
        num_classes: the length of the logits.
        preprocess: the evaluation transform from a decoded image to the input (:class:`Preprocess`).
        labels: one class name per logit (no ':' and no control characters).
        onnx_file: the ONNX graph, relative to the artifact directory.
        onnx_sha256: its sha256 (hex), checked on load.
        opset: the ONNX opset the graph was written for.
        input_name: the graph's input, (batch, 3, img_size, img_size) float32.
        output_name: the graph's output, (batch, num_classes) logits.
        rpe_plugin: the graph does its iRPE lookups with the custom ``irpe::`` ops (a runtime needs the plugin).
        checkpoint_sha256: the sha256 of the checkpoint it was exported from.
        versions: package versions at export time (torch, onnx, irpe-deploy...).
        parity: the exported graph against the PyTorch reference (tolerance, largest difference, top-1).
        engines: built engines by kind (``tensorrt``...): their ``file`` and ``sha256``, checked on load,
            and their build facts.
        quantization: int8 QDQ export: method, scope, calibration.
        fidelity: the reduced-precision graphs ("int8", "bf16") against fp32 on held-out images.
        training: how a shipped model was trained (command, seed, ...).
        format_version: the model.json format; a newer one than this runtime's is refused.
    """

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
    quantization: dict[str, Any] = field(default_factory=dict)
    fidelity: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    format_version: int = ARTIFACT_FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of model.json (mean and std as lists)."""
        data = asdict(self)
        data["preprocess"]["mean"] = list(self.preprocess.mean)
        data["preprocess"]["std"] = list(self.preprocess.std)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "model.json") -> ModelArtifact:
        """The artifact a model.json object describes; ArtifactError naming ``source`` when it is invalid."""
        known = set(cls.__dataclass_fields__)
        missing = [key for key in ("name", "architecture", "img_size", "num_classes", "preprocess", "labels")
                   if key not in data]
        if missing:
            raise ArtifactError(f"{source}: missing required field(s) {missing}; re-run `irpe export`")
        if data.get("format_version", 1) > ARTIFACT_FORMAT_VERSION:
            raise ArtifactError(f"{source}: format_version {data['format_version']} is newer than this "
                                f"runtime supports ({ARTIFACT_FORMAT_VERSION}); upgrade irpe-deploy")
        kwargs = {key: value for key, value in data.items() if key in known}
        try:
            kwargs["preprocess"] = Preprocess(**data["preprocess"])
            artifact = cls(**kwargs)
        except TypeError as e:
            raise ArtifactError(f"{source}: malformed field ({e}); re-run `irpe export`") from None
        problems = artifact.problems()
        if problems:
            raise ArtifactError(f"{source}: invalid field(s): {'; '.join(problems[:8])}; fix model.json or "
                                "re-run `irpe export`")
        if len(artifact.labels) != artifact.num_classes:
            raise ArtifactError(f"{source}: {len(artifact.labels)} labels for num_classes={artifact.num_classes}; "
                                "fix the labels list or re-export with matching --num-classes")
        return artifact

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


_CONTROL = {chr(c) for c in range(32)} | {"\x7f"}


def _is_int(value: Any, low: int = 1, high: int = 1 << 20) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_real_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) in (1, 3) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value)


def relative_name_problem(name: Any) -> str:
    """Why ``name`` is not a plain relative path inside the artifact directory ("" when it is)."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    posix = PurePosixPath(name.replace("\\", "/"))
    if posix.is_absolute() or PureWindowsPath(name).drive or ".." in posix.parts:
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


def field_problems(artifact: ModelArtifact) -> list[str]:
    """Every field checked for type and range (model.json is read from disk: trust nothing in it)."""
    checks = [
        (isinstance(artifact.name, str) and 0 < len(artifact.name) <= 200 and not _CONTROL & set(artifact.name),
         "name: a string of 1-200 printable characters"),
        (isinstance(artifact.architecture, dict), "architecture: an object"),
        (_is_int(artifact.img_size, 1, 8192), "img_size: an integer 1..8192"),
        (_is_int(artifact.num_classes, 1, 1_000_000), "num_classes: an integer 1..1e6"),
        (isinstance(artifact.labels, list), "labels: a list of strings"),
        (isinstance(artifact.onnx_sha256, str) and (not artifact.onnx_sha256 or _is_hex64(artifact.onnx_sha256)),
         "onnx_sha256: 64 hex digits"),
        (_is_int(artifact.opset, 1, 100), "opset: an integer"),
        (isinstance(artifact.input_name, str) and isinstance(artifact.output_name, str),
         "input_name/output_name: strings"),
        (isinstance(artifact.rpe_plugin, bool), "rpe_plugin: true/false"),
        (all(isinstance(x, dict) for x in (artifact.versions, artifact.parity, artifact.engines)),
         "versions/parity/engines: objects"),
    ]
    bad = [message for ok, message in checks if not ok] + _preprocess_problems(artifact.preprocess)
    if isinstance(artifact.labels, list):
        bad += [problem for problem in (label_problem(label) for label in artifact.labels) if problem][:3]
    if (problem := relative_name_problem(artifact.onnx_file)):
        bad.append(f"onnx_file: {problem}")
    if isinstance(artifact.engines, dict) and all(isinstance(entry, dict) for entry in artifact.engines.values()):
        bad += [f"engines.{role} file: {problem}" for role, (name, _) in artifact.files().items()
                if role != "onnx" and (problem := relative_name_problem(name))]
    else:
        bad.append("engines: an object of objects")
    return bad


def _preprocess_problems(preprocess: Preprocess) -> list[str]:
    checks = [
        (_is_int(preprocess.resize, 1, 8192) and _is_int(preprocess.crop, 1, 8192),
         "preprocess.resize/crop: integers 1..8192"),
        (preprocess.interpolation in INTERPOLATIONS,
         f"preprocess.interpolation: one of {', '.join(INTERPOLATIONS)}"),
        (_is_real_list(preprocess.mean) and _is_real_list(preprocess.std) and all(x != 0 for x in preprocess.std),
         "preprocess.mean/std: 1 or 3 finite numbers, std non-zero"),
        (preprocess.invert in INVERT, f"preprocess.invert: one of {', '.join(INVERT)}"),
        (isinstance(preprocess.grayscale, bool), "preprocess.grayscale: true/false"),
        (preprocess.fit in FIT_MODES, f"preprocess.fit: one of {', '.join(FIT_MODES)}"),
        (_is_int(preprocess.fit_size, 0, 8192), "preprocess.fit_size: an integer 0..8192"),
    ]
    return [message for ok, message in checks if not ok]


def _is_hex64(v: str) -> bool:
    return len(v) == 64 and all(c in "0123456789abcdef" for c in v.lower())


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file, read in 1 MiB chunks.

    Args:
        path: the file.

    Returns:
        The digest as 64 lowercase hex digits.

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_artifact(artifact: ModelArtifact, directory: str | Path) -> Path:
    """Write model.json into an artifact directory.

    Args:
        artifact: what model.json says; its checksums are written as they are (compute them with
            :func:`file_sha256` once the files are in place).
        directory: the artifact directory; it exists and holds the files model.json names.

    Returns:
        The path of the model.json written (replacing any earlier one).

    Raises:
        ArtifactError: a field is invalid (:meth:`ModelArtifact.problems`); nothing is written.
    """
    problems = artifact.problems()
    if problems:
        raise ArtifactError(f"cannot write model.json: {'; '.join(problems[:8])}; fix these values (e.g. rename "
                            "the class names in the checkpoint) and export again")
    path = Path(directory) / "model.json"
    path.write_text(json.dumps(artifact.to_dict(), indent=2) + "\n")
    return path


def load_artifact(directory: str | Path, verify_checksum: bool = True) -> ModelArtifact:
    """Read and validate an artifact directory's model.json.

    Args:
        directory: a directory written by ``irpe export``.
        verify_checksum: check the sha256 of the ONNX file and of every engine file present, and refuse
            ONNX external data; False only checks that the ONNX file exists.

    Returns:
        The validated :class:`ModelArtifact`.

    Raises:
        ArtifactError: model.json is missing, not JSON, or has invalid fields; the ONNX file is missing; or,
            when verifying, a checksum is empty or differs, or the ONNX file keeps tensors in other files.
    """
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
    artifact = ModelArtifact.from_dict(data, source=str(path))
    onnx_path = directory / artifact.onnx_file
    if not onnx_path.is_file():
        raise ArtifactError(f"{onnx_path}: not found (named by {path}); re-run `irpe export`")
    if verify_checksum:
        if not artifact.onnx_sha256:
            raise ArtifactError(f"{path}: onnx_sha256 is empty, so {onnx_path.name} cannot be verified; "
                                "re-run `irpe export` (or set it to the file's sha256)")
        for role, (name, digest) in artifact.files().items():
            verify_file(directory / name, digest, path, required=role == "onnx")
        refuse_external_data(onnx_path)
    return artifact


def refuse_external_data(onnx_path: Path) -> None:
    """ArtifactError when the ONNX file keeps tensors in other files (see :mod:`.onnx_scan`): only the
    checksummed .onnx is verified, and runtimes keep external data mapped, so it could change unchecked."""
    try:
        external = external_tensors(onnx_path)
    except TooDeep as e:
        raise ArtifactError(f"{onnx_path}: {e}; re-run `irpe export`") from None
    if external:
        where = ", ".join(f"{t.name!r} in {t.location or '(no location)'!r}" for t in external[:3])
        count = f"{LISTED} or more" if len(external) >= LISTED else str(len(external))
        raise ArtifactError(f"{onnx_path}: {count} tensor(s) kept outside the file as ONNX external data "
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
