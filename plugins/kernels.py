"""Triton kernels for RPEIndex and RPEBucketSum (fp32 / fp16), plus launch wrappers on torch tensors.

Argument order follows TensorRT's AOT plugin convention: input tensors, then int32 scalars, then
output tensors (``tensorrt.plugin.aot_impl``: "extra_args ... located after the tensor inputs and before
the tensor outputs"). Both kernels use the grid ``(Lq, cdiv(B*H, BLOCK_BH))``: program ``(i, p)`` handles
query row ``i`` for a block of ``BLOCK_BH`` (batch, head) rows, looping over keys in ``BLOCK_J`` chunks,
because the bucket table depends on ``(i, j)`` only. RPEBucketSum turns the bucket ids into a one-hot
``[BLOCK_J, BLOCK_K]`` tile and accumulates ``attn @ onehot`` with ``tl.dot`` in fp32, so fp16 inputs
accumulate in fp32. fp32 inputs take three TF32 tensor-core products (``tf32x3``: ``attn`` split into a high and
a low TF32 part; the one-hot is exact in TF32), as accurate as IEEE fp32 on the one-hot and 3 times faster on
an H200 at DeiT-S's shape (docs/gpu.md). Tensors must be contiguous; offsets are int64.

This module imports triton; :mod:`irpe.plugins` does not import it. For CPU tests set
``TRITON_INTERPRET=1`` before the first ``import triton``.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

INDEX_BLOCK_J = 64
SUM_BLOCK_J = 32
MAX_BLOCK_BH = 64
AOT_BLOCK_BH = 32  # fixed at AOT time, where the batch is symbolic


@triton.jit
def rpe_index_kernel(lut_ptr, index_ptr, BH, LQ, LK, K, out_ptr,
                     BLOCK_BH: tl.constexpr, BLOCK_J: tl.constexpr):
    """out[bh, i, j] = lut[bh, i, index[i, j]] for one query row i and BLOCK_BH rows of (b, h)."""
    i = tl.program_id(0)
    bh = tl.program_id(1) * BLOCK_BH + tl.arange(0, BLOCK_BH)
    bh_mask = bh < BH
    rows = bh.to(tl.int64) * LQ + i
    for j0 in range(0, LK, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        j_mask = j < LK
        idx = tl.load(index_ptr + i * LK + j, mask=j_mask, other=0)
        mask = bh_mask[:, None] & j_mask[None, :]
        vals = tl.load(lut_ptr + rows[:, None] * K + idx[None, :], mask=mask, other=0.0)
        tl.store(out_ptr + rows[:, None] * LK + j[None, :], vals, mask=mask)


@triton.jit
def bucket_sum_kernel(attn_ptr, index_ptr, BH, LQ, LK, K, out_ptr,
                      BLOCK_BH: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[bh, i, k] = sum_j [index[i, j] == k] attn[bh, i, j], accumulated in fp32."""
    i = tl.program_id(0)
    bh = tl.program_id(1) * BLOCK_BH + tl.arange(0, BLOCK_BH)
    bh_mask = bh < BH
    rows = bh.to(tl.int64) * LQ + i
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_BH, BLOCK_K), dtype=tl.float32)
    for j0 in range(0, LK, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        j_mask = j < LK
        idx = tl.load(index_ptr + i * LK + j, mask=j_mask, other=-1)
        a = tl.load(attn_ptr + rows[:, None] * LK + j[None, :],
                    mask=bh_mask[:, None] & j_mask[None, :], other=0.0)
        onehot = (idx[:, None] == ks[None, :]).to(a.dtype)
        if attn_ptr.dtype.element_ty == tl.float32:  # decided when compiled (module docstring)
            acc = tl.dot(a, onehot, acc, input_precision="tf32x3")
        else:
            acc = tl.dot(a, onehot, acc, input_precision="ieee")
    out = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * K + ks[None, :], out, mask=bh_mask[:, None] & (ks[None, :] < K))


def block_k_for(num_buckets: int) -> int:
    """BLOCK_K for RPEBucketSum: the next power of two >= num_buckets (at least 16, for tl.dot)."""
    return max(16, triton.next_power_of_2(int(num_buckets)))


def block_bh_for(bh: int) -> int:
    """BLOCK_BH for a launch with ``bh = B*H`` rows: a power of two in [16, MAX_BLOCK_BH]."""
    return min(MAX_BLOCK_BH, max(16, triton.next_power_of_2(int(bh))))


def _check(x: Any, index: Any, name: str) -> tuple[int, int, int, int]:
    import torch

    if x.dim() != 4 or x.dtype not in (torch.float32, torch.float16):
        raise ValueError(f"{name} must be a 4-D float32/float16 tensor, got {x.dtype} {tuple(x.shape)}")
    if index.dtype != torch.int32 or index.dim() != 2 or index.shape[0] != x.shape[2]:
        raise ValueError(f"index must be int32 [Lq={x.shape[2]}, Lk], got {index.dtype} {tuple(index.shape)}")
    if not (x.is_contiguous() and index.is_contiguous()):
        raise ValueError(f"{name} and index must be contiguous")
    b, h, lq, last = x.shape
    return b * h, lq, int(index.shape[1]), last


def rpe_index(lut: Any, index: Any, out: Any = None, *, block_bh: int | None = None,
              block_j: int = INDEX_BLOCK_J) -> Any:
    """Launch RPEIndex on torch tensors: ``lut[B,H,Lq,K]``, ``index:int32[Lq,Lk]`` -> ``[B,H,Lq,Lk]``."""
    import torch

    bh, lq, lk, k = _check(lut, index, "lut")
    if out is None:
        out = torch.empty((*lut.shape[:3], lk), dtype=lut.dtype, device=lut.device)
    block_bh = block_bh or block_bh_for(bh)
    grid = (lq, triton.cdiv(bh, block_bh))
    rpe_index_kernel[grid](lut, index, bh, lq, lk, k, out, BLOCK_BH=block_bh, BLOCK_J=block_j)
    return out


def bucket_sum(attn: Any, index: Any, num_buckets: int, out: Any = None, *, block_bh: int | None = None,
               block_j: int = SUM_BLOCK_J) -> Any:
    """Launch RPEBucketSum: ``attn[B,H,Lq,Lk]``, ``index:int32[Lq,Lk]`` -> ``[B,H,Lq,num_buckets]``."""
    import torch

    bh, lq, lk, _ = _check(attn, index, "attn")
    if index.shape[1] != lk:
        raise ValueError(f"index must be [Lq, Lk={lk}] to match attn, got {tuple(index.shape)}")
    if out is None:
        out = torch.empty((*attn.shape[:3], num_buckets), dtype=attn.dtype, device=attn.device)
    block_bh = block_bh or block_bh_for(bh)
    grid = (lq, triton.cdiv(bh, block_bh))
    bucket_sum_kernel[grid](attn, index, bh, lq, lk, num_buckets, out, BLOCK_BH=block_bh,
                            BLOCK_J=block_j, BLOCK_K=block_k_for(num_buckets))
    return out
