"""How OpenVINO reads an artifact's model.onnx: the iRPE layers rewritten into OpenVINO's fast forms.

Here (torch-free, beside the model.json contract) because the server's OpenVINO engine and the export's bf16
fidelity check must run the same graph, and the benches time it.

``irpe export`` lays each lookup out for ONNX Runtime: the lut (N, H, n, K') transposed to rows (n*K', N, H),
whole rows gathered by a constant index (n*n,), the q and k terms added flat, and one transpose of the
(n, n, N, H) result back to (N, H, n, n). ONNX Runtime copies whole rows fast and single elements slowly, so
that is its best form. OpenVINO is the other way round: a Gather on the last axis of the natural layout
(N, H, n*K') indexed by the same numbers laid out (n, n) gives (N, H, n, n) directly, with no transposes
(``irpe bench rpe-lookup``: +0.91 against +1.47 ms per attention core in bf16). The indices do not change
(row i*K' + bucket of the row layout is element i*K' + bucket of the flat one), so the answer is the same
(bit-identical in f32). Graphs without the pattern (plain DeiT, bias mode, plugin graphs) are left alone.

The value side of the product method (separable tables, shared weights) is exported as two per-query one-hot
contractions, over key columns then key rows, and a (K', d) MatMul. OpenVINO runs the key-row step, a MatMul
whose first input is a constant, in f32 over thousands of (m, gh) x (gh, m) products. Here that step and the
MatMul merge into one FullyConnected batched over the query's grid row, whose constant is (gh, gh*m, d): query
row r's weights for (key row, column bucket) pairs, W[a(r, key row), column bucket]. Prefix queries (all their
patch-bucket sums are zero) get zeros. Same sums, another order: 1e-6 in f32.

On a bf16 compile, an attention layer with more than the k-side lookup (a q-side lookup or value-side sums) runs
as one fused op instead (:mod:`.openvino_attention`): Softmax(q kᵀ + lookups), its context MatMul and its bucket
sums become one node that reads bf16 q, kᵀ, v and the luts, with the indices and buckets read off the graph's own
constants. K-only layers stay in OpenVINO's fused attention with the last-axis gather (as fast as the op there).
"""

from __future__ import annotations

from typing import Any

import numpy as np

ROWS_PERM = [2, 3, 0, 1]  # (N, H, n, K') -> (n, K', N, H) and (n, n, N, H) -> (N, H, n, n)


def read_model(core: Any, onnx_path: Any, *, bf16: bool = False, threads: int = 0) -> Any:
    """``onnx_path`` read by ``core`` (an ``openvino.Core``) as an ``openvino.Model``, its lookups rewritten:
    how the server's engine, the export's bf16 fidelity check and the benches read an artifact. ``bf16``: the
    model will be compiled with the bf16 hint, so its iRPE attention layers may run as the fused op
    (:func:`fused_attention`, on ``threads`` threads per inference stream; 0: every CPU)."""
    model = core.read_model(str(onnx_path))
    if bf16:
        fused_attention(model, threads)
    last_axis_lookups(model)
    grouped_value_sums(model)
    return model


def last_axis_lookups(model: Any) -> int:
    """Rewrite every row-layout lookup of ``model`` (an ``openvino.Model``) in place; the number rewritten."""
    import openvino.opset13 as ops

    shared: dict[bytes, Any] = {}  # one (n, n) index constant per distinct table, as in the ONNX graph
    count = 0
    for node in model.get_ordered_ops():
        found = _row_lookups(node)
        if not found:
            continue
        total = None
        for lut, index, n in found:
            key = index.tobytes()
            if key not in shared:
                shared[key] = ops.constant(index.reshape(n, n).astype(np.int64))
            flat = ops.reshape(lut, ops.constant(np.array([0, 0, -1], np.int64)), special_zero=True)
            term = ops.gather(flat, shared[key], ops.constant(np.int64(2)))
            total = term if total is None else ops.add(total, term)
        for target in list(node.output(0).get_target_inputs()):
            target.replace_source_output(total.output(0))
        count += 1
    return count


def _row_lookups(node: Any) -> list[tuple[Any, np.ndarray, int]] | None:
    """For the final transpose of a row-layout lookup: its (lut, flat index, n) terms; else None."""
    if node.get_type_name() != "Transpose" or _perm(node) != ROWS_PERM:
        return None
    grid = node.input_value(0).get_node()
    if grid.get_type_name() != "Reshape":
        return None
    return _gathers(grid.input_value(0))


