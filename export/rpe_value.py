"""Value-side iRPE as ONNX nodes: out[b, h, i] += sum_j attn[b, h, i, j] Wv[bucket[i, j]], added to the
attention context as it is merged back to tokens.

Bucket sums run query-major: attn (B, H, n, n) -> (n, B*H, keys) by a transpose that keeps the innermost
axis, then batched MatMuls with per-query constants, then one (K', d) MatMul and one (n, B, D) -> (B, n, D)
transpose (merged with the context there, so the term is never transposed back to (B, H, n, d)).

* Product method (the published models): the patch block of the table is separable,
  bucket = a(r_i, r_j) * m + b(c_i, c_j), so the sums over a query's keys are two small contractions,
  over key columns by a (gw, m) one-hot and over key rows by a (gh, m) one-hot (both per query, built from
  the table): n * (P * m + gh * m * m) multiply-adds per (batch, head) instead of n * n * K', and constants
  of n * (gw + gh) * m floats (150 kB at 224 px) instead of n * n * K' (7.8 MB). The prefix (skip) bucket is a
  ReduceSum over the prefix keys (and 1 for prefix queries: softmax rows sum to 1).
* Any other table (cross, euc, quant): one batched MatMul per query row with the (n, n, K') one-hot.
* Only MatMul, Transpose, Reshape, Slice, ReduceSum, Concat: TensorRT's parser takes it (no ScatterND).
* Plugin graphs: one irpe::RPEBucketSum node per table in the natural layout.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from .emit import Emit, Table
from .rpe_graph import _concat_weights, _offsets, _plugin_node, _squeeze_shared


def merged_context(emit: Emit, ctx: str, attn: str, tables: list[Table], key: str) -> tuple[str, np.ndarray | None]:
    """(N * n, D): the context (N, H, n, d) merged to tokens, plus the value-side term when ``tables``; and a
    (D,) constant still to add to every token (folded into the next linear layer's bias by the caller)."""
    g, name = emit.builder, f"{key}.rpe_v"
    if tables and emit.plugin:
        parts = [_plugin_node(emit, "sum", attn, t.bucket, name, t.num_buckets) for t in tables]
        sums = parts[0] if len(parts) == 1 else g.op("Concat", parts, f"{name}/sums", axis=-1)
        w = _squeeze_shared(_concat_weights(tables, axis=1))  # (K', d) or (H, K', d)
        term = g.op("MatMul", [sums, g.weight(w, f"{name}.weight")], f"{name}/values")
        ctx = g.op("Add", [ctx, term], f"{key}/rpe_v")
    out = g.op("Transpose", [ctx], f"{key}/merge", perm=[0, 2, 1, 3])
    out = g.op("Reshape", [out, g.ints([-1, emit.cfg.embed_dim])], f"{key}/flatten")
    if not tables or emit.plugin:
        return out, None
    term, shift = _query_major_term(emit, attn, tables, name)
    return g.op("Add", [out, term], f"{key}/rpe_v"), shift


def product_factors(bucket: np.ndarray, grid: tuple[int, int], skip: int,
                    num_buckets: int) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(a (gh, gh), b (gw, gw), m) with bucket[s + r_i*gw + c_i, s + r_j*gw + c_j] = a[r_i, r_j] * m + b[c_i, c_j]
    and every prefix row and column in the last bucket; None when the table is not of that form."""
    gh, gw = grid
    n, last = skip + gh * gw, num_buckets - 1
    if bucket.shape != (n, n) or (skip and not ((bucket[:skip] == last).all() and (bucket[:, :skip] == last).all())):
        return None
    inner = num_buckets - (1 if skip else 0)
    m = math.isqrt(inner)
    if m * m != inner:
        return None
    core = bucket[skip:, skip:].reshape(gh, gw, gh, gw)
    rows, cols = core[:, 0, :, 0] // m, core[0, :, 0, :] % m
    if not np.array_equal(core, rows[:, None, :, None] * m + cols[None, :, None, :]):
        return None
    return rows, cols, m


def _query_major_term(emit: Emit, attn: str, tables: list[Table], name: str) -> tuple[str, np.ndarray | None]:
    """The value term as (N * n, D) from bucket sums laid out (n, N*H, K'), and the (D,) constant that the
    separable form leaves out (the prefix bucket's row, added to every token; None for the one-hot form)."""
    g, heads, n = emit.builder, emit.cfg.num_heads, emit.tokens
    if g.dtype != np.float32:  # fp16 graphs sum in float32 (ONNX Runtime's optimizer crashes on the fp16 form)
        attn = g.op("Cast", [attn], f"{name}/attn_fp32", to=TensorProto.FLOAT)
    skip, t = emit.cfg.num_prefix_tokens, tables[0]
    factors = product_factors(t.bucket, emit.cfg.grid, skip, t.num_buckets)
    shift = None
    if len(tables) == 1 and factors is not None:
        sums, w = _separable_sums(emit, attn, factors, name), t.weight
        if skip:  # prefix bucket sum = 1 - the patch buckets' sums (softmax rows sum to 1): fold it in
            w, shift = w[:, :-1] - w[:, -1:], np.broadcast_to(w[:, -1], (heads, w.shape[2])).reshape(-1)
    else:
        sums, w = _onehot_row_sums(emit, attn, tables, name), _concat_weights(tables, axis=1)
    if g.dtype != np.float32:
        sums = g.op("Cast", [sums], f"{name}/sums_cast", to=g.onnx_dtype)
    if w.shape[0] == 1:  # shared: (n, N*H, K') @ (K', d)
        vals = g.op("MatMul", [sums, g.weight(w[0], f"{name}.weight")], f"{name}/values")
    else:  # per head: (n, N, H, 1, K') @ (H, K', d)
        sums = g.op("Reshape", [sums, g.ints([n, -1, heads, 1, w.shape[1]])], f"{name}/per_head")
        vals = g.op("MatMul", [sums, g.weight(w, f"{name}.weight")], f"{name}/values")
    vals = g.op("Reshape", [vals, g.ints([n, -1, emit.cfg.embed_dim])], f"{name}/tokens")  # (n, N, D)
    vals = g.op("Transpose", [vals], f"{name}/batch_major", perm=[1, 0, 2])
    return g.op("Reshape", [vals, g.ints([-1, emit.cfg.embed_dim])], f"{name}/flatten"), shift


def _separable_sums(emit: Emit, attn: str, factors: tuple[np.ndarray, np.ndarray, int], name: str) -> str:
    """Sums (n, N*H, m*m) over the patch keys in the patch buckets (zero for prefix queries): over key columns
    by a per-query (gw, m) one-hot on the right, then over key rows by a per-query (m, gh) one-hot on the
    left (a broadcast MatMul; a transpose in between would run element by element in ONNX Runtime)."""
    g, n, s = emit.builder, emit.tokens, emit.cfg.num_prefix_tokens
    (gh, gw), (rows, cols, m) = emit.cfg.grid, factors
    col_hot, row_hot = np.zeros((n, gw, m), np.float32), np.zeros((n, 1, m, gh), np.float32)
    for i in range(gh * gw):
        r, c = divmod(i, gw)
        col_hot[s + i, np.arange(gw), cols[c]] = 1
        row_hot[s + i, 0, rows[r], np.arange(gh)] = 1
    keys = g.op("Slice", [attn, g.ints([s]), g.ints([n]), g.ints([3])], f"{name}/patch_keys") if s else attn
    t = g.op("Transpose", [keys], f"{name}/attn_rows", perm=[2, 0, 1, 3])  # (n, N, H, P)
    t = g.op("Reshape", [t, g.ints([n, -1, gw])], f"{name}/key_cols")  # (n, N*H*gh, gw)
    t = g.op("MatMul", [t, g.shared_initializer(col_hot, "rpe_v.col_onehot")], f"{name}/col_sums")
    t = g.op("Reshape", [t, g.ints([n, -1, gh, m])], f"{name}/key_rows")  # (n, N*H, gh, m_b)
    t = g.op("MatMul", [g.shared_initializer(row_hot, "rpe_v.row_onehot"), t], f"{name}/row_sums")
    return g.op("Reshape", [t, g.ints([n, -1, m * m])], f"{name}/sums")  # (n, N*H, m_a*m_b)


def _onehot(emit: Emit, tables: list[Table]) -> str:
    """The constant float32 (n, n, K') one-hot of the value-side tables: onehot[i, j, k] = [bucket[i, j] == k]."""
    n = emit.tokens
    onehot = np.zeros((n, n, sum(t.num_buckets for t in tables)), dtype=np.float32)
    rows, cols = np.arange(n)[:, None], np.arange(n)[None, :]
    for t, off in zip(tables, _offsets(tables), strict=True):
        onehot[rows, cols, off + t.bucket] = 1
    return emit.builder.shared_initializer(onehot, "rpe_v.onehot")


def _onehot_row_sums(emit: Emit, attn: str, tables: list[Table], name: str) -> str:
    """Bucket sums (n, N*H, K') as one batched MatMul per query row: attn (N, H, n, n) -> (n, N*H, n) @ onehot
    (n, n, K'); the transpose keeps the innermost axis (row copies)."""
    g, n = emit.builder, emit.tokens
    rows = g.op("Transpose", [attn], f"{name}/attn_rows", perm=[2, 0, 1, 3])
    rows = g.op("Reshape", [rows, g.ints([n, -1, n])], f"{name}/rows")
    return g.op("MatMul", [rows, _onehot(emit, tables)], f"{name}/onehot_sums")
