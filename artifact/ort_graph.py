"""How ONNX Runtime reads an artifact's model.onnx on a CPU: the iRPE lookups as the ``irpe.ort`` custom ops.

Here (torch-free, beside the model.json contract) because the server's ONNX Runtime engine and the benches must
run the same graph; the file on disk is never changed, as with :mod:`.openvino_graph`.

``irpe export`` writes every lookup in standard ops, in the layout ONNX Runtime runs fastest among them (rows
gathered, then one transpose back to (N, H, n, n); the value side as one-hot MatMuls). Each of those passes
writes and reads an (N, H, n, n) tensor, and that, not the multiply-adds, is what iRPE costs there. The C ops
in ``_ortops.c`` do the same arithmetic in one pass each:

* ``Add(scores, <row lookups summed>)`` -> ``LookupAdd[2-4](scores, lut, index, ...)``, one (lut, index) per
  lookup (k, q; two each for cross tables): the same sums in the same order (bit-identical in float32).
* the value side's bucket sums (separable product form, or the (n, n, K) one-hot) -> ``BucketSumRows(attn,
  index; num_buckets)`` in the (n, N*H, K) layout the next MatMul reads (the same sums, in another order).

The lookup index is read off the graph's own constants (the row index, the one-hots), so nothing but the
graph decides the buckets. Graphs without the patterns (plain DeiT, bias mode, plugin graphs) are left alone.
The graph is read and written in the wire format (:mod:`.onnx_wire`: the serving image has no onnx package).
``IRPE_ORT_OPS=0`` turns the rewrite off; without the compiled library it is off too.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import onnx_wire
from .onnx_wire import Node
from .openvino_graph import ROWS_PERM  # the row layout both rewrites undo (imports no openvino)
from .protowire import Malformed

DOMAIN = "irpe.ort"
MAX_TERMS = 4  # lookups summed into one node: LookupAdd, LookupAdd2 .. LookupAdd4 (_ortops.c)
QUERY_MAJOR = [2, 0, 1, 3]  # attn (N, H, n, n) -> (n, N, H, n)


def library() -> str | None:
    """The compiled custom-op library's path, or None (not built: no C compiler at install time)."""
    try:
        from . import _ortops  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _ortops.__file__


def prepare(onnx_path: str | Path) -> tuple[str | bytes, str | None]:
    """(what to hand ``onnxruntime.InferenceSession``, the library to register on its SessionOptions or None):
    model.onnx's path as it is, or its bytes with the lookups rewritten."""
    lib = library() if os.environ.get("IRPE_ORT_OPS", "1") != "0" else None
    if lib is None:
        return str(onnx_path), None
    try:
        data = Path(onnx_path).read_bytes()
        out = rewrite(data)
    except (OSError, Malformed):  # unreadable, or not an ONNX file: ONNX Runtime reads the path and says so
        return str(onnx_path), None
    return (out, lib) if out is not None else (str(onnx_path), None)


def rewrite(data: bytes) -> bytes | None:
    """The ModelProto ``data`` with its lookups rewritten, or None when it has none."""
    graph = Graph(onnx_wire.read(data))
    count = sum(_lookup(graph, node) for node in list(graph.nodes) if node.op_type == "Add")
    count += sum(_bucket_sums(graph, node) for node in list(graph.nodes) if node.op_type in ("Reshape", "MatMul"))
    if not count:
        return None
    nodes, unused = graph.live()
    return onnx_wire.write(graph.model, nodes, graph.added, unused, {DOMAIN: 1})


class Graph:
    """A graph's nodes with their producers and constants indexed, and the constants added to it."""

    def __init__(self, model: onnx_wire.Model):
        self.model, self.nodes = model, list(model.nodes)
        self.producer = {out: node for node in self.nodes for out in node.outputs}
        self.added: dict[str, np.ndarray] = {}

    def made_by(self, name: str, op: str) -> Node | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op and node.domain in ("", "ai.onnx") else None

    def const(self, name: str) -> np.ndarray | None:
        if name in self.added:
            return self.added[name]
        node = self.made_by(name, "Constant")
        if node is not None and "value" in node.tensors:
            return onnx_wire.tensor(self.model.buf, *node.tensors["value"])
        return self.model.array(name)

    def add_const(self, array: np.ndarray, name: str) -> str:
        self.added.setdefault(name, array)
        return name

    def replace(self, old: Node, new: Node) -> None:
        self.nodes[next(i for i, node in enumerate(self.nodes) if node is old)] = new
        for out in new.outputs:
            self.producer[out] = new

    def live(self) -> tuple[list[Node], set[str]]:
        """(the nodes something still reads, the initializers nothing reads any more)."""
        nodes, outputs = self.nodes, set(self.model.outputs)
        while True:
            used = {i for node in nodes for i in node.inputs} | outputs
            keep = [node for node in nodes if any(o in used for o in node.outputs)]
            if len(keep) == len(nodes):
                return keep, set(self.model.initializers) - used
            nodes = keep


def _lookup(graph: Graph, add: Node) -> int:
    """``add`` = scores + (transpose back of row lookups): one LookupAdd[2] node in its place."""
    for scores, term in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        back = graph.made_by(term, "Transpose")
        back = back if back is not None and list(back.ints.get("perm", [])) == ROWS_PERM else None
        grid = back is not None and graph.made_by(back.inputs[0], "Reshape")
        found = _row_gathers(graph, grid.inputs[0]) if grid else None
        if not found or len(found) > MAX_TERMS:
            continue
        inputs = [scores]
        for lut, index, name in found:
            inputs += [lut, graph.add_const(index.reshape(-1).astype(np.int32), f"{name}/irpe_ort")]
        op = "LookupAdd" if len(found) == 1 else f"LookupAdd{len(found)}"
        graph.replace(add, Node(op, inputs, list(add.outputs), name=f"{add.name}/irpe_ort", domain=DOMAIN))
        return 1
    return 0


