"""How OpenVINO reads an artifact's model.onnx: the iRPE q/k lookups rewritten into OpenVINO's fast form.

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

The graph is untrusted: the walks keep :mod:`.graph_limits` (each node once per walk, no recursion, a depth
and a term limit, a time budget), the tables built from the graph's constants (the (n, n) index, the grouped
weights, whose size is a product of the constants' dimensions) are reserved against its memory budget before
they are allocated, and a rewrite that gives up or fails in any way leaves the model as OpenVINO reads the
file, said in one warning line.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Hashable
from typing import Any

import numpy as np

from . import graph_limits
from .graph_limits import Budget, Leaf, Through

log = logging.getLogger("irpe.artifact")
ROWS_PERM = [2, 3, 0, 1]  # (N, H, n, K') -> (n, K', N, H) and (n, n, N, H) -> (N, H, n, n)


def read_model(core: Any, onnx_path: Any, budget_s: float = graph_limits.BUDGET_S,
               memory_mb: float = graph_limits.MEMORY_MB) -> Any:
    """How the server's engine, the export's bf16 fidelity check and the benches read an artifact.

    Args:
        core: an ``openvino.Core``.
        onnx_path: the artifact's model.onnx.
        budget_s: how long the rewrite may take before the model as read from the file is used.
        memory_mb: what the tables the rewrite builds may hold (:class:`.graph_limits.Budget`).

    Returns:
        The ``openvino.Model`` with its lookups rewritten; as read from the file when the rewrite gives up or
        fails (one warning line says why).

    Raises:
        Whatever ``core.read_model`` raises for a file OpenVINO cannot read.
    """
    model = core.read_model(str(onnx_path))
    try:
        budget = Budget(budget_s, memory_mb)
        last_axis_lookups(model, budget)
        grouped_value_sums(model, budget)
    except Exception as e:  # RewriteRefused, or a graph no exported model has: the file as exported still serves
        log.warning("%s: the iRPE lookup rewrite for OpenVINO gave up (%s: %s); OpenVINO runs the file as "
                    "exported", onnx_path, type(e).__name__, str(e)[:200])
        log.debug("the OpenVINO rewrite of %s failed", onnx_path, exc_info=True)
        model = core.read_model(str(onnx_path))  # the rewrite may have changed part of the graph in place
    return model


def last_axis_lookups(model: Any, budget: Budget | None = None) -> int:
    """Rewrite every row-layout lookup of ``model`` (an ``openvino.Model``) in place.

    Args:
        model: an ``openvino.Model``.
        budget: the time and memory the rewrite may take (:class:`.graph_limits.Budget`'s defaults when None).

    Returns:
        The number of lookups rewritten.

    Raises:
        RewriteRefused: the budget ran out.
    """
    import openvino.opset13 as ops

    budget = budget or Budget()
    shared: dict[tuple[int, bytes], Any] = {}  # one (n, n) index constant per distinct table (by digest)
    count = 0
    for node in model.get_ordered_ops():
        budget.check()
        found = _row_lookups(node, budget)
        if not found:
            continue
        total = None
        for lut, index, n in found:
            key = (n, hashlib.sha256(np.ascontiguousarray(index)).digest() + index.dtype.str.encode())
            if key not in shared:
                budget.reserve(2 * 8 * n * n, f"a ({n}, {n}) lookup index")  # the array and OpenVINO's copy
                shared[key] = ops.constant(index.reshape(n, n).astype(np.int64))
            flat = ops.reshape(lut, ops.constant(np.array([0, 0, -1], np.int64)), special_zero=True)
            term = ops.gather(flat, shared[key], ops.constant(np.int64(2)))
            total = term if total is None else ops.add(total, term)
        for target in list(node.output(0).get_target_inputs()):
            target.replace_source_output(total.output(0))
        count += 1
    return count


def _row_lookups(node: Any, budget: Budget) -> list[tuple[Any, np.ndarray, int]] | None:
    """For the final transpose of a row-layout lookup: its (lut, flat index, n) terms; else None."""
    if node.get_type_name() != "Transpose" or _perm(node) != ROWS_PERM:
        return None
    grid = node.input_value(0).get_node()
    if grid.get_type_name() != "Reshape":
        return None
    return graph_limits.summed_terms(grid.input_value(0), _summand, _key, budget)


def _key(value: Any) -> Hashable:
    return value.get_node().get_instance_id(), value.get_index()


def _summand(value: Any) -> Through | Leaf:
    """What ``value`` is in a sum of row gathers (through flattening Reshapes and Adds): an Add or Reshape
    (walk on), a row gather (its (lut, flat index, n)), or neither."""
    node = value.get_node()
    kind = node.get_type_name()
    if kind == "Add":
        return Through((node.input_value(0), node.input_value(1)))
    if kind == "Reshape":
        return Through((node.input_value(0),))
    if kind != "Gather" or node.get_input_size() != 3:
        return Leaf(None)
    index, axis, rows = (node.input_value(i).get_node() for i in (1, 2, 0))
    if not (_constant(index) and _constant(axis)) or axis.get_data().size != 1 \
            or int(axis.get_data().reshape(-1)[0]) != 0:
        return Leaf(None)
    flat = index.get_data().reshape(-1)
    n = int(round(np.sqrt(flat.size)))
    transpose = rows.input_value(0).get_node() if rows.get_type_name() == "Reshape" else None
    if n * n != flat.size or transpose is None or transpose.get_type_name() != "Transpose" \
            or _perm(transpose) != ROWS_PERM:
        return Leaf(None)
    lut = transpose.input_value(0)
    rank = lut.get_partial_shape().rank
    if not rank.is_static or rank.get_length() != 4:
        return Leaf(None)
    return Leaf([(lut, flat, n)])


def _constant(node: Any) -> bool:
    return node.get_type_name() == "Constant"


def _perm(node: Any) -> list[int] | None:
    source = node.input_value(1).get_node()
    return [int(v) for v in source.get_data().reshape(-1)] if _constant(source) else None


def grouped_value_sums(model: Any, budget: Budget | None = None) -> int:
    """Rewrite every separable value-side sum with shared weights of ``model`` in place.

    Args:
        model: an ``openvino.Model``.
        budget: the time and memory the rewrite may take (:class:`.graph_limits.Budget`'s defaults when None).

    Returns:
        The number of value sums rewritten.

    Raises:
        RewriteRefused: the budget ran out.
    """
    import openvino.opset13 as ops

    budget = budget or Budget()
    count = 0
    for node in model.get_ordered_ops():
        budget.check()
        found = _separable_values(node, budget)
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


def _separable_values(node: Any, budget: Budget) -> tuple[Any, np.ndarray, int, int] | None:
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
                            node.input_value(1).get_node().get_data(), col_sums, budget)


def _grouped_weights(row_hot: np.ndarray, col_hot: np.ndarray, w: np.ndarray, col_sums: Any,
                     budget: Budget | None = None) -> tuple[Any, np.ndarray, int, int] | None:
    """row_hot (n, 1, m_a, gh), col_hot (n, gw, m_b), w (m_a*m_b, d) -> (col_sums, (gh, gh*m_b, d), prefix, n)
    when every query of a grid row has the same one-hot rows and prefix queries have none; else None. The
    grouped weights (gh * gh * m_b * d floats, a product of the constants' sizes) are reserved first."""
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
    size = 2 * 4 * gh * gh * mb * w.shape[1]  # the array and OpenVINO's constant
    (budget or Budget()).reserve(size, f"grouped value weights ({gh}, {gh * mb}, {w.shape[1]})")
    weights = w.reshape(ma, mb, -1)[bucket]  # (gh, gh, m_b, d)
    return col_sums, np.ascontiguousarray(weights.reshape(gh, gh * mb, -1), dtype=np.float32), skip, n
