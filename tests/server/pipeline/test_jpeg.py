"""The JPEG fast path gives Pillow's path's input bit for bit, and steps aside wherever it does not apply."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from irpe.artifact import Preprocess
from irpe.artifact.preprocess import preprocess_image
from irpe.server.errors import APIError
from irpe.server.pipeline import decode, jpeg

MAX_PIXELS = 40_000_000


def photo(size: tuple[int, int], seed: int) -> Image.Image:
    """Smooth colour structure plus noise (exercises IDCT rounding and chroma upsampling)."""
    rng = np.random.default_rng(seed)
    w, h = size
    base = Image.fromarray(rng.integers(0, 256, (5, 6, 3), dtype=np.uint8), "RGB").resize((w, h), Image.BICUBIC)
    noisy = np.asarray(base, dtype=np.int16) + rng.integers(-30, 31, (h, w, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def encode(img: Image.Image, **options: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **options)
    return buf.getvalue()


def pillow_path(data: bytes, pp: Preprocess) -> np.ndarray:
    """What the server computed before the fast path: Pillow decode, then the artifact's transform."""
    return preprocess_image(decode.decode_image(data, MAX_PIXELS), pp)


ENCODINGS = [{"subsampling": 2}, {"subsampling": 1}, {"subsampling": 0}, {"subsampling": 2, "progressive": True},
             {"subsampling": 0, "progressive": True}, {"subsampling": 2, "restart_marker_rows": 1},
             {"subsampling": 2, "quality": 35}, {"subsampling": 0, "quality": 100}]
SIZES = [(512, 512), (640, 480), (481, 641), (257, 300), (1023, 229), (256, 256), (333, 999)]


def test_the_decoders_agree_here() -> None:
    """simplejpeg is a dependency and decodes like Pillow on this install (else every test below is moot)."""
    assert jpeg.available()