def _gathers(value: Any) -> list[tuple[Any, np.ndarray, int]] | None:
    """The row gathers summed into ``value`` (through flattening Reshapes and Adds), or None."""
    node = value.get_node()
    kind = node.get_type_name()
    if kind == "Add":
        a, b = _gathers(node.input_value(0)), _gathers(node.input_value(1))
        return a + b if a is not None and b is not None else None
    if kind == "Reshape":
        return _gathers(node.input_value(0))
    if kind != "Gather":
        return None
    index, axis, rows = (node.input_value(i).get_node() for i in (1, 2, 0))
    if not (_constant(index) and _constant(axis) and int(axis.get_data().reshape(-1)[0]) == 0):
        return None
    flat = index.get_data().reshape(-1)
    n = int(round(np.sqrt(flat.size)))
    transpose = rows.input_value(0).get_node() if rows.get_type_name() == "Reshape" else None
    if n * n != flat.size or transpose is None or transpose.get_type_name() != "Transpose" \
            or _perm(transpose) != ROWS_PERM:
        return None
    lut = transpose.input_value(0)
    rank = lut.get_partial_shape().rank
    if not rank.is_static or rank.get_length() != 4:
        return None
    return [(lut, flat, n)]


def _constant(node: Any) -> bool:
    return node.get_type_name() == "Constant"


def _perm(node: Any) -> list[int] | None:
    source = node.input_value(1).get_node()
    return [int(v) for v in source.get_data().reshape(-1)] if _constant(source) else None


def grouped_value_sums(model: Any) -> int:
    """Rewrite every separable value-side sum with shared weights of ``model`` in place; the number rewritten."""
    import openvino.opset13 as ops

    count = 0
    for node in model.get_ordered_ops():
        found = _separable_values(node)
        if found is None:
            continue
        col_sums, weights, skip, n = found
        (gh, rows, d), patches = weights.shape, n - skip
        ints = lambda *v: ops.constant(np.array(v, np.int64))  # noqa: E731
        x = ops.reshape(col_sums, ints(n, -1, rows), special_zero=False)  # (n, N*H, gh*m_b)
        x = ops.slice(x, ints(skip), ints(n), ints(1), ints(0)) if skip else x
        x = ops.reshape(x, ints(gh, -1, rows), special_zero=False)  # (gh, gw*N*H, gh*m_b): by query row
        y = ops.matmul(x, ops.constant(weights), transpose_a=False, transpose_b=False)
        y = ops.reshape(y, ints(patches, -1, d), special_zero=False)
        if skip:
            y = ops.pad(y, ints(skip, 0, 0), ints(0, 0, 0), "constant", ops.constant(np.float32(0)))
        for target in list(node.output(0).get_target_inputs()):
            target.replace_source_output(y.output(0))
        count += 1
    return count


def _separable_values(node: Any) -> tuple[Any, np.ndarray, int, int] | None:
    """For the (K', d) MatMul of a separable value sum: (the key-column sums (n, N*H*gh, m_b), the grouped
    weights (gh, gh*m_b, d), the number of prefix queries, n); else None."""
    if node.get_type_name() != "MatMul" or not _constant(node.input_value(1).get_node()):
        return None
    sums = node.input_value(0).get_node()
    rows = sums.input_value(0).get_node() if sums.get_type_name() == "Reshape" else None
    if rows is None or rows.get_type_name() != "MatMul" or not _constant(rows.input_value(0).get_node()):
        return None
    cols = rows.input_value(1).get_node()
    col_sums = cols.input_value(0) if cols.get_type_name() == "Reshape" else None
    if col_sums is None or col_sums.get_node().get_type_name() != "MatMul" \
            or not _constant(col_sums.get_node().input_value(1).get_node()):
        return None
    if any(n.get_attributes().get(k) for n in (node, rows) for k in ("transpose_a", "transpose_b")):
        return None
    return _grouped_weights(rows.input_value(0).get_node().get_data(),
                            col_sums.get_node().input_value(1).get_node().get_data(),
                            node.input_value(1).get_node().get_data(), col_sums)


