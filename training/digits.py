"""The builtin ``digits`` dataset: scikit-learn's 8x8 digits, rendered and fitted by the serving transform.

Contract (stored in the checkpoint and model.json): ``fit="ink"`` (the ink's bounding square, any
polarity, colour, size or margin, resized bilinearly to the model's input; see
:func:`irpe.artifact.preprocess.fit_ink`), mean/std of the training pixels. Validation tensors are
``preprocess_image`` of the plain 8 px rendering of each held-out digit. Training samples, per epoch,
either that plain rendering or one of ``VARIANTS`` pre-rendered image files drawn from
:func:`irpe.training.renderings.training_rendering` (sizes, filters, JPEG, colours, strokes, margins,
rotations), each through ``preprocess_image``, plus a small random affine.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from irpe.artifact.preprocess import preprocess_image
from irpe.artifact.schema import Preprocess

from .data import DataBundle, normalize, unnormalized
from .renderings import MAX_VALUE, decoded, digit_image, split_digits, training_rendering

__all__ = ["CLASS_NAMES", "MAX_VALUE", "DigitsDataset", "digit_image", "digits_bundle", "digits_preprocess",
           "pixels01", "random_affine", "rendered_variants", "split_digits"]

CLASS_NAMES = [str(i) for i in range(10)]
VARIANTS = 8  # pre-rendered training renderings per digit
PLAIN_SHARE = 0.25  # share of training samples that use the plain rendering


def digits_preprocess(img_size: int = 32, mean: float = 0.0, std: float = 1.0) -> Preprocess:
    """The serving transform of the digits model."""
    return Preprocess(resize=img_size, crop=img_size, interpolation="bilinear", mean=(mean,) * 3,
                      std=(std,) * 3, invert="never", grayscale=True, fit="ink", fit_size=12)


def pixels01(images: np.ndarray, pp: Preprocess) -> torch.Tensor:
    """(N, 1, S, S) [0, 1] tensors: preprocess_image of each plain 8 px digit with mean 0 / std 1."""
    raw = unnormalized(pp)
    return torch.from_numpy(np.stack([preprocess_image(digit_image(x), raw)[:1] for x in images]))


def rendered_variants(images: np.ndarray, pp: Preprocess, variants: int = VARIANTS, seed: int = 0) -> torch.Tensor:
    """(variants, N, 1, S, S) [0, 1]: each digit as ``variants`` random training renderings (decoded
    image files, JPEG artefacts included), through preprocess_image."""
    raw, rng = unnormalized(pp), np.random.default_rng([seed, 8])
    out = np.empty((variants, len(images), 1, pp.crop, pp.crop), dtype=np.float32)
    for v in range(variants):
        for n, x in enumerate(images):
            out[v, n] = preprocess_image(decoded(x, training_rendering(rng)), raw)[:1]
    return torch.from_numpy(out)


class DigitsDataset(Dataset):
    """Pre-rendered digits; ``augment`` picks a rendering and a random affine from torch's global RNG."""

    def __init__(self, pixels: torch.Tensor, labels: np.ndarray, pp: Preprocess, augment: bool,
                 variants: torch.Tensor | None = None) -> None:
        self.pixels, self.labels, self.variants = pixels, [int(y) for y in labels], variants
        self.pp, self.augment = pp, augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = self.pixels[index]
        if self.augment:
            if self.variants is not None and float(torch.rand(1)) >= PLAIN_SHARE:
                x = self.variants[int(torch.randint(len(self.variants), (1,))), index]
            x = random_affine(x)
        return normalize(x.expand(3, -1, -1), self.pp), self.labels[index]


def random_affine(x: torch.Tensor, degrees: float = 8.0, shift: float = 0.04,
                  scale: tuple[float, float] = (0.92, 1.08), shear: float = 0.15) -> torch.Tensor:
    """Rotate by up to ``degrees``, slant (horizontal shear up to ``shear``: handwriting leans), shift by up
    to ``shift`` of the side, rescale; zero (ink-free) fill."""
    angle = math.radians(float(torch.empty(1).uniform_(-degrees, degrees)))
    s = float(torch.empty(1).uniform_(*scale))
    tx, ty = (float(t) for t in torch.empty(2).uniform_(-2 * shift, 2 * shift))
    k = float(torch.empty(1).uniform_(-shear, shear))
    cos, sin = math.cos(angle) / s, math.sin(angle) / s
    theta = torch.tensor([[[cos, cos * k - sin, tx], [sin, sin * k + cos, ty]]], dtype=torch.float32)
    grid = F.affine_grid(theta, [1, *x.shape], align_corners=False)
    return F.grid_sample(x[None], grid, mode="bilinear", padding_mode="zeros", align_corners=False)[0]


def digits_bundle(img_size: int = 32) -> DataBundle:
    """Train (augmented) and val splits, with the preprocess dict normalised by the train pixels."""
    x_tr, x_va, y_tr, y_va = split_digits()
    base = digits_preprocess(img_size)
    train_px, val_px = pixels01(x_tr, base), pixels01(x_va, base)
    variants = rendered_variants(x_tr, base)
    mean, std = float(variants.mean()), float(variants.std())
    pp = digits_preprocess(img_size, round(mean, 4), round(std, 4))
    return DataBundle(DigitsDataset(train_px, y_tr, pp, augment=True, variants=variants),
                      DigitsDataset(val_px, y_va, pp, augment=False), list(CLASS_NAMES), pp)
