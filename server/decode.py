"""Bytes -> RGB PIL image -> model input, with the HTTP error each failure deserves.

Accepted: JPEG (and camera MPO), PNG, WebP, BMP, GIF (first frame), TIFF. EXIF orientation is applied;
grayscale, RGBA/LA (alpha dropped, as the training loader's ``convert("RGB")`` does), palette, CMYK and
16-bit images become 8-bit RGB. The pixel count is checked from the header before any pixel is decoded.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from irpe.artifact import Preprocess
from irpe.artifact.preprocess import preprocess_image

from .errors import APIError

FORMATS = frozenset({"JPEG", "MPO", "PNG", "WEBP", "BMP", "GIF", "TIFF"})
JPEG_FORMATS = frozenset({"JPEG", "MPO"})
_ORIENTATION = 0x0112
_SIXTEEN_BIT = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I"})


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
    except (OSError, SyntaxError, ValueError) as e:
        raise APIError(400, "invalid_image", f"image header is corrupt ({e})") from None
    if img.format not in FORMATS:
        raise APIError(415, "unsupported_media_type",
                       f"{img.format} images are not accepted; send JPEG, PNG, WebP, BMP, GIF or TIFF")
    width, height = img.size
    if width * height > max_pixels:
        raise APIError(413, "too_many_pixels", f"image is {width}x{height} = {width * height} pixels; "
                       f"the limit is {max_pixels} (--max-pixels)")
    return img


def _sixteen_to_l(img: Image.Image) -> Image.Image:
    """16-bit (or 32-bit int / float) single-channel image -> 8-bit L, scaling the full range."""
    arr = np.asarray(img)
    if img.mode == "F":
        arr = arr * 255.0 if float(np.nanmax(arr, initial=0.0)) <= 1.0 else arr
        return Image.fromarray(np.clip(np.nan_to_num(arr), 0, 255).round().astype(np.uint8), "L")
    arr = np.clip(arr.astype(np.float64), 0, 65535) / 257.0
    return Image.fromarray(arr.round().astype(np.uint8), "L")


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


def decode_image(data: bytes, max_pixels: int, draft_size: int = 0) -> Image.Image:
    """Decode the first frame of ``data`` to an EXIF-oriented RGB image.

    ``draft_size`` > 0: a JPEG is decoded by libjpeg at the smallest DCT scale (1/2, 1/4, 1/8) that keeps
    both sides >= ``draft_size`` (faster, not bit-exact); other formats are unaffected.
    """
    img = open_image(data, max_pixels)
    if draft_size > 0 and img.format in JPEG_FORMATS:
        img.draft("RGB", (draft_size, draft_size))
    try:
        img.load()
        if img.getexif().get(_ORIENTATION, 1) != 1:
            img = ImageOps.exif_transpose(img) or img
    except Image.DecompressionBombError as e:
        raise APIError(413, "too_many_pixels", str(e)) from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        code = "truncated_image" if "truncat" in str(e).lower() else "invalid_image"
        raise APIError(400, code, f"image data is truncated or corrupt ({e})") from None
    return to_rgb(img)


def prepare(data: bytes, pp: Preprocess, max_pixels: int, jpeg_draft: bool = False) -> np.ndarray:
    """Bytes -> float32 (3, crop, crop) model input following model.json's preprocess block.

    ``jpeg_draft``: decode JPEGs at a reduced DCT scale no smaller than ``pp.resize`` (opt-in; see
    :func:`decode_image`); off, the result is bit-exact with the reference transform.
    """
    img = decode_image(data, max_pixels, draft_size=pp.resize if jpeg_draft else 0)
    w, h = img.size  # resizing the shorter side to pp.resize must not blow up a thin image (1x40M -> 36x1.4G)
    resized = pp.resize * int(pp.resize * max(w, h) / min(w, h))
    if resized > max_pixels:
        raise APIError(413, "too_many_pixels", f"image is {w}x{h}; resizing its shorter side to {pp.resize} "
                       f"would give {resized} pixels, over the limit {max_pixels} (--max-pixels); crop it first")
    return preprocess_image(img, pp)
