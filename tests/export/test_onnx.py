"""The ONNX graph built from the weights: parity with PyTorch, graph rules, dynamic batch, plugin form."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from irpe.export import build_onnx, onnx_from_model
from irpe.export.bench import random_model
from irpe.export.onnx import check_onnx
from irpe.models import list_models

PUBLISHED = [n for n in list_models() if "_ctx_" in n and "patch16_224" in n]
FORBIDDEN_OPS = {"Loop", "If", "Scan", "NonZero", "Unique", "Range"}
INDEXED_OPS = {"Gather": 1, "GatherElements": 1, "GatherND": 1, "Scatter": 1, "ScatterElements": 1, "ScatterND": 1}
TOL = 1e-4


def session(proto: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def max_diff(model: torch.nn.Module, sess: ort.InferenceSession, batch: int, seed: int = 0) -> float:
    size = model.cfg.img_size
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((batch, 3, size, size), dtype=np.float32))
    with torch.no_grad():
        ref = model(x).numpy()
    out = sess.run(["logits"], {"images": x.numpy()})[0]
    assert out.shape == ref.shape
    return float(np.abs(out - ref).max())


def constant_names(graph: onnx.GraphProto) -> set[str]:
    return {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}


def graph_rule_violations(proto: onnx.ModelProto) -> list[str]:
    """Forbidden control-flow/data-dependent ops anywhere; gather/scatter indices not constant."""
    bad, consts = [], constant_names(proto.graph)
    for node in proto.graph.node:
        if node.op_type in FORBIDDEN_OPS:
            bad.append(f"{node.name}: forbidden op {node.op_type}")
        pos = INDEXED_OPS.get(node.op_type)
        if pos is not None and node.input[pos] not in consts:
            bad.append(f"{node.name}: {node.op_type} index {node.input[pos]} is computed")
    return bad


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_variant_parity_and_graph_rules(name):
    model = random_model(name, img_size=64, rpe_std=0.5)
    proto = build_onnx(model)
    assert graph_rule_violations(proto) == []
    assert max_diff(model, session(proto), batch=2) <= TOL


CONFIGS = {
    "bias_k": dict(rpe_mode="bias", rpe_on="k"),
    "bias_qk_unshared_cross": dict(rpe_mode="bias", rpe_on="qk", rpe_shared=False, rpe_method="cross", rpe_ratio=20),
    "ctx_qkv_unshared": dict(rpe_on="qkv", rpe_shared=False),
    "ctx_qkv_cross": dict(rpe_on="qkv", rpe_method="cross", rpe_ratio=20),
    "ctx_qkv_euc": dict(rpe_on="qkv", rpe_method="euc", rpe_ratio=20),
    "ctx_qv_quant_unshared": dict(rpe_on="qv", rpe_method="quant", rpe_ratio=33, rpe_shared=False),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_rpe_configurations_match_pytorch(config):
    model = random_model("deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=48, rpe_std=0.5,
                         **CONFIGS[config])
    proto = build_onnx(model)
    check_onnx(proto)
    assert graph_rule_violations(proto) == []
    assert max_diff(model, session(proto), batch=3) <= TOL


def test_distilled_returns_mean_of_both_heads():
    model = random_model("deit_tiny_distilled_patch16_224", img_size=48)
    assert max_diff(model, session(build_onnx(model)), batch=2) <= TOL


def test_rpe_tables_reach_the_logits():
    """A graph exported with zeroed tables must differ: parity above is not blind to the RPE terms."""
    model = random_model("deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=48, rpe_std=0.5, rpe_on="qkv")
    with_rpe = session(build_onnx(model))
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "lookup_table" in key:
                p.zero_()
    assert max_diff(model, with_rpe, batch=1) > 1e-2


def test_full_size_224_with_dynamic_batches():
    model = random_model("deit_small_patch16_224_ctx_product_50_shared_qkv", rpe_std=0.1)
    proto = build_onnx(model)
    assert graph_rule_violations(proto) == []
    sess = session(proto)
    for batch in (1, 3):
        assert max_diff(model, sess, batch) <= TOL


def test_dynamic_batch_1_3_16_and_io_contract(tmp_path):
    model = random_model("deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=32, rpe_std=0.5, rpe_on="qkv")
    path = onnx_from_model(model, tmp_path / "m.onnx")
    proto = onnx.load(str(path))
    (inp,), (out,) = proto.graph.input, proto.graph.output
    assert inp.name == "images" and out.name == "logits"
    assert inp.type.tensor_type.elem_type == out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert dims == ["batch", 3, 32, 32]
    sess = session(proto)
    for batch in (1, 3, 16):
        assert max_diff(model, sess, batch, seed=batch) <= TOL


def test_checker_full_check_and_strict_shape_inference():
    model = random_model("deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=32, rpe_std=0.5, rpe_on="qkv")
    proto = build_onnx(model)
    onnx.checker.check_model(proto, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)
    assert {o.domain for o in proto.opset_import} == {""}
    assert max(o.version for o in proto.opset_import) >= 17
    logits = next(v for v in inferred.graph.output if v.name == "logits")
    assert [d.dim_param or d.dim_value for d in logits.type.tensor_type.shape.dim] == ["batch", 1000]


def _inferred_shapes(proto: onnx.ModelProto) -> dict[str, list]:
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True, data_prop=True)
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in inferred.graph.value_info}


def test_bias_mode_is_one_constant_addend_per_layer():
    model = random_model("deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=32, rpe_mode="bias",
                         rpe_on="qk", rpe_shared=False)
    proto = build_onnx(model)
    n = 1 + (32 // 16) ** 2
    inits = {i.name: tuple(i.dims) for i in proto.graph.initializer}
    addends = [x for node in proto.graph.node if node.op_type == "Add" for x in node.input
               if inits.get(x) == (model.cfg.num_heads, n, n)]
    assert len(addends) == model.cfg.depth
    assert not any(n.op_type in ("Gather", "MatMul") and "rpe" in n.name for n in proto.graph.node)


def test_contextual_graph_never_materialises_an_n_n_d_table():
    model = random_model("deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=64, rpe_on="qkv")
    proto = build_onnx(model)
    n, d = 1 + (64 // 16) ** 2, model.cfg.embed_dim // model.cfg.num_heads
    shapes = list(_inferred_shapes(proto).values()) + [list(i.dims) for i in proto.graph.initializer]
    too_big = [s for s in shapes if any(s[i:i + 3] == [n, n, d] or s[i:i + 2] == [n * n, d] for i in range(len(s)))]
    assert too_big == []
    ops = [node.op_type for node in proto.graph.node if "rpe_v" in node.name]
    assert "ScatterND" not in ops and ops.count("MatMul") == 3 * model.cfg.depth  # column, row sums, then (K, d)
    k = model.blocks[0].attn.rpe_v.num_buckets
    assert not [i.name for i in proto.graph.initializer if i.name.startswith("rpe") and np.prod(i.dims) >= n * n * k]
    gathers = [node for node in proto.graph.node if node.op_type == "Gather" and "rpe" in node.name]
    assert len(gathers) == 2 * model.cfg.depth  # one per contextual q / k lookup


def test_plugin_graph_matches_standard_graph_through_ort_custom_ops(tmp_path):
    from irpe.plugins.ort_op import session_for_plugin_graph

    model = random_model("deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=32, rpe_std=0.5,
                         rpe_on="qkv", rpe_method="cross", rpe_ratio=20)
    plugin = onnx_from_model(model, tmp_path / "plugin.onnx", rpe_plugin=True)
    proto = onnx.load(str(plugin))
    ops = [(n.domain, n.op_type) for n in proto.graph.node if n.domain == "irpe"]
    depth = model.cfg.depth
    assert ops.count(("irpe", "RPEIndex")) == 2 * 2 * depth and ops.count(("irpe", "RPEBucketSum")) == 2 * depth
    indices = {n.input[1] for n in proto.graph.node if n.domain == "irpe"}
    inits = {i.name: i for i in proto.graph.initializer}
    assert all(inits[i].data_type == onnx.TensorProto.INT32 and len(inits[i].dims) == 2 for i in indices)
    assert graph_rule_violations(proto) == []
    x = np.random.default_rng(1).standard_normal((3, 3, 32, 32), dtype=np.float32)
    got = session_for_plugin_graph(plugin).run(["logits"], {"images": x})[0]
    want = session(build_onnx(model)).run(["logits"], {"images": x})[0]
    assert np.abs(got - want).max() <= TOL


def test_opset_20_uses_gelu_and_matches():
    model = random_model("deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=32, rpe_std=0.5)
    proto = build_onnx(model, opset=20)
    assert any(n.op_type == "Gelu" for n in proto.graph.node)
    assert max_diff(model, session(proto), batch=2) <= TOL


def test_old_opset_is_refused():
    with pytest.raises(ValueError, match="opset >= 17"):
        build_onnx(random_model("deit_tiny_patch16_224", img_size=32), opset=16)


def test_fp16_graph_keeps_float32_io_and_is_close():
    model = random_model("deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=32, rpe_std=0.5, rpe_on="qkv")
    proto = build_onnx(model, fp16=True)
    assert proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in proto.graph.initializer)
    assert max_diff(model, session(proto), batch=2) <= 2e-2


def test_value_side_graph_has_no_scatter_reduction_and_matches(tmp_path):
    """TensorRT's ONNX parser rejects ScatterND(reduction); value buckets are summed by MatMuls, so
    the standard graph (cross: two tables per layer) is already the TensorRT one."""
    from irpe.export.tensorrt import tensorrt_incompatibilities

    model = random_model("deit_tiny_patch16_224_ctx_product_50_shared_k", img_size=32, rpe_std=0.5,
                         rpe_on="qkv", rpe_method="cross", rpe_shared=False)
    standard = build_onnx(model)
    assert tensorrt_incompatibilities(standard) == []
    assert not {"ScatterND", "ScatterElements"} & {n.op_type for n in standard.graph.node}
    check_onnx(standard)
    assert max_diff(model, session(standard), batch=3) <= TOL


def test_product_tables_factor_into_rows_and_columns_and_others_do_not():
    """The separable value-side sums apply to product tables exactly (the published ones) and to no other."""
    from irpe.export.rpe_value import product_factors
    from irpe.models.buckets import bucket_ids, num_buckets

    for method, ratio, factored in (("product", 1.9, True), ("euc", 20, False), ("quant", 33, False)):
        table, k = bucket_ids(method, ratio, 14, 14, 1), num_buckets(method, ratio, 1)
        got = product_factors(table, (14, 14), 1, k)
        assert (got is not None) == factored, method
        if got:
            rows, cols, m = got
            r, c = np.divmod(np.arange(196), 14)
            rebuilt = rows[r][:, r] * m + cols[c][:, c]
            assert m * m + 1 == k and np.array_equal(rebuilt, table[1:, 1:])
