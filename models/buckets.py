"""Bucket index tables for 2D image relative position encoding (pure NumPy, torch-free).

Every function here mirrors the arithmetic of the authors' published code (float32, round half to
even, truncation of the beta clip) so that the tables equal the released models' tables bit for bit.
Patch (r, c) is token ``skip + r * width + c``; offsets are query minus key.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, get_args

import numpy as np

#: How relative position becomes a bucket: Euclidean distance, quantized squared distance, the sum of a
#: row and a column table, or one bucket per (row, column) offset pair.
RPEMethod = Literal["euc", "quant", "cross", "product"]
#: A method that owns one table; ``cross`` is the sum of ``cross_rows`` and ``cross_cols``.
TableMethod = Literal["euc", "quant", "cross_rows", "cross_cols", "product"]

METHODS: tuple[RPEMethod, ...] = get_args(RPEMethod)
TABLE_METHODS: tuple[TableMethod, ...] = get_args(TableMethod)


@dataclass(frozen=True)
class PiecewiseCoefficients:
    """alpha, beta, gamma of the piecewise index function g(x) (paper Eq. 18)."""

    alpha: float
    beta: float
    gamma: float

    @classmethod
    def from_ratio(cls, ratio: float) -> PiecewiseCoefficients:
        return cls(alpha=1.0 * ratio, beta=2.0 * ratio, gamma=8.0 * ratio)


def piecewise_index(x: np.ndarray, coef: PiecewiseCoefficients) -> np.ndarray:
    """The piecewise index function g(x) of the paper (Eq. 18), element-wise.

    Args:
        x: relative distances, any shape (computed in float32, as the authors' code does).
        coef: alpha (exact up to here), beta (the clip) and gamma (the logarithm's span).

    Returns:
        int64 array of ``x``'s shape: ``round(x)`` where ``|x| <= alpha``, logarithmic beyond, clipped
        to ``[-beta, beta]``.
    """
    x = np.asarray(x, dtype=np.float32)
    alpha, beta = np.float32(coef.alpha), np.float32(coef.beta)
    log_span = np.float32(np.log(coef.gamma / coef.alpha))
    absx = np.abs(x)
    far = absx > alpha
    out = np.round(x).astype(np.int64)
    xf, af = x[far], absx[far]
    mag = alpha + np.log(af / alpha) / log_span * (beta - alpha)
    y = np.sign(xf) * np.minimum(np.round(mag), beta)
    out[far] = y.astype(np.int64)
    return out


def _offsets(height: int, width: int) -> np.ndarray:
    rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    pos = np.stack([rows.ravel(), cols.ravel()], axis=1).astype(np.int64)
    return pos[:, None, :] - pos[None, :, :]


def _table_ids(method: TableMethod, diff: np.ndarray, coef: PiecewiseCoefficients) -> np.ndarray:
    b = int(coef.beta)
    if method == "euc":
        dist = np.round(np.sqrt(np.square(diff).sum(-1).astype(np.float32)))
        return piecewise_index(dist, coef) + b
    if method == "quant":
        return piecewise_index(np.square(diff).sum(-1), coef) + b
    if method == "cross_rows":
        return piecewise_index(diff[..., 0], coef) + b
    if method == "cross_cols":
        return piecewise_index(diff[..., 1], coef) + b
    if method == "product":
        side = 2 * b + 1
        return (piecewise_index(diff[..., 0], coef) + b) * side + piecewise_index(diff[..., 1], coef) + b
    raise ValueError(f"unknown bucket method {method!r}; expected one of {TABLE_METHODS}")


def num_buckets(method: TableMethod, ratio: float, skip: int = 0) -> int:
    """The number of buckets of one table.

    Args:
        method: the table's method (``product`` has ``(2 beta + 1)^2`` buckets, the others ``2 beta + 1``).
        ratio: the piecewise ratio; beta is ``2 * ratio``.
        skip: prefix tokens (class, distillation) outside the grid; any > 0 adds one shared bucket.

    Returns:
        The bucket count, the extra prefix bucket included.
    """
    b = int(PiecewiseCoefficients.from_ratio(ratio).beta)
    n = (2 * b + 1) ** 2 if method == "product" else 2 * b + 1
    return n + (1 if skip > 0 else 0)


@lru_cache(maxsize=256)
def _bucket_ids_cached(method: TableMethod, ratio: float, height: int, width: int, skip: int) -> np.ndarray:
    coef = PiecewiseCoefficients.from_ratio(ratio)
    ids = _table_ids(method, _offsets(height, width), coef)
    if skip > 0:
        n = height * width
        extra = num_buckets(method, ratio, 0)
        full = np.full((skip + n, skip + n), extra, dtype=np.int64)
        full[skip:, skip:] = ids
        ids = full
    ids.setflags(write=False)
    return ids


def bucket_ids(method: TableMethod, ratio: float, height: int, width: int, skip: int = 0) -> np.ndarray:
    """The bucket of every (query, key) token pair for one table.

    Args:
        method: one of :data:`TABLE_METHODS`.
        ratio: the piecewise ratio (beta = 2 * ratio).
        height: patch rows of the grid.
        width: patch columns of the grid.
        skip: prefix tokens before the grid; their rows and columns get the extra last bucket.

    Returns:
        A read-only (skip + H*W, skip + H*W) int64 array, cached per argument set.

    Raises:
        ValueError: ``method`` is unknown, the grid is smaller than 1x1 or ``skip`` is negative.
    """
    if method not in TABLE_METHODS:
        raise ValueError(f"unknown bucket method {method!r}; expected one of {TABLE_METHODS}")
    if height < 1 or width < 1 or skip < 0:
        raise ValueError(f"grid must be at least 1x1 and skip >= 0, got {height}x{width}, skip={skip}")
    return _bucket_ids_cached(method, float(ratio), int(height), int(width), int(skip))


def table_methods(method: RPEMethod) -> tuple[TableMethod, ...]:
    """The tables one RPE method sums: ``cross`` -> rows and cols, others -> themselves."""
    if method == "cross":
        return ("cross_rows", "cross_cols")
    if method not in METHODS:
        raise ValueError(f"unknown rpe_method {method!r}; expected one of {METHODS}")
    return (method,)
