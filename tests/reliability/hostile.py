"""Resource-exhaustion payloads, built in memory: small on the wire, costly if unbounded."""

from __future__ import annotations

import io
import struct

import numpy as np
from PIL import Image

from tests.reliability.inputs import png_chunk
from tests.server.helpers import encode, image


def one_bit_png(width: int = 8000, height: int = 5000) -> bytes:
    """A ~10 KB 1-bit PNG of ``width`` x ``height`` (40 Mpixels by default)."""
    return encode(Image.new("1", (width, height)), optimize=True)


def sixteen_bit_png(width: int = 8000, height: int = 5000) -> bytes:
    """A flat 16-bit grayscale PNG (compresses to ~100 KB at 40 Mpixels)."""
    return encode(Image.new("I;16", (width, height), 1000), compress_level=9)


def int32_tiff(width: int = 8000, height: int = 5000) -> bytes:
    """A flat 32-bit integer TIFF (deflate), decoded as mode ``I``."""
    return encode(Image.new("I", (width, height), 70000), "TIFF", compression="tiff_adobe_deflate")


def float_tiff(width: int = 8000, height: int = 5000) -> bytes:
    """A flat 32-bit float TIFF (deflate), decoded as mode ``F``."""
    return encode(Image.new("F", (width, height), 0.5), "TIFF", compression="tiff_adobe_deflate")


def _segments(data: bytes) -> tuple[bytes, list[bytes], bytes]:
    """Split a progressive JPEG into (header up to the first scan's tables, [each scan with the DHT
    segments before it], EOI)."""
    first = data.index(b"\xff\xda")
    scans, pos, unit = [], first, b""
    while data[pos:pos + 2] != b"\xff\xd9":
        if data[pos:pos + 2] != b"\xff\xda":  # DHT and friends: length-prefixed, kept with the next scan
            length = struct.unpack(">H", data[pos + 2:pos + 4])[0]
            unit, pos = unit + data[pos:pos + 2 + length], pos + 2 + length
            continue
        nxt = pos + 2
        while True:  # entropy data ends at the next marker that is not a stuffed 0x00 or a restart
            nxt = data.index(b"\xff", nxt + 1)
            if data[nxt + 1] not in (0x00, *range(0xD0, 0xD8), 0xFF):
                break
        scans.append(unit + data[pos:nxt])
        pos, unit = nxt, b""
    return data[:first], scans, data[pos:]


def scan_bomb(size: int = 2048, repeats: int = 20_000) -> bytes:
    """A flat progressive JPEG whose smallest AC scan is repeated ``repeats`` times (a few hundred KB):
    every copy makes libjpeg walk every block of the image again."""
    data = encode(Image.new("RGB", (size, size), (90, 120, 200)), "JPEG", progressive=True, quality=90)
    head, scans, tail = _segments(data)

    def is_ac(scan: bytes) -> bool:
        sos = scan.index(b"\xff\xda")
        return scan[sos + 5 + 2 * scan[sos + 4]] > 0  # Ss > 0

    small = min((s for s in scans if is_ac(s)), key=len)
    return head + b"".join(scans) + small * repeats + tail


def tall_strips(count: int = 256, width: int = 32, base: int = 600_000) -> list[bytes]:
    """``count`` 1-bit PNGs ``width`` wide with distinct heights from ``base`` (each a new resize axis)."""
    return [encode(Image.new("1", (width, base + 1000 * i)), optimize=True) for i in range(count)]


def huge_header_request(host: str, port: int, size: int) -> bytes:
    """A raw HTTP/1.1 request with one header value of ``size`` bytes."""
    return (f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\nX-Big: ".encode() + b"a" * size
            + b"\r\n\r\n")


def tiff_odd_tags() -> list[tuple[str, bytes]]:
    """TIFFs Pillow chokes on with TypeError/OverflowError/...: float StripOffsets, huge counts, CMYK, EXIF."""
    base = encode(image((16, 16)), "TIFF")
    out = [("cmyk", encode(image((16, 16)).convert("CMYK"), "TIFF"))]
    buf = io.BytesIO()
    image((16, 16)).save(buf, "TIFF", exif=Image.Exif())
    out.append(("exif", buf.getvalue()))
    frames = [image((16, 16), seed=s) for s in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, "TIFF", save_all=True, append_images=frames[1:])
    out.append(("multi-page", buf.getvalue()))
    out += [(f"tag {tag} as {name}", _retype_tag(base, tag, kind)) for tag in (273, 279, 256, 257, 258, 277)
            for name, kind in (("FLOAT", 11), ("DOUBLE", 12), ("RATIONAL", 5), ("SRATIONAL", 10), ("ASCII", 2))]
    out.append(("StripOffsets huge", _retag_value(base, 273, 0xFFFFFFF0)))
    out.append(("StripByteCounts huge", _retag_value(base, 279, 0xFFFFFFF0)))
    return out


def _ifd_entries(data: bytes) -> tuple[str, int, int]:
    order = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack(order + "I", data[4:8])
    (n,) = struct.unpack(order + "H", data[ifd:ifd + 2])
    return order, ifd + 2, n


def _retype_tag(data: bytes, tag: int, kind: int) -> bytes:
    """``data`` with the type field of ``tag`` in the first IFD replaced by ``kind``."""
    out = bytearray(data)
    order, start, n = _ifd_entries(data)
    for i in range(n):
        pos = start + 12 * i
        if struct.unpack(order + "H", data[pos:pos + 2])[0] == tag:
            out[pos + 2:pos + 4] = struct.pack(order + "H", kind)
    return bytes(out)


def _retag_value(data: bytes, tag: int, value: int) -> bytes:
    out = bytearray(data)
    order, start, n = _ifd_entries(data)
    for i in range(n):
        pos = start + 12 * i
        if struct.unpack(order + "H", data[pos:pos + 2])[0] == tag:
            out[pos + 2:pos + 12] = struct.pack(order + "HII", 4, 1, value)
    return bytes(out)


def flat_png_rows(width: int, height: int) -> bytes:
    """A hand-built 8-bit gray PNG with one IDAT (for size-limit edge cases)."""
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    raw = (b"\x00" + bytes(width)) * height
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(raw, 9))
            + png_chunk(b"IEND", b""))


def noise(size: tuple[int, int] = (64, 48)) -> np.ndarray:
    return np.asarray(image(size))
