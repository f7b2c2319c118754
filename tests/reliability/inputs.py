"""Hostile and odd request payloads: broken, huge, exotic and bomb images, built in memory."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image

from tests.server.helpers import encode, image


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A ~100-byte PNG whose header claims ``width`` x ``height`` RGB pixels (one compressed row of zeros)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * (1 + 3 * min(width, 1000)), 9)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def png_bad_crc() -> bytes:
    """A valid PNG with the IHDR checksum flipped."""
    data = bytearray(encode(image()))
    data[29] ^= 0xFF  # last byte of the IHDR CRC (8 signature + 4 len + 4 type + 13 data = 29)
    return bytes(data)


def jpeg_bomb(width: int = 65_000, height: int = 65_000) -> bytes:
    """A small JPEG with the frame header (SOF0) rewritten to claim ``width`` x ``height``."""
    data = bytearray(encode(image(), "JPEG", quality=80))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def sixteen_bit_png() -> bytes:
    arr = (np.arange(64 * 48, dtype=np.uint16).reshape(48, 64) * 21).astype(np.uint16)
    img = Image.fromarray(arr)
    assert img.mode.startswith("I;16"), img.mode
    return encode(img)


def animated_gif() -> bytes:
    frames = [image(seed=s).convert("P") for s in range(4)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    return buf.getvalue()


def palette_png(transparency: bool = False) -> bytes:
    img = image().convert("P")
    return encode(img, transparency=0) if transparency else encode(img)


def infer_body(shape: object = (1, 3, 32, 32), datatype: object = "FP32", data: object = None,
               **extra: object) -> dict[str, object]:
    """A KServe v2 JSON request for input ``images`` (zeros matching ``shape`` unless ``data`` is given)."""
    if data is None:
        n = int(np.prod(shape)) if isinstance(shape, tuple) else 3072
        data = [0.0] * n
    spec = {"name": "images", "datatype": datatype, "shape": list(shape) if isinstance(shape, tuple) else shape,
            "data": data}
    return {"inputs": [spec], **extra}
