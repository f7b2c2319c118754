"""all_finite: the same verdict as np.isfinite for every exponent and sign, on every path (bytes and NumPy);
stack: the bytes of np.stack."""

from __future__ import annotations

import numpy as np
import pytest

from irpe.server.tensors import QUIET_VALUES, all_finite, stack


def _values() -> np.ndarray:
    """One float32 per (high byte, top bit of the next byte, low bits): every sign and exponent, NaN and Inf."""
    high = np.repeat(np.arange(256, dtype=np.uint32), 8)
    second = np.tile(np.array([0x00, 0x80, 0x7F, 0xFF], dtype=np.uint32), 512)
    low = np.tile(np.array([0, 1, 0xFFFF, 0x1234], dtype=np.uint32), 512)
    return ((high << 24) | (second << 16) | low).view(np.float32)


def test_every_exponent_and_sign_alone_gets_isfinite_verdict() -> None:
    values = _values()
    assert set(np.isfinite(values)) == {True, False}  # both kinds are among them
    for v in values:
        tensor = np.full((1, 3, 4, 4), 0.5, np.float32)
        tensor[0, 1, 2, 3] = v
        assert all_finite(tensor) == bool(np.isfinite(v)), v


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf, 3.4e38, -3.4e38, 1.7e38, 1e-45, -0.0])
@pytest.mark.parametrize("size", [3 * 32 * 32, QUIET_VALUES, QUIET_VALUES + 1, 3 * 224 * 224])
def test_a_special_value_anywhere_in_small_and_large_tensors(special: float, size: int) -> None:
    rng = np.random.default_rng(size)
    tensor = rng.standard_normal(size).astype(np.float32)
    assert all_finite(tensor)
    tensor[rng.integers(size)] = special
    assert all_finite(tensor) == bool(np.isfinite(np.float32(special)))


@pytest.mark.parametrize("layout", ["strided", "big-endian", "float64"])
def test_other_layouts_take_numpy_with_the_same_verdict(layout: str) -> None:
    base = np.linspace(-1, 1, 3 * 32 * 32 * 2, dtype=np.float32)
    tensor = {"strided": base[::2], "big-endian": base.astype(">f4"), "float64": base.astype(np.float64)}[layout]
    assert all_finite(tensor)
    tensor = tensor.copy() if layout != "strided" else tensor
    tensor[7] = np.nan
    assert not all_finite(tensor)


@pytest.mark.parametrize("count", [1, 2, 4, 5])
@pytest.mark.parametrize("side", [32, 224])
def test_stack_equals_numpy_stack_and_is_writable(count: int, side: int) -> None:
    rng = np.random.default_rng(count * side)
    images = [rng.standard_normal((3, side, side)).astype(np.float32) for _ in range(count)]
    batch = stack(images)
    assert batch.dtype == np.float32 and batch.shape == (count, 3, side, side)
    assert batch.tobytes() == np.stack(images).tobytes()
    assert batch.flags.writeable  # an engine may write into its input
    assert np.shares_memory(batch, images[0]) == (count == 1)  # one image: a view, no copy


def test_stack_of_strided_images_and_of_different_shapes() -> None:
    base = np.arange(2 * 3 * 64 * 64, dtype=np.float32).reshape(2, 3, 64, 64)
    strided = [base[0, :, ::2, ::2], base[1, :, ::2, ::2]]
    assert stack(strided).tobytes() == np.stack(strided).tobytes()
    with pytest.raises(ValueError):
        stack([np.zeros((3, 32, 32), np.float32), np.zeros((3, 16, 16), np.float32)])
