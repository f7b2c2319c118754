"""Bytes -> RGB PIL image -> model input, with the HTTP error each failure deserves.

Accepted: JPEG (and camera MPO), PNG, WebP, BMP, GIF (first frame), TIFF. EXIF orientation is applied;
grayscale, RGBA/LA (alpha dropped, as the training loader's ``convert("RGB")`` does), palette, CMYK and
16-bit images become 8-bit RGB. The pixel count is checked from the header before any pixel is decoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import re
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from irpe.artifact import ModelArtifact, Preprocess
from irpe.artifact.preprocess import preprocess_image

from ..config import Settings
from ..errors import APIError, timed_out
from . import jpeg

FORMATS = frozenset({"JPEG", "MPO", "PNG", "WEBP", "BMP", "GIF", "TIFF"})
JPEG_FORMATS = frozenset({"JPEG", "MPO"})
_ORIENTATION = 0x0112
_SIXTEEN_BIT = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I"})
_CHUNK = 1 << 20  # pixels converted at a time from 16/32-bit modes (bounds the temporary copies)
MAX_JPEG_SCANS = 100
log = logging.getLogger("irpe.server")


class PixelBudget:
    """Pixels being decoded at once, across every decode thread (each costs up to ~12 bytes while it is
    decoded, converted and resized). A decode waits for room; an image larger than the whole budget
    never gets here (--max-pixels <= budget)."""

    def __init__(self, pixels: int):
        self.total = pixels
        self.free = pixels
        self._cond = threading.Condition()

    def take_now(self, pixels: int) -> bool:
        """Take ``pixels`` if they are free now (never waits: the event loop's inline decode); give them
        back with :meth:`give`."""
        with self._cond:
            if self.free < pixels:
                return False
            self.free -= pixels
            return True

    def give(self, pixels: int) -> None:
        with self._cond:
            self.free += pixels
            self._cond.notify_all()

    @contextmanager
    def hold(self, pixels: int, deadline: float | None = None) -> Iterator[None]:
        """Take ``pixels`` (at most the whole budget) for the block; 504 if ``deadline`` passes first."""
        n = min(pixels, self.total)
        with self._cond:
            while self.free < n:
                left = None if deadline is None else deadline - time.perf_counter()
                if left is not None and left <= 0:
                    raise APIError(504, "timeout", "request deadline passed while waiting to decode (--timeout-s)")
                self._cond.wait(left)
            self.free -= n
        try:
            yield
        finally:
            with self._cond:
                self.free += n
                self._cond.notify_all()


INLINE_PIXELS = 1 << 20  # a baseline JPEG up to this size decodes on the event loop (a bounded couple of ms)
INLINE_BYTES = 1 << 20  # ... and up to this many bytes (the entropy-coded data is read once)


class InlineTurn:
    """Pixels decoded on the event loop in one loop iteration: at most ``cap``; the rest go to the pool."""

    def __init__(self, cap: int):
        self.cap = cap
        self.spent = 0

    def take(self, pixels: int) -> bool:
        """Whether ``pixels`` more fit this loop iteration's share (they are then counted).

        Args:
            pixels: the pixels of one image.

        Returns:
            True when the image decodes on the event loop now.
        """
        if self.spent + pixels > self.cap:
            return False
        if not self.spent:  # runs in the next loop iteration
            asyncio.get_running_loop().call_soon(self._reset)
        self.spent += pixels
        return True

    def _reset(self) -> None:
        self.spent = 0


def inline_pixels(data: bytes, limit: int = INLINE_PIXELS) -> int:
    """The pixels of a JPEG whose decode costs a bounded couple of milliseconds, 0 for any other: sequential
    (not progressive), at most ``limit`` pixels and :data:`INLINE_BYTES`, no more scans than components, only
    tables, COM and APPn before the frame, and libjpeg's own header reader finds the same size. Cheaper to
    decode at once on the event loop than to hand to a thread (~0.5 CPU-ms per request in ``irpe bench serve
    --frontend``: no hand-off, no GIL contention)."""
    if len(data) > INLINE_BYTES or (f := jpeg.read_frame(data, strict=True)) is None or not f.sequential:
        return 0
    pixels = f.width * f.height
    if not 0 < pixels <= limit or data.count(b"\xff\xda") > f.components:  # SOS markers, over-counted at worst
        return 0
    return pixels if jpeg.available() and jpeg.decoder_agrees(data, f) else 0


def small_baseline_jpeg(data: bytes, limit: int = INLINE_PIXELS) -> bool:
    """Whether ``data`` may decode on the event loop (:func:`inline_pixels`)."""
    return inline_pixels(data, limit) > 0


_NEXT_MARKER = re.compile(rb"\xff+[^\x00\xd0-\xd7\xff]")


def jpeg_scans(data: bytes, limit: int) -> int:
    """Number of scans (SOS segments) of a JPEG, counting stops once it passes ``limit``. Walks the
    marker segments, skipping entropy-coded data (where 0xFF is always stuffed), so embedded thumbnails
    in APPn segments are not counted; cost: one regex search per scan."""
    pos = 2
    scans = 0
    end = len(data)
    while scans <= limit and (segment := jpeg.next_segment(data, pos, end)) is not None:
        marker, pos, length = segment
        if marker == 0xD9:  # EOI
            return scans
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            pos += 2
            continue
        pos += 2 + length
        if marker == 0xDA:
            scans += 1
            found = _NEXT_MARKER.search(data, pos)
            if found is None:
                return scans
            pos = found.end() - 2
            while data[pos + 1] == 0xFF:
                pos += 1
    return scans


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Lazily open ``data`` and check format and size from the header (no pixel decoding yet)."""
    if not data:
        raise APIError(400, "empty_body", "no image data received; send the image as the body or "
                       "as multipart field 'file'")
    try:
        img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise APIError(415, "unsupported_media_type", "not a recognised image; send JPEG, PNG, WebP, "
                       "BMP, GIF or TIFF") from None
    except Image.DecompressionBombError as e:
        raise APIError(413, "too_many_pixels", str(e)) from None
    except Exception as e:  # Pillow raises TypeError, OverflowError, ... on odd TIFF tags and the like
        raise APIError(400, "invalid_image", f"image header is corrupt ({_describe(e)})") from None
    if img.format not in FORMATS:
        raise APIError(415, "unsupported_media_type",
                       f"{img.format} images are not accepted; send JPEG, PNG, WebP, BMP, GIF or TIFF")
    width, height = img.size
    if width * height > max_pixels:
        raise APIError(413, "too_many_pixels", f"image is {width}x{height} = {width * height} pixels; "
                       f"the limit is {max_pixels} (--max-pixels)")
    return img


def _describe(e: BaseException) -> str:
    text = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _rows(arr: np.ndarray) -> Iterator[slice]:
    step = max(1, _CHUNK // max(1, arr.shape[1]))
    for r in range(0, arr.shape[0], step):
        yield slice(r, r + step)


def _sixteen_to_l(img: Image.Image) -> Image.Image:
    """16-bit (or 32-bit int / float) single-channel image -> 8-bit L, scaling the full range.

    Converted a band of rows at a time, in integers (round(x / 257) == (x + 128) // 257 for 0..65535),
    so the temporaries stay ~1 Mpixel whatever the image size."""
    arr = np.asarray(img)
    out = np.empty(arr.shape, dtype=np.uint8)
    if img.mode == "F":
        unit = all(float(np.nanmax(arr[r], initial=0.0)) <= 1.0 for r in _rows(arr))
        for r in _rows(arr):
            band = np.nan_to_num(arr[r], nan=0.0, posinf=255.0, neginf=0.0)
            with np.errstate(over="ignore"):  # -3e38 * 255 -> -inf, clipped to 0 below
                band = band * np.float32(255.0) if unit else band
            out[r] = np.clip(band, 0, 255).round()
        return Image.fromarray(out, "L")
    for r in _rows(arr):
        band = np.clip(arr[r], 0, 65535).astype(np.uint32)
        out[r] = (band + 128) // 257
    return Image.fromarray(out, "L")


def to_rgb(img: Image.Image) -> Image.Image:
    """Any decoded mode -> 8-bit RGB."""
    if img.mode == "RGB":
        return img
    if img.mode in _SIXTEEN_BIT or img.mode == "F":
        img = _sixteen_to_l(img)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # palette-with-transparency notice; alpha is dropped anyway
        try:
            return img.convert("RGB")
        except ValueError as e:
            raise APIError(415, "unsupported_media_type", f"{img.mode} images are not supported ({e})") from None
        except Exception as e:
            raise APIError(400, "invalid_image", f"image data is corrupt ({_describe(e)})") from None


def check_scans(data: bytes, img: Image.Image, max_scans: int) -> None:
    """413 for a JPEG with more than ``max_scans`` scans (each one is another pass over every block:
    a few hundred KB of repeated scans would cost tens of seconds of decode CPU)."""
    if img.format not in JPEG_FORMATS or data.count(b"\xff\xda") <= max_scans:  # an SOS marker per scan, at
        return  # least: the byte count (C speed) clears almost every JPEG without the marker walk
    if (n := jpeg_scans(data, max_scans)) > max_scans:
        raise _too_many_scans(n, max_scans)


def _too_many_scans(n: int, max_scans: int) -> APIError:
    return APIError(413, "too_many_scans", f"JPEG has more than {max_scans} scans (found {n} so far; "
                    "--max-jpeg-scans); re-encode it (a normal progressive JPEG has about 10)")


def decode_image(data: bytes, max_pixels: int, draft_size: int = 0, max_scans: int = MAX_JPEG_SCANS,
                 img: Image.Image | None = None) -> Image.Image:
    """Decode the first frame of ``data`` to an EXIF-oriented RGB image.

    ``draft_size`` > 0: a JPEG is decoded by libjpeg at the smallest DCT scale (1/2, 1/4, 1/8) that keeps
    both sides >= ``draft_size`` (faster, not bit-exact); other formats are unaffected. ``img``: the
    already opened ``data``. Every decoder failure is an APIError (4xx).
    """
    img = img or open_image(data, max_pixels)
    check_scans(data, img, max_scans)
    if draft_size > 0 and img.format in JPEG_FORMATS:
        img.draft("RGB", (draft_size, draft_size))
    try:
        img.load()
        if img.getexif().get(_ORIENTATION, 1) != 1:
            img = ImageOps.exif_transpose(img) or img
    except Image.DecompressionBombError as e:
        raise APIError(413, "too_many_pixels", str(e)) from None
    except MemoryError:
        raise APIError(413, "too_many_pixels", "image too large to decode in the memory available") from None
    except Exception as e:  # every decoder failure (OSError, TypeError, OverflowError, ...) is the file's fault
        code = "truncated_image" if "truncat" in str(e).lower() else "invalid_image"
        raise APIError(400, code, f"image data is truncated or corrupt ({_describe(e)})") from None
    return to_rgb(img)


def prepare(data: bytes, preprocess: Preprocess, max_pixels: int, jpeg_draft: bool = False, *,
            budget: PixelBudget | None = None, deadline: float | None = None,
            max_scans: int = MAX_JPEG_SCANS) -> np.ndarray:
    """Bytes -> float32 (3, crop, crop) model input following model.json's preprocess block.

    ``jpeg_draft``: decode JPEGs at a reduced DCT scale no smaller than ``preprocess.resize`` (opt-in; see
    :func:`decode_image`); off, the result is bit-exact with the reference transform. ``budget``: the
    shared pixel budget the decode holds its pixels from (waiting at most until ``deadline``).
    """
    if not jpeg_draft and (size := jpeg.plain_size(data, preprocess, max_pixels)) is not None:
        with budget.hold(size[0] * size[1], deadline) if budget else contextlib.nullcontext():
            if (x := _prepare_plain(data, size, preprocess, max_pixels, max_scans)) is not None:
                return x
    img = open_image(data, max_pixels)  # anything else, and a plain JPEG that failed (to say why)
    if budget is None:
        return _prepare_open(data, img, preprocess, max_pixels, jpeg_draft, max_scans)
    with budget.hold(img.size[0] * img.size[1], deadline):
        return _prepare_open(data, img, preprocess, max_pixels, jpeg_draft, max_scans)


def _prepare_open(data: bytes, img: Image.Image, preprocess: Preprocess, max_pixels: int, jpeg_draft: bool,
                  max_scans: int) -> np.ndarray:
    if not jpeg_draft and jpeg.applies(img, preprocess):  # the common upload, bit-exact without a Pillow image
        check_scans(data, img, max_scans)
        _check_resized(*img.size, preprocess, max_pixels)
        if (x := jpeg.prepare_jpeg(data, preprocess)) is not None:
            return x
    draft_size = preprocess.resize if jpeg_draft else 0
    img = decode_image(data, max_pixels, draft_size=draft_size, max_scans=max_scans, img=img)
    _check_resized(*img.size, preprocess, max_pixels)
    try:
        return preprocess_image(img, preprocess)
    except MemoryError:
        raise APIError(413, "too_many_pixels", "image too large to resize in the memory available") from None


def _prepare_plain(data: bytes, size: tuple[int, int], preprocess: Preprocess, max_pixels: int,
                   max_scans: int) -> np.ndarray | None:
    """A plain JPEG (:func:`jpeg.plain_size`) without Pillow: the same checks, then the fast path."""
    if data.count(b"\xff\xda") > max_scans and (n := jpeg_scans(data, max_scans)) > max_scans:
        raise _too_many_scans(n, max_scans)
    _check_resized(*size, preprocess, max_pixels)
    return jpeg.prepare_jpeg(data, preprocess)


def _check_resized(w: int, h: int, preprocess: Preprocess, max_pixels: int) -> None:
    """Resizing the shorter side to preprocess.resize must not blow up a thin image (1x40M -> 36x1.4G)."""
    resized = preprocess.resize * int(preprocess.resize * max(w, h) / min(w, h))
    if resized > max_pixels:
        raise APIError(413, "too_many_pixels", f"image is {w}x{h}; resizing its shorter side to {preprocess.resize} "
                       f"would give {resized} pixels, over the limit {max_pixels} (--max-pixels); crop it first")


def prepare_timed(data: bytes, artifact: ModelArtifact, settings: Settings, budget: PixelBudget | None,
                  deadline: float | None) -> tuple[np.ndarray, float]:
    """:func:`prepare` with the server's settings, timed.

    Args:
        data: the encoded image.
        artifact: the model whose preprocessing applies.
        settings: the server's settings (pixel and scan limits, JPEG draft).
        budget: the shared pixel budget (None: already taken).
        deadline: the ``time.perf_counter()`` after which the request has given up.

    Returns:
        The model input and the seconds it took.

    Raises:
        APIError: 4xx for an image that cannot be decoded; 504 when the deadline passed before the decode began.
    """
    start = time.perf_counter()
    if deadline is not None and start > deadline:  # the request gave up while this waited for a thread
        raise timed_out(settings.timeout_s)
    array = prepare(data, artifact.preprocess, settings.max_pixels, jpeg_draft=settings.jpeg_draft, budget=budget,
                    deadline=deadline, max_scans=settings.max_jpeg_scans)
    return array, time.perf_counter() - start
