"""Parity of an exported graph with the PyTorch model: random inputs at several batch sizes and photographs.

Deterministic by construction, so one checkpoint passes or fails the same way on every run:
* ONNX Runtime runs single-threaded: a multi-threaded reduction may add in an order that depends on the thread
  schedule, and a check that passes must pass on every run.
* The reference is PyTorch in float64 (a copy of the model), so the measured difference is the exported
  graph's own float32 (or float16) rounding, not the sum of two float32 errors.
* The bound scales with the logits: |ort - ref| <= atol + rtol * max|ref| over every input of the check.
  fp32: atol 1e-5, rtol 1e-4 (measured on DeiT-S QKV: 1e-6 at max|logit| 1.4, about 1/100 of the bound);
  fp16: atol 1e-3, rtol 1e-2, and the photographs' top-1 must agree.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from irpe.artifact import Preprocess


@dataclass(frozen=True)
class Tolerance:
    """|exported - reference| <= atol + rtol * max|reference logit|."""

    atol: float
    rtol: float

    def bound(self, logit_scale: float) -> float:
        return self.atol + self.rtol * logit_scale


FP32_TOLERANCE = Tolerance(atol=1e-5, rtol=1e-4)
FP16_TOLERANCE = Tolerance(atol=1e-3, rtol=1e-2)
SAMPLE_IMAGES = ("astronaut", "chelsea", "coffee")
RANDOM_BATCHES = (1, 3)


class ParityError(ValueError):
    """The exported graph's logits differ from PyTorch's by more than the tolerance."""


def sample_images(preprocess: Preprocess, names: tuple[str, ...] = SAMPLE_IMAGES) -> np.ndarray:
    """scikit-image's bundled photographs through the artifact's preprocessing, (len(names), 3, S, S)."""
    from PIL import Image
    from skimage import data

    from irpe.artifact.preprocess import preprocess_image  # Pillow: imported only where photographs are read

    arrays = []
    for name in names:
        img = getattr(data, name)()
        arrays.append(preprocess_image(Image.fromarray(img), preprocess))
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


def reference_model(model: nn.Module) -> nn.Module:
    """A float64 copy of ``model`` in eval mode (the parity reference; ``model`` is left untouched)."""
    return copy.deepcopy(model).double().eval()


def _compare(ref_model: nn.Module, session: Any, x: np.ndarray) -> tuple[float, float, bool]:
    """(max abs logit diff, max |reference logit|, top-1 equal for every row) of ONNX Runtime vs PyTorch."""
    with torch.no_grad():
        ref = ref_model(torch.from_numpy(x).double()).numpy()
    out = session.run(["logits"], {"images": x})[0]
    if out.shape != ref.shape:
        raise ParityError(f"exported graph returns logits of shape {out.shape}, PyTorch {ref.shape}")
    diff = float(np.abs(out.astype(np.float64) - ref).max())
    return diff, float(np.abs(ref).max()), bool((out.argmax(1) == ref.argmax(1)).all())


def check_parity(model: nn.Module, onnx_path: str | Path, preprocess: Preprocess, *, fp16: bool = False,
                 rpe_plugin: bool = False, seed: int = 0, session: Any = None) -> dict[str, Any]:
    """Compare logits on random inputs (batches 1 and 3) and on photographs; raise ParityError on failure."""
    session = session or ort_session(onnx_path, rpe_plugin=rpe_plugin, threads=1)
    tol = FP16_TOLERANCE if fp16 else FP32_TOLERANCE
    ref_model = reference_model(model)
    size = model.cfg.img_size
    rng = np.random.default_rng(seed)
    random = [_compare(ref_model, session, rng.standard_normal((b, 3, size, size), dtype=np.float32))
              for b in RANDOM_BATCHES]
    image_diff, image_scale, image_top1 = _compare(ref_model, session, sample_images(preprocess))
    random_diff = max(r[0] for r in random)
    worst = max(random_diff, image_diff)
    scale = max([r[1] for r in random] + [image_scale])
    bound = tol.bound(scale)
    report = {"precision": "fp16" if fp16 else "fp32", "tolerance": bound, "atol": tol.atol, "rtol": tol.rtol,
              "logit_scale": scale, "max_abs_diff": worst, "reference": "pytorch-float64",
              "random": {"batches": list(RANDOM_BATCHES), "max_abs_diff": random_diff,
                         "top1_equal": all(r[2] for r in random)},
              "images": {"names": list(SAMPLE_IMAGES), "max_abs_diff": image_diff, "top1_equal": image_top1},
              "runtime": "onnxruntime-cpu-1thread" + ("+irpe-custom-ops" if rpe_plugin else ""),
              "passed": worst <= bound and (image_top1 or not fp16)}
    if not report["passed"]:
        why = (f"max abs logit diff {worst:.3g} exceeds the {report['precision']} tolerance {bound:.3g} "
               f"(= {tol.atol:g} + {tol.rtol:g} x max|logit| {scale:.3g}) by {worst - bound:.3g}"
               if worst > bound else "top-1 class differs on the sample photographs")
        raise ParityError(f"parity check failed: {why} (random inputs {random_diff:.3g}, "
                          f"photographs {image_diff:.3g}); the export was not accepted")
    return report


def check_ort_ops(model: nn.Module, onnx_path: str | Path, preprocess: Preprocess) -> dict[str, Any] | None:
    """Parity of the graph the server's ONNX Runtime engine runs on a CPU (:mod:`irpe.artifact.ort_graph`: the
    iRPE lookups as irpe.ort custom ops), as :func:`check_parity` checks the file; None when that graph is the
    file itself (no lookups, or the custom-op library is not built)."""
    import onnxruntime as ort

    from irpe.artifact.ort_graph import prepare

    source, library = prepare(onnx_path)
    if library is None:
        return None
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 1, 3
    so.register_custom_ops_library(library)
    session = ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    try:
        report = check_parity(model, onnx_path, preprocess, session=session)
    except ParityError as e:
        raise ParityError(f"{e}, on the graph with the irpe.ort custom ops that `irpe serve` runs on ONNX Runtime "
                          "(a bug: please report it; IRPE_ORT_OPS=0 serves the file as exported)") from None
    return {"runtime": "onnxruntime-cpu-1thread+irpe.ort", "max_abs_diff": report["max_abs_diff"],
            "passed": report["passed"]}


def format_report(report: dict[str, Any]) -> str:
    """One line for the terminal."""
    return (f"parity ({report['runtime']}, {report['precision']}): max |logit diff| "
            f"{report['max_abs_diff']:.2e} <= {report['tolerance']:.2e} "
            f"(= {report['atol']:g} + {report['rtol']:g} x max|logit| {report['logit_scale']:.3g}; "
            f"random {report['random']['max_abs_diff']:.2e}, photographs {report['images']['max_abs_diff']:.2e}, "
            f"top-1 equal: {report['images']['top1_equal']})"
            + (f"; with the irpe.ort custom ops {report['irpe_ort_ops']['max_abs_diff']:.2e}"
               if "irpe_ort_ops" in report else ""))
