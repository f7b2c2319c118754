"""Resize-shorter-side + center-crop of 8-bit RGB, bit-identical to Pillow's ``Image.resize`` then crop.

Pillow resamples in two separable fixed-point passes (horizontal, then vertical, 22 fraction bits, an
8-bit round trip between them). This module computes the same integer coefficients (the same double
arithmetic, in NumPy), but only for the output rows and columns the crop keeps, and runs both passes
along the first axis of an array, where the C kernels in ``_resample.c`` vectorise (AVX2 / AVX-512 picked
at load time): the vertical pass on the image as it is, the horizontal pass on strips of 32 rows
transposed into a tile that stays in the L1 cache (the source is read once, in place): the same pixels
in less time. Anything it does not cover (other modes and filters, crops larger than the image, no
compiled kernel) returns ``None`` and the caller uses Pillow itself.
"""

from __future__ import annotations

import collections
import platform
import threading
from typing import NamedTuple

import numpy as np
import PIL
from PIL import Image

from .schema import Interpolation

try:
    from . import _resample  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: Pillow does the work
    _resample = None

FRACTION_BITS = 22
_SUPPORT = {"bicubic": 2.0, "bilinear": 1.0}


_AVAILABLE = _resample is not None and hasattr(_resample, "hrows") \
    and platform.machine().lower() in ("x86_64", "amd64")  # hrows: not an extension built by an older checkout
# Pillow 13 picks the pass order by :func:`vertical_first`; earlier releases always went horizontal
# first. Where the two disagree, only the verified release takes the fast path.
_ORDER_VERIFIED = PIL.__version__.split(".")[0] == "13"


def available() -> bool:
    """True when the compiled kernels are importable on a platform where the arithmetic was verified."""
    return _AVAILABLE


def _kernel(x: np.ndarray, interpolation: Interpolation) -> np.ndarray:
    """Pillow's filters with its operation order (so the doubles round the same way)."""
    ax = np.abs(x)
    if interpolation == "bilinear":
        return np.where(ax < 1.0, 1.0 - ax, 0.0)
    near = ((1.5 * ax - 2.5) * ax) * ax + 1.0
    far = ((((ax - 5.0) * ax) + 8.0) * ax - 4.0) * -0.5
    return np.where(ax < 1.0, near, np.where(ax < 2.0, far, 0.0))


CACHE_BYTES = 16 << 20  # coefficient windows kept for reuse (LRU, bounded by bytes, not entries)


class _WindowCache:
    """LRU of coefficient windows bounded by their total size: distinct image sizes from a client
    (256 tall strips, say) can no longer pin memory for the life of the process."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: collections.OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> tuple[np.ndarray, np.ndarray] | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key: tuple, value: tuple[np.ndarray, np.ndarray]) -> None:
        size = value[0].nbytes + value[1].nbytes
        if size > self.max_bytes // 4:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = value
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (b, w) = self._items.popitem(last=False)
                self.bytes -= b.nbytes + w.nbytes


_CACHE = _WindowCache(CACHE_BYTES)


def coefficients(in_size: int, out_size: int, interpolation: Interpolation, start: int = 0,
                 count: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(bounds (count, 2) int32 [first, count], weights (count, taps) int32)`` of outputs
    ``start .. start + count`` (default: the whole axis) of resizing ``in_size`` to ``out_size``, as Pillow
    computes them (each output row's arithmetic is independent of the others, so a window is exact)."""
    count = out_size - start if count is None else count
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = _SUPPORT[interpolation] * filterscale
    ksize = int(np.ceil(support)) * 2 + 1
    center = (np.arange(start, start + count, dtype=np.float64) + 0.5) * scale
    first = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    taken = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size) - first
    taps = np.arange(ksize)
    pos = (first[:, None] + taps[None, :]).astype(np.float64)
    w = _kernel(((pos - center[:, None]) + 0.5) * (1.0 / filterscale), interpolation)
    w = np.where(taps[None, :] < taken[:, None], w, 0.0)
    total = np.zeros(count)
    for t in range(ksize):  # left to right, as the C loop adds them
        total = total + w[:, t]
    w = np.where(total[:, None] != 0.0, w / np.where(total == 0.0, 1.0, total)[:, None], w)
    scaled = w * float(1 << FRACTION_BITS)
    fixed = np.trunc(np.where(w < 0, scaled - 0.5, scaled + 0.5)).astype(np.int32)
    bounds = np.stack([first, taken], axis=1).astype(np.int32)
    bounds.setflags(write=False)
    fixed.setflags(write=False)
    return bounds, fixed


