"""Renderings of scikit-learn's 8x8 digits the way people show and draw them (torch-free).

One :class:`Rendering` says how a digit becomes an image file: side 8..512 px, the upscaling filter
(nearest, bilinear, bicubic, antialiased = Lanczos), PNG or JPEG, light on dark or dark on light, grey
or colour, thinner or thicker strokes, a blank margin, a shift and a rotation. :data:`FAMILIES` draws
one family's renderings (the others' factors stay plain, the size and filter vary); :func:`held_out_set`
is the held-out evaluation set of every family, and :func:`training_rendering` the mixture the digits
training samples from (on the training split only).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image, ImageFilter

MAX_VALUE = 16.0
FILTERS = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC,
           "antialiased": Image.LANCZOS}
SIZES = (8, 12, 16, 24, 28, 32, 48, 64, 96, 128, 160, 224, 256, 384, 512)
TEST_SEED = 20


def split_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, x_val, y_train, y_val) with x as (N, 8, 8) float arrays: stratified 80/20, seed 0."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    ds = load_digits()
    x_tr, x_va, y_tr, y_va = train_test_split(ds.images, ds.target, test_size=0.2, random_state=0,
                                              stratify=ds.target)
    return x_tr, x_va, y_tr, y_va


def digit_image(pixels: np.ndarray, dark_on_light: bool = False) -> Image.Image:
    """An (8, 8) digits sample (0..16, light ink on dark) as an 8-bit grayscale PIL image."""
    v = np.rint(np.asarray(pixels, dtype=np.float64).reshape(8, 8) * (255.0 / MAX_VALUE)).astype(np.uint8)
    return Image.fromarray(255 - v if dark_on_light else v, mode="L")


@dataclass(frozen=True)
class Rendering:
    """How one digit becomes an image file (see the module docstring)."""

    size: int = 32
    interpolation: str = "bilinear"
    fmt: str = "PNG"
    quality: int = 90
    paper: tuple[int, int, int] = (0, 0, 0)
    ink: tuple[int, int, int] = (255, 255, 255)
    stroke: int = 0  # < 0 thinner, > 0 thicker (min/max filter passes at >= 64 px)
    margin: float = 0.0  # blank border on each side, fraction of the side
    shift: tuple[float, float] = (0.0, 0.0)  # fraction of the side
    angle: float = 0.0  # degrees, counter-clockwise

    @property
    def grey(self) -> bool:
        return len({*self.paper}) == 1 and len({*self.ink}) == 1


def _strokes(img: Image.Image, stroke: int, side: int) -> Image.Image:
    """Smooth upscale to >= 64 px, erode (stroke < 0) or dilate (> 0), back to ``side``."""
    work = max(64, side)
    big = img.resize((work, work), Image.BICUBIC)
    k = 2 * max(1, work // 32) + 1
    filt = ImageFilter.MaxFilter(k) if stroke > 0 else ImageFilter.MinFilter(k)
    for _ in range(abs(stroke)):
        big = big.filter(filt)
    return big.resize((side, side), Image.LANCZOS)


def render(pixels: np.ndarray, r: Rendering) -> Image.Image:
    """The decoded image of ``pixels`` (8x8, 0..16) rendered as ``r`` says (mode L or RGB)."""
    side = max(1, round(r.size * (1.0 - 2.0 * r.margin)))
    digit = digit_image(pixels)
    if r.stroke:
        digit = _strokes(digit, r.stroke, side)
    elif side != 8:
        digit = digit.resize((side, side), FILTERS[r.interpolation])
    canvas = Image.new("L", (r.size, r.size), 0)
    offset = (r.size - side) / 2.0
    canvas.paste(digit, (round(offset + r.shift[0] * r.size), round(offset + r.shift[1] * r.size)))
    if r.angle:
        canvas = canvas.rotate(r.angle, resample=Image.BILINEAR, fillcolor=0)
    t = np.asarray(canvas, dtype=np.float32)[..., None] / 255.0
    rgb = np.asarray(r.paper, np.float32) * (1.0 - t) + np.asarray(r.ink, np.float32) * t
    out = Image.fromarray(np.rint(rgb).astype(np.uint8), "RGB")
    return out.convert("L") if r.grey else out


def encode(img: Image.Image, r: Rendering) -> bytes:
    """The file bytes (PNG, or JPEG at ``r.quality``)."""
    buf = io.BytesIO()
    img.save(buf, format=r.fmt, **({"quality": r.quality} if r.fmt == "JPEG" else {}))
    return buf.getvalue()


def image_bytes(pixels: np.ndarray, r: Rendering) -> bytes:
    """:func:`render` then :func:`encode`."""
    return encode(render(pixels, r), r)


def decoded(pixels: np.ndarray, r: Rendering) -> Image.Image:
    """What a server decodes from :func:`image_bytes` (JPEG artefacts included)."""
    if r.fmt == "PNG":
        return render(pixels, r)
    with Image.open(io.BytesIO(image_bytes(pixels, r))) as im:
        return im.convert("RGB")


# ---- families -----------------------------------------------------------------------------------

def _colours(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Paper and ink colours at least 45% apart in luminance, either one the lighter."""
    while True:
        a, b = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
        la, lb = (float(np.dot(c, (0.299, 0.587, 0.114))) for c in (a, b))
        if abs(la - lb) >= 0.45 * 255:
            return tuple(int(v) for v in a), tuple(int(v) for v in b)


