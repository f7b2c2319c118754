"""iRPE modules: bias and contextual relative position encoding on q, k or v (paper Eq. 13-17, 27-28).

Shapes: B images, H heads, N tokens (prefix + grid), D head dim, K buckets of one table, and H' the heads
of a table (1 when shared across heads, else H).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args

import torch
from torch import nn

from .buckets import METHODS, RPEMethod, TableMethod, bucket_ids, num_buckets, table_methods

#: "bias": one learned scalar per bucket and head; "ctx": contextual, a learned vector per bucket that
#: meets the query, key or attention weights.
RPEMode = Literal["bias", "ctx"]
#: What an RPE module encodes: the queries, the keys or the values.
RPETarget = Literal["q", "k", "v"]
#: The targets of a model ("" for none), in canonical order; other orders are accepted and normalized.
RPETargets = Literal["", "q", "k", "v", "qk", "qv", "kv", "qkv"]

MODES: tuple[RPEMode, ...] = get_args(RPEMode)


@dataclass(frozen=True)
class RPEConfig:
    """Where and how relative position is encoded.

    Attributes:
        on: the encoded targets, any combination of "q", "k", "v" ("" for none).
        method: how an offset becomes a bucket (see :data:`irpe.models.buckets.METHODS`).
        mode: "bias" (a scalar per bucket) or "ctx" (contextual: a vector per bucket).
        ratio: the piecewise ratio; the buckets reach out to beta = 2 * ratio.
        shared: one table for all heads (True) or one per head.
    """

    on: RPETargets = "k"
    method: RPEMethod = "product"
    mode: RPEMode = "ctx"
    ratio: float = 1.9
    shared: bool = True

    def __post_init__(self) -> None:
        if set(self.on) - set("qkv") or len(set(self.on)) != len(self.on):
            raise ValueError(f"rpe_on must combine 'q', 'k', 'v' (e.g. 'qkv') or be '', got {self.on!r}")
        if self.method not in METHODS:
            raise ValueError(f"rpe_method {self.method!r} is unknown; use one of {', '.join(METHODS)}")
        if self.mode not in MODES:
            raise ValueError(f"rpe_mode {self.mode!r} is unknown; use 'bias' or 'ctx'")
        if self.mode == "bias" and "v" in self.on:
            raise ValueError(
                "rpe_mode='bias' cannot be applied to v (a scalar bias has no value-side form); "
                "use rpe_mode='ctx' for v or drop 'v' from rpe_on"
            )
        if self.ratio <= 0:
            raise ValueError(f"rpe_ratio must be positive, got {self.ratio}")

    def normalized(self) -> RPEConfig:
        """The same config with ``on`` in canonical q, k, v order."""
        return replace(self, on="".join(target for target in "qkv" if target in self.on))


def flat_gather_index(table: torch.Tensor, buckets: int) -> torch.Tensor:
    """Index into a (n, buckets) matrix flattened: row i, bucket b -> i * buckets + b."""
    rows = table.shape[0]
    return (table + torch.arange(rows, dtype=table.dtype)[:, None] * buckets).flatten()


class RelativePosition(nn.Module):
    """One bucket table and its learned embedding.

    ``transposed=True`` acts on queries or keys and returns an (B, H, N, N) attention addend;
    ``transposed=False`` acts on attention weights and returns a (B, H, N, D) value addend.
    """

    def __init__(self, table_method: TableMethod, mode: RPEMode, ratio: float, heads: int, head_dim: int,
                 grid: tuple[int, int], skip: int, transposed: bool) -> None:
        super().__init__()
        if mode == "bias" and not transposed:
            raise ValueError("bias mode has no value-side (non-transposed) form; use mode='ctx' on v")
        self.mode, self.transposed, self.heads, self.head_dim = mode, transposed, heads, head_dim
        self.num_buckets = num_buckets(table_method, ratio, skip)
        table = torch.from_numpy(bucket_ids(table_method, ratio, grid[0], grid[1], skip).copy())  # (N, N)
        self.register_buffer("bucket", table, persistent=False)
        self.register_buffer("bucket_flat", flat_gather_index(table, self.num_buckets), persistent=False)  # (N*N,)
        if mode == "bias":
            self.lookup_table_bias = nn.Parameter(torch.zeros(heads, self.num_buckets))  # (H', K)
        elif transposed:
            self.lookup_table_weight = nn.Parameter(torch.zeros(heads, head_dim, self.num_buckets))  # (H', D, K)
        else:
            self.lookup_table_weight = nn.Parameter(torch.zeros(heads, self.num_buckets, head_dim))  # (H', K, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The addend for ``x``: queries or keys (B, H, N, D) when transposed, else attention (B, H, N, N)."""
        tokens = self.bucket.shape[0]
        if self.mode == "bias":
            bias = self.lookup_table_bias[:, self.bucket.flatten()]  # (H', N*N)
            return bias.view(1, -1, tokens, tokens)  # (1, H', N, N)
        batch, heads = x.shape[0], x.shape[1]
        if self.transposed:  # Eq. 27: q . W for every bucket, then gather by the constant table.
            per_bucket = torch.matmul(x, self.lookup_table_weight.unsqueeze(0))  # (B, H, N, K)
            gathered = per_bucket.flatten(2)[:, :, self.bucket_flat]  # (B, H, N*N)
            return gathered.view(batch, heads, tokens, tokens)  # (B, H, N, N)
        # Eq. 28 for values: sum attention weights into buckets, then one (K, D) matmul.
        sums = x.new_zeros(batch, heads, tokens, self.num_buckets)  # (B, H, N, K)
        sums.scatter_add_(3, self.bucket.expand(batch, heads, tokens, tokens), x)
        return torch.matmul(sums, self.lookup_table_weight.unsqueeze(0))  # (B, H, N, D)


class CrossRelativePosition(nn.Module):
    """The cross method: a rows table plus a cols table, summed."""

    def __init__(self, **kwargs) -> None:
        super().__init__()
        self.rp_rows = RelativePosition("cross_rows", **kwargs)
        self.rp_cols = RelativePosition("cross_cols", **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The rows addend plus the cols addend (shapes as :meth:`RelativePosition.forward`)."""
        return self.rp_rows(x) + self.rp_cols(x)


def build_rpe(config: RPEConfig, target: RPETarget, *, num_heads: int, head_dim: int, grid: tuple[int, int],
              skip: int) -> nn.Module | None:
    """The RPE module for ``target`` ("q", "k" or "v"), or None when ``config`` does not encode it."""
    if target not in config.on:
        return None
    kwargs = dict(mode=config.mode, ratio=config.ratio, heads=1 if config.shared else num_heads,
                  head_dim=head_dim, grid=grid, skip=skip, transposed=target != "v")
    if config.method == "cross":
        return CrossRelativePosition(**kwargs)
    (method,) = table_methods(config.method)
    return RelativePosition(method, **kwargs)


def rpe_tables(module: nn.Module) -> list[RelativePosition]:
    """The RelativePosition leaves of an RPE module (two for cross, one otherwise)."""
    if isinstance(module, RelativePosition):
        return [module]
    return [module.rp_rows, module.rp_cols]
