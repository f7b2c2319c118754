"""Parity of an exported graph with the PyTorch model: random inputs at several batch sizes and photographs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from irpe.artifact import Preprocess
from irpe.artifact.preprocess import preprocess_image

FP32_TOLERANCE = 1e-4
FP16_TOLERANCE = 2e-2
SAMPLE_IMAGES = ("astronaut", "chelsea", "coffee")
RANDOM_BATCHES = (1, 3)


class ParityError(ValueError):
    """The exported graph's logits differ from PyTorch's by more than the tolerance."""


def sample_images(pp: Preprocess, names: tuple[str, ...] = SAMPLE_IMAGES) -> np.ndarray:
    """scikit-image's bundled photographs through the artifact's preprocessing, (len(names), 3, S, S)."""
    from PIL import Image
    from skimage import data

    arrays = []
    for name in names:
        img = getattr(data, name)()
        arrays.append(preprocess_image(Image.fromarray(img), pp))
    return np.stack(arrays)


def ort_session(onnx_path: str | Path, *, rpe_plugin: bool = False, threads: int = 0) -> Any:
    """A CPU InferenceSession; plugin graphs run through the irpe custom ops for ONNX Runtime."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    if rpe_plugin:
        from irpe.plugins.ort_op import session_for_plugin_graph

        return session_for_plugin_graph(str(onnx_path), sess_options=so)
    return ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])


def _compare(model: nn.Module, session: Any, x: np.ndarray) -> tuple[float, bool]:
    """(max abs logit diff, top-1 equal for every row) of ONNX Runtime vs PyTorch on ``x``."""
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    out = session.run(["logits"], {"images": x})[0]
    if out.shape != ref.shape:
        raise ParityError(f"exported graph returns logits of shape {out.shape}, PyTorch {ref.shape}")
    return float(np.abs(out - ref).max()), bool((out.argmax(1) == ref.argmax(1)).all())


def check_parity(model: nn.Module, onnx_path: str | Path, pp: Preprocess, *, fp16: bool = False,
                 rpe_plugin: bool = False, seed: int = 0, session: Any = None) -> dict[str, Any]:
    """Compare logits on random inputs (batches 1 and 3) and on photographs; raise ParityError on failure."""
    session = session or ort_session(onnx_path, rpe_plugin=rpe_plugin)
    tol = FP16_TOLERANCE if fp16 else FP32_TOLERANCE
    size = model.cfg.img_size
    rng = np.random.default_rng(seed)
    random_diffs, random_top1 = [], True
    for batch in RANDOM_BATCHES:
        diff, same = _compare(model, session, rng.standard_normal((batch, 3, size, size), dtype=np.float32))
        random_diffs.append(diff)
        random_top1 &= same
    image_diff, image_top1 = _compare(model, session, sample_images(pp))
    worst = max(random_diffs + [image_diff])
    report = {"precision": "fp16" if fp16 else "fp32", "tolerance": tol, "max_abs_diff": worst,
              "random": {"batches": list(RANDOM_BATCHES), "max_abs_diff": max(random_diffs),
                         "top1_equal": random_top1},
              "images": {"names": list(SAMPLE_IMAGES), "max_abs_diff": image_diff, "top1_equal": image_top1},
              "runtime": "onnxruntime-cpu" + ("+irpe-custom-ops" if rpe_plugin else ""),
              "passed": worst <= tol and (image_top1 or not fp16)}
    if not report["passed"]:
        why = (f"max abs logit diff {worst:.3g} exceeds the {report['precision']} tolerance {tol:g} "
               f"by {worst - tol:.3g}" if worst > tol else "top-1 class differs on the sample photographs")
        raise ParityError(f"parity check failed: {why} (random inputs {max(random_diffs):.3g}, "
                          f"photographs {image_diff:.3g}); the export was not accepted")
    return report


def format_report(report: dict[str, Any]) -> str:
    """One line for the terminal."""
    return (f"parity ({report['runtime']}, {report['precision']}): max |logit diff| "
            f"{report['max_abs_diff']:.2e} <= {report['tolerance']:g} "
            f"(random {report['random']['max_abs_diff']:.2e}, photographs {report['images']['max_abs_diff']:.2e}, "
            f"top-1 equal: {report['images']['top1_equal']})")