def _grouped_weights(row_hot: np.ndarray, col_hot: np.ndarray, w: np.ndarray,
                     col_sums: Any) -> tuple[Any, np.ndarray, int, int] | None:
    """row_hot (n, 1, m_a, gh), col_hot (n, gw, m_b), w (m_a*m_b, d) -> (col_sums, (gh, gh*m_b, d), prefix, n)
    when every query of a grid row has the same one-hot rows and prefix queries have none; else None."""
    if row_hot.ndim != 4 or row_hot.shape[1] != 1 or col_hot.ndim != 3 or w.ndim != 2:
        return None
    n, _, ma, gh = row_hot.shape
    gw, mb = col_hot.shape[1:]
    skip = n - gh * gw
    if skip < 0 or col_hot.shape[0] != n or w.shape[0] != ma * mb or (skip and row_hot[:skip].any()):
        return None
    grid = row_hot[skip:, 0].reshape(gh, gw, ma, gh)
    if not (grid == grid[:, :1]).all() or not (grid.sum(axis=2) == 1).all():
        return None
    bucket = grid[:, 0].argmax(axis=1)  # (gh query rows, gh key rows): the row bucket a
    weights = w.reshape(ma, mb, -1)[bucket]  # (gh, gh, m_b, d)
    return col_sums, np.ascontiguousarray(weights.reshape(gh, gh * mb, -1), dtype=np.float32), skip, n


def fused_attention(model: Any, threads: int = 0) -> int:
    """Rewrite every iRPE attention layer of ``model`` with a q-side lookup or value-side sums into the fused op
    (when :func:`openvino_attention.available`); the number rewritten."""
    from . import openvino_attention as fused

    if not fused.available():
        return 0
    values = _value_sums(model)
    threads = threads or fused.default_threads()
    found = [f for f in (_attention(node, values) for node in model.get_ordered_ops()) if f is not None]
    for layer in found:
        _fuse(*layer, threads)
    return len(found)


def _fuse(scores: Any, lookups: list, context: Any, value: tuple | None, threads: int) -> None:
    """One layer's Softmax(scores + lookups) @ v (and bucket sums) replaced by the fused op."""
    import openvino.opset13 as ops

    from . import openvino_attention as fused

    halves: dict[tuple[str, int], Any] = {}  # one Convert per distinct input (cross tables share a lut)

    def half(x: Any) -> Any:
        return halves.setdefault((x.get_node().get_friendly_name(), x.get_index()), ops.convert(x, "bf16").output(0))

    shapes = [lut.get_partial_shape() for lut, _, _ in lookups]
    kv = value[2] if value else 0
    layer = fused.plan(lookups[0][2], [index for _, index, _ in lookups],
                       [s[2].get_length() * s[3].get_length() for s in shapes],
                       value[1] if value else None, kv, value[3] if value else None)
    out = fused.op(half(scores.input_value(0)), half(scores.input_value(1)), half(context.input_value(1)),
                   [half(lut) for lut, _, _ in lookups], layer, kv, threads)
    _replace(context.output(0), ops.convert(out.output(0), "f32").output(0))
    if value:
        _replace(value[0].output(0), out.output(1))


def _replace(old: Any, new: Any) -> None:
    for target in list(old.get_target_inputs()):
        target.replace_source_output(new)


def _attention(softmax: Any, values: dict[str, tuple]) -> tuple | None:
    """For Softmax(MatMul(q, kᵀ) + row lookups) read by its context MatMul (and value-side sums): (the scores
    MatMul, [(lut, flat index, n)], the context MatMul, the value sums or None) when it is worth fusing."""
    if softmax.get_type_name() != "Softmax" or int(softmax.get_attributes().get("axis", -1)) not in (-1, 3):
        return None
    add = softmax.input_value(0).get_node()
    if add.get_type_name() != "Add":
        return None
    for side in (0, 1):
        lookups, scores = _row_lookups(add.input_value(1 - side).get_node()), add.input_value(side).get_node()
        if lookups and scores.get_type_name() == "MatMul" and not any(scores.get_attributes().values()):
            break
    else:
        return None
    value = values.get(softmax.get_friendly_name())
    readers = [t.get_node() for t in softmax.output(0).get_target_inputs()]
    context = [r for r in readers if r.get_type_name() == "MatMul" and r.input_value(0).get_node() is not None
               and r.input_value(0).get_node().get_friendly_name() == softmax.get_friendly_name()]
    if len(context) != 1 or any(context[0].get_attributes().values()) or len(readers) != 1 + bool(value) \
            or (len(lookups) < 2 and not value) or len(lookups) > 4:  # k alone: OpenVINO's own is as fast
        return None
    return scores, lookups, context[0], value


