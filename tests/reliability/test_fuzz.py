"""Property-based fuzzing (Hypothesis, bounded): the image decoder in-process, the multipart path over HTTP.

Property: every input is either classified or refused with a 4xx ``APIError`` / JSON error body, never a
crash or a 5xx.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from irpe.artifact import Preprocess
from irpe.server.errors import APIError
from irpe.server.pipeline.decode import prepare
from tests.reliability.procs import ServerProcess
from tests.reliability.record import record
from tests.server.helpers import CROP, encode, image

PP = Preprocess(resize=36, crop=CROP)
MAX_PIXELS = 2_000_000  # small so a mutated header cannot make one example decode for seconds
FORMATS = ["PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF"]
MODES = ["RGB", "L", "P", "RGBA", "CMYK", "I;16", "1", "LA"]
pytestmark = pytest.mark.filterwarnings("ignore:Tag data larger than file:UserWarning")
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _seed_image(fmt: str, mode: str, size: tuple[int, int]) -> bytes:
    """A valid image of ``mode`` in ``fmt`` (the mode is converted when the format cannot hold it)."""
    img = image(size, seed=size[0])
    if mode == "I;16":
        img = Image.fromarray(np.asarray(img.convert("L"), dtype=np.uint16) * 257)
    else:
        img = img.convert(mode)
    for candidate in (img, img.convert("RGB")):
        try:
            return encode(candidate, fmt)
        except (OSError, ValueError, KeyError):
            continue
    raise AssertionError(f"cannot encode {mode} as {fmt}")


@st.composite
def mutated_images(draw: st.DrawFn) -> bytes:
    """A valid image with bytes flipped, overwritten, truncated or spliced in."""
    size = (draw(st.integers(1, 48)), draw(st.integers(1, 48)))
    data = bytearray(_seed_image(draw(st.sampled_from(FORMATS)), draw(st.sampled_from(MODES)), size))
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "insert", "header"]))
        if not data:
            break
        pos = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[pos] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80]))
        elif op == "truncate":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=32))
        else:  # the header holds sizes and offsets: hit it harder
            data[min(pos, 40) % len(data)] = draw(st.integers(0, 255))
    return bytes(data)


def _check_prepare(data: bytes) -> None:
    try:
        x = prepare(data, PP, MAX_PIXELS)
    except APIError as e:
        assert e.status in (400, 413, 415), (e.status, e.code, e.message)
        assert e.code and e.message
        return
    assert x.shape == (3, CROP, CROP) and x.dtype == np.float32
    assert np.isfinite(x).all()


@FUZZ
@given(st.binary(max_size=2048))
def test_decoder_random_bytes(data: bytes) -> None:
    _check_prepare(data)


@FUZZ
@given(mutated_images())
def test_decoder_mutated_images(data: bytes) -> None:
    _check_prepare(data)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(FORMATS), st.sampled_from(MODES), st.integers(1, 64), st.integers(1, 64))
def test_decoder_accepts_every_valid_format_and_mode(fmt: str, mode: str, w: int, h: int) -> None:
    x = prepare(_seed_image(fmt, mode, (w, h)), PP, MAX_PIXELS)
    assert x.shape == (3, CROP, CROP) and np.isfinite(x).all()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    """The fuzzers' client; at teardown (whatever ran, in any order) the server must still be healthy."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c
        check_still_healthy(c, server)


GOOD = encode(image((40, 30)))
payloads = st.one_of(st.just(GOOD), st.binary(max_size=512), mutated_images())
names = st.one_of(st.none(), st.text(max_size=40), st.sampled_from(["../../x.png", "C:\\a\\b.png", "😀.jpg", ""]))
ctypes = st.sampled_from(["image/png", "image/jpeg", "application/octet-stream", "text/plain", "", "x/y; a=b"])
parts = st.tuples(st.sampled_from(["file", "file", "File", "image", "file[]", ""]), names, payloads, ctypes)


@settings(max_examples=50, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(st.lists(parts, max_size=4), st.dictionaries(st.text(min_size=1, max_size=10), st.text(max_size=20),
                                                    max_size=2))
def test_multipart_fuzz(client: httpx.Client, files: list[tuple[str, str | None, bytes, str]],
                        fields: dict[str, str]) -> None:
    """Random multipart forms: 200 with one prediction list per ``file`` file part, else a JSON 4xx."""
    multipart = [(f, (n, blob, ct) if ct else (n, blob)) for f, n, blob, ct in files]
    if not multipart and not fields:
        multipart = [("x", (None, b""))]  # force a multipart body
    try:
        r = client.post("/classify", files=multipart, data=fields)
    except UnicodeEncodeError:  # httpx cannot put this field name into a header; not the server's business
        return
    record("fuzz", "multipart", r)
    assert r.status_code in (200, 400, 413, 415), r.text
    if r.status_code == 200:
        # every part named "file" is an image, filename or not (a "file" text field too); others are ignored
        n_files = sum(1 for f, *_ in files if f == "file") + ("file" in fields)
        assert len(r.json()["predictions"]) == n_files
    else:
        body = r.json()
        assert set(body) == {"error"} and body["error"]["code"] and body["error"]["message"]


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(payloads, ctypes)
def test_raw_body_fuzz(client: httpx.Client, data: bytes, ctype: str) -> None:
    r = client.post("/classify", content=data, headers={"content-type": ctype} if ctype else {})
    record("fuzz", "raw body", r)
    assert r.status_code in (200, 400, 413, 415), r.text
    if r.status_code >= 400:
        assert set(r.json()) == {"error"}


def check_still_healthy(client: httpx.Client, server: ServerProcess) -> None:
    assert server.proc.poll() is None, "the server died during the fuzzing"
    r = client.post("/classify", files={"file": ("a.png", io.BytesIO(GOOD), "image/png")})
    assert r.status_code == 200
    log = server.output()
    assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]
