"""artifact/openvino_graph.py: every iRPE q/k lookup of an exported graph is rewritten into the last-axis form,
with OpenVINO's f32 answer unchanged and PyTorch's answer kept; graphs without the pattern are left alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from irpe.artifact.openvino_graph import ROWS_PERM, last_axis_lookups
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
