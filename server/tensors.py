"""Small inference tensors checked and batched without releasing the GIL.

NumPy's ufuncs and copies release the GIL above about 500 values. With the event loop and the inference threads
in one process that is a hand-off: a thread waiting for the GIL takes it, and the one that released it waits to
get it back (a wake-up and a switch each way). For a small tensor the work itself costs less than that, so it is
done here in bytes, the GIL held; large tensors go to NumPy, where releasing it pays.
"""

from __future__ import annotations

import numpy as np

QUIET_VALUES = 16384  # float32 tensors up to this many values (64 KB) are checked holding the GIL
_LE_FP32 = np.dtype("<f4")
_TOP_EXPONENT = (b"\x7f", b"\xff")  # a high byte with the exponent's top 7 bits set: |x| >= 2**127, Inf or NaN


def all_finite(values: np.ndarray) -> bool:
    """Whether every value of a tensor is finite (no NaN, no +-Inf).

    A small contiguous little-endian float32 tensor is first looked at in its bytes: each value's high byte
    holds the sign and the exponent's top 7 bits, so with no 0x7F or 0xFF among them every exponent is below
    254 and every value finite (a copy, a strided slice and two byte searches, all in C with the GIL held).
    Anything else (large, strided, another dtype, or a value of magnitude 2**127 or more) is checked by
    ``np.isfinite``. Measured on a near-free model, 8 requests at once: about 3 context switches per request
    with ``np.isfinite`` on the event loop, 1.2 with this.

    Args:
        values: the tensor.

    Returns:
        True when every value is finite.
    """
    if values.size <= QUIET_VALUES and values.dtype == _LE_FP32 and values.flags.c_contiguous:
        high = values.tobytes()[3::4]
        if _TOP_EXPONENT[0] not in high and _TOP_EXPONENT[1] not in high:
            return True
    return bool(np.isfinite(values).all())


def stack(images: list[np.ndarray]) -> np.ndarray:
    """The batch tensor [N, ...] of equal-shaped images: one image as a view (no copy); a small batch of one
    dtype joined in bytes, the GIL held (a writable array); any other with ``np.stack``.

    Args:
        images: the images, each [3, H, W].

    Returns:
        Their batch, in order.

    Raises:
        ValueError: images of different shapes (as ``np.stack``).
    """
    first = images[0]
    if len(images) == 1:
        return first[None]
    if first.size * len(images) > QUIET_VALUES or any(i.shape != first.shape or i.dtype != first.dtype
                                                      for i in images):
        return np.stack(images)
    joined = bytearray().join([i.tobytes() for i in images])
    return np.frombuffer(joined, dtype=first.dtype).reshape(len(images), *first.shape)
