"""iRPE terms as ONNX nodes: folded bias constants and contextual q/k lookups (value side: rpe_value).

Layout choices (ONNX Runtime CPU, DeiT-S, batch 8, n = 197, K = 50, measured on a 2-core host):

* q/k lookups: ONNX Runtime's Gather on the last axis copies element by element (11.9 ms per lookup
  as (B, H, n*K) -> (B, H, n*n)). Both luts are (B, H, n, K) weight GEMMs (q Wk, and k Wq for the q side, so
  OpenVINO runs them as int8/bf16 FullyConnected layers; the old Wq k^T form ran in f32 there), laid out as
  rows (n*K, B, H) with batch x heads innermost by a 2-D-mergeable transpose, whole rows gathered by a
  constant flat index (0.22 ms), the q- and k-side rows added as 1-D tensors (OpenVINO's Add on (n*n, B, H)
  with a dynamic B walks 6-wide rows: 6.9 ms vs 1.1 ms flat; ONNX Runtime's variadic Sum runs
  single-threaded) and transposed back once. A one-hot batched MatMul takes 2.5 ms, a per-query (n, d, n)
  constant MatMul 6.2 ms.
* v bucket sums: see :mod:`export.rpe_value`.
* Plugin graphs keep the natural layout: one irpe::RPEIndex / irpe::RPEBucketSum node per table.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from irpe.models.rpe import rpe_tables

from .emit import Emit, Table


def collect_tables(model: nn.Module) -> dict[int, dict[str, list[Table]]]:
    """Per block, per target ("q", "k", "v"): the RPE tables (two for the cross method)."""
    out: dict[int, dict[str, list[Table]]] = {}
    for i, blk in enumerate(model.blocks):
        for target in "qkv":
            module = getattr(blk.attn, f"rpe_{target}")
            if module is None:
                continue
            out.setdefault(i, {})[target] = [
                Table(t.bucket.numpy().astype(np.int64), int(t.num_buckets),
                      (t.lookup_table_bias if t.mode == "bias" else t.lookup_table_weight).detach().float().numpy())
                for t in rpe_tables(module)]
    return out


def bias_constant(tables: dict[str, list[Table]]) -> np.ndarray:
    """All q- and k-side bias terms of a layer folded into one (Ht, n, n) addend."""
    total: np.ndarray | float = 0.0
    for t in tables.get("k", []):
        total = total + t.weight[:, t.bucket]
    for t in tables.get("q", []):
        total = total + t.weight[:, t.bucket.T]
    return np.asarray(total, dtype=np.float32)


def add_score_terms(emit: Emit, attn: str, q: str, k_tokens: str, tables: dict[str, list[Table]], key: str) -> str:
    """attn (N, H, n, n) + every q/k-side iRPE term of the layer (q is scaled; k_tokens is k (N, n, H, d),
    unscaled: its own transpose keeps d innermost, which OpenVINO and ONNX Runtime copy in rows, where
    k^T -> k did not)."""
    g = emit.builder
    if not ({"q", "k"} & set(tables)):
        return attn
    if emit.cfg.rpe.mode == "bias":
        return g.op("Add", [attn, g.weight(bias_constant(tables), f"{key}.rpe_bias")], f"{key}/rpe_bias")
    scale = (emit.cfg.embed_dim // emit.cfg.num_heads) ** -0.5
    luts = {}
    if "k" in tables:
        w = _concat_weights(tables["k"], axis=-1)  # (Ht, d, K')
        luts["k"] = g.op("MatMul", [q, g.weight(_squeeze_shared(w), f"{key}.rpe_k.weight")], f"{key}.rpe_k/lut")
    if "q" in tables:
        w = _concat_weights(tables["q"], axis=-1) * scale  # (Ht, d, K')
        k = g.op("Transpose", [k_tokens], f"{key}.rpe_q/keys", perm=[0, 2, 1, 3])  # (N, H, n, d)
        luts["q"] = g.op("MatMul", [k, g.weight(_squeeze_shared(w), f"{key}.rpe_q.weight")], f"{key}.rpe_q/lut")
    if emit.plugin:
        return _plugin_scores(emit, attn, luts, tables, key)
    return g.op("Add", [attn, _row_scores(emit, luts, tables, key)], f"{key}/rpe_qk")


def _concat_weights(tables: list[Table], axis: int) -> np.ndarray:
    return np.concatenate([t.weight for t in tables], axis=axis)


def _squeeze_shared(w: np.ndarray) -> np.ndarray:
    """Drop the head axis of a shared table so MatMul broadcasts one 2-D weight."""
    return w[0] if w.shape[0] == 1 else w


def _offsets(tables: list[Table]) -> list[int]:
    return [int(sum(t.num_buckets for t in tables[:i])) for i in range(len(tables))]


def _row_index(tables: list[Table], side: str) -> list[np.ndarray]:
    """Per table: for output (i, j), the row to gather from the lut laid out with B*H innermost.

    Both luts are (N, H, n, K'), laid out as rows (n * K') by a 2-D-mergeable transpose (perm 2, 3, 0, 1).
    k side (lut = q W): row i * K' + bucket[i, j]; q side (lut = k W, looked up at key j): row j * K' + bucket[j, i].
    """
    total = sum(t.num_buckets for t in tables)
    out = []
    for t, off in zip(tables, _offsets(tables), strict=True):
        n = t.bucket.shape[0]
        if side == "k":
            rows = np.arange(n)[:, None] * total + off + t.bucket
        else:
            rows = np.arange(n)[None, :] * total + off + t.bucket.T
        out.append(rows.reshape(-1).astype(np.int64))
    return out


def _row_scores(emit: Emit, luts: dict[str, str], tables: dict[str, list[Table]], key: str) -> str:
    """Gather whole rows of luts laid out (n * K', B*H), sum, one transpose back to (N, H, n, n)."""
    g, n, heads = emit.builder, emit.tokens, emit.cfg.num_heads
    picked = []
    for side, lut in luts.items():
        width = sum(t.num_buckets for t in tables[side])
        rows = g.op("Reshape", [g.op("Transpose", [lut], f"{key}.rpe_{side}/lut_rows", perm=[2, 3, 0, 1]),
                                g.ints([n * width, -1, heads])], f"{key}.rpe_{side}/rows")  # (n*K', N, H)
        for idx in _row_index(tables[side], side):
            index = g.shared_initializer(idx, f"rpe_{side}.row_index")
            picked.append(g.op("Gather", [rows, index], f"{key}.rpe_{side}/gather", axis=0))
    if len(picked) > 1:  # 1-D: OpenVINO's Add on (n*n, N, H) with a dynamic N walks 6-wide rows (6.9 vs 1.1 ms)
        picked = [g.op("Reshape", [p, g.ints([-1])], f"{key}.rpe/flat") for p in picked]
    total = picked[0]
    for other in picked[1:]:  # Add, not Sum: ONNX Runtime runs Sum single-threaded (0.60 vs 0.21 ms)
        total = g.op("Add", [total, other], f"{key}.rpe/sum")
    total = g.op("Reshape", [total, g.ints([n, n, -1, heads])], f"{key}.rpe/grid")
    return g.op("Transpose", [total], f"{key}.rpe/scores", perm=[2, 3, 0, 1])


def _plugin_scores(emit: Emit, attn: str, luts: dict[str, str], tables: dict[str, list[Table]], key: str) -> str:
    """attn + irpe::RPEIndex lookups on natural-layout luts (one node per table)."""
    g = emit.builder
    for side, lut in luts.items():
        for t, off in zip(tables[side], _offsets(tables[side]), strict=True):
            term = _plugin_node(emit, "index", lut, t.bucket + off, f"{key}.rpe_{side}")
            if side == "q":
                term = g.op("Transpose", [term], f"{key}.rpe_q/transpose", perm=[0, 1, 3, 2])
            attn = g.op("Add", [attn, term], f"{key}/rpe_{side}")
    return attn


def _plugin_node(emit: Emit, kind: str, x: str, bucket: np.ndarray, name: str, num_buckets: int = 0) -> str:
    """One irpe::RPEIndex (kind "index") or irpe::RPEBucketSum node with its int32 bucket table."""
    from irpe.plugins.ops import make_bucket_sum_node, make_rpe_index_node, plugin_opset_import

    g = emit.builder
    index = g.shared_initializer(bucket.astype(np.int32), "rpe.bucket_index")
    out = g.unique(f"{name}/{'rpe_index' if kind == 'index' else 'bucket_sum'}")
    node = (make_rpe_index_node(x, index, out, out) if kind == "index"
            else make_bucket_sum_node(x, index, out, out, num_buckets=num_buckets))
    opset = plugin_opset_import()
    g.add_node(node, (opset.domain, opset.version))
    return out
