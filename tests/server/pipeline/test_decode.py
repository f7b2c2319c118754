"""Decoding: every accepted format and mode becomes RGB; bad input gets the right status before decoding."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from irpe.server.errors import APIError
from irpe.server.pipeline.decode import decode_image, open_image
from tests.server.helpers import encode, image

LIMIT = 10_000_000


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF"])
def test_formats_decode_to_rgb(fmt: str) -> None:
    src = image((40, 30), seed=3)
    out = decode_image(encode(src, fmt), LIMIT)
    assert out.mode == "RGB" and out.size == (40, 30)
    if fmt in ("PNG", "BMP", "TIFF", "WEBP"):
        tol = 0 if fmt != "WEBP" else 40
        diff = np.abs(np.asarray(out, dtype=int) - np.asarray(src, dtype=int)).max()
        assert diff <= tol


def test_gif_first_frame() -> None:
    red, blue = Image.new("RGB", (16, 16), (255, 0, 0)), Image.new("RGB", (16, 16), (0, 0, 255))
    buf = io.BytesIO()
    red.save(buf, "GIF", save_all=True, append_images=[blue])
    out = np.asarray(decode_image(buf.getvalue(), LIMIT))
    assert out[..., 0].min() > 200 and out[..., 2].max() < 50


def test_exif_orientation_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 clockwise on display
    data = encode(image((64, 48)), "JPEG", exif=exif.tobytes())
    assert Image.open(io.BytesIO(data)).size == (64, 48)
    assert decode_image(data, LIMIT).size == (48, 64)


@pytest.mark.parametrize("mode", ["L", "RGBA", "LA", "P", "1", "CMYK"])
def test_modes_become_rgb(mode: str) -> None:
    src = image((20, 20), seed=5)
    fmt = "JPEG" if mode == "CMYK" else ("TIFF" if mode == "LA" else "PNG")
    img = src.convert(mode)
    out = decode_image(encode(img, fmt), LIMIT)
    assert out.mode == "RGB" and out.size == (20, 20)
    if mode == "L":
        arr = np.asarray(out)
        assert (arr[..., 0] == arr[..., 1]).all() and (arr[..., 0] == np.asarray(img)).all()


def test_rgba_drops_alpha_like_the_training_loader() -> None:
    rgba = Image.new("RGBA", (8, 8), (10, 200, 30, 0))
    out = decode_image(encode(rgba, "PNG"), LIMIT)
    assert out.getpixel((0, 0)) == (10, 200, 30)


def test_sixteen_bit_grayscale_is_scaled() -> None:
    arr = np.array([[0, 257 * 100, 65535]], dtype=np.uint16)
    data = encode(Image.fromarray(arr), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    out = np.asarray(decode_image(data, LIMIT))
    assert out[0, :, 0].tolist() == [0, 100, 255]


def _error(data: bytes, limit: int = LIMIT) -> APIError:
    with pytest.raises(APIError) as info:
        decode_image(data, limit)
    return info.value


def test_empty_and_garbage() -> None:
    assert (_error(b"").status, _error(b"").code) == (400, "empty_body")
    assert _error(b"this is not an image at all").status == 415


def test_unsupported_format() -> None:
    assert _error(encode(image((8, 8)), "PPM")).status == 415


def test_truncated_jpeg() -> None:
    data = encode(image((256, 256), seed=2), "JPEG")
    err = _error(data[: len(data) // 2])
    assert (err.status, err.code) == (400, "truncated_image")


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG header declaring width x height, followed by a few bytes of (unusable) pixel data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\0" * 64))


def test_pixel_limit_checked_from_header_before_decoding() -> None:
    for side in (7_000, 30_000):  # 49 Mpx (our limit), 900 Mpx (also PIL's bomb guard)
        data = _png_header_only(side, side)  # almost no pixel data: decoding would fail with 400
        err = _error(data, limit=40_000_000)
        assert (err.status, err.code) == (413, "too_many_pixels")
    assert _error(_png_header_only(100, 100)).status == 400  # small: decoded, found truncated
    assert open_image(_png_header_only(100, 100), 40_000_000).size == (100, 100)


def test_small_baseline_jpeg_reads_the_frame_header_only() -> None:
    """Inline decoding is for sequential JPEGs of at most INLINE_PIXELS: progressive, large, other formats,
    truncated and garbage bytes go to a decode thread."""
    import io

    from PIL import Image

    from irpe.server.pipeline.decode import INLINE_PIXELS, small_baseline_jpeg

    def jpeg(w: int, h: int, **options: object) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (w, h), (90, 120, 30)).save(buf, "JPEG", **options)
        return buf.getvalue()

    assert small_baseline_jpeg(jpeg(512, 512))
    assert small_baseline_jpeg(jpeg(1024, 1024))  # exactly INLINE_PIXELS
    assert INLINE_PIXELS == 1024 * 1024
    assert not small_baseline_jpeg(jpeg(1025, 1024))
    assert not small_baseline_jpeg(jpeg(512, 512, progressive=True))
    exif = Image.Exif()
    exif[0x010E] = "x" * 3000  # a long APP1 segment before the frame header
    assert small_baseline_jpeg(jpeg(64, 48, exif=exif.tobytes()))
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    data = jpeg(512, 512)
    for bad in (png.getvalue(), b"", b"\xff\xd8", data[:20], b"\xff\xd8" + b"\x00" * 64):
        assert not small_baseline_jpeg(bad)
