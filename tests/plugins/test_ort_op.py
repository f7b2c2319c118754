"""Plugin-op ONNX graphs in ONNX Runtime (lowered to standard ops, no extension library) vs NumPy."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from irpe.plugins import ops
from irpe.plugins.ort_op import session_for_plugin_graph

L, D, K, H = 10, 8, 7, 2
RNG = np.random.default_rng(11)
INDEX = RNG.integers(0, K, (L, L)).astype(np.int32)
W_K = RNG.standard_normal((D, K)).astype(np.float32)  # q @ W_K -> lut for every bucket
W_V = RNG.standard_normal((K, D)).astype(np.float32)  # bucket sums @ W_V -> value addend


def _model(plugin: bool, dtype: int) -> onnx.ModelProto:
    """q[N,H,L,D], attn[N,H,L,L] -> bias = RPEIndex(q@Wk), vout = RPEBucketSum(attn)@Wv."""
    np_dt = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [numpy_helper.from_array(INDEX, "table"), numpy_helper.from_array(W_K.astype(np_dt), "w_k"),
             numpy_helper.from_array(W_V.astype(np_dt), "w_v")]
    nodes = [helper.make_node("MatMul", ["q", "w_k"], ["lut"])]
    if plugin:
        nodes += [ops.make_rpe_index_node("lut", "table", "bias", "rpe_k"),
                  ops.make_bucket_sum_node("attn", "table", "sums", "rpe_v", num_buckets=K)]
    else:  # the same maths with standard ops: GatherElements / ScatterElements(add) on the expanded table
        inits.append(numpy_helper.from_array(np.zeros((1, 1, 1, K), np.float32), "zeros_k"))
        nodes += [helper.make_node("Shape", ["attn"], ["attn_shape"]),
                  helper.make_node("Expand", ["table", "attn_shape"], ["table4"]),
                  helper.make_node("GatherElements", ["lut", "table4"], ["bias"], axis=3),
                  helper.make_node("Shape", ["lut"], ["lut_shape"]),
                  helper.make_node("Expand", ["zeros_k", "lut_shape"], ["zeros"]),
                  helper.make_node("Cast", ["attn"], ["attn32"], to=TensorProto.FLOAT),  # sum in fp32
                  helper.make_node("ScatterElements", ["zeros", "table4", "attn32"], ["sums32"], axis=3,
                                   reduction="add"),
                  helper.make_node("Cast", ["sums32"], ["sums"], to=dtype)]
    nodes.append(helper.make_node("MatMul", ["sums", "w_v"], ["vout"]))
    io = [helper.make_tensor_value_info("q", dtype, ["N", H, L, D]),
          helper.make_tensor_value_info("attn", dtype, ["N", H, L, L])]
    outs = [helper.make_tensor_value_info("bias", dtype, ["N", H, L, L]),
            helper.make_tensor_value_info("vout", dtype, ["N", H, L, D])]
    opsets = [helper.make_opsetid("", 17)] + ([ops.plugin_opset_import()] if plugin else [])
    graph = helper.make_graph(nodes, "irpe_plugin_test", io, outs, inits)
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def _standard_session(dtype: int):
    import onnxruntime as ort

    model = _model(False, dtype)
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16], ids=["fp32", "fp16"])
def test_plugin_graph_matches_standard_graph_and_reference(dtype, tmp_path):
    np_dt = helper.tensor_dtype_to_np_dtype(dtype)
    path = tmp_path / "plugin.onnx"
    onnx.save(_model(True, dtype), path)
    before = path.read_bytes()
    plugin, standard = session_for_plugin_graph(path), _standard_session(dtype)
    assert path.read_bytes() == before, "the model on disk must not be rewritten"
    tol = 1e-5 if dtype == TensorProto.FLOAT else 2e-2
    for n in (1, 3, 16):
        rng = np.random.default_rng(n)
        feed = {"q": rng.standard_normal((n, H, L, D)).astype(np_dt),
                "attn": rng.random((n, H, L, L)).astype(np_dt)}
        bias, vout = plugin.run(None, feed)
        assert bias.shape == (n, H, L, L) and vout.shape == (n, H, L, D) and bias.dtype == np_dt
        for got, want in zip((bias, vout), standard.run(None, feed), strict=True):
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
        lut = (feed["q"].astype(np.float64) @ W_K.astype(np_dt).astype(np.float64))
        np.testing.assert_allclose(bias.astype(np.float64), ops.rpe_index_ref(lut, INDEX), rtol=tol, atol=tol)
        sums = ops.bucket_sum_ref(feed["attn"].astype(np.float64), INDEX, K)
        np.testing.assert_allclose(vout.astype(np.float64), sums @ W_V.astype(np_dt).astype(np.float64),
                                   rtol=tol, atol=tol)


def test_plain_onnxruntime_cannot_run_the_plugin_graph():
    import onnxruntime as ort

    with pytest.raises(Exception, match="RPEIndex|irpe"):
        ort.InferenceSession(_model(True, TensorProto.FLOAT).SerializeToString(),
                             providers=["CPUExecutionProvider"])


def test_rewrite_lowers_every_plugin_node_and_needs_no_extension_library(monkeypatch):
    from irpe.plugins.ort_op import rewrite_for_ort

    monkeypatch.setitem(__import__("sys").modules, "onnxruntime_extensions", None)
    model = rewrite_for_ort(_model(True, TensorProto.FLOAT))
    assert not any(n.domain == ops.DOMAIN for n in model.graph.node)
    assert ops.DOMAIN not in {o.domain for o in model.opset_import}
    kinds = [n.op_type for n in model.graph.node]
    assert kinds.count("GatherElements") == 1 and kinds.count("ScatterElements") == 1
    names = {a.name for n in model.graph.node for a in n.attribute}
    assert not names & {"plugin_namespace", "plugin_version", "aot"}
    onnx.checker.check_model(model, full_check=True)


def test_rewrite_refuses_an_opset_without_scatter_reduction():
    from irpe.plugins.ort_op import rewrite_for_ort

    model = _model(True, TensorProto.FLOAT)
    model.opset_import[0].version = 15
    with pytest.raises(ValueError, match="opset >= 16"):
        rewrite_for_ort(model)
