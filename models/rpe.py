"""iRPE modules: bias and contextual relative position encoding on q, k or v (paper Eq. 13-17, 27-28)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from .buckets import METHODS, bucket_ids, num_buckets, table_methods

MODES = ("bias", "ctx")


@dataclass(frozen=True)
class RPEConfig:
    """Where and how relative position is encoded. ``on`` is any combination of "q", "k", "v"."""

    on: str = "k"
    method: str = "product"
    mode: str = "ctx"
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
        return replace(self, on="".join(c for c in "qkv" if c in self.on))


def flat_gather_index(table: torch.Tensor, buckets: int) -> torch.Tensor:
    """Index into a (n, buckets) matrix flattened: row i, bucket b -> i * buckets + b."""
    n = table.shape[0]
    return (table + torch.arange(n, dtype=table.dtype)[:, None] * buckets).flatten()


class RelativePosition(nn.Module):
    """One bucket table and its learned embedding.

    ``transposed=True`` acts on queries or keys and returns an (B, H, n, n) attention addend;
    ``transposed=False`` acts on attention weights and returns a (B, H, n, d) value addend.
    """

    def __init__(self, table_method: str, mode: str, ratio: float, heads: int, head_dim: int,
                 grid: tuple[int, int], skip: int, transposed: bool) -> None:
        super().__init__()
        if mode == "bias" and not transposed:
            raise ValueError("bias mode has no value-side (non-transposed) form; use mode='ctx' on v")
        self.mode, self.transposed, self.heads, self.head_dim = mode, transposed, heads, head_dim
        self.num_buckets = num_buckets(table_method, ratio, skip)
        table = torch.from_numpy(bucket_ids(table_method, ratio, grid[0], grid[1], skip).copy())
        self.register_buffer("bucket", table, persistent=False)
        self.register_buffer("bucket_flat", flat_gather_index(table, self.num_buckets), persistent=False)
        if mode == "bias":
            self.lookup_table_bias = nn.Parameter(torch.zeros(heads, self.num_buckets))
        elif transposed:
            self.lookup_table_weight = nn.Parameter(torch.zeros(heads, head_dim, self.num_buckets))
        else:
            self.lookup_table_weight = nn.Parameter(torch.zeros(heads, self.num_buckets, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.bucket.shape[0]
        if self.mode == "bias":
            return self.lookup_table_bias[:, self.bucket.flatten()].view(1, -1, n, n)
        b, h = x.shape[0], x.shape[1]
        if self.transposed:  # Eq. 27: q . W for every bucket, then gather by the constant table.
            lut = torch.matmul(x, self.lookup_table_weight.unsqueeze(0))  # (B, H, n, K)
            return lut.flatten(2)[:, :, self.bucket_flat].view(b, h, n, n)
        # Eq. 28 for values: sum attention weights into buckets, then one (K, d) matmul.
        sums = x.new_zeros(b, h, n, self.num_buckets)
        sums.scatter_add_(3, self.bucket.expand(b, h, n, n), x)
        return torch.matmul(sums, self.lookup_table_weight.unsqueeze(0))


class CrossRelativePosition(nn.Module):
    """The cross method: a rows table plus a cols table, summed."""

    def __init__(self, **kwargs) -> None:
        super().__init__()
        self.rp_rows = RelativePosition("cross_rows", **kwargs)
        self.rp_cols = RelativePosition("cross_cols", **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rp_rows(x) + self.rp_cols(x)


def build_rpe(cfg: RPEConfig, target: str, num_heads: int, head_dim: int, grid: tuple[int, int],
              skip: int) -> nn.Module | None:
    """The RPE module for ``target`` in "q", "k", "v", or None when cfg does not encode it."""
    if target not in cfg.on:
        return None
    kwargs = dict(mode=cfg.mode, ratio=cfg.ratio, heads=1 if cfg.shared else num_heads,
                  head_dim=head_dim, grid=grid, skip=skip, transposed=target != "v")
    if cfg.method == "cross":
        return CrossRelativePosition(**kwargs)
    (method,) = table_methods(cfg.method)
    return RelativePosition(method, **kwargs)


def rpe_tables(module: nn.Module) -> list[RelativePosition]:
    """The RelativePosition leaves of an RPE module (two for cross, one otherwise)."""
    if isinstance(module, RelativePosition):
        return [module]
    return [module.rp_rows, module.rp_cols]