def _value_sums(model: Any) -> dict[str, tuple]:
    """Per Softmax (by name): (the node whose output is its bucket sums (n, N*H, K), the (n*n,) bucket index,
    K, the grid for separable tables or None), for each value side read off the graph."""
    out = {}
    for node in model.get_ordered_ops():
        found = _separable_sums(node) if node.get_type_name() == "Reshape" else \
            _one_hot_sums(node) if node.get_type_name() == "MatMul" else None
        if found is not None:
            attn, index, kv, grid = found
            out[attn.get_friendly_name()] = (node, index.reshape(-1), kv, grid)
    return out


def _query_rows(value: Any) -> tuple[Any, int] | None:
    """(attn, prefix keys sliced off) for Reshape(Transpose(attn [Slice], (2, 0, 1, 3))), or None."""
    shape = value.get_node()
    rows = shape.input_value(0).get_node() if shape.get_type_name() == "Reshape" else None
    if rows is None or rows.get_type_name() != "Transpose" or _perm(rows) != [2, 0, 1, 3]:
        return None
    attn = rows.input_value(0).get_node()
    if attn.get_type_name() != "Slice":
        return attn, 0
    start = attn.input_value(1).get_node()
    return (attn.input_value(0).get_node(), int(start.get_data().reshape(-1)[0])) if _constant(start) else None


def _separable_sums(node: Any) -> tuple | None:
    """Reshape(MatMul(row one-hot (n, 1, m, gh), Reshape(MatMul(<query rows>, col one-hot (n, gw, m)))))."""
    rows = node.input_value(0).get_node()
    if rows.get_type_name() != "MatMul" or not _constant(rows.input_value(0).get_node()):
        return None
    regroup = rows.input_value(1).get_node()
    cols = regroup.input_value(0).get_node() if regroup.get_type_name() == "Reshape" else None
    if cols is None or cols.get_type_name() != "MatMul" or not _constant(cols.input_value(1).get_node()):
        return None
    found = _query_rows(cols.input_value(0))
    row_hot, col_hot = rows.input_value(0).get_node().get_data(), cols.input_value(1).get_node().get_data()
    index = separable_index(row_hot, col_hot, found[1]) if found else None
    if index is None:
        return None
    n, gw, m = col_hot.shape
    return found[0], index, m * m, (found[1], row_hot.shape[3], gw, m)


def _one_hot_sums(node: Any) -> tuple | None:
    """MatMul(<query rows>, one-hot (n, n, K)), every key in one bucket."""
    found = _query_rows(node.input_value(0)) if _constant(node.input_value(1).get_node()) else None
    if found is None or found[1]:
        return None
    hot = node.input_value(1).get_node().get_data()
    index = one_hot_index(hot)
    return (found[0], index, hot.shape[2], None) if index is not None else None


def separable_index(row_hot: np.ndarray, col_hot: np.ndarray, skip: int) -> np.ndarray | None:
    """The (n, n) bucket index (-1: not in a bucket) of the separable value sums' one-hots: row_hot (n, 1, m, gh)
    over key rows, col_hot (n, gw, m) over key columns, ``skip`` prefix keys left out; None when a query's
    one-hots are not exact (each key row and column in exactly one bucket, or none for a prefix query)."""
    if row_hot.ndim != 4 or col_hot.ndim != 3 or row_hot.shape[1] != 1:
        return None
    n, gw, m = col_hot.shape
    gh = row_hot.shape[3]
    if row_hot.shape[:3] != (n, 1, m) or skip + gh * gw != n:
        return None
    index = np.full((n, n), -1, np.int32)
    for i in range(n):
        rows_i, cols_i = row_hot[i, 0].T, col_hot[i]  # (gh, m), (gw, m)
        if not (rows_i.any() or cols_i.any()):
            continue
        if not (one_hot_rows(rows_i, exact=True) and one_hot_rows(cols_i, exact=True)):
            return None
        index[i, skip:] = (rows_i.argmax(1)[:, None] * m + cols_i.argmax(1)[None, :]).reshape(-1)
    return index


def one_hot_index(hot: np.ndarray) -> np.ndarray | None:
    """The (n, n) bucket index of an (n, n, K) one-hot with one bucket per (query, key), else None."""
    if hot.ndim != 3 or hot.shape[0] != hot.shape[1] or not one_hot_rows(hot, exact=True):
        return None
    return hot.argmax(-1).astype(np.int32)


def one_hot_rows(hot: np.ndarray, exact: bool = False) -> bool:
    """Every last-axis row of ``hot`` is all zeros (or, ``exact``, never) but for one 1."""
    ones = (hot == 1).sum(-1)
    return bool(((hot == 0) | (hot == 1)).all() and ((ones == 1) if exact else (ones <= 1)).all())
