"""The compiled resize + crop gives exactly Pillow's pixels, for every geometry and both pass orders."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from irpe.artifact import Preprocess, resample
from irpe.artifact.preprocess import center_crop, crop_uint8, preprocess_image, resize_shorter

needs_kernels = pytest.mark.skipif(not resample.available(),
                                   reason="the C kernels were not built (no compiler) or this is not x86-64")

FIXED = [(512, 512), (640, 480), (480, 640), (500, 375), (257, 300), (256, 256), (256, 400), (1024, 768),
         (225, 1000), (447, 1261), (999, 301), (100, 900), (900, 100), (224, 224), (300, 224), (2000, 1500)]
RANDOM = [tuple(int(v) for v in np.random.default_rng(7).integers(24, 1400, 2)) for _ in range(40)]
GEOMETRIES = [(256, 224), (232, 224), (224, 224), (36, 32)]


def pillow(img: Image.Image, size: int, crop: int, interpolation: str) -> np.ndarray:
    return np.asarray(center_crop(resize_shorter(img, size, interpolation), crop))


def noise(size: tuple[int, int], seed: int) -> Image.Image:
    w, h = size
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


@needs_kernels
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
@pytest.mark.parametrize("size", FIXED + RANDOM)
def test_equals_pillow_bit_for_bit(size: tuple[int, int], interpolation: str) -> None:
    img = noise(size, seed=size[0] * 7 + size[1])
    checked = 0
    for resize, crop in GEOMETRIES:
        fast = resample.resize_crop(img, resize, crop, interpolation)
        if fast is None:  # crop larger than the resized image: Pillow's path pads
            assert crop > min(resample.resized_size(*size, resize))
            continue
        checked += 1
        assert fast.dtype == np.uint8 and fast.shape == (crop, crop, 3)
        np.testing.assert_array_equal(fast, pillow(img, resize, crop, interpolation))
    assert checked


@needs_kernels
def test_extreme_values_clip_like_pillow() -> None:
    """Checkerboards of 0/255 overshoot with bicubic's negative lobes: both clip the same way."""
    board = (np.indices((600, 800)).sum(axis=0) % 2 * 255).astype(np.uint8)
    img = Image.fromarray(np.repeat(board[:, :, None], 3, axis=2), "RGB")
    np.testing.assert_array_equal(resample.resize_crop(img, 256, 224, "bicubic"), pillow(img, 256, 224, "bicubic"))


@pytest.mark.parametrize("shape", [(895, 447, 512, 256), (1000, 1000, 500, 760), (1000, 1000, 500, 750)])
def test_pass_order_follows_pillow(shape: tuple[int, int, int, int]) -> None:
    """Pillow runs the vertical pass first iff the height loses over twice the pixels the width does;
    the two orders round differently, so Pillow's own output tells which one it ran."""
    h, w, nh, nw = shape
    img = noise((w, h), seed=h + w + nw)
    direct = np.asarray(img.resize((nw, nh), Image.BILINEAR))
    h_first = np.asarray(img.resize((nw, h), Image.BILINEAR).resize((nw, nh), Image.BILINEAR))
    assert np.array_equal(direct, h_first) != resample.vertical_first(w, h, nw, nh)


def test_unsupported_inputs_fall_back_to_pillow() -> None:
    img = noise((300, 200), seed=1)
    assert resample.resize_crop(img.convert("L"), 256, 224, "bicubic") is None
    assert resample.resize_crop(img, 256, 224, "nearest") is None
    assert resample.resize_crop(noise((200, 200), 2), 200, 224, "bicubic") is None  # crop pads
    pp = Preprocess(resize=256, crop=224, interpolation="nearest")
    np.testing.assert_array_equal(crop_uint8(img, pp), pillow(img, 256, 224, "nearest"))


def test_accelerated_and_reference_preprocessing_agree() -> None:
    img = noise((640, 427), seed=3)
    pp = Preprocess()
    np.testing.assert_array_equal(preprocess_image(img, pp), preprocess_image(img, pp, accelerated=False))


@needs_kernels
def test_kernels_reject_bad_buffers() -> None:
    """Sizes are checked in C before any pixel is touched (a bad call is a ValueError, not a crash)."""
    src = np.zeros((4, 6), dtype=np.uint8)
    bounds = np.array([[3, 3]], dtype=np.int32)  # reads rows 3..5 of a 4-row source
    with pytest.raises(ValueError, match="bounds"):
        resample._resample.rows(src, 4, 6, bounds, np.ones((1, 3), np.int32), 3, np.empty((1, 6), np.uint8))
    with pytest.raises(ValueError, match="dst"):
        resample._resample.transpose(src, 4, 2, 3, np.empty(5, np.uint8))


def test_coefficients_sum_to_one_in_fixed_point() -> None:
    bounds, weights = resample.coefficients(1000, 256, "bicubic")
    assert bounds.shape == (256, 2) and weights.shape[0] == 256
    assert np.all(np.abs(weights.sum(axis=1) - (1 << resample.FRACTION_BITS)) <= weights.shape[1])
    assert np.all(bounds[:, 0] >= 0) and np.all(bounds.sum(axis=1) <= 1000)


def test_unverified_pillow_keeps_pillow_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under another Pillow release, shapes whose pass order depends on the release go to Pillow."""
    monkeypatch.setattr(resample, "_ORDER_VERIFIED", False)
    tall = noise((447, 1261), seed=4)  # vertical first under Pillow 13
    assert resample.resize_crop(tall, 256, 224, "bicubic") is None
    square = noise((512, 512), seed=5)  # horizontal first under every release
    assert resample.resize_crop(square, 256, 224, "bicubic") is not None or not resample.available()


@needs_kernels
@pytest.mark.parametrize("size", [(2000, 1500), (1500, 2000), (300, 3000), (3000, 300), (640, 480), (447, 1261)])
def test_strips_give_the_same_pixels(size: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The first pass runs on strips (bounded memory for huge images): tiny strips change no pixel."""
    monkeypatch.setattr(resample, "STRIP_PIXELS", 5000)
    img = noise(size, seed=size[0] + 3 * size[1])
    for resize, crop in GEOMETRIES:
        np.testing.assert_array_equal(resample.resize_crop(img, resize, crop, "bicubic"),
                                      pillow(img, resize, crop, "bicubic"))


def test_window_cache_is_bounded_by_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = resample._WindowCache(1 << 20)
    monkeypatch.setattr(resample, "_CACHE", cache)
    for height in range(10_000, 10_400):
        resample.cached_window(height, height // 3, "bicubic", 100, 224)
    assert 0 < cache.bytes <= 1 << 20
    bounds, weights = resample.cached_window(9000, 3000, "bicubic", 100, 224)
    full = resample.coefficients(9000, 3000, "bicubic")
    assert np.array_equal(bounds, full[0][100:324]) and np.array_equal(weights, full[1][100:324])
