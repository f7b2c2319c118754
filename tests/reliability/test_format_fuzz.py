"""Time-bounded mutation fuzzer over PNG / JPEG / TIFF / GIF / WebP seeds.

Seeds cover the decoder paths that matter (progressive and CMYK JPEG, EXIF orientation, interlaced,
palette, 1- and 16-bit PNG, compressed / multi-page / 16-bit / float TIFF, animated GIF and WebP, lossless
WebP); mutations are generic (bit flips, interesting integers at any offset, truncation, insertion,
duplicated ranges, splices between seeds) and structural (PNG IHDR sizes with a fixed CRC, TIFF tag
types and values, repeated JPEG scans). Property: every input is classified or refused with a 4xx
``APIError`` within a bounded time; over HTTP, a 4xx JSON answer and a server that keeps answering.
``IRPE_FUZZ_SECONDS`` (default 20) bounds the in-process run; the seed is fixed, so a run is reproducible.
"""

from __future__ import annotations

import io
import os
import random
import struct
import time
import zlib

import httpx
import numpy as np
import pytest
from PIL import Image, features

from irpe.artifact import Preprocess
from irpe.server.errors import APIError
from irpe.server.pipeline.decode import PixelBudget, prepare
from tests.reliability import hostile
from tests.reliability.procs import ServerProcess
from tests.reliability.record import record
from tests.server.helpers import CROP, encode, image

PP = Preprocess(resize=36, crop=CROP)
MAX_PIXELS = 2_000_000
SECONDS = float(os.environ.get("IRPE_FUZZ_SECONDS", "20"))
SLOWEST_S = 5.0  # one example, on a shared 2-core machine
INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::PIL.Image.DecompressionBombWarning")


def _save(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def seeds() -> dict[str, bytes]:
    """Small valid files, one per decoder path worth mutating."""
    rgb = image((40, 28))
    exif = Image.Exif()
    exif[0x0112] = 6
    frames = [image((24, 16), seed=s) for s in range(3)]
    out = {
        "png rgb": encode(rgb), "png palette+trns": encode(rgb.convert("P"), transparency=0),
        "png 1-bit": encode(rgb.convert("1")), "png 16-bit": encode(Image.new("I;16", (30, 20), 4000)),
        "png LA interlaced": encode(rgb.convert("LA"), interlace=1),
        "jpeg baseline": encode(rgb, "JPEG", quality=80), "jpeg progressive": encode(rgb, "JPEG", progressive=True),
        "jpeg gray 4:2:0": encode(rgb.convert("L"), "JPEG"), "jpeg cmyk": encode(rgb.convert("CMYK"), "JPEG"),
        "jpeg exif rotated": _save(rgb, "JPEG", exif=exif), "jpeg scans x20": hostile.scan_bomb(32, 20),
        "tiff raw": encode(rgb, "TIFF"), "tiff lzw": _save(rgb, "TIFF", compression="tiff_lzw"),
        "tiff deflate 16-bit": encode(Image.new("I;16", (20, 12), 9), "TIFF", compression="tiff_adobe_deflate"),
        "tiff float": encode(Image.new("F", (20, 12), 0.25), "TIFF"), "tiff cmyk": encode(rgb.convert("CMYK"), "TIFF"),
        "tiff packbits multipage": _save(frames[0], "TIFF", compression="packbits", save_all=True,
                                         append_images=frames[1:]),
        "gif": encode(rgb.convert("P"), "GIF"),
        "gif animated": _save(frames[0].convert("P"), "GIF", save_all=True, append_images=frames[1:], duration=40),
        "webp lossy": encode(rgb, "WEBP", quality=70), "webp lossless alpha": encode(rgb.convert("RGBA"), "WEBP",
                                                                                      lossless=True),
    }
    if features.check("webp_anim"):
        out["webp animated"] = _save(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=40)
    return out


def _png_resize(data: bytearray, rnd: random.Random) -> None:
    if data[:8] != b"\x89PNG\r\n\x1a\n" or len(data) < 33:
        return
    w, h = rnd.choice([(0, 1), (1, 0), (1 << 31, 1), (70_000, 70_000), (1, 2_000_000), (3, 5), (40, 28)])
    data[16:24] = struct.pack(">II", w, h)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))


def _tiff_tag(data: bytearray, rnd: random.Random) -> None:
    if data[:2] not in (b"II", b"MM") or len(data) < 16:
        return
    order = "<" if data[:2] == b"II" else ">"
    ifd = struct.unpack(order + "I", data[4:8])[0]
    if ifd + 2 > len(data):
        return
    n = struct.unpack(order + "H", data[ifd:ifd + 2])[0]
    if n == 0 or ifd + 2 + 12 * n > len(data):
        return
    pos = ifd + 2 + 12 * rnd.randrange(n)
    if rnd.random() < 0.5:
        data[pos + 2:pos + 4] = struct.pack(order + "H", rnd.choice([1, 2, 3, 4, 5, 7, 10, 11, 12, 16, 99]))
    else:
        data[pos + 4:pos + 12] = struct.pack(order + "II", rnd.choice([0, 1, 2, 1 << 20]), rnd.choice(INTERESTING))


