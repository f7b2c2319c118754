"""``fit="ink"``: one canonical input whatever the size, margin, position, polarity or colours."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from irpe.artifact import ModelArtifact, Preprocess
from irpe.artifact.preprocess import fit_ink, ink_box, ink_map, preprocess_image


def _glyph(size: int = 60, margin: int = 0, dx: int = 0, dy: int = 0) -> np.ndarray:
    """A light '7'-like stroke pair on black, ``size`` px plus ``margin`` px of blank on each side."""
    g = np.zeros((size, size), np.uint8)
    g[: size // 6, :] = 255
    for r in range(size):
        c = size - 1 - r * 2 // 3
        g[r, max(0, c - size // 12): c + 1] = 255
    out = np.zeros((size + 2 * margin, size + 2 * margin), np.uint8)
    out[margin + dy: margin + dy + size, margin + dx: margin + dx + size] = g
    return out


def test_polarity_and_grey_level_do_not_matter() -> None:
    a = _glyph()
    light = fit_ink(Image.fromarray(a), 32)
    assert np.array_equal(fit_ink(Image.fromarray(255 - a), 32), light)
    faint = Image.fromarray((a // 3 + 40).astype(np.uint8))  # grey ink on dark grey paper
    assert np.abs(fit_ink(faint, 32) - light).max() < 0.02


def test_colours_map_to_the_same_strokes() -> None:
    a = _glyph() / 255.0
    paper, ink = np.array([250, 230, 40]), np.array([20, 30, 160])  # dark blue on yellow
    rgb = (paper * (1 - a[..., None]) + ink * a[..., None]).round().astype(np.uint8)
    assert np.abs(fit_ink(Image.fromarray(rgb), 32) - fit_ink(Image.fromarray(_glyph()), 32)).mean() < 0.01


def test_margin_shift_and_size_are_normalised_away() -> None:
    ref = fit_ink(Image.fromarray(_glyph()), 32)
    base = Image.fromarray(_glyph(margin=10))
    for img in (Image.fromarray(_glyph(margin=40)), Image.fromarray(_glyph(margin=30, dx=-20, dy=15)),
                base.resize((400, 400), Image.BICUBIC), base.resize((24, 24), Image.LANCZOS)):
        got = fit_ink(img, 32)
        assert np.abs(got - ref).mean() < 0.04, img.size
    a = ink_box(ink_map(Image.fromarray(_glyph(margin=40))))
    b = ink_box(ink_map(Image.fromarray(_glyph(margin=30, dx=-20, dy=15))))  # glyph at x 10 (not 40), y 45
    assert a[2] - a[0] == pytest.approx(a[3] - a[1]) == pytest.approx(b[2] - b[0])
    assert a[0] - b[0] == pytest.approx(30) and a[1] - b[1] == pytest.approx(-5)
    assert 40 < a[0] + (a[2] - a[0]) / 2 < 100  # centred on the ink


def test_fit_size_makes_blocky_and_smooth_upscales_alike() -> None:
    rng = np.random.default_rng(0)
    small = (rng.random((8, 8)) > 0.6).astype(np.uint8) * 255
    small[:, [0, 7]] = 0
    small[[0, 7], :] = 0
    img = Image.fromarray(small)
    blocky, smooth = img.resize((160, 160), Image.NEAREST), img.resize((160, 160), Image.BICUBIC)
    direct = np.abs(fit_ink(blocky, 32) - fit_ink(smooth, 32)).mean()
    via12 = np.abs(fit_ink(blocky, 32, fit_size=12) - fit_ink(smooth, 32, fit_size=12)).mean()
    assert via12 < 0.7 * direct, (via12, direct)
    assert 0.9 < fit_ink(blocky, 32, fit_size=12).max() <= 1.0  # rescaled to its peak


def test_blank_and_tiny_images_give_a_blank_input() -> None:
    for img in (Image.new("L", (50, 40), 128), Image.new("RGB", (1, 1), (9, 9, 9)), Image.new("L", (3, 700), 0)):
        out = fit_ink(img, 32)
        assert out.shape == (32, 32) and not out.any()


def test_ink_touching_the_border_is_cut_with_blank_around() -> None:
    a = np.zeros((40, 40), np.uint8)
    a[:, :8] = 255  # a bar along the left edge
    out = fit_ink(Image.fromarray(a), 32)
    assert out.shape == (32, 32) and out[:, 16].max() > 0.9 and out[:, 0].max() < 0.1


def test_preprocess_image_with_fit_normalises_and_replicates() -> None:
    pp = Preprocess(resize=32, crop=32, interpolation="bilinear", mean=(0.2,) * 3, std=(0.3,) * 3,
                    grayscale=True, fit="ink")
    x = preprocess_image(Image.fromarray(_glyph()).convert("RGB"), pp)
    want = (fit_ink(Image.fromarray(_glyph()), 32) - np.float32(0.2)) / np.float32(0.3)
    assert x.shape == (3, 32, 32) and x.dtype == np.float32
    assert np.allclose(x[0], want, atol=1e-6) and np.array_equal(x[0], x[2])


def test_fit_is_part_of_model_json_and_defaults_to_none() -> None:
    assert Preprocess().fit == "none"
    art = ModelArtifact(name="m", architecture={}, img_size=32, num_classes=1, labels=["a"],
                        preprocess=Preprocess(fit="ink"), training={"seed": 0})
    back = ModelArtifact.from_dict(art.to_dict())
    assert back.preprocess.fit == "ink" and back.training == {"seed": 0}
