"""The torch-free op spec: NumPy references against brute-force loops, and the ONNX node attributes."""

import subprocess
import sys

import numpy as np
import onnx
import pytest

from irpe.plugins import ops


def _loops_index(lut, index):
    b, h, lq, _ = lut.shape
    out = np.empty((b, h, lq, index.shape[1]), lut.dtype)
    for i in range(lq):
        for j in range(index.shape[1]):
            out[:, :, i, j] = lut[:, :, i, index[i, j]]
    return out


def _loops_sum(attn, index, k):
    out = np.zeros((*attn.shape[:3], k), np.float64)
    for i in range(index.shape[0]):
        for j in range(index.shape[1]):
            out[:, :, i, index[i, j]] += attn[:, :, i, j]
    return out


def test_rpe_index_ref_matches_loops():
    rng = np.random.default_rng(1)
    lut = rng.standard_normal((2, 3, 10, 7)).astype(np.float32)
    index = rng.integers(0, 7, (10, 12)).astype(np.int32)
    out = ops.rpe_index_ref(lut, index)
    assert out.shape == (2, 3, 10, 12) and out.dtype == np.float32
    np.testing.assert_array_equal(out, _loops_index(lut, index))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bucket_sum_ref_matches_loops(dtype):
    rng = np.random.default_rng(2)
    attn = rng.random((2, 2, 9, 9)).astype(dtype)
    index = rng.integers(0, 5, (9, 9)).astype(np.int32)
    out = ops.bucket_sum_ref(attn, index, 6)
    assert out.shape == (2, 2, 9, 6) and out.dtype == dtype
    np.testing.assert_allclose(out.astype(np.float64), _loops_sum(attn, index, 6), rtol=1e-3, atol=1e-6)
    assert np.all(out[..., 5] == 0), "a bucket no key falls into sums to zero"


def test_refs_reject_bad_shapes():
    with pytest.raises(ValueError, match="index must be"):
        ops.rpe_index_ref(np.zeros((1, 1, 4, 3), np.float32), np.zeros((5, 4), np.int32))
    with pytest.raises(ValueError, match="attn must be"):
        ops.bucket_sum_ref(np.zeros((4, 4), np.float32), np.zeros((4, 4), np.int32), 3)


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_rpe_index_node_carries_tensorrt_plugin_attributes():
    node = ops.make_rpe_index_node("lut", "table", "out", "blk0_rpe_k")
    assert (node.op_type, node.domain, node.name) == ("RPEIndex", "irpe", "blk0_rpe_k")
    assert list(node.input) == ["lut", "table"] and list(node.output) == ["out"]
    assert _attrs(node) == {"plugin_namespace": b"irpe", "plugin_version": b"1", "aot": 1}


def test_bucket_sum_node_attributes_and_checker():
    node = ops.make_bucket_sum_node("attn", "table", "sums", "blk0_rpe_v", num_buckets=50)
    assert node.op_type == "RPEBucketSum" and node.domain == "irpe"
    assert _attrs(node) == {"num_buckets": 50, "plugin_namespace": b"irpe", "plugin_version": b"1", "aot": 1}
    assert _attrs(ops.make_bucket_sum_node("a", "t", "s", "n", num_buckets=3, aot=False))["aot"] == 0
    with pytest.raises(ValueError, match="num_buckets"):
        ops.make_bucket_sum_node("a", "t", "s", "n", num_buckets=0)


def test_plugin_ids_and_opset():
    assert ops.plugin_id(ops.RPE_INDEX_OP) == "irpe::RPEIndex"
    assert ops.plugin_id(ops.BUCKET_SUM_OP) == "irpe::RPEBucketSum"
    opset = ops.plugin_opset_import()
    assert (opset.domain, opset.version) == ("irpe", 1)


def test_package_import_is_light():
    code = ("import sys, irpe.plugins; "
            "print(sorted(m for m in ('torch', 'triton', 'onnx', 'tensorrt') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