def _base(rng: np.random.Generator, i: int, sizes: tuple[int, ...] = SIZES) -> Rendering:
    """Plain grey PNG, light on dark, at the i-th size (cycled) with a random filter."""
    return Rendering(size=sizes[i % len(sizes)], interpolation=str(rng.choice(list(FILTERS))))


_DARK = {"paper": (255, 255, 255), "ink": (0, 0, 0)}
_LARGE = tuple(s for s in SIZES if s >= 28)

FAMILIES: dict[str, Callable[[np.random.Generator, int], Rendering]] = {
    "nearest": lambda rng, i: replace(_base(rng, i), interpolation="nearest"),
    "bilinear": lambda rng, i: replace(_base(rng, i), interpolation="bilinear"),
    "bicubic": lambda rng, i: replace(_base(rng, i), interpolation="bicubic"),
    "antialiased": lambda rng, i: replace(_base(rng, i), interpolation="antialiased"),
    "jpeg": lambda rng, i: replace(_base(rng, i), fmt="JPEG", quality=int(rng.integers(60, 96)),
                                   **(_DARK if i % 2 else {})),
    "dark_on_light": lambda rng, i: replace(_base(rng, i), **_DARK),
    "colour": lambda rng, i: replace(_base(rng, i), **dict(zip(("paper", "ink"), _colours(rng), strict=True))),
    "thin": lambda rng, i: replace(_base(rng, i, _LARGE), stroke=-1, **(_DARK if i % 2 else {})),
    "thick": lambda rng, i: replace(_base(rng, i, _LARGE), stroke=1, **(_DARK if i % 2 else {})),
    "margin": lambda rng, i: replace(_base(rng, i, _LARGE), margin=float(rng.uniform(0.05, 1 / 3)),
                                     **(_DARK if i % 2 else {})),
    "shift_rotate": lambda rng, i: replace(_base(rng, i, tuple(s for s in SIZES if s >= 16)),
                                           margin=0.12, shift=tuple(float(v) for v in rng.uniform(-0.1, 0.1, 2)),
                                           angle=float(rng.uniform(-15, 15)), **(_DARK if i % 2 else {})),
}


def family_rendering(family: str, i: int, seed: int = TEST_SEED) -> Rendering:
    """The i-th rendering of ``family`` (deterministic in family, i and seed)."""
    names = list(FAMILIES)
    return FAMILIES[family](np.random.default_rng([seed, names.index(family), i]), i)


def held_out_set(families: list[str] | None = None, per_family: int | None = None,
             ) -> Iterator[tuple[str, int, Rendering, np.ndarray, int]]:
    """(family, index, rendering, pixels, label) over the held-out split; ``per_family`` takes an
    evenly spread, fixed subset of the 360 held-out digits."""
    _, x_va, _, y_va = split_digits()
    n = len(y_va)
    idx = list(range(n)) if per_family is None or per_family >= n else \
        [int(k * n / per_family) for k in range(per_family)]
    for family in families or list(FAMILIES):
        for i in idx:
            yield family, i, family_rendering(family, i), x_va[i], int(y_va[i])


def training_rendering(rng: np.random.Generator) -> Rendering:
    """One draw of the training mixture: every family's factors, sizes 8..160 (larger sides look the
    same after the ink fit), so what the test set varies the model has seen varied."""
    sizes = tuple(s for s in SIZES if s <= 160)
    r = Rendering(size=int(rng.choice(sizes)), interpolation=str(rng.choice(list(FILTERS))))
    if rng.random() < 0.3:
        r = replace(r, fmt="JPEG", quality=int(rng.integers(50, 96)))
    if rng.random() < 0.3:
        r = replace(r, **dict(zip(("paper", "ink"), _colours(rng), strict=True)))
    elif rng.random() < 0.5:
        r = replace(r, **_DARK)
    if rng.random() < 0.5 and r.size >= 24:
        r = replace(r, stroke=int(rng.choice([-1, 1])))
    if rng.random() < 0.5 and r.size >= 24:
        r = replace(r, margin=float(rng.uniform(0.08, 0.34)),
                    shift=tuple(float(v) for v in rng.uniform(-0.08, 0.08, 2)), angle=float(rng.uniform(-18, 18)))
    elif rng.random() < 0.3:
        r = replace(r, angle=float(rng.uniform(-12, 12)))
    return r