def cached_window(in_size: int, out_size: int, interpolation: Interpolation, start: int,
                  count: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`coefficients` of one window, through the byte-bounded LRU cache."""
    key = (in_size, out_size, interpolation, start, count)
    hit = _CACHE.get(key)
    if hit is None:
        hit = coefficients(in_size, out_size, interpolation, start, count)
        _CACHE.put(key, hit)
    return hit


def resized_size(width: int, height: int, size: int) -> tuple[int, int]:
    """torchvision's ``Resize(size)`` output for a (width, height) image."""
    if min(width, height) == size:
        return width, height
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def _convolve(src: np.ndarray, bounds: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Convolve along axis 0 of a C-contiguous uint8 array: one output row per bounds row."""
    out = np.empty((len(bounds), *src.shape[1:]), dtype=np.uint8)
    _resample.rows(src, src.shape[0], src[0].size, bounds, weights, weights.shape[1], out)
    return out


def vertical_first(width: int, height: int, new_width: int, new_height: int) -> bool:
    """Pillow's pass order when both axes change: vertical first iff the height shrinks by more than
    twice the pixels the width loses (Pillow 13's rule; tests/artifact/test_resample.py checks it)."""
    return new_height < height and height - new_height > 2 * (width - new_width)


class _Window(NamedTuple):
    """The coefficients of the outputs one axis keeps, over the source span they read."""

    bounds: np.ndarray  # (outputs, 2) int32 [first tap, taps], relative to ``first``
    weights: np.ndarray  # (outputs, taps) int32 fixed-point
    first: int  # the source span [first, last) the outputs read
    last: int


_SHIFTED: dict[tuple, _Window] = {}  # per image size: the common sizes hit
_SHIFTED_MAX = 64


def _window(size: int, new_size: int, offset: int, crop: int, interpolation: Interpolation) -> _Window:
    """Coefficients of the ``crop`` outputs from ``offset``, their bounds shifted to the source span
    ``[first, last)`` they read, and that span."""
    key = (size, new_size, interpolation, offset, crop)
    if (hit := _SHIFTED.get(key)) is not None:
        return hit
    bounds, weights = cached_window(size, new_size, interpolation, offset, crop)
    first, last = int(bounds[0, 0]), int(bounds[-1, 0] + bounds[-1, 1])
    shifted = bounds.copy()
    shifted[:, 0] -= first
    shifted.setflags(write=False)
    out = _Window(bounds=shifted, weights=weights, first=first, last=last)
    if weights.nbytes <= 1 << 16:  # the usual photo sizes; at most 64 x 64 KB kept
        if len(_SHIFTED) >= _SHIFTED_MAX:  # distinct image sizes from clients: start over rather than grow
            _SHIFTED.clear()
        _SHIFTED[key] = out
    return out


def resize_crop(img: Image.Image | np.ndarray, size: int, crop: int,
                interpolation: Interpolation) -> np.ndarray | None:
    """``center_crop(resize_shorter(img, size), crop)`` as a (crop, crop, 3) uint8 array, or ``None``
    when the fast path does not apply (the caller then uses Pillow). ``img``: an RGB image, or its pixels
    as a C-contiguous (height, width, 3) uint8 array (read in place: no Pillow image, no copy)."""
    if isinstance(img, np.ndarray):
        if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8 or not img.flags.c_contiguous:
            return None
        h, w = img.shape[:2]
    elif img.mode != "RGB":
        return None
    else:
        w, h = img.size
    if not available() or interpolation not in _SUPPORT:
        return None
    new_w, new_h = resized_size(w, h, size)
    if crop > new_w or crop > new_h:
        return None
    top, left = int(round((new_h - crop) / 2.0)), int(round((new_w - crop) / 2.0))
    rows = _window(h, new_h, top, crop, interpolation) if new_h != h else None
    cols = _window(w, new_w, left, crop, interpolation) if new_w != w else None
    row_start, row_stop = (rows.first, rows.last) if rows else (top, top + crop)
    col_start, col_stop = (cols.first, cols.last) if cols else (left, left + crop)
    v_first = bool(rows and cols and vertical_first(w, h, new_w, new_h))
    if v_first and not _ORDER_VERIFIED:
        return None
    if v_first:  # the first pass runs on strips of columns, so no full-size copy of a big image is made
        strips = [_convolve(_region(img, (start, row_start, stop, row_stop)), rows.bounds, rows.weights)
                  for start, stop in _spans(col_start, col_stop, row_stop - row_start)]
        band = np.concatenate(strips, axis=1)
        return _horizontal(band, (0, 0, band.shape[1], band.shape[0]), cols)
    if cols:  # read in place, strip by strip in C: no full-size copy either
        band = _horizontal(img, (col_start, row_start, col_stop, row_stop), cols)
    else:
        band = _region(img, (col_start, row_start, col_stop, row_stop))
    return _convolve(band, rows.bounds, rows.weights) if rows else band


def _region(img: Image.Image | np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """The (left, top, right, bottom) window of ``img`` as a C-contiguous array."""
    if isinstance(img, np.ndarray):
        left, top, right, bottom = box
        return np.ascontiguousarray(img[top:bottom, left:right])
    return np.asarray(img if box == (0, 0, *img.size) else img.crop(box))


STRIP_PIXELS = 1 << 20  # pixels per strip of the first pass (~3 MB of RGB)


def _spans(start: int, stop: int, across: int) -> list[tuple[int, int]]:
    """``[start, stop)`` cut into spans of about STRIP_PIXELS / ``across`` lines each."""
    step = max(1, STRIP_PIXELS // max(1, across))
    return [(a, min(a + step, stop)) for a in range(start, stop, step)]


def _horizontal(img: Image.Image | np.ndarray, box: tuple[int, int, int, int], cols: _Window) -> np.ndarray:
    """The horizontal pass over the (left, top, right, bottom) window of ``img`` (an array is read in place):
    (bottom - top, len(cols), 3) uint8."""
    left, top, right, bottom = box
    if not isinstance(img, np.ndarray):
        img, (left, top, right, bottom) = _region(img, box), (0, 0, right - left, bottom - top)
    out = np.empty((bottom - top, len(cols.bounds), 3), dtype=np.uint8)
    stride = img.strides[0]
    _resample.hrows(img, bottom - top, right - left, stride, top * stride + left * 3, cols.bounds, cols.weights,
                    cols.weights.shape[1], out)
    return out


def lookup(u8: np.ndarray, table: np.ndarray) -> np.ndarray | None:
    """(H, W, 3) uint8 -> (3, H, W) float32 with ``out[c] = table[c, u8[..., c]]`` (``table``: (3, 256)
    float32) in one C pass; ``None`` without the compiled kernels."""
    if _resample is None or not hasattr(_resample, "lookup"):
        return None
    u8 = np.ascontiguousarray(u8)
    out = np.empty((3, *u8.shape[:2]), dtype=np.float32)
    _resample.lookup(u8, u8.shape[0] * u8.shape[1], np.ascontiguousarray(table, dtype=np.float32), out)
    return out
