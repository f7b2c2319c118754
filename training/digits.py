"""The builtin ``digits`` dataset: scikit-learn's 8x8 digits, upsampled through the serving transform.

Contract (stored in the checkpoint and model.json): grayscale, resize/crop to the model's input with
bilinear interpolation, ``invert="auto"`` (dark-on-light drawings are flipped to the dataset's
light-on-dark style), mean/std of the training pixels. Training tensors are ``preprocess_image`` of the
PNG-equivalent rendering of each digit, plus a small random affine (shift, rotation, scale).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset

from irpe.artifact.preprocess import preprocess_image
from irpe.artifact.schema import Preprocess

from .data import DataBundle, normalize, unnormalized

CLASS_NAMES = [str(i) for i in range(10)]
MAX_VALUE = 16.0


def digit_image(pixels: np.ndarray, dark_on_light: bool = False) -> Image.Image:
    """An (8, 8) digits sample (0..16, light ink on dark) as an 8-bit grayscale PIL image."""
    v = np.rint(np.asarray(pixels, dtype=np.float64).reshape(8, 8) * (255.0 / MAX_VALUE)).astype(np.uint8)
    return Image.fromarray(255 - v if dark_on_light else v, mode="L")


def split_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, x_val, y_train, y_val) with x as (N, 8, 8) float arrays; the issue's fixed split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    ds = load_digits()
    x_tr, x_va, y_tr, y_va = train_test_split(ds.images, ds.target, test_size=0.2, random_state=0,
                                              stratify=ds.target)
    return x_tr, x_va, y_tr, y_va


def digits_preprocess(img_size: int = 32, mean: float = 0.0, std: float = 1.0) -> Preprocess:
    """The serving transform of the digits model."""
    return Preprocess(resize=img_size, crop=img_size, interpolation="bilinear", mean=(mean,) * 3,
                      std=(std,) * 3, invert="auto", grayscale=True)


def pixels01(images: np.ndarray, pp: Preprocess, blocky: bool = False) -> torch.Tensor:
    """(N, 3, S, S) [0, 1] tensors: preprocess_image of each rendered digit with mean 0 / std 1.

    ``blocky`` renders each digit nearest-neighbour upscaled first (how a pixel-art PNG of an 8x8
    digit looks), so the model also learns the blocky style users may POST.
    """
    raw = unnormalized(pp)

    def render(x: np.ndarray) -> Image.Image:
        img = digit_image(x)
        return img.resize((4 * pp.resize, 4 * pp.resize), Image.NEAREST) if blocky else img

    return torch.from_numpy(np.stack([preprocess_image(render(x), raw) for x in images]))


class DigitsDataset(Dataset):
    """Pre-rendered digits; ``augment`` draws a random affine per sample from torch's global RNG."""

    def __init__(self, pixels: torch.Tensor, labels: np.ndarray, pp: Preprocess, augment: bool,
                 blocky: torch.Tensor | None = None) -> None:
        self.pixels, self.labels, self.blocky = pixels, [int(y) for y in labels], blocky
        self.pp, self.augment = pp, augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = self.pixels[index]
        if self.augment:
            if self.blocky is not None and float(torch.rand(1)) < 0.5:
                x = self.blocky[index]
            x = random_affine(x)
        return normalize(x, self.pp), self.labels[index]


def random_affine(x: torch.Tensor, degrees: float = 12.0, shift: float = 0.1,
                  scale: tuple[float, float] = (0.9, 1.1)) -> torch.Tensor:
    """Rotate by up to ``degrees``, shift by up to ``shift`` of the side, rescale; zero (ink-free) fill."""
    angle = math.radians(float(torch.empty(1).uniform_(-degrees, degrees)))
    s = float(torch.empty(1).uniform_(*scale))
    tx, ty = (float(t) for t in torch.empty(2).uniform_(-2 * shift, 2 * shift))
    cos, sin = math.cos(angle) / s, math.sin(angle) / s
    theta = torch.tensor([[[cos, -sin, tx], [sin, cos, ty]]], dtype=torch.float32)
    grid = F.affine_grid(theta, [1, *x.shape], align_corners=False)
    return F.grid_sample(x[None], grid, mode="bilinear", padding_mode="zeros", align_corners=False)[0]


def digits_bundle(img_size: int = 32) -> DataBundle:
    """Train (augmented) and val splits, with the preprocess dict normalised by the train pixels."""
    x_tr, x_va, y_tr, y_va = split_digits()
    base = digits_preprocess(img_size)
    train_px, val_px = pixels01(x_tr, base), pixels01(x_va, base)
    mean, std = float(train_px.mean()), float(train_px.std())
    pp = digits_preprocess(img_size, round(mean, 4), round(std, 4))
    blocky_px = pixels01(x_tr, base, blocky=True)
    return DataBundle(DigitsDataset(train_px, y_tr, pp, augment=True, blocky=blocky_px),
                      DigitsDataset(val_px, y_va, pp, augment=False), list(CLASS_NAMES), pp)
