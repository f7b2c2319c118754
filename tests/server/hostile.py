"""Hostile inputs for the decode-hardening tests: disguised and many-scan JPEGs, and a /healthz prober."""

from __future__ import annotations

import io
import threading
import time

import httpx
import numpy as np
from PIL import Image

# A baseline 8x8 YCbCr frame header: what a reader that gives RST0 a length finds.
FAKE_SOF = b"\xff\xc0\x00\x11\x08\x00\x08\x00\x08\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"


def com(payload: bytes) -> bytes:
    return b"\xff\xfe" + (len(payload) + 2).to_bytes(2, "big") + payload


def disguised_jpeg(real: bytes) -> bytes:
    """``real`` behind SOI, RST0 and two COM segments; read as if RST0 had a length (0xFFFE, the next COM's
    marker), the reader lands 65,538 bytes further on, inside the second COM, on :data:`FAKE_SOF`."""
    first = com(bytes(40000 - 2))  # bytes 4 .. 40006
    inside = 65538 - (4 + len(first) + 4)
    second = com(bytes(inside) + FAKE_SOF + bytes(64))
    data = b"\xff\xd8\xff\xd0" + first + second + real[2:]
    assert data[65538:65540] == b"\xff\xc0"
    return data


def big_progressive_jpeg(side: int = 6300) -> bytes:
    """A ``side`` x ``side`` progressive JPEG of a smooth image (a few hundred KB)."""
    rng = np.random.default_rng(29)
    small = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "RGB")
    buf = io.BytesIO()
    small.resize((side, side), Image.BILINEAR).save(buf, "JPEG", quality=60, progressive=True)
    return buf.getvalue()


def many_scan_jpeg(side: int = 1000, scans: int = 100) -> bytes:
    """A valid baseline (SOF0) gray ``side`` x ``side`` YCbCr JPEG with ``scans`` non-interleaved scans
    (each component over and over): Huffman tables with one 1-bit code each, every block 'DC 0, EOB'."""
    def seg(marker: int, body: bytes) -> bytes:
        return bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body

    one_code = bytes([1] + [0] * 15) + b"\x00"  # one code of length 1, symbol 0
    head = b"\xff\xd8" + seg(0xDB, b"\x00" + bytes([1] * 64)) + seg(0xC0, b"\x08" + side.to_bytes(2, "big") * 2
                                                                     + b"\x03\x01\x11\x00\x02\x11\x00\x03\x11\x00")
    head += seg(0xC4, b"\x00" + one_code) + seg(0xC4, b"\x10" + one_code)
    bits = ((side + 7) // 8) ** 2 * 2
    entropy = bytes(bits // 8) + (bytes([(1 << (8 - bits % 8)) - 1]) if bits % 8 else b"")
    body = b"".join(seg(0xDA, bytes([1, 1 + i % 3, 0, 0, 63, 0])) + entropy for i in range(scans))
    return head + body + b"\xff\xd9"


class Prober:
    """Times ``GET /healthz`` every ``every`` seconds in a thread (at most ``limit`` probes) while a block
    runs; ``latencies`` in seconds."""

    def __init__(self, url: str, every: float = 0.02, limit: int = 3000):
        self.url, self.every, self.limit = url, every, limit
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set() and len(self.latencies) < self.limit:
                start = time.perf_counter()
                try:
                    status = client.get(self.url + "/healthz").status_code
                except httpx.HTTPError as e:
                    status, self.failures = 0, [*self.failures, repr(e)]
                self.latencies.append(time.perf_counter() - start)
                if status != 200:
                    self.failures.append(f"/healthz answered {status}")
                self._stop.wait(self.every)

    def __enter__(self) -> Prober:
        self._thread.start()
        time.sleep(0.2)  # a few probes before the attack
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def worst(self) -> float:
        return max(self.latencies)
