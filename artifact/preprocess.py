"""The evaluation transform on decoded images (PIL + NumPy, torch-free)."""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image

from .resample import resize_crop, resized_size
from .schema import Preprocess

_RESAMPLE = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "nearest": Image.NEAREST}


def resize_shorter(img: Image.Image, size: int, interpolation: str) -> Image.Image:
    """Resize so the shorter side is ``size`` (torchvision's Resize(int) rounding)."""
    new = resized_size(*img.size, size)
    return img if new == img.size else img.resize(new, _RESAMPLE[interpolation])


def center_crop(img: Image.Image, size: int) -> Image.Image:
    """Center crop to size x size (torchvision's CenterCrop rounding; zero padding when too small)."""
    w, h = img.size
    if size > w or size > h:  # torchvision pads left/top (c - s) // 2, right/bottom (c - s + 1) // 2
        left, top = max(size - w, 0) // 2, max(size - h, 0) // 2
        canvas = Image.new(img.mode, (w + max(size - w, 0), h + max(size - h, 0)))
        canvas.paste(img, (left, top))
        img, (w, h) = canvas, canvas.size
    top = int(round((h - size) / 2.0))
    left = int(round((w - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def _maybe_invert(arr: np.ndarray, mode: str) -> np.ndarray:
    if mode == "always":
        return 1.0 - arr
    if mode == "auto":
        border = np.concatenate([arr[:, 0], arr[:, -1], arr[:, :, 0], arr[:, :, -1]], axis=1).mean()
        h, w = arr.shape[1:]
        centre = arr[:, h // 4: h - h // 4, w // 4: w - w // 4].mean()
        if border > centre:
            return 1.0 - arr
    return arr


@functools.lru_cache(maxsize=16)
def _table(mean: tuple[float, ...], std: tuple[float, ...], invert: bool) -> np.ndarray:
    """(3, 256) float32: every uint8 value through the exact float32 ops of the reference path."""
    v = np.arange(256, dtype=np.float32) / np.float32(255.0)
    if invert:
        v = np.float32(1.0) - v
    m = np.asarray(mean, dtype=np.float32)[:, None]
    s = np.asarray(std, dtype=np.float32)[:, None]
    return np.ascontiguousarray((v[None, :] - m) / s, dtype=np.float32)


def _normalise_lut(u8: np.ndarray, pp: Preprocess) -> np.ndarray:
    """Table lookup per channel: bit-identical to scale/invert/normalise, about 3x cheaper."""
    table = _table(tuple(pp.mean), tuple(pp.std), pp.invert == "always")
    out = np.empty((3, *u8.shape[:2]), dtype=np.float32)
    for c in range(3):
        np.take(table[c], u8[..., c], out=out[c])
    return out


def crop_uint8(img: Image.Image, pp: Preprocess, accelerated: bool = True) -> np.ndarray:
    """Decoded image -> (crop, crop, 3) uint8 after colour conversion, resize and center crop.

    ``accelerated`` uses :func:`irpe.artifact.resample.resize_crop` where it applies (same pixels as
    Pillow, computed only for the crop); ``False`` always runs Pillow's resize and crop.
    """
    if pp.grayscale:
        img = img.convert("L").convert("RGB")
    elif img.mode != "RGB":
        img = img.convert("RGB")
    fast = resize_crop(img, pp.resize, pp.crop, pp.interpolation) if accelerated else None
    if fast is not None:
        return fast
    return np.asarray(center_crop(resize_shorter(img, pp.resize, pp.interpolation), pp.crop))


def normalise(u8: np.ndarray, pp: Preprocess) -> np.ndarray:
    """(H, W, 3) uint8 -> float32 (3, H, W): scale to [0, 1], invert as configured, normalise."""
    if pp.invert in ("never", "always") and len(pp.mean) == len(pp.std) == 3:
        return _normalise_lut(u8, pp)
    arr = u8.astype(np.float32).transpose(2, 0, 1) / np.float32(255.0)
    arr = _maybe_invert(arr, pp.invert)
    mean = np.asarray(pp.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(pp.std, dtype=np.float32)[:, None, None]
    return np.ascontiguousarray((arr - mean) / std, dtype=np.float32)


def preprocess_image(img: Image.Image, pp: Preprocess, accelerated: bool = True) -> np.ndarray:
    """Decoded RGB image -> float32 (3, crop, crop) normalised array (see :func:`crop_uint8`)."""
    return normalise(crop_uint8(img, pp, accelerated), pp)
