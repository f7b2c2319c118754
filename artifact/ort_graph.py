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

The graph is untrusted: the walks keep :mod:`.graph_limits` (each node once per walk, no recursion, a depth
and a term limit, a time budget), every array that grows with a constant (a decoded constant, an index table,
the writer's copy of it) is reserved against its memory budget before it is allocated, and a rewrite that gives
up or fails in any way leaves ONNX Runtime the file as exported, said in one warning line.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from . import graph_limits, onnx_wire
from .graph_limits import Budget, Leaf, Through
from .onnx_wire import Node
from .openvino_graph import ROWS_PERM  # the row layout both rewrites undo (imports no openvino)
from .protowire import Malformed

log = logging.getLogger("irpe.artifact")
DOMAIN = "irpe.ort"
MAX_TERMS = graph_limits.MAX_TERMS  # lookups summed into one node: LookupAdd, LookupAdd2 .. LookupAdd4 (_ortops.c)
QUERY_MAJOR = [2, 0, 1, 3]  # attn (N, H, n, n) -> (n, N, H, n)
BLOCK = 1 << 20  # one-hot elements checked at once


def library() -> str | None:
    """The compiled custom-op library's path, or None (not built: no C compiler at install time)."""
    try:
        from . import _ortops  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _ortops.__file__


def prepare(onnx_path: str | Path, budget_s: float = graph_limits.BUDGET_S,
            memory_mb: float = graph_limits.MEMORY_MB) -> tuple[str | bytes, str | None]:
    """What ONNX Runtime reads for ``onnx_path``.

    Args:
        onnx_path: the artifact's model.onnx.
        budget_s: how long the rewrite may take before the file as exported is used.
        memory_mb: what the rewrite may hold beyond the file and its rewritten copy (:class:`.graph_limits.Budget`).

    Returns:
        (what to hand ``onnxruntime.InferenceSession``, the library to register on its SessionOptions or None):
        model.onnx's path as it is, or its bytes with the lookups rewritten. Never raises for a bad graph: a
        rewrite that gives up or fails leaves the path (one warning line says why).
    """
    lib = library() if os.environ.get("IRPE_ORT_OPS", "1") != "0" else None
    if lib is None:
        return str(onnx_path), None
    try:
        data = Path(onnx_path).read_bytes()
        out = rewrite(data, Budget(budget_s, memory_mb))
    except (OSError, Malformed):  # unreadable, or not an ONNX file: ONNX Runtime reads the path and says so
        return str(onnx_path), None
    except Exception as e:  # RewriteRefused, or a graph no exported model has: the file as exported still serves
        log.warning("%s: the iRPE lookup rewrite gave up (%s: %s); ONNX Runtime runs the file as exported",
                    onnx_path, type(e).__name__, str(e)[:200])
        log.debug("the rewrite of %s failed", onnx_path, exc_info=True)
        return str(onnx_path), None
    return (out, lib) if out is not None else (str(onnx_path), None)


def rewrite(data: bytes, budget: Budget | None = None) -> bytes | None:
    """The ModelProto ``data`` with its lookups rewritten.

    Args:
        data: a ModelProto's bytes.
        budget: the time and memory the rewrite may take (:data:`.graph_limits.BUDGET_S`,
            :data:`.graph_limits.MEMORY_MB` when None).

    Returns:
        The rewritten model's bytes, or None when it has no lookups (or none the limits let through).

    Raises:
        Malformed: ``data`` is not well-formed protobuf with one graph.
        RewriteRefused: the budget ran out.
    """
    budget = budget or Budget()
    graph = Graph(onnx_wire.read(data, budget), budget)
    count = 0
    for node in list(graph.nodes):
        graph.budget.check()
        count += _lookup(graph, node) if node.op_type == "Add" else 0
    for node in list(graph.nodes):
        graph.budget.check()
        count += _bucket_sums(graph, node) if node.op_type in ("Reshape", "MatMul") else 0
    if not count:
        return None
    nodes, unused = graph.live()
    graph.budget.release(sum(array.nbytes for array in graph.added.values()))  # the writer reserves its copy
    return onnx_wire.write(graph.model, nodes, graph.added, unused, {DOMAIN: 1})


class Graph:
    """A graph's nodes with their producers and constants indexed, and the constants added to it."""

    def __init__(self, model: onnx_wire.Model, budget: Budget):
        self.model, self.nodes, self.budget = model, list(model.nodes), budget
        self.producer = {out: node for node in self.nodes for out in node.outputs if out}
        self.added: dict[str, np.ndarray] = {}
        self._consts: dict[str, np.ndarray | None] = {}  # each constant decoded once, however many nodes read it
        self._position = {id(node): i for i, node in enumerate(self.nodes)}

    def made_by(self, name: str, op: str) -> Node | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op and node.domain in ("", "ai.onnx") \
            and not node.ambiguous else None

    def const(self, name: str) -> np.ndarray | None:
        if name in self.added:
            return self.added[name]
        if name not in self._consts:
            node = self.made_by(name, "Constant")
            if node is not None and "value" in node.tensors:
                self._consts[name] = onnx_wire.tensor(self.model.buf, *node.tensors["value"], budget=self.budget)
            else:
                self._consts[name] = self.model.array(name) if name else None
        return self._consts[name]

    def add_const(self, array: np.ndarray, name: str) -> str:
        self.added.setdefault(name, array)
        return name

    def reserve_table(self, nbytes: int, what: str) -> None:
        """Reserve a table about to be built and the writer's copy of it: a table that could not be written
        is never built."""
        self.budget.reserve(2 * nbytes, what)

    def replace(self, old: Node, new: Node) -> None:
        i = self._position.pop(id(old))
        self.nodes[i], self._position[id(new)] = new, i
        for out in new.outputs:
            self.producer[out] = new

    def live(self) -> tuple[list[Node], set[str]]:
        """(the nodes something still reads, the initializers nothing reads any more): the nodes the graph's
        outputs are reached from, found backwards in one pass."""
        makers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for out in node.outputs:
                makers.setdefault(out, []).append(i)
        used, wanted, keep = set(self.model.outputs), list(self.model.outputs), set()
        while wanted:
            for i in makers.get(wanted.pop(), []):
                if i not in keep:
                    keep.add(i)
                    fresh = [name for name in self.nodes[i].inputs if name not in used]
                    used.update(fresh)
                    wanted += fresh
        return [node for i, node in enumerate(self.nodes) if i in keep], set(self.model.initializers) - used


def _lookup(graph: Graph, add: Node) -> int:
    """``add`` = scores + (transpose back of row lookups): one LookupAdd[2] node in its place."""
    if len(add.inputs) != 2:
        return 0
    for scores, term in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        back = graph.made_by(term, "Transpose")
        back = back if back is not None and _perm(back) == ROWS_PERM else None
        grid = back is not None and graph.made_by(_input(back, 0), "Reshape")
        found = _row_gathers(graph, _input(grid, 0)) if grid else None
        if not found or len(found) > MAX_TERMS:
            continue
        inputs = [scores]
        for lut, index, name in found:
            graph.reserve_table(4 * index.size, "a lookup's index")
            inputs += [lut, graph.add_const(index.reshape(-1).astype(np.int32), f"{name}/irpe_ort")]
        op = "LookupAdd" if len(found) == 1 else f"LookupAdd{len(found)}"
        graph.replace(add, Node(op, inputs, list(add.outputs), name=f"{add.name}/irpe_ort", domain=DOMAIN))
        return 1
    return 0


def _input(node: Node | None, i: int) -> str:
    """``node``'s input ``i``, or "" (none: nothing makes "")."""
    return node.inputs[i] if node is not None and i < len(node.inputs) else ""


def _perm(node: Node) -> list[int] | None:
    perm = node.ints.get("perm")
    return list(perm) if isinstance(perm, list) else None


def _row_gathers(graph: Graph, name: str) -> list[tuple[str, np.ndarray, str]] | None:
    """(lut, flat row index, the index's name) of each row gather summed into ``name`` (through Reshapes and
    Adds), or None; walked within :mod:`.graph_limits`."""
    return graph_limits.summed_terms(name, lambda value: _summand(graph, value), lambda value: value, graph.budget)


def _summand(graph: Graph, name: str) -> Through | Leaf:
    """What ``name`` is in a sum of row gathers: an Add or Reshape (walk on), a row gather, or neither."""
    node = graph.producer.get(name)
    if node is None or node.domain not in ("", "ai.onnx") or node.ambiguous:
        return Leaf(None)
    if node.op_type == "Add" and len(node.inputs) == 2:
        return Through(tuple(node.inputs))
    if node.op_type == "Reshape" and node.inputs:
        return Through((node.inputs[0],))
    if node.op_type != "Gather" or node.ints.get("axis", 0) != 0 or len(node.inputs) != 2:
        return Leaf(None)
    index, rows = graph.const(node.inputs[1]), graph.made_by(node.inputs[0], "Reshape")
    lut = rows is not None and graph.made_by(_input(rows, 0), "Transpose")
    if index is None or index.ndim != 1 or not index.size or not lut or _perm(lut) != ROWS_PERM \
            or index.dtype.kind not in "iu" or index.min() < 0 or index.max() >= 2**31:
        return Leaf(None)  # a negative or huge index: ONNX Runtime's Gather says what it makes of it
    n = int(round(np.sqrt(index.size)))
    return Leaf([(_input(lut, 0), index, node.inputs[1])] if n * n == index.size else None)


def _bucket_sums(graph: Graph, node: Node) -> int:
    """``node`` = the value side's bucket sums (n, N*H, K): one BucketSumRows node in its place."""
    if not node.outputs:
        return 0
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
    rows = shape is not None and graph.made_by(_input(shape, 0), "Transpose")
    if not rows or _perm(rows) != QUERY_MAJOR:
        return None
    dims = graph.const(_input(shape, 1))
    if dims is None or dims.size != 3 or dims.dtype.kind not in "iu":
        return None
    keys, width = graph.made_by(_input(rows, 0), "Slice"), int(dims[-1])
    if keys is None:
        return _input(rows, 0), 0, width
    start, axes = graph.const(_input(keys, 1)), graph.const(_input(keys, 3))
    if start is None or axes is None or start.size != 1 or axes.size != 1 or start.dtype.kind not in "iu" \
            or int(axes.reshape(-1)[0]) not in (3, -1) or not 0 <= int(start.reshape(-1)[0]) < 2**31:
        return None
    return _input(keys, 0), int(start.reshape(-1)[0]), width


def _separable(graph: Graph, node: Node) -> tuple[str, np.ndarray, int] | None:
    """Product tables: Reshape(MatMul(row one-hot (n, 1, m, gh), Reshape(MatMul(<rows>, col one-hot (n, gw, m)))))."""
    rows = node.op_type == "Reshape" and graph.made_by(_input(node, 0), "MatMul")
    row_hot = graph.const(_input(rows, 0)) if rows else None
    regroup = row_hot is not None and graph.made_by(_input(rows, 1), "Reshape")
    cols = regroup and graph.made_by(_input(regroup, 0), "MatMul")
    col_hot = graph.const(_input(cols, 1)) if cols else None
    if col_hot is None or row_hot.ndim != 4 or col_hot.ndim != 3 or row_hot.shape[1] != 1:
        return None
    n, gw, m = col_hot.shape
    gh = row_hot.shape[3]
    found = _query_rows(graph, _input(cols, 0))
    if found is None or found[2] != gw or row_hot.shape[:3] != (n, 1, m) or found[1] + gh * gw != n:
        return None
    attn, skip, _ = found
    graph.reserve_table(4 * n * n, f"the value sums' ({n}, {n}) bucket index")
    index = np.full((n, n), -1, np.int32)
    rows, step = row_hot[:, 0].transpose(0, 2, 1), max(1, BLOCK // max(1, (gh + gw) * m + gh * gw))  # (n, gh, m)
    for i in range(0, n, step):  # a query's keys: all in buckets (a patch query) or none (a prefix query)
        part_rows, part_cols = rows[i:i + step], col_hot[i:i + step]
        work = 16 * (part_rows.size + part_cols.size + len(part_rows) * gh * gw)  # copies, checks, the products
        graph.budget.reserve(work, "the value sums' one-hot check")
        active = i + np.flatnonzero(part_rows.reshape(len(part_rows), -1).any(1)
                                    | part_cols.reshape(len(part_cols), -1).any(1))
        if len(active) and not _bucket_rows(rows[active], col_hot[active], index[:, skip:], active, m):
            return None
        graph.budget.release(work)
    return attn, index, m * m


def _bucket_rows(rows: np.ndarray, cols: np.ndarray, index: np.ndarray, queries: np.ndarray, m: int) -> bool:
    """Fill ``index``'s rows ``queries`` from their one-hot key rows (q, gh, m) and columns (q, gw, m): bucket
    row * m + bucket column for each (key row, key column); False where one is not one 1 among 0s."""
    if not (_one_hot_rows(rows, exact=True) and _one_hot_rows(cols, exact=True)):
        return False
    buckets = rows.argmax(2).astype(np.int32)[:, :, None] * m + cols.argmax(2).astype(np.int32)[:, None]
    index[queries] = buckets.reshape(len(queries), -1)
    return True


def _one_hot(graph: Graph, node: Node) -> tuple[str, np.ndarray, int] | None:
    """Any table: MatMul(<rows>, one-hot (n, n, K)) with one bucket per (query, key). The graph's shape is
    matched before the constant is read (every weight matrix is some MatMul's second input)."""
    found = _query_rows(graph, _input(node, 0)) if node.op_type == "MatMul" else None
    hot = graph.const(_input(node, 1)) if found is not None and not found[1] else None
    if hot is None or hot.ndim != 3 or hot.shape[0] != hot.shape[1] or hot.shape[0] != found[2]:
        return None
    graph.reserve_table(4 * hot.shape[0] * hot.shape[1], f"the value sums' {hot.shape[:2]} bucket index")
    index = _bucket_index(hot, graph.budget)
    return (found[0], index, hot.shape[2]) if index is not None else None


def _bucket_index(hot: np.ndarray, budget: Budget) -> np.ndarray | None:
    """The bucket of each row of the one-hot ``hot`` (n, n, K) as int32 (n, n), or None where a row is not
    one 1 among 0s; checked a block of rows at a time, its work arrays reserved against ``budget``."""
    index = np.empty(hot.shape[:2], np.int32)
    step = max(1, BLOCK // max(1, hot[0].size))
    for i in range(0, len(hot), step):
        part = hot[i:i + step]
        work = 3 * part.size + 16 * part.shape[0] * part.shape[1]  # three boolean arrays, counts and argmax
        budget.reserve(work, "the one-hot check")
        ok = _one_hot_rows(part, exact=True)
        if ok:
            index[i:i + step] = part.argmax(-1)
        budget.release(work)
        if not ok:
            return None
    return index


def _one_hot_rows(hot: np.ndarray, exact: bool = False) -> bool:
    """Every last-axis row of ``hot`` is all zeros (or, ``exact``, never) but for one 1."""
    ones = (hot == 1).sum(-1)
    return bool(((hot == 0) | (hot == 1)).all() and ((ones == 1) if exact else (ones <= 1)).all())
