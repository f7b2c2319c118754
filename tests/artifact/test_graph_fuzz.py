"""Property-based fuzzing (Hypothesis, bounded) of the load-time graph rewrites (artifact/ort_graph.py,
artifact/openvino_graph.py).

* Random sums between a lookup's Gather and its Reshape back (Adds of any earlier values, Reshapes): a valid
  graph, so the rewritten graph must give ONNX Runtime's answer for the file as exported, on ONNX Runtime and
  on OpenVINO, and the rewrite must return at once.
* Random small graphs (any of the ops the rewrites match, wired at random: cycles, missing inputs, odd
  attributes and constants): the rewrite returns a well-formed graph or None, or refuses over its budget;
  nothing else is raised.
* Mutations of a real exported graph's bytes (``irpe export``'s graph of a DeiT-Tiny with iRPE on q, k and v):
  the rewrite returns a graph (well-formed where the input is) or None, or refuses cleanly.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from irpe.artifact import onnx_wire
from irpe.artifact.graph_limits import Budget, RewriteRefused
from irpe.artifact.openvino_graph import ROWS_PERM
from irpe.artifact.ort_graph import QUERY_MAJOR, library, rewrite
from irpe.artifact.protowire import Malformed, fields
from tests.artifact.hostile_graphs import lookup_graph, model_bytes

BUDGET_S = 5.0
SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
IMAGES = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
pytestmark = pytest.mark.skipif(library() is None, reason="the _ortops C extension is not built (no C compiler)")


def _timed_rewrite(data: bytes) -> bytes | None:
    """``rewrite`` within its budget, or None where it refused over it; it never takes much longer."""
    start = time.monotonic()
    try:
        return rewrite(data, Budget(BUDGET_S))
    except RewriteRefused:
        return None
    finally:
        assert time.monotonic() - start < BUDGET_S + 1


@st.composite
def sums(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """(op, first value, second value) steps; value 0 is the Gather's output, value k the k-th step's."""
    steps = []
    for k in range(draw(st.integers(0, 7))):
        steps.append((draw(st.sampled_from(["Add", "Add", "Reshape"])), draw(st.integers(0, k)),
                      draw(st.integers(0, k))))
    return steps


def _middle(steps: list[tuple[str, int, int]]) -> object:
    def middle(start: str) -> tuple[list, str]:
        names, nodes = [start], []
        for k, (op, a, b) in enumerate(steps):
            inputs = [names[a], names[b]] if op == "Add" else [names[a], "row_shape"]
            nodes.append(helper.make_node(op, inputs, [f"v{k}"]))
            names.append(f"v{k}")
        return nodes, names[-1]
    return middle


def _ort(source: str | bytes, custom: bool) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    if custom:
        so.register_custom_ops_library(library())
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"]).run(None, {"images": IMAGES})[0]


@settings(max_examples=25, **SETTINGS)
@given(sums())
def test_random_sums_keep_onnx_runtimes_answer(tmp_path_factory: pytest.TempPathFactory,
                                              steps: list[tuple[str, int, int]]) -> None:
    data = model_bytes(*lookup_graph(_middle(steps)))
    want = _ort(data, custom=False)
    out = _timed_rewrite(data)
    if out is not None:
        np.testing.assert_allclose(_ort(out, custom=True), want, rtol=1e-5, atol=1e-30)
    ov = pytest.importorskip("openvino")
    from irpe.artifact.openvino_graph import read_model

    path = tmp_path_factory.mktemp("sums") / "model.onnx"
    path.write_bytes(data)
    core = ov.Core()
    start = time.monotonic()
    model = read_model(core, path, budget_s=BUDGET_S)
    assert time.monotonic() - start < BUDGET_S + 2
    got = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request().infer(
        {0: IMAGES})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)


NAMES = ["images", "idx", "hot", "shape", "start", "axes", "", "n0", "n1", "n2", "n3", "n4", "n5"]
OPS = ["Add", "Reshape", "Gather", "Transpose", "MatMul", "Slice", "Constant", "Identity"]


@st.composite
def random_graphs(draw: st.DrawFn) -> bytes:
    """Up to 8 nodes of the matched ops, wired at random among a few names (so cycles, missing inputs and
    several producers of one name happen), with random perms, axes and constants."""
    nodes = []
    for k in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(OPS))
        inputs = draw(st.lists(st.sampled_from(NAMES), max_size=5))
        attrs: dict[str, object] = {}
        if op == "Transpose" and draw(st.booleans()):
            attrs["perm"] = draw(st.sampled_from([ROWS_PERM, QUERY_MAJOR, [0], [3, 2, 1, 0], 5]))
        if op == "Gather" and draw(st.booleans()):
            attrs["axis"] = draw(st.sampled_from([0, 1, -1]))
        if op == "Constant":
            attrs["value"] = numpy_helper.from_array(_constant(draw), "c")
        nodes.append(helper.make_node(op, inputs, [draw(st.sampled_from(NAMES[6:])) if k else "n0"], **attrs))
    inits = {"idx": _constant(draw), "hot": _constant(draw), "shape": np.array([5, -1, 2], np.int64),
             "start": np.array([draw(st.sampled_from([0, 1, -3, 2**40]))], np.int64),
             "axes": np.array(draw(st.sampled_from([[3], [-1], [], [0, 1]])), np.int64)}
    graph = helper.make_graph(nodes, "random", [helper.make_tensor_value_info("images", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info(draw(st.sampled_from(NAMES[6:])), TensorProto.FLOAT,
                                                             None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph).SerializeToString()


def _constant(draw: st.DrawFn) -> np.ndarray:
    kind = draw(st.sampled_from(["index", "negative", "one-hot", "float", "empty", "scalar"]))
    n = draw(st.integers(1, 4))
    if kind == "index":
        return np.arange(n * n, dtype=np.int64)[::-1].copy()
    if kind == "negative":
        return np.array([-1, 2**40, 0, 1], np.int64)
    if kind == "one-hot":
        return np.eye(n, dtype=np.float32)[np.zeros((n, n), np.int64)]  # (n, n, n): bucket 0 everywhere
    if kind == "float":
        return np.full((n, 1, n, 2), 0.5, np.float32)
    return np.zeros((0,), np.int64) if kind == "empty" else np.array(3, np.int64)


@settings(max_examples=200, **SETTINGS)
@given(random_graphs())
def test_random_graphs_are_rewritten_or_left_alone(data: bytes) -> None:
    out = _timed_rewrite(data)
    if out is not None:
        onnx.load_from_string(out)  # well-formed: onnx parses it
        assert len(onnx_wire.read(out).nodes) <= len(onnx_wire.read(data).nodes)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """``irpe export``'s graph of a DeiT-Tiny (32 px, iRPE on q, k, v: both patterns), with every float
    weight the rewrite never reads cut to one value (the bytes stay a few hundred KB)."""
    from irpe.export.bench import random_model
    from irpe.export.onnx import onnx_from_model

    model = random_model("deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=32, rpe_on="qkv",
                         num_classes=10)
    proto = onnx.load(str(onnx_from_model(model, tmp_path_factory.mktemp("export") / "model.onnx")))
    for init in proto.graph.initializer:
        values = numpy_helper.to_array(init)
        if values.dtype == np.float32 and values.size > 64 and not np.isin(values, (0, 1)).all():
            init.CopyFrom(numpy_helper.from_array(np.zeros(1, np.float32), init.name))
    data = proto.SerializeToString()
    assert rewrite(data) is not None  # the patterns are still there
    return data


def _node_spans(data: bytes) -> list[tuple[int, int]]:
    ((start, end),) = [(a, b) for n, w, a, b, _ in fields(data, 0, len(data)) if n == 7 and w == 2]
    return [(a, b) for n, w, a, b, _ in fields(data, start, end) if n == 1 and w == 2]


@settings(max_examples=100, **SETTINGS)
@given(st.data())
def test_mutations_of_an_exported_graph_are_rewritten_or_refused(exported: bytes, data: st.DataObject) -> None:
    buf = bytearray(exported)
    spans = _node_spans(exported)
    for _ in range(data.draw(st.integers(1, 4))):
        low, high = data.draw(st.sampled_from(spans)) if data.draw(st.integers(0, 4)) else (0, len(buf))
        pos = data.draw(st.integers(low, max(low, min(high, len(buf)) - 1)))
        op = data.draw(st.sampled_from(["flip", "set", "cut", "repeat"]))
        if op == "flip":
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set":
            buf[pos] = data.draw(st.sampled_from([0x00, 0x01, 0x08, 0x0A, 0x12, 0x22, 0x7F, 0x80, 0xFF]))
        elif op == "cut":
            del buf[pos:pos + data.draw(st.integers(1, 12))]
        else:
            buf[pos:pos] = buf[pos:pos + data.draw(st.integers(2, 40))]
    mutated = bytes(buf)
    try:
        out = _timed_rewrite(mutated)
    except Malformed:
        return  # not protobuf: ONNX Runtime reads the file and refuses it
    if out is not None:
        onnx_wire.read(out)  # well-formed for the reader
        try:
            onnx.load_from_string(mutated)
        except Exception:
            return
        onnx.load_from_string(out)  # and for onnx, where the input was
