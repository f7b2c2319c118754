"""artifact/openvino_graph.py: every iRPE q/k lookup of an exported graph is rewritten into the last-axis form,
with OpenVINO's f32 answer unchanged and PyTorch's answer kept; graphs without the pattern are left alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from irpe.artifact.openvino_graph import (
    ROWS_PERM,
    _grouped_weights,
    grouped_value_sums,
    last_axis_lookups,
    read_model,
)
from irpe.export.bench import random_model
from irpe.export.onnx import onnx_from_model

ov = pytest.importorskip("openvino")
BASE = "deit_tiny_patch16_224_ctx_product_50_shared_k"
CONFIGS = {  # name -> (create_model overrides, lookups rewritten per block)
    "ctx_k_product": (dict(rpe_on="k"), 1),
    "ctx_qkv_product": (dict(rpe_on="qkv"), 1),
    "ctx_qk_cross_unshared": (dict(rpe_on="qk", rpe_method="cross", rpe_ratio=20, rpe_shared=False), 1),
    "ctx_qv_euc": (dict(rpe_on="qv", rpe_method="euc", rpe_ratio=20), 1),
    "bias_qk": (dict(rpe_mode="bias", rpe_on="qk"), 0),  # folded into one constant: nothing to gather
    "plain": (dict(rpe_on=""), 0),
}


def _compiled(model: object) -> object:
    return ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_lookups_rewritten_with_the_same_answers(config: str, tmp_path: Path) -> None:
    overrides, per_block = CONFIGS[config]
    model = random_model(BASE, img_size=48, rpe_std=0.5, **overrides)
    path = onnx_from_model(model, tmp_path / "model.onnx")
    x = np.random.default_rng(0).standard_normal((3, 3, 48, 48)).astype(np.float32)
    core = ov.Core()
    before = _compiled(core.read_model(str(path)))
    rewritten = core.read_model(str(path))
    assert last_axis_lookups(rewritten) == per_block * model.cfg.depth
    types = {op.get_type_name() for op in rewritten.get_ordered_ops()}
    after = _compiled(rewritten)
    got, want = (np.asarray(c.create_infer_request().infer({0: x})[0]) for c in (after, before))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    with torch.no_grad():
        reference = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-3)
    # the row layout's transposes were there and none is left in the rewritten graph's live part
    assert (_row_transposes(core.read_model(str(path))) > 0) == bool(per_block)
    assert _row_transposes(rewritten) == 0
    assert "Parameter" in types


def _row_transposes(model: object) -> int:
    return sum(1 for op in _live(model) if op.get_type_name() == "Transpose" and _perm(op) == ROWS_PERM)


def _perm(op: object) -> list[int] | None:
    source = op.input_value(1).get_node()
    return [int(v) for v in source.get_data().reshape(-1)] if source.get_type_name() == "Constant" else None


def _live(model: object) -> list:
    """Ops still reachable from the results (the replaced row-layout ops are left dangling)."""
    seen, stack, out = set(), [r for r in model.get_results()], []
    while stack:
        node = stack.pop()
        if id(node) in seen or node.get_friendly_name() in seen:
            continue
        seen.add(node.get_friendly_name())
        out.append(node)
        stack.extend(v.get_node() for v in node.input_values())
    return out


VALUE_CONFIGS = {  # name -> (create_model overrides, value sums grouped per block, key-row MatMuls per block)
    "ctx_qkv_product": (dict(rpe_on="qkv"), 1, 1),
    "ctx_v_product": (dict(rpe_on="v"), 1, 1),
    "ctx_v_product_unshared": (dict(rpe_on="v", rpe_shared=False), 0, 1),  # per-head weights: left as exported
    "ctx_qv_euc": (dict(rpe_on="qv", rpe_method="euc", rpe_ratio=20), 0, 0),  # one-hot form: not separable
    "ctx_k_product": (dict(rpe_on="k"), 0, 0),
}


@pytest.mark.parametrize("config", sorted(VALUE_CONFIGS))
def test_value_sums_grouped_with_the_same_answers(config: str, tmp_path: Path) -> None:
    overrides, per_block, key_rows = VALUE_CONFIGS[config]
    model = random_model(BASE, img_size=64, rpe_std=0.5, **overrides)
    path = onnx_from_model(model, tmp_path / "model.onnx")
    x = np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)
    core = ov.Core()
    before = _compiled(core.read_model(str(path)))
    rewritten = core.read_model(str(path))
    assert grouped_value_sums(rewritten) == per_block * model.cfg.depth
    after = _compiled(rewritten)
    got, want = (np.asarray(c.create_infer_request().infer({0: x})[0]) for c in (after, before))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    with torch.no_grad():
        reference = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-3)
    # the key-row MatMul (a constant first input) was there and is gone from the live graph where grouped
    depth = model.cfg.depth
    assert _key_row_matmuls(core.read_model(str(path))) == key_rows * depth
    assert _key_row_matmuls(rewritten) == (key_rows - per_block) * depth


def _key_row_matmuls(model: object) -> int:
    return sum(1 for op in _live(model) if op.get_type_name() == "MatMul"
               and op.input_value(0).get_node().get_type_name() == "Constant")


def test_value_sums_grouped_by_read_model(tmp_path: Path) -> None:
    """read_model, as the server and the export's bf16 check read an artifact, applies both rewrites."""
    model = random_model(BASE, img_size=48, rpe_std=0.5, rpe_on="qkv")
    path = onnx_from_model(model, tmp_path / "model.onnx")
    read = read_model(ov.Core(), path)
    assert _row_transposes(read) == 0
    assert grouped_value_sums(read) == 0  # already grouped: nothing left to match
    assert last_axis_lookups(read) == 0


def test_grouped_weights_refuse_rows_that_differ_within_a_grid_row() -> None:
    """A table whose row buckets vary along a grid row is not of the grouped form: left alone."""
    n, gh, gw, m = 5, 2, 2, 2
    row_hot = np.zeros((n, 1, m, gh), np.float32)
    col_hot = np.zeros((n, gw, m), np.float32)
    for q in range(1, n):
        row_hot[q, 0, 0, :] = 1
    row_hot[2, 0] = 0
    row_hot[2, 0, 1, :] = 1  # query (0, 1) differs from query (0, 0)
    w = np.ones((m * m, 3), np.float32)
    assert _grouped_weights(row_hot, col_hot, w, None) is None
    row_hot[2, 0] = row_hot[1, 0]
    found = _grouped_weights(row_hot, col_hot, w, None)
    assert found is not None and found[1].shape == (gh, gh * m, 3) and found[2:] == (1, n)
    row_hot[0, 0, 0, 0] = 1  # a prefix query with a patch bucket: not of the form either
    assert _grouped_weights(row_hot, col_hot, w, None) is None
