"""The evaluation transform on decoded images (PIL + NumPy, torch-free)."""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image

from .resample import lookup, resize_crop, resized_size
from .schema import Interpolation, InvertMode, Preprocess

_RESAMPLE = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "nearest": Image.NEAREST}
INK_SPREAD = 5.0  # fit="ink": side of the fitted square in standard deviations of the ink
_INK_FLOOR = 0.2  # fit="ink": ink strength below this is ignored by the moments
_MIN_CONTRAST = 12.0  # fit="ink": below this luminance difference (0..255) the image counts as blank


def resize_shorter(img: Image.Image, size: int, interpolation: Interpolation) -> Image.Image:
    """Resize so the shorter side is ``size`` (torchvision's Resize(int) rounding)."""
    new = resized_size(*img.size, size)
    return img if new == img.size else img.resize(new, _RESAMPLE[interpolation])


def center_crop(img: Image.Image, size: int) -> Image.Image:
    """Center crop to size x size (torchvision's CenterCrop rounding; zero padding when too small)."""
    w, h = img.size
    if size > w or size > h:  # torchvision pads left/top (crop - side) // 2, right/bottom (crop - side + 1) // 2
        left, top = max(size - w, 0) // 2, max(size - h, 0) // 2
        canvas = Image.new(img.mode, (w + max(size - w, 0), h + max(size - h, 0)))
        canvas.paste(img, (left, top))
        img, (w, h) = canvas, canvas.size
    top = int(round((h - size) / 2.0))
    left = int(round((w - size) / 2.0))
    return img.crop((left, top, left + size, top + size))


def _maybe_invert(arr: np.ndarray, mode: InvertMode) -> np.ndarray:
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
    values = np.arange(256, dtype=np.float32) / np.float32(255.0)
    if invert:
        values = np.float32(1.0) - values
    mean_column = np.asarray(mean, dtype=np.float32)[:, None]
    std_column = np.asarray(std, dtype=np.float32)[:, None]
    return np.ascontiguousarray((values[None, :] - mean_column) / std_column, dtype=np.float32)


def _normalise_lut(u8: np.ndarray, preprocess: Preprocess) -> np.ndarray:
    """Table lookup per channel: bit-identical to scale/invert/normalise, and cheaper than the arithmetic."""
    table = _table(tuple(preprocess.mean), tuple(preprocess.std), preprocess.invert == "always")
    fast = lookup(u8, table)  # the same lookup in one C pass, cheaper again
    if fast is not None:
        return fast
    out = np.empty((3, *u8.shape[:2]), dtype=np.float32)
    for c in range(3):
        np.take(table[c], u8[..., c], out=out[c])
    return out


def crop_uint8(img: Image.Image, preprocess: Preprocess, accelerated: bool = True) -> np.ndarray:
    """Decoded image -> (crop, crop, 3) uint8 after colour conversion, resize and center crop.

    ``accelerated`` uses :func:`irpe.artifact.resample.resize_crop` where it applies (same pixels as
    Pillow, computed only for the crop); ``False`` always runs Pillow's resize and crop.
    """
    if preprocess.grayscale:
        img = img.convert("L").convert("RGB")
    elif img.mode != "RGB":
        img = img.convert("RGB")
    fast = resize_crop(img, preprocess.resize, preprocess.crop, preprocess.interpolation) if accelerated else None
    if fast is not None:
        return fast
    return np.asarray(center_crop(resize_shorter(img, preprocess.resize, preprocess.interpolation), preprocess.crop))


