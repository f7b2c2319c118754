"""artifact/ort_graph.py and _ortops.c: every iRPE lookup and value-side bucket sum of an exported graph becomes one
irpe.ort custom op, ONNX Runtime's answer is kept (bit-identical for the q/k lookups), graphs without the pattern
are left alone, and a hostile index is refused with an error instead of a read out of bounds."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from irpe.artifact.ort_graph import DOMAIN, library, prepare, rewrite
from irpe.export.bench import random_model
from irpe.export.onnx import onnx_from_model

BASE = "deit_tiny_patch16_224_ctx_product_50_shared_k"
CONFIGS = {  # name -> (create_model overrides, {custom op: count per block})
    "ctx_k_product": (dict(rpe_on="k"), {"LookupAdd": 1}),
    "ctx_qkv_product": (dict(rpe_on="qkv"), {"LookupAdd2": 1, "BucketSumRows": 1}),
    "ctx_qk_cross_unshared": (dict(rpe_on="qk", rpe_method="cross", rpe_ratio=20, rpe_shared=False),
                              {"LookupAdd4": 1}),  # two lookups (rows, columns) per side
    "ctx_qv_euc": (dict(rpe_on="qv", rpe_method="euc", rpe_ratio=20), {"LookupAdd": 1, "BucketSumRows": 1}),
    "ctx_v_quant_unshared": (dict(rpe_on="v", rpe_method="quant", rpe_ratio=20, rpe_shared=False),
                             {"BucketSumRows": 1}),
    "bias_qk": (dict(rpe_mode="bias", rpe_on="qk"), {}),  # folded into one constant: nothing to gather
    "plain": (dict(rpe_on=""), {}),
}
pytestmark = pytest.mark.skipif(library() is None, reason="the _ortops C extension is not built (no C compiler)")


def _session(source: str | bytes, lib: str | None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    if lib:
        so.register_custom_ops_library(lib)
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_lookups_become_custom_ops_with_the_same_answers(config: str, tmp_path: Path) -> None:
    overrides, per_block = CONFIGS[config]
    model = random_model(BASE, img_size=48, rpe_std=0.5, **overrides)
    path = onnx_from_model(model, tmp_path / "model.onnx")
    source, lib = prepare(path)
    if not per_block:
        assert (source, lib) == (str(path), None)  # left alone: ONNX Runtime reads the file
        return
    ops = Counter(n.op_type for n in onnx.load_from_string(source).graph.node if n.domain == DOMAIN)
    assert ops == Counter({op: k * model.cfg.depth for op, k in per_block.items()})
    x = np.random.default_rng(0).standard_normal((3, 3, 48, 48)).astype(np.float32)
    got = _session(source, lib).run(None, {"images": x})[0]
    want = _session(str(path), None).run(None, {"images": x})[0]
    if "BucketSumRows" in ops:  # the value sums add in another order
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)
    with torch.no_grad():
        np.testing.assert_allclose(got, model(torch.from_numpy(x)).numpy(), rtol=0, atol=1e-3)


def test_the_rewrite_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = onnx_from_model(random_model(BASE, img_size=32), tmp_path / "model.onnx")
    assert isinstance(prepare(path)[0], bytes)
    monkeypatch.setenv("IRPE_ORT_OPS", "0")
    assert prepare(path) == (str(path), None)


def test_not_an_onnx_file_is_left_to_onnx_runtime_to_refuse(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    for data in (b"\x0a\xff\xff\xff\xff not protobuf", b"", b"\x3a\x02\x0a"):
        path.write_bytes(data)
        assert prepare(path) == (str(path), None)
    assert prepare(tmp_path / "missing.onnx") == (str(tmp_path / "missing.onnx"), None)


def _lookup_graph(index: np.ndarray, n: int = 4) -> bytes:
    nodes = [helper.make_node("LookupAdd", ["s", "lut", "index"], ["o"], domain=DOMAIN)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 2, n, n]),
                                           helper.make_tensor_value_info("lut", TensorProto.FLOAT, list("bhlk"))],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(index.astype(np.int32), "index")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(DOMAIN, 1)]).SerializeToString()


def test_lookup_add_matches_its_definition_and_refuses_an_index_out_of_range() -> None:
    n, k = 4, 3
    rng = np.random.default_rng(1)
    index = rng.integers(0, n * k, n * n)
    s, lut = rng.standard_normal((1, 2, n, n), np.float32), rng.standard_normal((1, 2, n, k), np.float32)
    got = _session(_lookup_graph(index), library()).run(None, {"s": s, "lut": lut})[0]
    want = s + lut.reshape(1, 2, n * k)[:, :, index].reshape(1, 2, n, n)
    np.testing.assert_array_equal(got, want)
    hostile = _session(_lookup_graph(np.where(np.arange(n * n) == 5, n * k + 10**6, index)), library())
    with pytest.raises(Exception, match="outside the table read"):
        hostile.run(None, {"s": s, "lut": lut})
    with pytest.raises(Exception, match="lut must be"):  # 2 planes in the scores, 3 in the lut
        hostile.run(None, {"s": s, "lut": np.zeros((1, 3, n, k), np.float32)})


def test_bucket_sums_match_their_definition() -> None:
    n, k, planes = 5, 4, (2, 3)
    rng = np.random.default_rng(2)
    index = rng.integers(-1, k, (n, n))
    attn = rng.random((*planes, n, n), dtype=np.float32)
    nodes = [helper.make_node("BucketSumRows", ["a", "index"], ["o"], domain=DOMAIN, num_buckets=k)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [*planes, n, n])],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(index.astype(np.int32), "index")])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(DOMAIN, 1)]).SerializeToString()
    got = _session(data, library()).run(None, {"a": attn})[0]
    flat = attn.reshape(-1, n, n)
    want = np.zeros((n, flat.shape[0], k), np.float32)
    for i in range(n):
        for j in range(n):
            if index[i, j] >= 0:
                want[i, :, index[i, j]] += flat[:, i, j]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_graph_without_lookups_is_not_rewritten() -> None:
    graph = helper.make_graph([helper.make_node("Add", ["a", "a"], ["o"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    assert rewrite(helper.make_model(graph).SerializeToString()) is None
