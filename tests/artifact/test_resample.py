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
_RNG = np.random.default_rng(7)  # one generator: 40 different geometries
RANDOM = [tuple(int(v) for v in _RNG.integers(24, 1400, 2)) for _ in range(40)]
GEOMETRIES = [(256, 224), (232, 224), (224, 224), (36, 32)]
FILTERS = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "nearest": Image.NEAREST}


def reference_size(width: int, height: int, size: int) -> tuple[int, int]:
    """torchvision's Resize(int) rule, restated here (not via resample.resized_size): the shorter side
    becomes ``size``, the longer ``int(size * long / short)``; an image already that size is kept."""
    short, long = min(width, height), max(width, height)
    if short == size:
        return width, height
    new_long = int(size * long / short)
    return (size, new_long) if width <= height else (new_long, size)


def pillow(img: Image.Image, size: int, crop: int, interpolation: str) -> np.ndarray:
    """Pillow's resize to the reference size, then torchvision's centre-crop rounding (crop <= image)."""
    w, h = reference_size(*img.size, size)
    resized = img if (w, h) == img.size else img.resize((w, h), FILTERS[interpolation])
    top, left = int(round((h - crop) / 2.0)), int(round((w - crop) / 2.0))
    return np.asarray(resized)[top:top + crop, left:left + crop]


def test_random_geometries_are_distinct():
    assert len(set(RANDOM)) == len(RANDOM) == 40


@pytest.mark.parametrize("size", FIXED + RANDOM)
@pytest.mark.parametrize("target", [256, 232, 224, 36])
def test_resized_size_matches_the_reference_rule(size: tuple[int, int], target: int) -> None:
    assert resample.resized_size(*size, target) == reference_size(*size, target)
    img = Image.new("RGB", size)
    assert resize_shorter(img, target, "bilinear").size == reference_size(*size, target)


def test_reference_crop_equals_the_library_crop() -> None:
    img = noise((301, 260), seed=11)
    np.testing.assert_array_equal(np.asarray(center_crop(img, 224)), np.asarray(img)[18:242, 38:262])


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


@needs_kernels
def test_accelerated_and_reference_preprocessing_agree() -> None:
    img = noise((640, 427), seed=3)
    pp = Preprocess()
    assert resample.resize_crop(img, pp.resize, pp.crop, pp.interpolation) is not None  # the fast path ran
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


@needs_kernels
def test_unverified_pillow_keeps_pillow_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under another Pillow release, shapes whose pass order depends on the release go to Pillow."""
    monkeypatch.setattr(resample, "_ORDER_VERIFIED", False)
    tall = noise((447, 1261), seed=4)  # vertical first under Pillow 13
    assert resample.resize_crop(tall, 256, 224, "bicubic") is None
    square = noise((512, 512), seed=5)  # horizontal first under every release
    assert resample.resize_crop(square, 256, 224, "bicubic") is not None


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


@needs_kernels
@pytest.mark.parametrize("size", FIXED[:8] + RANDOM[:10])
def test_array_input_equals_pillow(size: tuple[int, int]) -> None:
    """Pixels given as a (h, w, 3) uint8 array (a decoder's output, read in place) give Pillow's crop."""
    img = noise(size, seed=size[0] + size[1])
    arr = np.asarray(img).copy()
    for resize, crop in GEOMETRIES:
        fast = resample.resize_crop(arr, resize, crop, "bicubic")
        if fast is not None or crop <= min(resample.resized_size(*size, resize)):
            np.testing.assert_array_equal(fast, pillow(img, resize, crop, "bicubic"))
    assert resample.resize_crop(arr[:, ::2], 256, 224, "bicubic") is None  # not C-contiguous
    assert resample.resize_crop(arr[..., 0].copy(), 256, 224, "bicubic") is None  # not 3 channels


@needs_kernels
@pytest.mark.parametrize("rows", [1, 31, 32, 33, 70])
def test_horizontal_pass_in_strips_equals_rows_on_the_transpose(rows: int) -> None:
    """hrows (strips of 32 rows, in place) = transpose + rows + transpose, for every strip remainder."""
    rng = np.random.default_rng(rows)
    src = rng.integers(0, 256, (rows + 9, 61, 3), dtype=np.uint8)
    bounds, weights = resample.coefficients(50, 17, "bicubic")
    bounds = (bounds + np.array([[5, 0]])).astype(np.int32)  # columns 5..55 of the 61
    out = np.empty((rows, 17, 3), dtype=np.uint8)
    resample._resample.hrows(src, rows, 61, src.strides[0], 4 * src.strides[0], bounds, weights, weights.shape[1],
                             out)
    window = np.ascontiguousarray(src[4:4 + rows].transpose(1, 0, 2))
    want = np.empty((17, rows, 3), dtype=np.uint8)
    resample._resample.rows(window, 61, rows * 3, bounds, weights, weights.shape[1], want)
    np.testing.assert_array_equal(out, want.transpose(1, 0, 2))
    with pytest.raises(ValueError, match="bounds"):  # columns past the window
        resample._resample.hrows(src, rows, 61, src.strides[0], 0, (bounds + np.array([[10, 0]])).astype(np.int32),
                                 weights, weights.shape[1], out)
    with pytest.raises(ValueError, match="src"):  # rows past the end of the buffer
        resample._resample.hrows(src, rows, 61, src.strides[0], 10 * src.strides[0], bounds, weights,
                                 weights.shape[1], out)
    with pytest.raises(ValueError, match="dst"):
        resample._resample.hrows(src, rows, 61, src.strides[0], 0, bounds, weights, weights.shape[1], out[:-1])


@needs_kernels
def test_strided_transpose_reads_a_window_in_place() -> None:
    src = np.random.default_rng(3).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    out = np.empty((20, 10, 3), dtype=np.uint8)
    resample._resample.transpose(src, 10, 20, 3, out, (5 * 50 + 7) * 3, 50 * 3)
    np.testing.assert_array_equal(out, src[5:15, 7:27].transpose(1, 0, 2))
    with pytest.raises(ValueError, match="src"):  # the window runs past the end of the buffer
        resample._resample.transpose(src, 10, 20, 3, out, (35 * 50 + 7) * 3, 50 * 3)
    with pytest.raises(ValueError, match="bad sizes"):  # rows overlap: stride shorter than a row
        resample._resample.transpose(src, 10, 20, 3, out, 0, 20)


@needs_kernels
def test_lookup_equals_numpy_take() -> None:
    u8 = np.random.default_rng(4).integers(0, 256, (37, 29, 3), dtype=np.uint8)
    table = np.random.default_rng(5).standard_normal((3, 256)).astype(np.float32)
    want = np.stack([np.take(table[c], u8[..., c]) for c in range(3)])
    np.testing.assert_array_equal(resample.lookup(u8, table), want)
    with pytest.raises(ValueError, match="table"):
        resample._resample.lookup(u8, u8.size // 3, table[:2], np.empty(u8.size, np.float32))