def normalise(u8: np.ndarray, preprocess: Preprocess) -> np.ndarray:
    """(H, W, 3) uint8 -> float32 (3, H, W): scale to [0, 1], invert as configured, normalise."""
    if preprocess.invert in ("never", "always") and len(preprocess.mean) == len(preprocess.std) == 3:
        return _normalise_lut(u8, preprocess)
    arr = u8.astype(np.float32).transpose(2, 0, 1) / np.float32(255.0)
    arr = _maybe_invert(arr, preprocess.invert)
    mean = np.asarray(preprocess.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(preprocess.std, dtype=np.float32)[:, None, None]
    return np.ascontiguousarray((arr - mean) / std, dtype=np.float32)


def ink_map(img: Image.Image) -> np.ndarray:
    """Luminance -> float32 ink strength in [0, 1], whatever the polarity or colours.

    The background is the median of the border pixels; ink is the distance from it, scaled so the
    75th percentile of the strong ink (at least half the peak) is 1 (JPEG overshoot and faint or
    low-contrast renderings map to the same strokes). A near-uniform image gives all zeros.
    """
    luminance = np.asarray(img.convert("L"), dtype=np.float32)
    border = np.concatenate([luminance[0], luminance[-1], luminance[:, 0], luminance[:, -1]])
    distance = np.abs(luminance - np.float32(np.median(border)))
    peak = float(distance.max())
    if peak < _MIN_CONTRAST:
        return np.zeros_like(distance)
    level = float(np.percentile(distance[distance >= 0.5 * peak], 75))
    return np.minimum(distance / np.float32(level), np.float32(1.0))


def ink_box(ink: np.ndarray, spread: float = INK_SPREAD) -> tuple[float, float, float, float]:
    """The square (left, top, right, bottom) centred on the ink's centre of mass, ``spread`` times its
    larger standard deviation (rows or columns) wide; the whole image when there is no ink.

    Moments, unlike a bounding box, barely move between an 8 px digit and any upscale of it (blocky or
    smooth), so every rendering lands on the same square. Ink below ``_INK_FLOOR`` (JPEG noise) does not count.
    """
    h, w = ink.shape
    weight = np.maximum(ink - np.float32(_INK_FLOOR), 0)
    mass = float(weight.sum())
    if mass <= 0:
        side = float(max(h, w))
        return (w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2
    ys, xs = np.arange(h, dtype=np.float64) + 0.5, np.arange(w, dtype=np.float64) + 0.5
    rows, cols = weight.sum(1, dtype=np.float64), weight.sum(0, dtype=np.float64)
    cy, cx = float(rows @ ys) / mass, float(cols @ xs) / mass
    sy = np.sqrt(max(float(rows @ (ys - cy) ** 2) / mass, 1e-6))
    sx = np.sqrt(max(float(cols @ (xs - cx) ** 2) / mass, 1e-6))
    side = spread * max(sx, sy, 0.5)
    return cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2


def fit_ink(img: Image.Image, size: int, interpolation: Interpolation = "bilinear", fit_size: int = 0) -> np.ndarray:
    """``fit="ink"``: :func:`ink_map`, cut the :func:`ink_box` square (blank beyond the image) and
    resize it to (size, size) float32 in [0, 1]: light ink on black, like a drawing on the demo page,
    at any image size, margin, position, polarity and colour.

    ``fit_size`` > 0: the square is first resized to fit_size x fit_size and rescaled so its brightest
    pixel is 1 (for the digits model, about the 8x8 dataset's own resolution: blocky, smooth, thin, thick
    and JPEG renderings of a digit then look alike), then resized to ``size``.
    """
    ink = ink_map(img)
    left, top, right, bottom = ink_box(ink)
    h, w = ink.shape
    pad = int(np.ceil(max(0.0, -left, -top, right - w, bottom - h))) + 1
    padded = Image.fromarray(np.pad(ink, pad), mode="F")
    box = (left + pad, top + pad, right + pad, bottom + pad)
    resample = _RESAMPLE[interpolation]
    if fit_size > 0:
        small = np.clip(np.asarray(padded.resize((fit_size, fit_size), resample, box=box), dtype=np.float32), 0, 1)
        peak = float(small.max())
        small = small / np.float32(peak) if peak > 0 else small
        out = Image.fromarray(small, mode="F").resize((size, size), resample)
    else:
        out = padded.resize((size, size), resample, box=box)
    return np.clip(np.asarray(out, dtype=np.float32), 0.0, 1.0)


def preprocess_image(img: Image.Image, preprocess: Preprocess, accelerated: bool = True) -> np.ndarray:
    """The model input of one decoded image, as model.json's transform describes it.

    Args:
        img: a decoded image in any mode (converted to RGB, or to luminance with ``grayscale``).
        preprocess: the transform: resize the shorter side, center crop, scale to [0, 1], invert,
            normalise (:func:`crop_uint8`, :func:`normalise`); with ``fit="ink"`` the ink-box transform of
            :func:`fit_ink` replaces resize, crop and invert.
        accelerated: use the compiled resize-and-crop where it applies (the same pixels as Pillow);
            False always runs Pillow.

    Returns:
        A C-contiguous float32 (3, crop, crop) array.

    Raises:
        KeyError: ``preprocess.interpolation`` is not bicubic, bilinear or nearest and a resample is
            needed (:func:`~irpe.artifact.load_artifact` refuses such a model.json: only a hand-built
            :class:`Preprocess` gets here).
    """
    if preprocess.fit == "ink":
        ink = fit_ink(img, preprocess.crop, preprocess.interpolation, preprocess.fit_size)
        mean = np.asarray(preprocess.mean, dtype=np.float32)[:, None, None]
        std = np.asarray(preprocess.std, dtype=np.float32)[:, None, None]
        return np.ascontiguousarray((ink[None] - mean) / std, dtype=np.float32)
    return normalise(crop_uint8(img, preprocess, accelerated), preprocess)