def _row_gathers(graph: Graph, name: str) -> list[tuple[str, np.ndarray, str]] | None:
    """(lut, flat row index, the index's name) of each row gather summed into ``name`` (through Reshapes and
    Adds), or None."""
    node = graph.producer.get(name)
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Add":
        a, b = _row_gathers(graph, node.inputs[0]), _row_gathers(graph, node.inputs[1])
        return a + b if a is not None and b is not None else None
    if node.op_type == "Reshape":
        return _row_gathers(graph, node.inputs[0])
    if node.op_type != "Gather" or node.ints.get("axis", 0) != 0:
        return None
    index, rows = graph.const(node.inputs[1]), graph.made_by(node.inputs[0], "Reshape")
    lut = rows is not None and graph.made_by(rows.inputs[0], "Transpose")
    if index is None or index.ndim != 1 or not lut or list(lut.ints.get("perm", [])) != ROWS_PERM:
        return None
    n = int(round(np.sqrt(index.size)))
    return [(lut.inputs[0], index, node.inputs[1])] if n * n == index.size else None


def _bucket_sums(graph: Graph, node: Node) -> int:
    """``node`` = the value side's bucket sums (n, N*H, K): one BucketSumRows node in its place."""
    for match in (_separable, _one_hot):
        found = match(graph, node)
        if found is not None:
            attn, index, k = found
            name = graph.add_const(index, f"{node.outputs[0]}/irpe_ort_index")
            graph.replace(node, Node("BucketSumRows", [attn, name], list(node.outputs), name=f"{node.name}/irpe_ort",
                                     domain=DOMAIN, ints={"num_buckets": k}))
            return 1
    return 0


def _query_rows(graph: Graph, name: str) -> tuple[str, int, int] | None:
    """(attn, prefix keys sliced off, row width) for Reshape(Transpose(attn [Slice]) to query-major rows of
    width keys), or None."""
    shape = graph.made_by(name, "Reshape")
    rows = shape is not None and graph.made_by(shape.inputs[0], "Transpose")
    if not rows or list(rows.ints.get("perm", [])) != QUERY_MAJOR:
        return None
    dims = graph.const(shape.inputs[1])
    if dims is None or dims.size != 3:
        return None
    keys, width = graph.made_by(rows.inputs[0], "Slice"), int(dims[-1])
    if keys is None:
        return rows.inputs[0], 0, width
    start, axes = graph.const(keys.inputs[1]), graph.const(keys.inputs[3]) if len(keys.inputs) > 3 else None
    if start is None or axes is None or start.size != 1 or int(axes.reshape(-1)[0]) not in (3, -1):
        return None
    return keys.inputs[0], int(start.reshape(-1)[0]), width


def _separable(graph: Graph, node: Node) -> tuple[str, np.ndarray, int] | None:
    """Product tables: Reshape(MatMul(row one-hot (n, 1, m, gh), Reshape(MatMul(<rows>, col one-hot (n, gw, m)))))."""
    rows = node.op_type == "Reshape" and graph.made_by(node.inputs[0], "MatMul")
    row_hot = graph.const(rows.inputs[0]) if rows else None
    regroup = row_hot is not None and graph.made_by(rows.inputs[1], "Reshape")
    cols = regroup and graph.made_by(regroup.inputs[0], "MatMul")
    col_hot = graph.const(cols.inputs[1]) if cols else None
    if col_hot is None or row_hot.ndim != 4 or col_hot.ndim != 3 or row_hot.shape[1] != 1:
        return None
    n, gw, m = col_hot.shape
    gh = row_hot.shape[3]
    found = _query_rows(graph, cols.inputs[0])
    if found is None or found[2] != gw or row_hot.shape[:3] != (n, 1, m) or found[1] + gh * gw != n:
        return None
    attn, skip, _ = found
    index = np.full((n, n), -1, np.int32)
    for i in range(n):  # a query's keys: all in buckets (a patch query) or none (a prefix query)
        rows_i, cols_i = row_hot[i, 0].T, col_hot[i]  # (gh, m), (gw, m)
        if not (rows_i.any() or cols_i.any()):
            continue
        if not (_one_hot_rows(rows_i, exact=True) and _one_hot_rows(cols_i, exact=True)):
            return None
        index[i, skip:] = (rows_i.argmax(1)[:, None] * m + cols_i.argmax(1)[None, :]).reshape(-1)
    return attn, index, m * m


def _one_hot(graph: Graph, node: Node) -> tuple[str, np.ndarray, int] | None:
    """Any table: MatMul(<rows>, one-hot (n, n, K)) with one bucket per (query, key). The graph's shape is
    matched before the constant is read (every weight matrix is some MatMul's second input)."""
    found = _query_rows(graph, node.inputs[0]) if node.op_type == "MatMul" else None
    hot = graph.const(node.inputs[1]) if found is not None and not found[1] else None
    if hot is None or hot.ndim != 3 or hot.shape[0] != hot.shape[1] or hot.shape[0] != found[2] \
            or not _one_hot_rows(hot, exact=True):
        return None
    return found[0], hot.argmax(-1).astype(np.int32), hot.shape[2]


def _one_hot_rows(hot: np.ndarray, exact: bool = False) -> bool:
    """Every last-axis row of ``hot`` is all zeros (or, ``exact``, never) but for one 1."""
    ones = (hot == 1).sum(-1)
    return bool(((hot == 0) | (hot == 1)).all() and ((ones == 1) if exact else (ones <= 1)).all())