@pytest.mark.parametrize("options", ENCODINGS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("size", SIZES)
def test_fast_path_is_bit_exact(size: tuple[int, int], options: dict) -> None:
    data = encode(photo(size, seed=size[0] + 3 * size[1]), **{"quality": 90, **options})
    for pp in (Preprocess(), Preprocess(resize=232, crop=224, interpolation="bilinear", invert="always")):
        img = decode.open_image(data, MAX_PIXELS)
        assert jpeg.applies(img, pp)
        fast = jpeg.prepare_jpeg(data, pp)
        assert fast is not None and fast.dtype == np.float32
        np.testing.assert_array_equal(fast, pillow_path(data, pp))
        np.testing.assert_array_equal(decode.prepare(data, pp, MAX_PIXELS), fast)


def rotated(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(photo((300, 260), seed=orientation), exif=exif.tobytes(), quality=90)


def test_exif_orientation_takes_pillows_path() -> None:
    pp = Preprocess()
    assert jpeg.applies(decode.open_image(rotated(1), MAX_PIXELS), pp)  # EXIF, but upright
    img = decode.open_image(rotated(6), MAX_PIXELS)
    assert not jpeg.applies(img, pp)
    out = decode.prepare(rotated(6), pp, MAX_PIXELS)  # rotated by Pillow's path
    np.testing.assert_array_equal(out, pillow_path(rotated(6), pp))


@pytest.mark.parametrize("pp", [Preprocess(grayscale=True), Preprocess(invert="auto"), Preprocess(fit="ink"),
                                Preprocess(mean=(0.5,), std=(0.5,))])
def test_other_transforms_take_pillows_path(pp: Preprocess) -> None:
    assert not jpeg.applies(decode.open_image(encode(photo((300, 260), 1)), MAX_PIXELS), pp)


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_other_jpeg_modes_take_pillows_path(mode: str) -> None:
    data = encode(photo((300, 260), 2).convert(mode))
    assert not jpeg.applies(decode.open_image(data, MAX_PIXELS), Preprocess())
    np.testing.assert_array_equal(decode.prepare(data, Preprocess(), MAX_PIXELS), pillow_path(data, Preprocess()))


def test_broken_jpegs_get_pillows_answer() -> None:
    """A truncated or corrupt JPEG makes the fast path step aside; Pillow's path gives the usual 400."""
    data = encode(photo((512, 512), 3), quality=90)
    truncated = data[: len(data) // 2]
    assert jpeg.prepare_jpeg(truncated, Preprocess()) is None
    with pytest.raises(APIError) as e:
        decode.prepare(truncated, Preprocess(), MAX_PIXELS)
    assert e.value.status == 400 and e.value.code == "truncated_image"
    garbled = data[:600] + bytes(200) + data[800:]
    assert jpeg.prepare_jpeg(garbled, Preprocess()) is None or np.array_equal(
        jpeg.prepare_jpeg(garbled, Preprocess()), pillow_path(garbled, Preprocess()))


def test_a_disagreeing_decoder_turns_the_fast_path_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another libjpeg-turbo build that rounds differently is caught by the startup comparison."""

    class OffByOne:
        @staticmethod
        def decode_jpeg(data: bytes, **kwargs: object) -> np.ndarray:
            return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) ^ np.uint8(1)

    monkeypatch.setattr(jpeg, "simplejpeg", OffByOne)
    jpeg.available.cache_clear()
    try:
        assert not jpeg.available()
        assert not jpeg.applies(decode.open_image(encode(photo((300, 260), 1)), MAX_PIXELS), Preprocess())
    finally:
        jpeg.available.cache_clear()


def test_thin_jpeg_is_refused_before_decoding() -> None:
    """The resized-size limit holds on the fast path too (a 4000x3 strip would resize to 341333x256)."""
    data = encode(photo((4000, 3), 5), quality=90)
    assert jpeg.applies(decode.open_image(data, MAX_PIXELS), Preprocess())
    with pytest.raises(APIError) as e:
        decode.prepare(data, Preprocess(), MAX_PIXELS)
    assert e.value.status == 413 and "crop it first" in e.value.message


@pytest.mark.parametrize("options", ENCODINGS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_read_frame_agrees_with_pillow(options: dict) -> None:
    """The frame header read from the marker segments: Pillow's size; sequential unless progressive."""
    data = encode(photo((333, 257), seed=4), **options)
    f = jpeg.read_frame(data)
    assert f is not None and (f.width, f.height) == Image.open(io.BytesIO(data)).size
    assert (f.components, f.precision, f.plain) == (3, 8, True)
    assert f.sequential != bool(options.get("progressive"))


def test_only_plain_jpegs_skip_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain JPEG is prepared without opening it in Pillow; EXIF, grayscale, CMYK, over-limit sizes,
    other formats and unreadable headers are not (Pillow's path then decides, as before)."""
    pp = Preprocess()
    plain = encode(photo((300, 260), 6), quality=90)
    assert jpeg.plain_size(plain, pp, MAX_PIXELS) == (300, 260)
    icc = encode(photo((300, 260), 6), quality=90, icc_profile=b"\0" * 300)
    assert jpeg.plain_size(icc, pp, MAX_PIXELS) == (300, 260)
    png = io.BytesIO()
    photo((30, 20), 1).save(png, "PNG")
    for data in (rotated(1), encode(photo((300, 260), 2).convert("L")), encode(photo((300, 260), 2).convert("CMYK")),
                 png.getvalue(), b"", plain[:2], plain[:30], b"\xff\xd8\xff\xda\x00\x02"):
        assert jpeg.plain_size(data, pp, MAX_PIXELS) is None
    assert jpeg.plain_size(plain, pp, 300 * 260 - 1) is None
    assert jpeg.plain_size(plain, Preprocess(grayscale=True), MAX_PIXELS) is None

    def no_pillow(*args: object, **kwargs: object) -> None:
        raise AssertionError("Pillow opened a plain JPEG")

    want, want_icc = pillow_path(plain, pp), pillow_path(icc, pp)
    monkeypatch.setattr(decode, "open_image", no_pillow)
    np.testing.assert_array_equal(decode.prepare(plain, pp, MAX_PIXELS), want)
    budget = decode.PixelBudget(10**6)
    np.testing.assert_array_equal(decode.prepare(icc, pp, MAX_PIXELS, budget=budget), want_icc)
    assert budget.free == budget.total


def test_plain_jpeg_limits_hold_without_pillow() -> None:
    """The scan limit and the resized-size limit answer as on Pillow's path."""
    many = encode(photo((64, 48), 7), quality=90, progressive=True)
    assert jpeg.plain_size(many, Preprocess(), MAX_PIXELS) is not None
    with pytest.raises(APIError) as e:
        decode.prepare(many, Preprocess(), MAX_PIXELS, max_scans=2)
    assert (e.value.status, e.value.code) == (413, "too_many_scans")
    thin = encode(photo((4000, 3), 5), quality=90)
    with pytest.raises(APIError) as e:
        decode.prepare(thin, Preprocess(), MAX_PIXELS)
    assert e.value.status == 413 and "crop it first" in e.value.message
