"""Calibration / held-out image sets and the fidelity reports of int8 and bf16 against fp32.

``digits`` calibrates on the training split of scikit-learn's digits and measures on the validation split
(never trained or calibrated on), with labels, so the report has the accuracy change. A directory of images
(recursively; a class sub-folder named like a model label gives that image a label) is shuffled with a fixed
seed and split: the first ``--calibration-size`` images calibrate, the next ``heldout`` are held out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from irpe.artifact import ModelArtifact

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")
#: Default floors (override with --min-top1 / --min-cosine / --max-accuracy-drop): the issue's targets.
THRESHOLDS = {"int8": {"top1_agreement": 0.99, "cosine_mean": 0.99, "accuracy_drop": 0.003},
              "bf16": {"top1_agreement": 0.99, "cosine_mean": 0.999, "accuracy_drop": 0.001}}


class FidelityError(ValueError):
    """A quantized/bf16 model is below the fidelity floor; the message says by how much and how to override."""


@dataclass
class ImageSets:
    """Preprocessed (N, 3, S, S) calibration and held-out images; held-out labels (-1 = unknown)."""

    calibration: np.ndarray
    heldout: np.ndarray
    labels: np.ndarray
    source: str


def image_sets(spec: str, artifact: ModelArtifact, *, calibration_size: int = 64, heldout: int = 400,
               seed: int = 0) -> ImageSets:
    """The calibration and held-out sets named by ``--calibration`` (``digits`` or a directory)."""
    if calibration_size < 1 or heldout < 1:
        raise ValueError("--calibration-size and the held-out size must be >= 1")
    if spec == "digits":
        return _digits(artifact, calibration_size, heldout, seed)
    root = Path(spec)
    if not root.is_dir():
        raise ValueError(f"--calibration {spec}: not a directory; pass a directory of images or 'digits'")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if len(files) < 2:
        raise ValueError(f"--calibration {spec}: found {len(files)} image(s); need at least 2 (one to calibrate, "
                         "one held out), better a few hundred")
    random.Random(seed).shuffle(files)
    n_cal = min(calibration_size, len(files) - 1)
    cal, held = files[:n_cal], files[n_cal:n_cal + heldout]
    index = {name: i for i, name in enumerate(artifact.labels)}
    labels = np.array([index.get(p.parent.name, -1) for p in held], dtype=np.int64)
    return ImageSets(_load(cal, artifact), _load(held, artifact), labels, f"{root} ({n_cal} calibration / {len(held)} "
                     "held-out images)")


def _load(files: list[Path], artifact: ModelArtifact) -> np.ndarray:
    from PIL import Image

    from irpe.artifact.preprocess import preprocess_image

    out = []
    for path in files:
        try:
            with Image.open(path) as img:
                out.append(preprocess_image(img, artifact.preprocess))
        except OSError as e:
            raise ValueError(f"{path}: cannot read it as an image ({e}); remove it from the calibration "
                             "directory") from None
    return np.stack(out).astype(np.float32)


def _digits(artifact: ModelArtifact, calibration_size: int, heldout: int, seed: int) -> ImageSets:
    try:
        from irpe.training.digits import digit_image, split_digits
    except ImportError as e:
        raise ValueError(f"--calibration digits needs scikit-learn ({e}); pip install '.[train]' from the irpe-deploy "
                         "checkout's root") from None
    from irpe.artifact.preprocess import preprocess_image

    x_tr, x_va, _, y_va = split_digits()
    pick = np.random.default_rng(seed).permutation(len(x_tr))[:calibration_size]
    cal = np.stack([preprocess_image(digit_image(x_tr[i]), artifact.preprocess) for i in pick])
    held = np.stack([preprocess_image(digit_image(x), artifact.preprocess) for x in x_va[:heldout]])
    labels = y_va[:heldout].astype(np.int64) if artifact.num_classes == 10 else np.full(len(held), -1)
    return ImageSets(cal.astype(np.float32), held.astype(np.float32), labels,
                     f"digits (training split: {len(cal)} calibration; validation split: {len(held)} held-out)")


def compare(ref: np.ndarray, out: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """Top-1 agreement, logit cosine (mean, min), max |d logit|, and accuracies where labels are known."""
    ref, out = ref.astype(np.float64), out.astype(np.float64)
    cos = (ref * out).sum(1) / np.maximum(np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1), 1e-30)
    report: dict[str, Any] = {"images": int(len(ref)),
                              "top1_agreement": float((ref.argmax(1) == out.argmax(1)).mean()),
                              "cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()),
                              "max_abs_logit_diff": float(np.abs(ref - out).max())}
    known = labels >= 0
    if known.any():
        acc_ref = float((ref[known].argmax(1) == labels[known]).mean())
        acc_out = float((out[known].argmax(1) == labels[known]).mean())
        report.update(labelled=int(known.sum()), accuracy_fp32=acc_ref, accuracy=acc_out,
                      accuracy_drop=acc_ref - acc_out)
    return report


def enforce(kind: str, report: dict[str, Any], floors: dict[str, float]) -> dict[str, Any]:
    """Record the floors and ``passed`` in ``report``; FidelityError naming each gap when below."""
    floors = {**THRESHOLDS[kind], **{k: v for k, v in floors.items() if v is not None}}
    gaps = []
    for key in ("top1_agreement", "cosine_mean"):
        if report[key] < floors[key]:
            gaps.append(f"{key} {report[key]:.4f} < {floors[key]:g} (short by {floors[key] - report[key]:.4f})")
    drop, limit = report.get("accuracy_drop", 0.0), floors["accuracy_drop"]
    if drop > limit:
        gaps.append(f"accuracy drop {100 * drop:.2f} points > {100 * limit:.2f} (over by {100 * (drop - limit):.2f})")
    report.update(thresholds=floors, passed=not gaps)
    if gaps and kind == "int8":
        raise FidelityError(f"int8 fidelity on {report['images']} held-out images is below the floor: "
                            f"{'; '.join(gaps)}. Calibrate on more representative images (--calibration, "
                            "--calibration-size), or accept it with --min-top1 / --min-cosine / --max-accuracy-drop")
    return report


def run_logits(onnx_path: str | Path, x: np.ndarray, *, runtime: str = "onnxruntime", precision: str = "fp32",
               batch: int = 16) -> np.ndarray:
    """Logits of ``x`` from ONNX Runtime (fp32 float parts) or OpenVINO (``precision`` fp32/bf16)."""
    if runtime == "onnxruntime":
        from .parity import ort_session

        sess = ort_session(onnx_path)
        return np.concatenate([sess.run(["logits"], {"images": x[i:i + batch]})[0] for i in range(0, len(x), batch)])
    compiled = openvino_compiled(onnx_path, precision)
    req, port = compiled.create_infer_request(), compiled.output(0)
    return np.concatenate([np.array(req.infer({"images": x[i:i + batch]})[port]) for i in range(0, len(x), batch)])


def openvino_compiled(onnx_path: str | Path, precision: str) -> Any:
    """OpenVINO CPU CompiledModel of ``onnx_path`` with float parts in ``precision`` (fp32 or bf16), read as the
    server reads it."""
    import openvino as ov

    from irpe.artifact.openvino_graph import read_model

    core = ov.Core()
    model = read_model(core, onnx_path)  # the graph the server's OpenVINO engine runs
    hint = "bf16" if precision == "bf16" else "f32"
    return core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"})


def openvino_available() -> bool:
    """OpenVINO is installed (the ``[cpu]`` extra)."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def openvino_bf16() -> bool:
    """OpenVINO is installed and this CPU runs bf16 natively."""
    try:
        import openvino as ov
    except ImportError:
        return False
    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def format_report(kind: str, report: dict[str, Any]) -> str:
    """One line for the terminal."""
    acc = (f", accuracy {100 * report['accuracy_fp32']:.2f}% -> {100 * report['accuracy']:.2f}%"
           if "accuracy" in report else "")
    return (f"{kind} fidelity ({report.get('runtime', '?')}, {report['images']} held-out images): top-1 agreement "
            f"{100 * report['top1_agreement']:.2f}%, logit cosine {report['cosine_mean']:.5f} (min "
            f"{report['cosine_min']:.5f}), max |d logit| {report['max_abs_logit_diff']:.3g}{acc}"
            f"{'' if report.get('passed', True) else ' - BELOW THE FLOOR'}")