def _jpeg_repeat_scan(data: bytearray, rnd: random.Random) -> None:
    sos = data.find(b"\xff\xda", 2)
    end = data.find(b"\xff\xda", sos + 2)
    if sos > 0 and end > sos:
        data[end:end] = data[sos:end] * rnd.randint(1, 200)


def mutate(data: bytes, rnd: random.Random, others: list[bytes]) -> bytes:
    """1-8 mutations of ``data``."""
    out = bytearray(data)
    for _ in range(rnd.randint(1, 8)):
        if not out:
            break
        pos = rnd.randrange(len(out))
        op = rnd.randrange(10)
        if op == 0:
            out[pos] ^= 1 << rnd.randrange(8)
        elif op == 1:
            width, order = rnd.choice([(1, ">"), (2, ">"), (2, "<"), (4, ">"), (4, "<")])
            value = rnd.choice(INTERESTING) & ((1 << (8 * width)) - 1)
            out[pos:pos + width] = value.to_bytes(width, "big" if order == ">" else "little")
        elif op == 2:
            del out[rnd.randrange(len(out)):]
        elif op == 3:
            out[pos:pos] = rnd.randbytes(rnd.randint(1, 64))
        elif op == 4:
            end = min(len(out), pos + rnd.randint(1, 256))
            out[end:end] = out[pos:end] * rnd.randint(1, 50)
        elif op == 5:
            other = rnd.choice(others)
            out[pos:] = other[rnd.randrange(len(other)):]
        elif op == 6:
            _png_resize(out, rnd)
        elif op == 7:
            _tiff_tag(out, rnd)
        elif op == 8:
            _jpeg_repeat_scan(out, rnd)
        else:
            out[min(pos, 64) % len(out)] = rnd.randrange(256)  # headers hold sizes and offsets: hit them harder
    return bytes(out)


def _outcome(data: bytes, budget: PixelBudget) -> str:
    try:
        x = prepare(data, PP, MAX_PIXELS, budget=budget, max_scans=100)
    except APIError as e:
        assert e.status in (400, 413, 415), (e.status, e.code, e.message)
        assert e.code and e.message
        return str(e.status)
    assert x.shape == (3, CROP, CROP) and x.dtype == np.float32 and np.isfinite(x).all()
    return "ok"


def test_every_seed_decodes() -> None:
    budget = PixelBudget(2 * MAX_PIXELS)
    assert {name: _outcome(blob, budget) for name, blob in seeds().items()} == dict.fromkeys(seeds(), "ok")


def test_mutation_fuzz_in_process() -> None:
    """Mutated seeds for IRPE_FUZZ_SECONDS: never a non-4xx exception, never one slow example."""
    rnd, base = random.Random(22), seeds()
    names, blobs = list(base), list(base.values())
    budget = PixelBudget(2 * MAX_PIXELS)
    outcomes: dict[str, int] = {}
    slowest, n, stop = (0.0, ""), 0, time.monotonic() + SECONDS
    while time.monotonic() < stop:
        k = n % len(blobs)
        data = mutate(blobs[k], rnd, blobs)
        start = time.perf_counter()
        try:
            result = _outcome(data, budget)
        except AssertionError:
            raise
        except Exception as e:  # not an APIError: a decoder error that would be a 500
            raise AssertionError(f"example {n} (seed {names[k]}): {type(e).__name__}: {e}; "
                                 f"input {data[:64].hex()}... ({len(data)} bytes)") from e
        took = time.perf_counter() - start
        slowest = max(slowest, (took, names[k]))
        outcomes[result] = outcomes.get(result, 0) + 1
        n += 1
    assert n >= min(200, 10 * SECONDS), f"only {n} examples in {SECONDS}s"
    assert slowest[0] < SLOWEST_S, f"slowest example took {slowest[0]:.2f}s (seed {slowest[1]})"
    assert outcomes.get("ok") and len(outcomes) >= 3, outcomes  # the mutations reach decoding and refusal
    assert budget.free == budget.total


def test_mutation_fuzz_over_http(server: ServerProcess) -> None:
    rnd, base = random.Random(2222), list(seeds().values())
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for i in range(60):
            data = mutate(base[i % len(base)], rnd, base)
            r = client.post("/classify", content=data, headers={"content-type": "application/octet-stream"})
            record("format-fuzz", "raw body", r)
            assert r.status_code in (200, 400, 413, 415), r.text
            if r.status_code != 200:
                assert set(r.json()) == {"error"} and r.json()["error"]["code"]
        assert client.post("/classify", content=encode(image()), headers={"content-type": "image/png"}
                           ).status_code == 200
    assert "Traceback" not in server.output() and "unhandled error" not in server.output()
