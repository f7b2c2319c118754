"""A tiny digits-shaped iRPE checkpoint made in a second (random weights) and its int8 export."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from irpe.export import ExportOptions, export_artifact
from irpe.export.bench import random_model

MICRO = "deit_micro_patch4_32_ctx_product_shared_k"
DIGITS_PP = {"resize": 32, "crop": 32, "interpolation": "bilinear", "mean": [0.2, 0.2, 0.2],
             "std": [0.3, 0.3, 0.3], "invert": "auto", "grayscale": True}


def digits_arrays(n: int = 400, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """(images (n, 3, 32, 32) through the serving transform, labels) from scikit-learn's digits."""
    from irpe.artifact import Preprocess
    from irpe.artifact.preprocess import preprocess_image
    from irpe.training.digits import digit_image, split_digits

    x_tr, x_va, y_tr, y_va = split_digits()
    x, y = (x_tr, y_tr) if split == "train" else (x_va, y_va)
    pp = Preprocess(**{k: tuple(v) if isinstance(v, list) else v for k, v in DIGITS_PP.items()})
    return np.stack([preprocess_image(digit_image(d), pp) for d in x[:n]]).astype(np.float32), y[:n]


def digits_checkpoint(path: Path) -> Path:
    """A random-weight micro iRPE checkpoint with the digits preprocessing (non-zero biases, like a trained one)."""
    model = random_model(MICRO, img_size=32, rpe_std=0.5)
    with torch.no_grad():  # trained models have non-zero biases (all-zero ones trip OpenVINO 2026.4's
        for key, p in model.named_parameters():  # int8 Reshape transformation on this 65-token micro model)
            if key.endswith("bias") and "norm" not in key:
                p.normal_(0.0, 0.02)
    torch.save({"model": model.state_dict(), "class_names": [str(i) for i in range(10)],
                "preprocess": DIGITS_PP, "args": argparse.Namespace(model=MICRO, overrides={})}, path)
    return path


#: A random-weight model has near-tied logits on many images, so top-1 flips under tiny noise: the floors
#: on top-1 and accuracy are relaxed for it (cosine keeps the default 0.99); a trained digits model (4 epochs)
#: measured 100% int8 top-1 agreement and no accuracy change with the defaults.
RANDOM_MODEL_FLOORS = {"top1_agreement": 0.9, "accuracy_drop": 0.03}


def export_int8(ckpt: Path, out: Path, **kw: object) -> Path:
    """--int8 --calibration digits export (small calibration set, every validation image held out)."""
    options = ExportOptions(progress=False, int8=True, calibration="digits",
                            calibration_options={"calibration_size": 32, "floors": RANDOM_MODEL_FLOORS, **kw})
    return export_artifact(ckpt, out, options)
